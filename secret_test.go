package spillway_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/spillway-go/spillway"
)

func TestSecretNeverPrints(t *testing.T) {
	s := spillway.Secret("hunter2")
	js, err := json.Marshal(struct{ P spillway.Secret }{s})
	if err != nil {
		t.Fatal(err)
	}
	y, _ := s.MarshalYAML()
	for _, got := range []string{s.String(), fmt.Sprint(s), fmt.Sprintf("%+v", struct{ P spillway.Secret }{s}),
		fmt.Sprintf("%#v", s), string(js), fmt.Sprint(y)} {
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
