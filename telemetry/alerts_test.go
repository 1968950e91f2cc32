package telemetry_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// envRequirePromtool makes a missing promtool a failure instead of a skip;
// .ci/run sets it, and .ci/deps.sh installs Debian's prometheus package,
// which ships promtool.
const envRequirePromtool = "SPILLWAY_REQUIRE_PROMTOOL"

// The recording rules and alerts in docs/ops are valid Prometheus rules and
// their unit tests (docs/ops/spillway-alerts.test.yaml) pass.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv(envRequirePromtool) == "1" {
			t.Fatalf("promtool not found and %s=1: install Debian's prometheus package (make deps)", envRequirePromtool)
		}
		t.Skip("promtool not installed (make deps installs it)")
	}
	dir := filepath.Join("..", "docs", "ops")
	for _, args := range [][]string{
		{"check", "rules", "spillway-alerts.yaml"},
		{"test", "rules", "spillway-alerts.test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
