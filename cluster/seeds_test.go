package cluster

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
)

// fakeDNS answers LookupIPAddr from a table: a name missing from it is
// not found.
type fakeDNS map[string][]string

func (f fakeDNS) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	ips, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]net.IPAddr, len(ips))
	for i, s := range ips {
		out[i] = net.IPAddr{IP: net.ParseIP(s)}
	}
	return out, nil
}

func TestResolveSeeds(t *testing.T) {
	self := netip.MustParseAddrPort("10.0.0.1:7946")
	dns := fakeDNS{
		"peers.svc":   {"10.0.0.1", "10.0.0.2", "10.0.0.3"},
		"dual.svc":    {"10.0.0.4", "fd00::4"},
		"only-me.svc": {"10.0.0.1"},
		"mapped.svc":  {"::ffff:10.0.0.1", "::ffff:10.0.0.5"},
		"empty.svc":   {},
	}
	for _, tc := range []struct {
		name    string
		seeds   []string
		want    []string
		wantErr bool
	}{
		{"address stands for itself", []string{"10.0.0.9:7946"}, []string{"10.0.0.9:7946"}, false},
		{"name is every address but self", []string{"peers.svc:7946"}, []string{"10.0.0.2:7946", "10.0.0.3:7946"}, false},
		{"IPv4 and IPv6", []string{"dual.svc:7000"}, []string{"10.0.0.4:7000", "[fd00::4]:7000"}, false},
		{"self on another port is another node", []string{"only-me.svc:7000"}, []string{"10.0.0.1:7000"}, false},
		{"only self", []string{"only-me.svc:7946"}, nil, false},
		{"self as an address", []string{"10.0.0.1:7946", "10.0.0.2:7946"}, []string{"10.0.0.2:7946"}, false},
		{"IPv4-mapped self", []string{"mapped.svc:7946"}, []string{"10.0.0.5:7946"}, false},
		{"repeats once", []string{"peers.svc:7946", "10.0.0.2:7946", "peers.svc:7946"}, []string{"10.0.0.2:7946", "10.0.0.3:7946"}, false},
		{"unknown name", []string{"nowhere.svc:7946"}, nil, true},
		{"no addresses", []string{"empty.svc:7946"}, nil, true},
		{"unknown name beside a good one", []string{"nowhere.svc:7946", "dual.svc:7946"}, []string{"10.0.0.4:7946", "[fd00::4]:7946"}, true},
		{"memberlist's name/addr form passes", []string{"n2/10.0.0.2:7946"}, []string{"n2/10.0.0.2:7946"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveSeeds(context.Background(), dns, tc.seeds, self)
			if !slices.Equal(got, tc.want) {
				t.Errorf("addresses %q, want %q", got, tc.want)
			}
			if (err != nil) != tc.wantErr {
				t.Errorf("error %v, want one: %v", err, tc.wantErr)
			}
			var dnsErr *net.DNSError
			if err != nil && !errors.As(err, &dnsErr) && tc.name != "no addresses" {
				t.Errorf("error %v does not wrap the resolver's", err)
			}
		})
	}
}
