package spillway_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/spillway-go/spillway"
)

func TestFieldError(t *testing.T) {
	err := errors.Join(
		&spillway.FieldError{Field: "kafka.brokers[0]", Value: "no-port", Reason: "must be host:port"},
		&spillway.FieldError{Field: "budget.vertices", Value: "-1", Reason: "must be positive", Source: "spillway.yaml:3"},
	)
	if !errors.Is(err, spillway.ErrInvalidConfig) {
		t.Fatal("errors.Is(err, ErrInvalidConfig) is false")
	}
	var fe *spillway.FieldError
	if !errors.As(err, &fe) || fe.Field != "kafka.brokers[0]" {
		t.Fatalf("errors.As: %v", fe)
	}
	want := "config: kafka.brokers[0]: must be host:port, got \"no-port\"\nconfig: budget.vertices (spillway.yaml:3): must be positive, got \"-1\""
	if err.Error() != want {
		t.Fatalf("Error():\n%s\nwant\n%s", err, want)
	}
	if errors.Is(errors.New("other"), spillway.ErrInvalidConfig) {
		t.Fatal("an unrelated error matches ErrInvalidConfig")
	}
}

func TestPressureFunc(t *testing.T) {
	var p spillway.Pressure = spillway.PressureFunc(func() time.Duration { return time.Second })
	if p.SaturatedFor() != time.Second {
		t.Fatal("PressureFunc does not call its function")
	}
}

// Every Validate returns FieldErrors: one errors.Is covers them all.
func ExampleFieldError() {
	err := fmt.Errorf("loading spillway.yaml: %w", &spillway.FieldError{
		Field: "budget.vertices", Value: "-5", Reason: "must be positive",
	})
	var fe *spillway.FieldError
	fmt.Println(errors.Is(err, spillway.ErrInvalidConfig), errors.As(err, &fe), fe.Field)
	// Output: true true budget.vertices
}
