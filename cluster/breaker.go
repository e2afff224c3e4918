package cluster

import (
	"sync"

	"github.com/sluicehq/sluice/internal/breaker"
)

// breakers holds one breaker per peer name.
type breakers struct {
	m sync.Map // peer name -> *breaker.Breaker
}

func (bs *breakers) get(peer string) *breaker.Breaker {
	if b, ok := bs.m.Load(peer); ok {
		return b.(*breaker.Breaker)
	}
	b, _ := bs.m.LoadOrStore(peer, new(breaker.Breaker))
	return b.(*breaker.Breaker)
}

// forget drops the breakers of peers no longer in the cluster.
func (bs *breakers) forget(keep map[string]string) {
	bs.m.Range(func(k, _ any) bool {
		if _, ok := keep[k.(string)]; !ok {
			bs.m.Delete(k)
		}
		return true
	})
}
