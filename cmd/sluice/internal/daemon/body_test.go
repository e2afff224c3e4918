package daemon

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testwait"
)

const legitCheck = `{"name":"api","key":"legit","limit":1000,"period":"1m","algorithm":"gcra"}`

// sendPartial opens a connection to d's HTTP API and sends a POST of
// /v1/check announcing a body of total bytes, and the first sent of them.
func sendPartial(t *testing.T, d *Daemon, total, sent int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", d.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", total)
	if _, err := c.Write(append([]byte(head), make([]byte, sent)...)); err != nil {
		t.Fatal(err)
	}
	return c
}

// readResponse reads the response on c, waiting at most 30s.
func readResponse(t *testing.T, c net.Conn) (int, string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	bufio.NewReader(resp.Body).WriteTo(&b)
	return resp.StatusCode, b.String()
}

// Unfinished bodies hold at most http_body_bytes beyond their first 4 KiB,
// taken as their bytes come (a buffer that doubles, never past the declared
// length): a declared length whose bytes do not come holds nothing; a body
// that finds no room is answered 503 naming the setting, while small
// checks go on being answered; a body whose client goes away gives its
// bytes back. A chunked body is answered 503 likewise.
func TestHTTPBodiesStayWithinTheBudget(t *testing.T) {
	cfg := testConfig("bodies")
	cfg.MaxBodyBytes = 64 << 10
	cfg.HTTPBodyBytes = 128 << 10
	cfg.HTTPBodyTimeout = time.Minute
	d := start(t, cfg)
	base := "http://" + d.HTTPAddr()
	const total, sent = 64 << 10, 60_000
	const held = total - freeBodyBytes // the buffer doubled to 64 KiB for 60,000 bytes
	// Declared lengths with no byte of their bodies: if they held any of
	// the budget, the counts below would not add up.
	for range 8 {
		sendPartial(t, d, total, 0)
	}
	var attackers []net.Conn
	for i, want := range []int64{held, 2 * held} {
		attackers = append(attackers, sendPartial(t, d, total, sent))
		testwait.For(t, fmt.Sprintf("attacker %d's body to be held", i), func() bool { return d.bodies.used.Load() == want })
		if r := do(t, http.MethodPost, base+"/v1/check", legitCheck); r.status != http.StatusOK {
			t.Fatalf("a check beside %d unfinished bodies: %d %s", i+1, r.status, r.body)
		}
	}
	third := sendPartial(t, d, total, sent)
	if status, body := readResponse(t, third); status != http.StatusServiceUnavailable || !strings.Contains(body, "http_body_bytes") {
		t.Fatalf("a body beyond the budget: %d %s, want 503 naming http_body_bytes", status, body)
	}
	if got := d.bodies.used.Load(); got != 2*held {
		t.Fatalf("%d bytes held after the refusal, want %d", got, 2*held)
	}
	if got := scrape(t, base)["sluice_http_body_bytes_reserved"]; got != 2*held {
		t.Errorf("sluice_http_body_bytes_reserved = %v, want %d", got, 2*held)
	}
	if r := do(t, http.MethodPost, base+"/v1/check", legitCheck); r.status != http.StatusOK {
		t.Fatalf("a check with the budget full: %d %s", r.status, r.body)
	}
	// Chunked: 8,192 bytes of room left, taken as the body grows.
	c, err := net.Dial("tcp", d.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	chunk := strings.Repeat(" ", 16<<10)
	fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nTransfer-Encoding: chunked\r\n\r\n")
	for range 3 {
		fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
	}
	if status, body := readResponse(t, c); status != http.StatusServiceUnavailable || !strings.Contains(body, "http_body_bytes") {
		t.Fatalf("a chunked body beyond the budget: %d %s, want 503", status, body)
	}
	if got := d.bodies.used.Load(); got != 2*held {
		t.Fatalf("%d bytes held after the chunked body's refusal, want %d", got, 2*held)
	}
	attackers[0].Close()
	testwait.For(t, "the bytes of a body whose client left to be given back", func() bool { return d.bodies.used.Load() == held })
}

// A body that does not arrive whole within http_body_timeout is answered
// 408 naming the setting, and its bytes are given back.
func TestHTTPBodyTimeout(t *testing.T) {
	cfg := testConfig("body-timeout")
	cfg.HTTPBodyTimeout = 50 * time.Millisecond
	d := start(t, cfg)
	c := sendPartial(t, d, 100_000, 20_000)
	if status, body := readResponse(t, c); status != http.StatusRequestTimeout || !strings.Contains(body, "http_body_timeout") {
		t.Fatalf("a stalled body: %d %s, want 408 naming http_body_timeout", status, body)
	}
	testwait.For(t, "the stalled body's bytes to be given back", func() bool { return d.bodies.used.Load() == 0 })
	if r := do(t, http.MethodPost, "http://"+d.HTTPAddr()+"/v1/check", legitCheck); r.status != http.StatusOK {
		t.Fatalf("a check after: %d %s", r.status, r.body)
	}
}

// http_max_connections bounds the connections open at once, and idle
// keep-alive connections cannot hold it: a connection beyond the cap takes
// the slot of the one idle longest, which is closed. With every connection
// busy, one beyond the cap waits until a slot frees.
func TestHTTPConnectionCap(t *testing.T) {
	cfg := testConfig("http-cap")
	cfg.HTTPMaxConnections = 3
	cfg.HTTPBodyTimeout = time.Minute
	d := start(t, cfg)
	get := "GET /healthz HTTP/1.1\r\nHost: sluice\r\n\r\n"
	dialGet := func() net.Conn {
		c, err := net.Dial("tcp", d.HTTPAddr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write([]byte(get)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	var idle []net.Conn
	for range cfg.HTTPMaxConnections {
		c := dialGet()
		if status, _ := readResponse(t, c); status != http.StatusOK {
			t.Fatalf("connection %d: %d", len(idle)+1, status)
		}
		idle = append(idle, c) // kept alive, idle
	}
	// Beyond the cap, with all three idle: served, and the first closed.
	if status, _ := readResponse(t, dialGet()); status != http.StatusOK {
		t.Fatalf("a connection beyond the cap, the others idle: %d", status)
	}
	idle[0].SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection idle longest is still open")
	}
	for _, c := range idle {
		c.Close()
	}

	// Three busy connections, each in the middle of a body.
	var busy []net.Conn
	for range cfg.HTTPMaxConnections {
		busy = append(busy, sendPartial(t, d, 64<<10, 1000))
	}
	testwait.For(t, "the three busy connections to hold every slot", func() bool {
		return len(d.httpConns.slots) == cfg.HTTPMaxConnections
	})
	extra := dialGet()
	// Not served while the others are busy: no answer comes in this
	// while, however long (a slow server only makes the check weaker).
	extra.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, err := extra.Read(make([]byte, 1)); n > 0 || err == nil {
		t.Fatal("a connection beyond http_max_connections was served while the others were busy")
	}
	busy[0].Close()
	if status, _ := readResponse(t, extra); status != http.StatusOK {
		t.Fatalf("the waiting connection, once a slot is free: %d", status)
	}
}
