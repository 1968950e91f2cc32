package shedding

import "testing"

func TestReasonStrings(t *testing.T) {
	if reason(0).String() != "reason(0)" || reasonPriority.String() != "shed_priority" ||
		reasonStale.String() != "stale_version" || reasonSuperseded.String() != "superseded" {
		t.Error("reason strings")
	}
}
