package sizing_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-go/spillway/cost"
	"github.com/spillway-go/spillway/sizing"
)

func TestReadSample(t *testing.T) {
	in := strings.Join([]string{
		`{"type":"Feature","properties":{"name":"a"},"geometry":{"type":"Point","coordinates":[1,2]}}`,
		``,
		`   `,
		`{"type":"Polygon","coordinates":[[[0,0],[4,0],[4,4],[0,4],[0,0]]]}`,
		`{"type":"LineString","coordinates":[[0,0],[1,1],[2,2]]}`,
	}, "\n")
	s, err := sizing.ReadSample(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := totals(s); len(s.Payloads) != 3 || v != 9 || s.Vertices[1] != 5 {
		t.Fatalf("got %d payloads, %d vertices (%v)", len(s.Payloads), v, s.Vertices)
	}
}

func TestReadSampleErrors(t *testing.T) {
	point := `{"type":"Point","coordinates":[1,2]}`
	tests := []struct {
		name   string
		in     string
		line   int // 0: not a line error
		target error
	}{
		{"empty", "", 0, sizing.ErrEmptySample},
		{"blank lines only", "\n  \n\n", 0, sizing.ErrEmptySample},
		{"not JSON", point + "\n\nhello\n", 3, cost.ErrMalformed},
		{"not a geometry", point + "\n" + `{"name":"x"}` + "\n", 2, cost.ErrMalformed},
		{"truncated", `{"type":"Point","coordinates":[1,`, 1, cost.ErrMalformed},
		{"null geometry", point + "\n" + `{"type":"Feature","geometry":null}`, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := sizing.ReadSample(strings.NewReader(tt.in))
			if err == nil {
				t.Fatal("no error")
			}
			if tt.line == 0 {
				if !errors.Is(err, tt.target) {
					t.Fatalf("error %v, want %v", err, tt.target)
				}
				return
			}
			if want := fmt.Sprintf("sample line %d is not a geometry", tt.line); !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v, want one naming line %d", err, tt.line)
			}
			if tt.target != nil && !errors.Is(err, tt.target) {
				t.Fatalf("error %v does not wrap %v", err, tt.target)
			}
		})
	}
}

func TestNewSample(t *testing.T) {
	if _, err := sizing.NewSample(nil); !errors.Is(err, sizing.ErrEmptySample) {
		t.Fatalf("nil payloads: %v", err)
	}
	_, err := sizing.NewSample([][]byte{[]byte(`{"type":"Point","coordinates":[1,2]}`), []byte("nope")})
	if !errors.Is(err, cost.ErrMalformed) || !strings.Contains(err.Error(), "payload 1") {
		t.Fatalf("bad payload: %v", err)
	}
}
