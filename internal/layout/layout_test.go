package layout_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/spillway-go/spillway"

// heavy are modules the library must not bring into a user's graph: the
// demo's plotting, CLI and progress bars, the embedded brokers and the
// linter.
var heavy = []string{
	"gonum.org/v1/plot",
	"github.com/spf13/cobra",
	"github.com/vbauerster/mpb",
	"github.com/twmb/franz-go/pkg/kfake",
	"github.com/alicebob/miniredis",
	"github.com/yuin/gopher-lua",
	"honnef.co/go/tools",
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", module, err)
	}
	return strings.TrimSpace(string(out))
}

// libraryPackages lists the library module's non-internal packages.
func libraryPackages(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	var pkgs []string
	for p := range strings.FieldsSeq(string(out)) {
		if !strings.Contains(p, "/internal/") {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs
}

// A scratch module that imports every library package, the way a user's
// would after go get, has none of the heavy modules in its graph.
func TestUserModuleGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a scratch module")
	}
	root := repoRoot(t)
	pkgs := libraryPackages(t, root)
	dir := t.TempDir()
	gomod := "module example.com/scratch\n\ngo 1.26.0\n\nrequire " + module + " v0.0.0-00010101000000-000000000000\n\nreplace " + module + " => " + root + "\n"
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, p := range pkgs {
		src.WriteString("\t_ \"" + p + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	for name, body := range map[string]string{"go.mod": gomod, "main.go": src.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "tidy")
	all := run("list", "-m", "all")
	for _, line := range strings.Split(all, "\n") {
		for _, h := range heavy {
			if strings.HasPrefix(line, h) {
				t.Errorf("a module importing the library has %s in its graph (go list -m all: %q)", h, line)
			}
		}
	}
	if !strings.Contains(all, "github.com/ThreeDotsLabs/watermill ") {
		t.Fatalf("go list -m all lacks watermill: the check read the wrong graph:\n%s", all)
	}
}

type pkg struct {
	ImportPath string
	Imports    []string
}

// Which library package may import which: the broker packages never import
// router or telemetry, and telemetry's core no broker; cost, sizing, middleware and producer import no broker, telemetry
// or router package (nor each other, but for cost, and sizing building on
// cost); no library package imports the embedded brokers.
func TestDependencyDirection(t *testing.T) {
	root := repoRoot(t)
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		imports[strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")] = p.Imports
	}
	if len(imports) < 8 {
		t.Fatalf("go list found %d packages: the check read the wrong tree", len(imports))
	}
	forbid := func(from string, to ...string) {
		t.Helper()
		got, ok := imports[from]
		if !ok {
			t.Errorf("package %s is missing", from)
			return
		}
		for _, imp := range got {
			rel, found := strings.CutPrefix(imp, module+"/")
			if !found {
				continue
			}
			if slices.Contains(to, rel) || slices.ContainsFunc(to, func(p string) bool { return strings.HasPrefix(rel, p+"/") }) {
				t.Errorf("%s imports %s", from, rel)
			}
		}
	}
	for from := range imports {
		forbid(from, "embedded", "cmd", "examples")
	}
	// The root package is the shared vocabulary: it imports no other.
	forbid("", "cost", "sizing", "middleware", "producer", "shedding", "retrygate", "kafkabroker", "redisbroker", "telemetry", "router")
	// Both brokers relate to telemetry the same way: a broker never
	// imports telemetry; the adapters under telemetry/ (kafkatel,
	// redistel) may import the brokers, and the router wires the two.
	for from := range imports {
		for _, broker := range []string{"kafkabroker", "redisbroker"} {
			if from == broker || strings.HasPrefix(from, broker+"/") {
				forbid(from, "router", "telemetry")
			}
		}
	}
	forbid("telemetry", "router", "kafkabroker", "redisbroker")
	forbid("cost", "router", "kafkabroker", "redisbroker", "telemetry", "middleware", "sizing", "producer")
	forbid("sizing", "router", "kafkabroker", "redisbroker", "telemetry", "middleware", "producer")
	forbid("middleware", "router", "kafkabroker", "redisbroker", "telemetry", "producer")
	forbid("producer", "router", "kafkabroker", "redisbroker", "telemetry", "middleware")
}
