package ring_test

import (
	"fmt"

	"github.com/sluicehq/sluice/ring"
)

func Example() {
	r, err := ring.New(ring.DefaultConfig())
	if err != nil {
		panic(err)
	}
	// Every node builds its ring from the same member list, in any order.
	err = r.SetMembers([]ring.Member{
		{Name: "node-c", Addr: "10.0.0.3:7000"},
		{Name: "node-a", Addr: "10.0.0.1:7000"},
		{Name: "node-b", Addr: "10.0.0.2:7000"},
	})
	if err != nil {
		panic(err)
	}

	owner, ok := r.Owner("api-requests", "user-42")
	fmt.Println(ok, owner.Name, owner.Addr)

	// The owner first, then who takes over if it goes away.
	for _, m := range r.Owners("api-requests", "user-42", 2) {
		fmt.Println(m.Name)
	}
	fmt.Println(r.Len(), r.Version())
	// Output:
	// true node-a 10.0.0.1:7000
	// node-a
	// node-c
	// 3 1
}
