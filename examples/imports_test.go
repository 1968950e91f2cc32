// Package examples holds only this test: every example is a main package of
// its own, in a directory below.
package examples

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoInternalImports: the examples use only Spillway's public API, so a
// user can copy one out of the repository and build it against the
// published module. It checks what the examples import themselves, tests
// included; the library's own packages may use its internal ones.
func TestNoInternalImports(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command:", err)
	}
	out, err := exec.Command("go", "list", "-f",
		`{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}`,
		"./...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatal("go list:", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 {
		t.Fatalf("go list found %d packages, want the examples:\n%s", len(lines), out)
	}
	for _, line := range lines {
		pkg, imports, _ := strings.Cut(line, " ")
		for _, imp := range strings.Fields(imports) {
			// Any module of the repository: the library, embedded, cmd.
			if strings.HasPrefix(imp, "github.com/spillway-go/spillway/") && strings.Contains(imp+"/", "/internal/") {
				t.Errorf("%s imports %s: examples must use only the public API", pkg, imp)
			}
		}
	}
}
