package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// loopback measures the floor under the cluster's latencies on this
// machine: plain Go round trips on loopback TCP, with no gRPC and no
// sluice. links connections each carry one message of size bytes to an echo
// goroutine and back, over and over, for d or at most maxTrips times each;
// the sluice cluster of the standard workload has as many links
// (nodes × (nodes-1)) carrying its batches. It returns the round trips'
// latencies.
func loopback(links, size int, d time.Duration, maxTrips int) (result, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return result{}, err
	}
	var echoes sync.WaitGroup
	echoes.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			echoes.Go(func() {
				defer c.Close()
				buf := make([]byte, size)
				for {
					if _, err := io.ReadFull(c, buf); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			})
		}
	})
	conns := make([]net.Conn, 0, links)
	defer func() { // the echoes end once their connections and the listener are closed
		for _, c := range conns {
			c.Close()
		}
		ln.Close()
		echoes.Wait()
	}()
	for range links {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return result{}, err
		}
		conns = append(conns, c)
	}
	lats := make([]histogram, links)
	errs := make([]error, links)
	stop := time.Now().Add(d)
	r := measure(func() {
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Go(func() {
				buf := make([]byte, size)
				for n := 0; n < maxTrips; n++ {
					t0 := time.Now()
					if n%64 == 0 && t0.After(stop) {
						return
					}
					if _, err := c.Write(buf); err != nil {
						errs[i] = err
						return
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						errs[i] = err
						return
					}
					lats[i].record(time.Since(t0))
				}
			})
		}
		wg.Wait()
	})
	for i := range lats {
		r.lat.merge(&lats[i])
	}
	r.checks = r.lat.n
	if err := errors.Join(errs...); err != nil {
		return r, fmt.Errorf("loopback round trips: %w", err)
	}
	return r, nil
}
