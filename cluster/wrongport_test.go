package cluster_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/cluster"
)

// Joining a node's gRPC port instead of its gossip port fails with an
// error that says so, rather than memberlist's "invalid msgType (0)" alone;
// the gossip port joins.
func TestJoinGRPCPortNamesTheMistake(t *testing.T) {
	a, err := cluster.New(cluster.TestConfig("wrong-port-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := cluster.New(cluster.TestConfig("wrong-port-b"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_, err = b.Join(a.GRPCAddr())
	if !errors.Is(err, cluster.ErrJoin) || !strings.Contains(err.Error(), "looks like a sluice node's gRPC port") ||
		!strings.Contains(err.Error(), "gossip_addr") {
		t.Fatalf("join of the gRPC port: %v; want ErrJoin naming the gRPC port and gossip_addr", err)
	}
	if _, err := b.Join(a.GossipAddr()); err != nil {
		t.Fatalf("join of the gossip port: %v", err)
	}
}

// A node whose peer calls are open to any caller says so: to its Logger,
// or to slog.Default when it has none, so that an embedded node with the
// defaults is not silently open. A node with a ClusterSecret does not.
func TestOpenNodeWarnsWithoutALogger(t *testing.T) {
	var def lockedBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, nil)))
	defer slog.SetDefault(prev)
	const warning = "peer calls are open to every caller"
	for _, tc := range []struct {
		name        string
		logger      bool
		secret      bool
		wantDefault bool
		wantOwn     bool
	}{
		{"no logger", false, false, true, false},
		{"a logger", true, false, false, true},
		{"a cluster secret", false, true, false, false},
	} {
		def.Reset()
		var own lockedBuffer
		cfg := cluster.TestConfig("open-" + strings.ReplaceAll(tc.name, " ", "-"))
		if tc.logger {
			cfg.Logger = slog.New(slog.NewTextHandler(&own, nil))
		}
		if tc.secret {
			cfg.ClusterSecret = []byte("0123456789abcdef0123456789abcdef")
		}
		nd, err := cluster.New(cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		nd.Close()
		if got := strings.Contains(def.String(), warning); got != tc.wantDefault {
			t.Errorf("%s: slog.Default warned %v, want %v: %q", tc.name, got, tc.wantDefault, def.String())
		}
		if got := strings.Contains(own.String(), warning); got != tc.wantOwn {
			t.Errorf("%s: the node's logger warned %v, want %v", tc.name, got, tc.wantOwn)
		}
	}
}

// lockedBuffer is a bytes.Buffer that goroutines still logging after a
// node closed may write to while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *lockedBuffer) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Reset()
}
