package dockertest

import "testing"

// TestCalendarZonesInTheImage: the image is the binary alone (FROM
// scratch), with no zone database on its file system, yet a calendar
// window in an IANA zone is decided there as anywhere: the binary carries
// its own. Two checks of a daily limit of 1 in each zone: the first
// admitted, the second denied.
func TestCalendarZonesInTheImage(t *testing.T) {
	c := startCluster(t, 1)
	nd := c.nodes[0]
	for _, zone := range []string{"Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"} {
		req := checkRequest{Name: "dockertest-zone", Key: zone, Limit: 1, Algorithm: "fixed_window", Calendar: "day", TimeZone: zone}
		for i, want := range []bool{true, false} {
			d, err := c.check(nd, req)
			if err != nil {
				t.Fatalf("%s, check %d: %v", zone, i, err)
			}
			if d.Allowed != want {
				t.Errorf("%s, check %d: allowed %v, want %v", zone, i, d.Allowed, want)
			}
		}
	}
}
