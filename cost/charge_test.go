package cost_test

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/spillway-go/spillway/cost"
)

func TestParseCount(t *testing.T) {
	tests := []struct {
		value      string
		payloadLen int
		want       int64
		src        cost.Source
	}{
		{"", 10, 0, cost.SourceMissing},
		{"", 0, 0, cost.SourceMissing},
		{"12", 10, 12, cost.SourceHeader},
		{"1", 1, 1, cost.SourceHeader},
		{"+12", 10, 12, cost.SourceHeader}, // a leading '+' is accepted
		{"007", 10, 7, cost.SourceHeader},
		{"00000000000000000000000001", 10, 1, cost.SourceHeader}, // leading zeros do not overflow
		{"0", 0, 0, cost.SourceHeader},                           // nothing to count
		{"+0", 0, 0, cost.SourceHeader},
		{"000", 0, 0, cost.SourceHeader},
		{"0", 10, 0, cost.SourceMalformed}, // zero for a non-empty payload
		{"00", 1, 0, cost.SourceMalformed},
		{"9223372036854775807", 10, math.MaxInt64, cost.SourceHeader},
		{"+9223372036854775807", 10, math.MaxInt64, cost.SourceHeader},
		{"09223372036854775807", 10, math.MaxInt64, cost.SourceHeader},
		{"9223372036854775808", 10, 0, cost.SourceMalformed},
		{"18446744073709551616", 10, 0, cost.SourceMalformed},
		{"99999999999999999999", 10, 0, cost.SourceMalformed},
		{strings.Repeat("9", 10000), 10, 0, cost.SourceMalformed},
		{"abc", 10, 0, cost.SourceMalformed},
		{"12abc", 10, 0, cost.SourceMalformed},
		{"-1", 10, 0, cost.SourceMalformed},
		{"-0", 0, 0, cost.SourceMalformed},
		{"1.5", 10, 0, cost.SourceMalformed},
		{"1e3", 10, 0, cost.SourceMalformed},
		{"0x10", 10, 0, cost.SourceMalformed},
		{"1_000", 10, 0, cost.SourceMalformed},
		{" 12", 10, 0, cost.SourceMalformed},
		{"12 ", 10, 0, cost.SourceMalformed},
		{"\t12", 10, 0, cost.SourceMalformed},
		{"+", 10, 0, cost.SourceMalformed},
		{"++12", 10, 0, cost.SourceMalformed},
		{"+-12", 10, 0, cost.SourceMalformed},
		{"١٢", 10, 0, cost.SourceMalformed}, // Arabic-Indic digits
		{"１２", 10, 0, cost.SourceMalformed}, // full-width digits
	}
	for _, tt := range tests {
		name := tt.value
		if len(name) > 30 {
			name = name[:30] + "..."
		}
		t.Run(strconv.Quote(name)+"/"+strconv.Itoa(tt.payloadLen), func(t *testing.T) {
			n, src := cost.ParseCount(tt.value, tt.payloadLen)
			if n != tt.want || src != tt.src {
				t.Errorf("ParseCount(%q, %d) = %d, %v; want %d, %v", tt.value, tt.payloadLen, n, src, tt.want, tt.src)
			}
		})
	}
}

func TestSourceString(t *testing.T) {
	for src, want := range map[cost.Source]string{
		cost.SourceHeader:    "header",
		cost.SourceMissing:   "missing",
		cost.SourceMalformed: "malformed",
		cost.SourceComputed:  "computed",
		cost.Source(9):       "Source(9)",
	} {
		if got := src.String(); got != want {
			t.Errorf("Source(%d).String() = %q, want %q", uint8(src), got, want)
		}
	}
}

const squareGeoJSON = `{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}` // 5 vertices

func newMsg(payload string, meta map[string]string) *message.Message {
	msg := message.NewMessage("uuid-"+strconv.Itoa(len(payload)), message.Payload(payload))
	for k, v := range meta {
		msg.Metadata.Set(k, v)
	}
	return msg
}

func TestEstimator(t *testing.T) {
	const def = 1_000
	key := cost.MetadataKey
	tests := []struct {
		name    string
		opts    []cost.Option
		payload string
		meta    map[string]string
		want    cost.Charge
	}{
		{"header", nil, squareGeoJSON, map[string]string{key: "42"},
			cost.Charge{Vertices: 42, Messages: 1, Source: cost.SourceHeader}},
		{"header with plus", nil, squareGeoJSON, map[string]string{key: "+42"},
			cost.Charge{Vertices: 42, Messages: 1, Source: cost.SourceHeader}},
		{"header zero, empty payload", nil, "", map[string]string{key: "0"},
			cost.Charge{Vertices: 0, Messages: 1, Source: cost.SourceHeader}},
		{"missing is charged the default", nil, squareGeoJSON, nil,
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMissing}},
		{"empty value is missing", nil, squareGeoJSON, map[string]string{key: ""},
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMissing}},
		{"malformed is charged the default", nil, squareGeoJSON, map[string]string{key: "abc"},
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMalformed}},
		{"zero for a non-empty payload is malformed", nil, squareGeoJSON, map[string]string{key: "0"},
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMalformed}},
		{"overflow is malformed", nil, squareGeoJSON, map[string]string{key: "9223372036854775808"},
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMalformed}},

		{"compute missing", []cost.Option{cost.WithComputeMissing()}, squareGeoJSON, nil,
			cost.Charge{Vertices: 5, Messages: 1, Source: cost.SourceComputed}},
		{"compute malformed", []cost.Option{cost.WithComputeMissing()}, squareGeoJSON, map[string]string{key: "-5"},
			cost.Charge{Vertices: 5, Messages: 1, Source: cost.SourceComputed}},
		{"compute does not override a header", []cost.Option{cost.WithComputeMissing()}, squareGeoJSON, map[string]string{key: "3"},
			cost.Charge{Vertices: 3, Messages: 1, Source: cost.SourceHeader}},
		{"compute falls back to the default (missing)", []cost.Option{cost.WithComputeMissing()}, "not geometry", nil,
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMissing}},
		{"compute falls back to the default (malformed)", []cost.Option{cost.WithComputeMissing()}, "not geometry", map[string]string{key: "x"},
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMalformed}},
		{"compute empty geometry charges 1", []cost.Option{cost.WithComputeMissing()}, `{"type":"Feature","geometry":null}`, nil,
			cost.Charge{Vertices: 1, Messages: 1, Source: cost.SourceComputed}},
		{"compute empty payload charges 0", []cost.Option{cost.WithComputeMissing()}, "", nil,
			cost.Charge{Vertices: 0, Messages: 1, Source: cost.SourceComputed}},
		{"empty payload without compute is missing", nil, "", nil,
			cost.Charge{Vertices: def, Messages: 1, Source: cost.SourceMissing}},

		{"nil option is ignored", []cost.Option{nil}, squareGeoJSON, map[string]string{key: "99"},
			cost.Charge{Vertices: 99, Messages: 1, Source: cost.SourceHeader}},
		{"the stamping publisher's option is ignored", []cost.Option{cost.WithSkipUncountable()}, squareGeoJSON, map[string]string{key: "99"},
			cost.Charge{Vertices: 99, Messages: 1, Source: cost.SourceHeader}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := cost.NewEstimator(def, tt.opts...)
			if got := e.Estimate(newMsg(tt.payload, tt.meta)); got != tt.want {
				t.Errorf("Estimate = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestEstimatorComputesRealData(t *testing.T) {
	e := cost.NewEstimator(cost.FullBudget, cost.WithComputeMissing())
	for i, line := range readLines(t, countriesFile)[:20] {
		want, err := cost.CountPayload(line)
		if err != nil {
			t.Fatal(err)
		}
		got := e.Estimate(message.NewMessage("m", line))
		if got.Vertices != int64(want) || got.Source != cost.SourceComputed {
			t.Errorf("feature %d: %+v, want %d computed", i, got, want)
		}
	}
}

func TestNewEstimatorDefault(t *testing.T) {
	for _, def := range []int64{0, -1, math.MinInt64} {
		e := cost.NewEstimator(def)
		if c := e.Estimate(newMsg(squareGeoJSON, nil)); c.Vertices != cost.FullBudget {
			t.Errorf("NewEstimator(%d) charged %d for a missing count", def, c.Vertices)
		}
	}
	if c := cost.NewEstimator(123).Estimate(newMsg(squareGeoJSON, nil)); c.Vertices != 123 || c.Source != cost.SourceMissing {
		t.Errorf("NewEstimator(123) charged %+v for a missing count, want 123 missing", c)
	}
}
