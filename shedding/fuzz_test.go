package shedding

import (
	"math/big"
	"regexp"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

var (
	signedDigits   = regexp.MustCompile(`^[+-]?[0-9]+$`)
	unsignedDigits = regexp.MustCompile(`^[0-9]+$`)
	minInt64       = big.NewInt(-1 << 63)
	maxInt64       = big.NewInt(1<<63 - 1)
	maxUint64      = new(big.Int).SetUint64(1<<64 - 1)
)

// refPriority is an independent statement of the priority grammar.
func refPriority(s string) (*big.Int, field) {
	if s == "" {
		return nil, fieldMissing
	}
	if !signedDigits.MatchString(s) {
		return nil, fieldMalformed
	}
	n, _ := new(big.Int).SetString(s, 10)
	if n.Cmp(minInt64) < 0 || n.Cmp(maxInt64) > 0 {
		return nil, fieldMalformed
	}
	return n, fieldOK
}

func refVersion(s string) (*big.Int, field) {
	if s == "" {
		return nil, fieldMissing
	}
	if !unsignedDigits.MatchString(s) {
		return nil, fieldMalformed
	}
	n, _ := new(big.Int).SetString(s, 10)
	if n.Cmp(maxUint64) > 0 {
		return nil, fieldMalformed
	}
	return n, fieldOK
}

type fixedPressure time.Duration

func (p fixedPressure) SaturatedFor() time.Duration { return time.Duration(p) }

// FuzzMetadata checks the priority and version grammars against an
// independent statement of them, and that a message with arbitrary
// metadata leaves the policy exactly once: handled, or dropped for the
// reason its metadata implies.
func FuzzMetadata(f *testing.F) {
	for _, seed := range [][3]string{
		{"0", "1", "bus"}, {"2", "18446744073709551615", "bus"}, {"-9223372036854775808", "18446744073709551616", ""},
		{"+1", "+1", "x"}, {" 1", "1 ", "x"}, {"1_000", "0x10", "x"}, {"", "", ""}, {"9223372036854775808", "007", "y"},
		{"१", "٣", "z"}, {"1e3", "-0", "z"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, priority, version, entity string) {
		n, pf := parsePriority(priority)
		rn, rf := refPriority(priority)
		if pf != rf || (pf == fieldOK && rn.Int64() != n) {
			t.Fatalf("priority %q: got %d/%d, reference %v/%d", priority, n, pf, rn, rf)
		}
		v, vf := parseVersion(version)
		rv, rvf := refVersion(version)
		if vf != rvf || (vf == fieldOK && rv.Uint64() != v) {
			t.Fatalf("version %q: got %d/%d, reference %v/%d", version, v, vf, rv, rvf)
		}

		pol, err := New(Config{
			Topics:       []string{"t"},
			VersionGuard: VersionGuardConfig{Enabled: true, MaxEntities: 4},
			Coalesce:     CoalesceConfig{Enabled: true},
		}, WithPressure(fixedPressure(time.Hour)), WithTopicFunc(func(*message.Message) string { return "t" }))
		if err != nil {
			t.Fatal(err)
		}
		ran := 0
		run := wrap(pol, func(h message.HandlerFunc) message.HandlerFunc { return h })(
			func(*message.Message) ([]*message.Message, error) { ran++; return nil, nil })
		for i := 0; i < 2; i++ { // the second delivery may be stale
			m := message.NewMessage("m", nil)
			m.Metadata.Set("region_priority", priority)
			m.Metadata.Set("entity_id", entity)
			m.Metadata.Set("entity_version", version)
			if _, err := run(m); err != nil {
				t.Fatal(err)
			}
			m.Ack()
		}
		st := Topics(pol)["t"]
		if dropped := st.ShedPriority + st.StaleVersion + st.Superseded; uint64(ran)+dropped != 2 {
			t.Fatalf("2 in, %d handled + %d dropped out", ran, dropped)
		}
		low := pf != fieldOK || n < defaultShedBelow
		switch {
		case low && st.ShedPriority != 2:
			t.Fatalf("priority %q: shed %d of 2", priority, st.ShedPriority)
		case !low && entity != "" && vf == fieldOK && (ran != 1 || st.StaleVersion != 1):
			t.Fatalf("version %q: handled %d, stale %d", version, ran, st.StaleVersion)
		case !low && (entity == "" || vf != fieldOK) && ran != 2:
			t.Fatalf("unguarded message: handled %d of 2", ran)
		}
		if wantBad := pf == fieldMalformed; (st.MalformedPriority == 2) != wantBad {
			t.Fatalf("MalformedPriority %d for %q", st.MalformedPriority, priority)
		}
		if InFlight(pol) != 0 {
			t.Fatal("registration leaked")
		}
	})
}

// wrap runs p's stage before admission, then admission, then its stage
// after admission.
func wrap(p *Policy, admission message.HandlerMiddleware) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return p.Middleware(admission(p.Admitted(h)))
	}
}
