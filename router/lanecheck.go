package router

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spillway-go/spillway"
)

// checkLaneSelectors reports, as joined [*spillway.FieldError] values,
// every handler or topic that a lane of budget.lanes selects but that no
// registered handler has: such a lane matches nothing, and its traffic
// would silently go to the last lane. topics maps each registered handler
// (retry handlers included) to the topic it consumes.
func checkLaneSelectors(c Config, topics map[string]string) error {
	handlerSet := make(map[string]bool, len(topics))
	topicSet := make(map[string]bool, len(topics))
	for h, t := range topics {
		handlerSet[h] = true
		topicSet[t] = true
	}
	var errs []error
	check := func(i int, lane, key, kind string, names []string, known map[string]bool) {
		for _, n := range names {
			if known[n] {
				continue
			}
			reason := fmt.Sprintf("lane %q selects %s %q, which no registered handler has, so the lane matches nothing "+
				"(registered %ss: %s)", lane, kind, n, kind, sortedNames(known))
			if near := nearest(n, known); near != "" {
				reason += "; did you mean " + strconv.Quote(near) + "?"
			}
			errs = append(errs, &spillway.FieldError{
				Field:  "budget.lanes[" + strconv.Itoa(i) + "]." + key,
				Value:  n,
				Reason: reason,
			})
		}
	}
	for i, l := range c.Budget.Lanes {
		check(i, l.Name, "handlers", "handler", l.Handlers, handlerSet)
		check(i, l.Name, "topics", "topic", l.Topics, topicSet)
	}
	return errors.Join(errs...)
}

// sortedNames renders the names of set sorted, or "none".
func sortedNames(set map[string]bool) string {
	if len(set) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(set)), ", ")
}
