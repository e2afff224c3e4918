package transport

import (
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testpki"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// TestProveSecret challenges a real server that answers as "owner" under
// a cluster secret: only the answer under a key the challenger holds, from
// the member it addressed, proves it.
func TestProveSecret(t *testing.T) {
	key, _ := PeerKey([]byte("correct horse battery staple"))
	other, _ := PeerKey([]byte("another cluster's secret"))
	addr := startAuthServer(t, &PeerAuth{Keys: [][]byte{key}}, nil)
	conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(PeerCredentials(key, nil)))
	for _, tc := range []struct {
		name   string
		to     string
		keys   [][]byte
		proven bool
	}{
		{"the member's key", "owner", [][]byte{key}, true},
		{"one of the challenger's keys", "owner", [][]byte{other, key}, true},
		{"another key", "owner", [][]byte{other}, false},
		{"another member's name", "mallory", [][]byte{key}, false},
	} {
		err := Prove(ctxT(t), conn, "caller", tc.to, tc.keys)
		if tc.proven && err != nil {
			t.Errorf("%s: %v, want proven", tc.name, err)
		}
		if !tc.proven && !errors.Is(err, ErrUnproven) {
			t.Errorf("%s: %v, want ErrUnproven", tc.name, err)
		}
	}

	// An answer is bound to its nonce, names and direction.
	nonce := make([]byte, ProofNonceLen)
	mac := ProveMAC(key, "caller", "owner", nonce)
	for name, other := range map[string][]byte{
		"another nonce":  ProveMAC(key, "caller", "owner", append([]byte{1}, nonce[1:]...)),
		"another caller": ProveMAC(key, "mallory", "owner", nonce),
		"swapped names":  ProveMAC(key, "owner", "caller", nonce),
	} {
		if string(other) == string(mac) {
			t.Errorf("%s gives the same answer", name)
		}
	}
}

// TestProveRefusesMalformed sends challenges a member must refuse, each
// with the status it names.
func TestProveRefusesMalformed(t *testing.T) {
	addr := startAuthServer(t, nil, nil)
	c := pb.NewPeerClient(dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials())))
	nonce := make([]byte, ProofNonceLen)
	for _, tc := range []struct {
		name string
		req  *pb.ProveRequest
		want codes.Code
	}{
		{"version 2", &pb.ProveRequest{Version: 2, To: "owner", Nonce: nonce}, codes.FailedPrecondition},
		{"version 0", &pb.ProveRequest{To: "owner", Nonce: nonce}, codes.FailedPrecondition},
		{"a short nonce", &pb.ProveRequest{Version: 1, To: "owner", Nonce: nonce[1:]}, codes.InvalidArgument},
		{"a long nonce", &pb.ProveRequest{Version: 1, To: "owner", Nonce: append(nonce, 0)}, codes.InvalidArgument},
		{"a long name", &pb.ProveRequest{Version: 1, From: strings.Repeat("x", MaxProofName+1), To: "owner", Nonce: nonce}, codes.InvalidArgument},
		{"another member", &pb.ProveRequest{Version: 1, To: "mallory", Nonce: nonce}, codes.FailedPrecondition},
		{"the member, open", &pb.ProveRequest{Version: 1, To: "owner", Nonce: nonce}, codes.OK},
	} {
		resp, err := c.Prove(ctxT(t), tc.req)
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err == nil && (resp.Name != "owner" || len(resp.Mac) != 0) {
			t.Errorf("%s: answer %+v, want owner without a MAC (no keys)", tc.name, resp)
		}
	}
}

// TestProveIdentity challenges members under mutual TLS with a challenger
// that verifies the answering certificate: a server with an API client's
// certificate of the same CA never proves itself, one with a peer identity
// does.
func TestProveIdentity(t *testing.T) {
	const id = "spiffe://sluice.test/peer"
	ca := testpki.NewCA(t, "cluster")
	caller := ca.IssueWith(t, "node-b", id)
	serve := func(cert tls.Certificate) string {
		server := ca.Config(cert)
		server.ClientAuth = tls.RequireAndVerifyClientCert
		return startAuthServer(t, &PeerAuth{Identities: []string{id}}, credentials.NewTLS(server))
	}
	creds := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{caller}, RootCAs: ca.Pool,
		VerifyConnection: VerifyPeerIdentity([]string{id}, nil),
	}))
	for _, tc := range []struct {
		name   string
		cert   tls.Certificate
		proven bool
	}{
		{"an API client's certificate", ca.Issue(t, "owner"), false},
		{"another identity", ca.IssueWith(t, "owner", "spiffe://sluice.test/client"), false},
		{"a peer's certificate", ca.IssueWith(t, "owner", id), true},
	} {
		conn := dial(t, serve(tc.cert), creds)
		err := Prove(ctxT(t), conn, "node-b", "owner", nil)
		if tc.proven && err != nil {
			t.Errorf("%s: %v, want proven", tc.name, err)
		}
		if !tc.proven {
			if err == nil {
				t.Errorf("%s: proven, want refused", tc.name)
			}
			// Every call on the connection fails, not only the proof.
			_, cerr := pb.NewPeerClient(conn).CheckBatch(ctxT(t), &pb.PeerCheckRequest{From: "node-b"})
			if status.Code(cerr) != codes.Unavailable {
				t.Errorf("%s: CheckBatch: %v, want Unavailable", tc.name, cerr)
			}
		}
	}
}

// TestProveGossip: a member's answer gives the gossip address its server
// reports, and ProveGossip returns it once the member has proved itself;
// an address that is no IP:port to join (none yet, a name, port 0, the
// unspecified address, text) is returned as "", and an unproven answer
// returns none.
func TestProveGossip(t *testing.T) {
	key, _ := PeerKey([]byte("correct horse battery staple"))
	for _, tc := range []struct{ reported, want string }{
		{"127.0.0.1:7946", "127.0.0.1:7946"},
		{"[::1]:7946", "[::1]:7946"},
		{"", ""},
		{"gossip.example:7946", ""},
		{"127.0.0.1:0", ""},
		{"0.0.0.0:7946", ""},
		{"127.0.0.1:7946\x00evil", ""},
	} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer(ServerOptions()...)
		RegisterPeer(s, &echoChecker{owner: "owner"}, WithPeerAuth(&PeerAuth{Keys: [][]byte{key}}), WithProver("owner"),
			WithProverGossip(func() string { return tc.reported }))
		go s.Serve(lis)
		conn := dial(t, lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(PeerCredentials(key, nil)))
		got, err := ProveGossip(ctxT(t), conn, "caller", "owner", [][]byte{key})
		if err != nil || got != tc.want {
			t.Errorf("reported %q: got %q, %v; want %q", tc.reported, got, err, tc.want)
		}
		other, _ := PeerKey([]byte("another cluster's secret"))
		if got, err := ProveGossip(ctxT(t), conn, "caller", "owner", [][]byte{other}); !errors.Is(err, ErrUnproven) || got != "" {
			t.Errorf("reported %q, unproven: got %q, %v; want \"\", ErrUnproven", tc.reported, got, err)
		}
		s.Stop()
	}
}
