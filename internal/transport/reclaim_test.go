package transport

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/testwait"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// serveReclaiming serves the Peer service on a listener of b's own
// (MessageBudget.Listen), and returns its address.
func serveReclaiming(t *testing.T, b *MessageBudget) string {
	t.Helper()
	lis, err := b.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, lis, b, func(s *grpc.Server) { RegisterPeer(s, &echoChecker{}) })
}

// TestIdleConnectionsGiveUpTheCap fills a port's connection cap with
// connections that open no call (raw TCP, the HTTP/2 preface alone, the
// preface and SETTINGS), under timeouts far longer than the test: a new
// client is still served at once, each new connection taking the slot of
// the one idle longest, while a connection with a call open keeps its
// own. Connections with no call, of a reclaiming listener, hold the cap no
// longer than the next connection that needs a slot.
func TestIdleConnectionsGiveUpTheCap(t *testing.T) {
	l := DefaultServerLimits()
	l.MaxConnections = 6
	l.HandshakeTimeout, l.MaxConnectionIdle = time.Hour, time.Hour
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	addr := serveReclaiming(t, b)

	// A peer with its stream open, which no reclaim may close.
	peer := newRawPeer(t, addr)
	peer.send(1)
	if got := peer.answer(); got != 1 {
		t.Fatalf("peer answer %d", got)
	}

	settings := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
	var idle []net.Conn
	for i := range 3 * l.MaxConnections {
		send := [][]byte{nil, []byte(clientPreface), settings}[i%3]
		c, err := tryRaw(t, addr, send)
		if err == nil {
			idle = append(idle, c)
		}
	}
	servedWhilePeerKept(t, addr, peer, "a client's call on a port whose cap idle connections fill")
	if n := b.Stats().Reclaimed; n == 0 {
		t.Errorf("no connection counted as reclaimed")
	}
}

// servedWhilePeerKept checks that three new clients are each served on
// addr, and that peer's stream (which has answered 1) survives them.
func servedWhilePeerKept(t *testing.T, addr string, peer *rawPeer, what string) {
	t.Helper()
	for range 3 {
		conn := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		testwait.ForTimeout(t, 20*time.Second, what, func() bool {
			_, err := peerCheck(t, conn)
			return err == nil
		})
		conn.Close()
	}
	peer.send(2)
	if got := peer.answer(); got != 2 {
		t.Fatalf("peer answer after the reclaims: %d", got)
	}
}

// peerCheck makes one call on conn, within 2 seconds.
func peerCheck(t *testing.T, conn *grpc.ClientConn) (*pb.PeerCheckResponse, error) {
	ctx, cancel := context.WithTimeout(ctxT(t), 2*time.Second)
	defer cancel()
	return pb.NewPeerClient(conn).CheckBatch(ctx, &pb.PeerCheckRequest{})
}
