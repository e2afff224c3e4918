package cluster

import (
	"flag"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/internal/leakcheck"
)

// waitingTests is how many parallel tests (those marked waitBound) run at
// once unless -test.parallel says otherwise. The cluster tests spend most
// of their time waiting on gossip, lease lifetimes, reaps and hand-offs,
// not on the CPU: run one at a time, the package keeps less than one core
// busy.
const waitingTests = 4

// TestMain runs up to waitingTests parallel tests at once and fails the
// run when a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", strconv.Itoa(waitingTests)); err != nil {
			panic(err)
		}
	}
	leakcheck.Main(m)
}
