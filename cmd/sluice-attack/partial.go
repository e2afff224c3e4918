package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sluicehq/sluice/internal/transport"
)

// Sizes of the unfinished messages and bodies.
const (
	partialStreams = 256       // calls per connection: the daemon's MaxConcurrentStreams
	partialMessage = 1_000_000 // bytes sent of a message that announces transport.MaxMessageSize
	partialBody    = 1_000_000 // bytes sent of a body of partialBodyOf
	partialBodyOf  = 1_048_000
)

// grpcPartial: each attacker opens a connection to the gRPC port and on it
// 256 CheckBatch calls, each sending 1,000,000 bytes of a message that
// announces transport.MaxMessageSize and nothing more, and holds them for
// the hostile phase.
func grpcPartial(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "grpc-partial-message", nil, overGRPC, func(t *target, r *row) error {
		streams := c.count(partialStreams)
		end := c.hostile()
		var sent, resets, dialed atomic.Int64
		var dialErrs tally
		swarm(c.attackers, func(int) {
			nc, err := net.DialTimeout("tcp", t.d.grpcAddr, 5*time.Second)
			if err != nil {
				dialErrs.add(dialError(err), 1)
				return
			}
			dialed.Add(1)
			var readers sync.WaitGroup
			readers.Go(func() { resets.Add(countResets(nc)) })
			nc.SetWriteDeadline(end)
			sent.Add(sendPartialCalls(nc, streams))
			if wait := time.Until(end); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
				}
			}
			nc.Close()
			readers.Wait()
		})
		r.did = fmt.Sprintf("%d attackers each open a connection to the gRPC port and on it %d CheckBatch calls, each sending %s bytes of a message that announces %s and nothing more, held for %v",
			c.attackers, streams, thousands(partialMessage), thousands(transport.MaxMessageSize), c.duration)
		r.result = fmt.Sprintf("%d connections, %s MB sent; %s calls reset or refused", dialed.Load(),
			thousands(sent.Load()/megabyte), thousands(resets.Load()))
		if n := dialErrs.sum(); n > 0 {
			r.result += fmt.Sprintf("; %d dials failed (%s)", n, dialErrs.String())
		}
		return nil
	})
}

// sendPartialCalls writes the HTTP/2 preface and the unfinished calls on
// nc, and returns the bytes written before a write failed.
func sendPartialCalls(nc net.Conn, streams int) int64 {
	cw := &countingWriter{w: nc}
	fr := http2.NewFramer(cw, nil)
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":path", Value: "/sluice.v1.Peer/CheckBatch"},
		{Name: ":authority", Value: "sluice"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
	} {
		enc.WriteField(f)
	}
	body := binary.BigEndian.AppendUint32([]byte{0}, uint32(transport.MaxMessageSize))
	body = append(body, make([]byte, partialMessage)...)
	if _, err := cw.Write([]byte(http2.ClientPreface)); err != nil || fr.WriteSettings() != nil {
		return cw.n
	}
	for i := range streams {
		id := uint32(2*i + 1)
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true}) != nil {
			return cw.n
		}
		for rest := body; len(rest) > 0; {
			chunk := rest[:min(len(rest), 16384)] // the default SETTINGS_MAX_FRAME_SIZE
			rest = rest[len(chunk):]
			if fr.WriteData(id, false, chunk) != nil {
				return cw.n
			}
		}
	}
	return cw.n
}

// countResets reads frames from nc until it closes, and returns how many
// streams the daemon ended: with RST_STREAM, or trailers ending the
// stream, or both.
func countResets(nc net.Conn) int64 {
	fr := http2.NewFramer(io.Discard, nc)
	ended := make(map[uint32]bool)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return int64(len(ended))
		}
		switch f := f.(type) {
		case *http2.RSTStreamFrame:
			ended[f.StreamID] = true
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				ended[f.StreamID] = true
			}
		}
	}
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// httpPartial: connections to the HTTP port, each posting 1,000,000 bytes
// of a 1,048,000-byte body to /v1/check and nothing more, held for the
// hostile phase.
func httpPartial(ctx context.Context, c *config) (*row, error) {
	return onDaemon(ctx, c, "http-partial-body", nil, overHTTP, func(t *target, r *row) error {
		total := c.count(500)
		head := fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", partialBodyOf)
		opening := append([]byte(head), bytes.Repeat([]byte{' '}, partialBody)...)
		h := holdConns(ctx, c, t.d.httpAddr, total, opening, nil, 0)
		r.did = fmt.Sprintf("%d attackers open %s HTTP connections, each posting %s bytes of a %s-byte body to /v1/check and nothing more, held for %v",
			c.attackers, thousands(int64(total)), thousands(partialBody), thousands(partialBodyOf), c.duration)
		r.result = h.String()
		return nil
	})
}
