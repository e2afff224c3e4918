package ring

import (
	"fmt"
	"testing"
)

func benchRing(b *testing.B, members int) *Ring {
	b.Helper()
	r := mustNew(b, DefaultConfig())
	mustSet(b, r, testMembers("node-", members))
	return r
}

func BenchmarkRouteHash(b *testing.B) {
	keys := testKeys(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		RouteHash("api-requests", keys[i&1023])
		i++
	}
}

func BenchmarkOwner(b *testing.B) {
	r := benchRing(b, 5)
	keys := testKeys(1024)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Owner("api-requests", keys[i&1023])
		i++
	}
}

func BenchmarkOwnerParallel(b *testing.B) {
	r := benchRing(b, 5)
	keys := testKeys(1024)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r.Owner("api-requests", keys[i&1023])
			i++
		}
	})
}

func BenchmarkOwners(b *testing.B) {
	for _, members := range []int{5, 50} {
		b.Run(fmt.Sprintf("members=%d/n=3", members), func(b *testing.B) {
			r := benchRing(b, members)
			keys := testKeys(1024)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				r.Owners("api-requests", keys[i&1023], 3)
				i++
			}
		})
	}
}

func BenchmarkSetMembers(b *testing.B) {
	for _, members := range []int{5, 50} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			r := mustNew(b, DefaultConfig())
			ms := testMembers("node-", members)
			b.ReportAllocs()
			for b.Loop() {
				if err := r.SetMembers(ms); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
