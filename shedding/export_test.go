package shedding

// InFlight returns how many entities have a message registered for
// coalescing (waiting for budget or being handled), for the external
// tests.
func InFlight(p *Policy) int {
	if p.coal == nil {
		return 0
	}
	return p.coal.len()
}
