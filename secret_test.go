package spillway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/spillway-go/spillway"
)

func TestSecretNeverPrints(t *testing.T) {
	s := spillway.Secret("hunter2")
	js, err := json.Marshal(struct{ P spillway.Secret }{s})
	if err != nil {
		t.Fatal(err)
	}
	y, err := yaml.Marshal(struct{ P spillway.Secret }{s})
	if err != nil {
		t.Fatal(err)
	}
	if want := "p: '[redacted]'\n"; string(y) != want {
		t.Errorf("YAML %q, want %q", y, want)
	}
	for _, got := range []string{s.String(), fmt.Sprint(s), fmt.Sprintf("%+v", struct{ P spillway.Secret }{s}),
		fmt.Sprintf("%#v", s), string(js), string(y)} {
		if strings.Contains(got, "hunter2") {
			t.Errorf("secret printed: %s", got)
		}
	}
	if s.String() != "[redacted]" || string(s) != "hunter2" {
		t.Errorf("String() = %q, string(s) = %q", s.String(), string(s))
	}
	if spillway.Secret("").String() != "" {
		t.Error("an empty secret should print empty")
	}
}
