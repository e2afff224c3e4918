package transport

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/testpki"
	"github.com/sluicehq/sluice/internal/testwait"
	pb "github.com/sluicehq/sluice/transport/sluicev1"
)

// A caller that holds no credential cannot take the Peer service's message
// budget from the members: HEADERS frames of Peer calls, on 40 connections
// of 256 calls with no message byte, are refused as they open, before they
// reserve anything (AuthorizePeers), and a member's call is served.
func TestPeerBudgetKeepsOutCallersWithoutCredentials(t *testing.T) {
	key, err := PeerKey([]byte("correct horse battery staple"))
	if err != nil {
		t.Fatal(err)
	}
	l := DefaultServerLimits()
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	timers := new(fakeTimers) // MessageTimeout never comes during the test
	timers.install(b)
	auth := &PeerAuth{Keys: [][]byte{key}}
	b.AuthorizePeers(auth)
	addr := serveBudget(t, b, func(s *grpc.Server) {
		RegisterPeer(s, &echoChecker{owner: "owner"}, WithPeerAuth(auth), WithProver("owner"))
	})
	member := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(PeerCredentials(key, time.Now)))
	checkWorks(t, member)

	// Headers only: no DATA frame, not a byte of any message.
	headersOnly := func(n int) net.Conn {
		buf := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
		for i := range n {
			buf = appendFrame(buf, frameHeaders, flagEndHeaders, uint32(2*i+1), grpcHeaders("/sluice.v1.Peer/CheckBatch"))
		}
		return dialRaw(t, addr, buf)
	}
	sent := 0
	conns := 0
	for conns < 40 {
		headersOnly(int(l.MaxConcurrentStreams))
		conns++
		testwait.For(t, "the connection's calls to be refused", func() bool {
			s := b.Stats()
			return s.Refused == int64(conns)*int64(l.MaxConcurrentStreams) && s.Reserved == 0
		})
		sent += int(l.MaxConcurrentStreams)
	}
	s := b.Stats()
	t.Logf("%d connections, %d HEADERS frames, no message bytes: %d of %d budget bytes reserved, %d calls refused", conns, sent, s.Reserved, l.MessageBytes, s.Refused)
	_, err = pb.NewPeerClient(member).CheckBatch(ctxT(t), &pb.PeerCheckRequest{})
	if err != nil {
		t.Errorf("a member's authenticated call, after %d unauthenticated connections that sent only headers: %v (%v)", conns, status.Code(err), err)
	}
}

// The same under mutual TLS with peer identities: an API client's
// certificate from the cluster's CA passes the handshake of the peer port,
// and its calls are refused before they reserve anything.
func TestPeerBudgetKeepsOutAPIClientCertificates(t *testing.T) {
	const id = "spiffe://sluice.test/peer"
	ca := testpki.NewCA(t, "cluster")
	server := ca.Config(ca.IssueWith(t, "node-a", id))
	server.ClientAuth = tls.RequireAndVerifyClientCert
	l := DefaultServerLimits()
	b, err := NewMessageBudget(l)
	if err != nil {
		t.Fatal(err)
	}
	timers := new(fakeTimers)
	timers.install(b)
	auth := &PeerAuth{Identities: []string{id}}
	b.AuthorizePeers(auth)
	addr := serveBudget(t, b, func(s *grpc.Server) {
		RegisterPeer(s, &echoChecker{owner: "owner"}, WithPeerAuth(auth), WithProver("node-a"))
	}, grpc.Creds(credentials.NewTLS(server)))
	member := dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.IssueWith(t, "node-b", id)}, RootCAs: ca.Pool})))
	checkWorks(t, member)

	apiCert := ca.Issue(t, "api-client") // no peer identity
	conns := 0
	for conns < 40 {
		c, err := tls.Dial("tcp", addr, &tls.Config{Certificates: []tls.Certificate{apiCert}, RootCAs: ca.Pool, NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		buf := appendFrame([]byte(clientPreface), frameSettings, 0, 0, nil)
		for i := range int(l.MaxConcurrentStreams) {
			buf = appendFrame(buf, frameHeaders, flagEndHeaders, uint32(2*i+1), grpcHeaders("/sluice.v1.Peer/CheckBatch"))
		}
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		go io.Copy(io.Discard, c)
		conns++
		testwait.For(t, "the connection's calls to be refused", func() bool {
			s := b.Stats()
			return s.Refused == int64(conns)*int64(l.MaxConcurrentStreams) && s.Reserved == 0
		})
	}
	s := b.Stats()
	t.Logf("%d TLS connections with an API client's certificate, headers only: %d of %d budget bytes reserved", conns, s.Reserved, l.MessageBytes)
	if _, err := pb.NewPeerClient(member).CheckBatch(ctxT(t), &pb.PeerCheckRequest{}); err != nil {
		t.Errorf("a node's call with its peer certificate, after %d connections of an API client's certificate that sent only headers: %v", conns, err)
	}
}
