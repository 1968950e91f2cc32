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

// TopicStats counts what a policy did to one sheddable topic.
type TopicStats struct {
	ShedPriority, StaleVersion, Superseded           uint64
	AuditFailed, MalformedPriority, MalformedVersion uint64
}

// Topics returns the counters of every sheddable topic, zero or not.
func Topics(p *Policy) map[string]TopicStats {
	m := make(map[string]TopicStats, len(p.topics))
	for name, tc := range p.topics {
		m[name] = TopicStats{
			ShedPriority:      tc.dropped[reasonPriority].Load(),
			StaleVersion:      tc.dropped[reasonStale].Load(),
			Superseded:        tc.dropped[reasonSuperseded].Load(),
			AuditFailed:       tc.auditFailed.Load(),
			MalformedPriority: tc.malformedPriority.Load(),
			MalformedVersion:  tc.malformedVersion.Load(),
		}
	}
	return m
}
