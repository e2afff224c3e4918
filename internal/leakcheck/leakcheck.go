// Package leakcheck fails a test binary that leaves a goroutine behind.
//
// goleak.VerifyTestMain gives goroutines about half a second to end.
// memberlist's probe goroutine outlives a closed node by up to a probe
// timeout, seconds on a loaded machine, so a package whose tests start
// nodes waits for it here as long as its tests wait for anything else.
package leakcheck

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testwait"
)

// Wait is how long Main waits for the goroutines left to end: as long as
// testcluster.DefaultWait.
const Wait = time.Minute

// Main runs m and, when every test passed, fails the run unless every
// goroutine a test started ends within Wait.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := testwait.Until(Wait, func() error { return goleak.Find(opts...) }); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines left after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
