package spillway_test

import (
	"strings"
	"testing"

	"github.com/spillway-go/spillway"
	"github.com/spillway-go/spillway/kafkabroker"
	"github.com/spillway-go/spillway/redisbroker"
)

// TestEmbeddedNotLinkedSaysHow: a configuration that asks for the embedded
// broker in a program that does not link it fails with an error that gives
// the import to add and the go.mod replace the unpublished module needs,
// on both brokers.
func TestEmbeddedNotLinkedSaysHow(t *testing.T) {
	errs := map[string]error{
		"kafka": kafkabroker.Config{Brokers: []string{spillway.Embedded}}.Validate(),
		"redis": redisbroker.Config{Addr: spillway.Embedded}.Validate(),
	}
	for broker, err := range errs {
		if err == nil {
			t.Errorf("%s: embedded validates without the embedded package linked", broker)
			continue
		}
		for _, want := range []string{
			`import _ "github.com/spillway-go/spillway/embedded"`,
			"replace github.com/spillway-go/spillway/embedded => ../spillway/embedded",
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q does not say %q", broker, err, want)
			}
		}
	}
}
