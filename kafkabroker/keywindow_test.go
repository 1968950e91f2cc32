package kafkabroker

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// testRecord is a record of the window tests: a keyRecord and nothing else.
type testRecord struct{ keyRecord }

func (r *testRecord) record() *keyRecord { return &r.keyRecord }

// windowSim drives a keyWindow as a partition's loop does (keyed.go's
// keyPartition.run): after every event it admits what fits, hands over
// what its key allows, and decides on pausing. It logs what it hands over
// (the offset) and the pauses and resumes, for the script to check.
type windowSim struct {
	t    *testing.T
	w    *keyWindow[*testRecord]
	recs map[int64]*testRecord
	log  []string
}

// loop is one pass of the partition's loop after an event.
func (s *windowSim) loop() {
	admitted := false
	for {
		r, ok := s.w.admitNext()
		if !ok {
			break
		}
		admitted = true
		s.w.enter(r)
		if s.w.claimKey(r) {
			s.log = append(s.log, strconv.FormatInt(r.off, 10))
		}
	}
	if admitted {
		s.w.publishReadAhead()
	}
	if pause, changed := s.w.pauseChange(); changed {
		s.log = append(s.log, map[bool]string{true: "pause", false: "resume"}[pause])
	}
}

// run executes one step of a script:
//
//	read OFFS KEY SIZE  read records (OFFS: 7 or 3-9; KEY "-" is no key,
//	                    "*" a key of each record's own)
//	ack OFFS            the handler acked: the record is done
//	nack OFFS           the handler nacked: the record stays handed over,
//	                    to be sent again; nothing changes in the window
//	commit              the watermark was committed
//	want [LOG...]       what was handed over (offsets, or ranges 3-9),
//	                    paused or resumed since the last want
//	wm N                the watermark
//	fill N BYTES        records and bytes in the window (published)
//	ahead N             records read ahead (published)
//	span N              records entered and not known committed
func (s *windowSim) run(step string) {
	s.t.Helper()
	f := strings.Fields(step)
	num := func(i int) int64 {
		s.t.Helper()
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			s.t.Fatalf("step %q: %v", step, err)
		}
		return n
	}
	offs := func() []int64 {
		s.t.Helper()
		lo, hi, isRange := strings.Cut(f[1], "-")
		a, err := strconv.ParseInt(lo, 10, 64)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseInt(hi, 10, 64)
		}
		if err != nil {
			s.t.Fatalf("step %q: %v", step, err)
		}
		var out []int64
		for off := a; off <= b; off++ {
			out = append(out, off)
		}
		return out
	}
	switch f[0] {
	case "read":
		for _, off := range offs() {
			key := f[2]
			switch key {
			case "-":
				key = ""
			case "*":
				key = fmt.Sprint("k", off)
			}
			r := &testRecord{keyRecord{off: off, key: key, size: int(num(3))}}
			s.recs[off] = r
			s.w.read(r)
		}
		s.w.publishReadAhead()
		s.loop()
	case "ack":
		for _, off := range offs() {
			r := s.recs[off]
			if r == nil || r.done {
				s.t.Fatalf("step %q: offset %d is not in flight", step, off)
			}
			s.w.finish(r)
			if next, ok := s.w.nextOfKey(r.key); ok {
				s.log = append(s.log, strconv.FormatInt(next.off, 10))
			}
			s.loop()
		}
	case "nack":
		for _, off := range offs() {
			if r := s.recs[off]; r == nil || r.done {
				s.t.Fatalf("step %q: offset %d is not in flight", step, off)
			}
		}
		s.loop()
	case "commit":
		s.w.commit(s.w.watermark())
		s.loop()
	case "want":
		var want []string
		for _, w := range f[1:] {
			lo, hi, isRange := strings.Cut(w, "-")
			if !isRange {
				want = append(want, w)
				continue
			}
			a, errA := strconv.Atoi(lo)
			b, errB := strconv.Atoi(hi)
			if errA != nil || errB != nil {
				s.t.Fatalf("step %q: bad range %q", step, w)
			}
			for off := a; off <= b; off++ {
				want = append(want, strconv.Itoa(off))
			}
		}
		if got, want := strings.Join(s.log, " "), strings.Join(want, " "); got != want {
			s.t.Errorf("%q: got %q", step, got)
		}
		s.log = s.log[:0]
	case "wm":
		if got := s.w.watermark(); got != num(1) {
			s.t.Errorf("watermark %d, want %d", got, num(1))
		}
	case "fill":
		if r, b := s.w.inWindow(); r != num(1) || b != num(2) {
			s.t.Errorf("window holds %d records, %d bytes; want %d, %d", r, b, num(1), num(2))
		}
	case "ahead":
		if r, _ := s.w.readAheadFill(); r != num(1) {
			s.t.Errorf("read-ahead holds %d records, want %d", r, num(1))
		}
	case "span":
		if got := s.w.span(); got != int(num(1)) {
			s.t.Errorf("span %d, want %d", got, num(1))
		}
	default:
		s.t.Fatalf("unknown step %q", step)
	}
}

func TestKeyWindow(t *testing.T) {
	for _, tc := range []struct {
		name       string
		msgs, size int
		steps      []string
	}{
		{
			name: "one record at a time per key, in offset order; keys run concurrently",
			msgs: 10, size: 1000,
			steps: []string{
				"read 0 a 1", "read 1 a 1", "read 2 b 1", "read 3 a 1", "read 4 b 1",
				"want 0 2", "fill 5 5",
				"ack 2", "want 4",
				"ack 0", "want 1",
				"ack 1", "want 3",
				"ack 3", "ack 4", "want", "wm 5", "fill 0 0",
			},
		},
		{
			name: "records without a key share one order",
			msgs: 10, size: 1000,
			steps: []string{
				"read 0 - 1", "read 1 - 1", "read 2 x 1",
				"want 0 2",
				"ack 0", "want 1",
			},
		},
		{
			name: "the watermark stops at the first record not done",
			msgs: 10, size: 1000,
			steps: []string{
				"read 0-3 * 1", "want 0 1 2 3", "wm 0",
				"ack 1-3", "wm 0", "fill 1 1",
				"ack 0", "wm 4", "fill 0 0",
			},
		},
		{
			name: "a nacked record holds the watermark and its key until it is acked",
			msgs: 10, size: 1000,
			steps: []string{
				"read 0 a 1", "read 1 a 1", "read 2 b 1", "want 0 2",
				"nack 0", "ack 2", "want", "wm 0",
				"nack 0", "want", "wm 0", "fill 2 2",
				// Sent again and acked this time.
				"ack 0", "want 1", "wm 1",
				"ack 1", "wm 3",
			},
		},
		{
			name: "the window is bounded in records",
			msgs: 2, size: 1000,
			steps: []string{
				"read 0-4 * 1", "want 0 1", "fill 2 2", "ahead 3",
				"ack 1", "want 2", "ahead 2",
				"ack 0", "want 3", "wm 2",
			},
		},
		{
			name: "the window is bounded in bytes",
			msgs: 10, size: 100,
			steps: []string{
				"read 0 a 60", "read 1 b 40", "read 2 c 1", "want 0 1", "fill 2 100",
				"ack 1", "want 2", "fill 2 61",
			},
		},
		{
			name: "a record larger than the window is admitted alone",
			msgs: 10, size: 100,
			steps: []string{
				// 500 bytes waiting fill the read-ahead as well.
				"read 0 a 10", "read 1 b 500", "read 2 c 10", "want 0 pause",
				"ack 0", "want 1 resume", "fill 1 500",
				"ack 1", "want 2", "fill 1 10",
			},
		},
		{
			name: "done records behind a slow one fill the span until it commits",
			msgs: 2, size: 1000, // span 16
			steps: []string{
				"read 0 slow 1", "read 1-30 * 1", "want 0 1",
				"ack 1-14",
				"want 2-15", "span 16",
				// The window has room, the span does not.
				"ack 15", "want", "fill 1 1", "wm 0",
				"ack 0", "wm 16", "want", "span 16",
				"commit", "want 16 17", "span 2",
			},
		},
		{
			name: "committed records leave the span; done ones beyond the watermark stay",
			msgs: 100, size: 100000,
			steps: []string{
				"read 0-199 * 1", "want 0-99",
				"ack 0-99", "want 100-199", "commit", "span 100",
				"ack 101-199", "commit", "span 100", "wm 100",
				"ack 100", "wm 200", "commit", "span 0",
				"read 200-201 * 1", "want 200 201", "wm 200",
				"ack 200-201", "wm 202",
			},
		},
		{
			name: "reading pauses at a full read-ahead and resumes at half (records)",
			msgs: 1, size: 1 << 20, // read-ahead: 32 records; span: 8
			steps: []string{
				"read 0 a 1", "want 0",
				"read 1-31 a 1", "want", "ahead 31",
				"read 32 a 1", "want pause", "ahead 32",
				// Down to 16 it stays paused; below it resumes.
				"ack 0-7", "commit", "ack 8-15", "commit", "ahead 16", "want 1-16",
				"ack 16", "ahead 15", "want 17 resume",
				"read 33-48 a 1", "want", "ahead 31",
				"read 49 a 1", "want pause",
			},
		},
		{
			name: "reading pauses at a full read-ahead and resumes at half (bytes)",
			msgs: 1, size: 1000,
			steps: []string{
				"read 0 a 10", "want 0",
				"read 1 a 600", "want",
				"read 2 a 400", "want pause",
				"ack 0", "want 1 resume", "fill 1 600",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &windowSim{t: t, w: newKeyWindow[*testRecord](tc.msgs, tc.size, 0), recs: map[int64]*testRecord{}}
			for _, step := range tc.steps {
				s.run(step)
			}
		})
	}
}

// A window that starts at a committed offset marks it until a record is
// done, and records after a gap in the offsets (compaction, transaction
// markers) move the watermark past the gap.
func TestKeyWindowWatermarkFromFirstOffset(t *testing.T) {
	s := &windowSim{t: t, w: newKeyWindow[*testRecord](10, 1000, 40), recs: map[int64]*testRecord{}}
	for _, step := range []string{
		"wm 40",
		"read 42 a 1", "read 45 b 1", "want 42 45", "wm 42",
		"ack 45", "wm 42",
		"ack 42", "wm 46",
	} {
		s.run(step)
	}
}

// The records listed in the commit metadata are exactly those done beyond
// the watermark.
func TestKeyWindowDoneBeyond(t *testing.T) {
	s := &windowSim{t: t, w: newKeyWindow[*testRecord](10, 1000, 0), recs: map[int64]*testRecord{}}
	for _, step := range []string{"read 0-5 * 1", "ack 0", "ack 2", "ack 5", "wm 1"} {
		s.run(step)
	}
	if got := fmt.Sprint(s.w.doneBeyond()); got != "[2 5]" {
		t.Errorf("done beyond the watermark: %s, want [2 5]", got)
	}
}

// Stopping drops the read-ahead: nothing more is admitted, and the
// published fill says so.
func TestKeyWindowDropReadAhead(t *testing.T) {
	s := &windowSim{t: t, w: newKeyWindow[*testRecord](1, 1000, 0), recs: map[int64]*testRecord{}}
	s.run("read 0-9 a 1")
	s.run("ahead 9")
	s.w.dropReadAhead()
	s.run("ahead 0")
	if _, ok := s.w.admitNext(); ok {
		t.Fatal("a record was admitted after the read-ahead was dropped")
	}
	s.run("ack 0")
	s.run("want 0")
	s.run("wm 1")
}
