package autoscale

import (
	"math"
	"time"
)

// Limits bound a controller's answer: at least Min and at most Max
// processes.
type Limits struct {
	Min, Max int
}

func (l Limits) clamp(n int) int { return max(l.Min, min(l.Max, n)) }

// LagDesired is KEDA's answer for a backlog counted in messages (its
// Kafka scaler's lagThreshold, its Redis Streams scaler's lagCount):
// ceil(lag / threshold) processes, within l.
func LagDesired(lag, threshold int64, l Limits) int {
	if lag <= 0 || threshold <= 0 {
		return l.Min
	}
	return l.clamp(int((lag + threshold - 1) / threshold))
}

// DrainSignal is what docs/scaling.md's query returns: the seconds one
// process needs for the whole backlog, from the workers' metrics.
type DrainSignal struct {
	// Backlog is the sum over partitions (streams) of the largest
	// spillway_backlog_vertices any worker reports for it.
	Backlog float64
	// Rate is the average of the workers' spillway_drain_rate_per_second;
	// Rates is how many series it averages.
	Rate  float64
	Rates int
}

// Seconds is the signal's value and whether it has one: none while a
// backlog waits and no worker has measured a rate (the query divides by
// zero), 0 when there is no backlog.
func (s DrainSignal) Seconds() (float64, bool) {
	if s.Backlog <= 0 {
		return 0, true
	}
	if s.Rates == 0 || s.Rate <= 0 {
		return 0, false
	}
	return s.Backlog / s.Rate, true
}

// DrainDesired is an HPA's answer to the drain-time signal with an
// AverageValue target: ceil(seconds / target) processes within l; the
// current size when the signal has no value.
func DrainDesired(s DrainSignal, target time.Duration, current int, l Limits) int {
	secs, ok := s.Seconds()
	if !ok {
		return l.clamp(current)
	}
	return l.clamp(int(math.Ceil(secs / target.Seconds())))
}

// Stabilizer applies an HPA's behavior.scaleDown stabilization window to
// a controller's answers: scaling out follows an answer at once, scaling
// in goes only as low as the highest answer of the last Window.
type Stabilizer struct {
	Window time.Duration

	history []recommendation
}

type recommendation struct {
	at time.Time
	n  int
}

// Next records desired, the controller's answer at now, and returns the
// size to scale to from current.
func (s *Stabilizer) Next(now time.Time, desired, current int) int {
	s.history = append(s.history, recommendation{now, desired})
	keep := s.history[:0]
	highest := desired
	for _, r := range s.history {
		if now.Sub(r.at) > s.Window {
			continue
		}
		keep = append(keep, r)
		highest = max(highest, r.n)
	}
	s.history = keep
	switch {
	case desired >= current:
		return desired
	case highest < current:
		return highest
	default:
		return current
	}
}
