package doccheck_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// knownImports maps the package names a snippet may use without importing
// them to their import paths.
var knownImports = map[string]string{
	// The library.
	"spillway":    "github.com/spillway-go/spillway",
	"cost":        "github.com/spillway-go/spillway/cost",
	"sizing":      "github.com/spillway-go/spillway/sizing",
	"middleware":  "github.com/spillway-go/spillway/middleware",
	"producer":    "github.com/spillway-go/spillway/producer",
	"shedding":    "github.com/spillway-go/spillway/shedding",
	"retrygate":   "github.com/spillway-go/spillway/retrygate",
	"kafkabroker": "github.com/spillway-go/spillway/kafkabroker",
	"redisbroker": "github.com/spillway-go/spillway/redisbroker",
	"telemetry":   "github.com/spillway-go/spillway/telemetry",
	"kafkatel":    "github.com/spillway-go/spillway/telemetry/kafkatel",
	"redistel":    "github.com/spillway-go/spillway/telemetry/redistel",
	"router":      "github.com/spillway-go/spillway/router",

	// Its dependencies.
	"watermill":   "github.com/ThreeDotsLabs/watermill",
	"message":     "github.com/ThreeDotsLabs/watermill/message",
	"gochannel":   "github.com/ThreeDotsLabs/watermill/pubsub/gochannel",
	"kafka":       "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka",
	"redisstream": "github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream",
	"sarama":      "github.com/IBM/sarama",
	"redis":       "github.com/redis/go-redis/v9",
	"geom":        "github.com/twpayne/go-geom",
	"otel":        "go.opentelemetry.io/otel",
	"attribute":   "go.opentelemetry.io/otel/attribute",
	"propagation": "go.opentelemetry.io/otel/propagation",
	"metric":      "go.opentelemetry.io/otel/metric",
	"trace":       "go.opentelemetry.io/otel/trace",
	"sdktrace":    "go.opentelemetry.io/otel/sdk/trace",
	"sdkmetric":   "go.opentelemetry.io/otel/sdk/metric",
	"otelprom":    "go.opentelemetry.io/otel/exporters/prometheus",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
	"promhttp":    "github.com/prometheus/client_golang/prometheus/promhttp",

	// The standard library.
	"context": "context",
	"errors":  "errors",
	"fmt":     "fmt",
	"http":    "net/http",
	"io":      "io",
	"log":     "log",
	"os":      "os",
	"signal":  "os/signal",
	"slog":    "log/slog",
	"strings": "strings",
	"sync":    "sync",
	"syscall": "syscall",
	"time":    "time",
}

// A snippet is one ```go block of a markdown file.
type snippet struct {
	file string // relative to the repository root, slash-separated
	line int    // line of the first line of code (the one after the fence)
	code string
}

func (s snippet) String() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

// extract returns the ```go blocks of a markdown document. Other fences,
// including ```go-pseudo, are skipped.
func extract(name string, r io.Reader) ([]snippet, error) {
	var (
		out   []snippet
		cur   *snippet
		fence string
		buf   strings.Builder
		n     int
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case fence == "" && strings.HasPrefix(trimmed, "```"):
			fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, "`"))]
			if strings.TrimSpace(strings.TrimPrefix(trimmed, fence)) == "go" {
				cur = &snippet{file: name, line: n + 1}
				buf.Reset()
			}
		case fence != "" && strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, "`") == "":
			if cur != nil {
				cur.code = buf.String()
				out = append(out, *cur)
				cur = nil
			}
			fence = ""
		case cur != nil:
			buf.WriteString(line)
			buf.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("%s: unterminated code fence", name)
	}
	return out, nil
}

// genName names the generated files. It has no directory, so that the
// relative file names of the //line directives stay as they are.
const genName = "snippet.go"

// source turns a snippet into a Go file that compiles when the snippet
// does. //line directives keep positions pointing into the markdown.
func source(s snippet) (string, error) {
	fset := token.NewFileSet()
	code := s.code
	at := func(line int) string { return fmt.Sprintf("//line %s:%d:1\n", s.file, line) }

	// A whole file stays as it is.
	if f, err := parser.ParseFile(fset, genName, code, parser.PackageClauseOnly); err == nil && f.Name != nil {
		return at(s.line) + code, nil
	}

	// A file body.
	body := "package snippet\n" + at(s.line) + code
	if f, err := parser.ParseFile(fset, genName, body, parser.SkipObjectResolution); err == nil {
		return withImports(f, "package snippet\n", at(s.line)+code), nil
	}

	// Statements, after optional imports.
	head, err := parser.ParseFile(fset, genName, "package snippet\n"+code, parser.ImportsOnly)
	if err != nil {
		return "", err
	}
	split := 0 // byte offset in code where the statements start
	if n := len(head.Decls); n > 0 {
		end := fset.Position(head.Decls[n-1].End()).Offset - len("package snippet\n")
		split = end
		if i := strings.IndexByte(code[end:], '\n'); i >= 0 {
			split = end + i + 1
		} else {
			split = len(code)
		}
	}
	imports, stmts := code[:split], code[split:]
	stmtLine := s.line + strings.Count(imports, "\n")
	wrapped := at(s.line) + imports +
		"func _() error {\n" + at(stmtLine) + stmts + "\nreturn nil\n}\n"
	f, err := parser.ParseFile(fset, genName, "package snippet\n"+wrapped, 0)
	if err != nil {
		return "", err
	}
	return withImports(f, "package snippet\n", wrapped), nil
}

// withImports inserts, after the package clause, the imports of the known
// package names that f uses but neither declares nor imports.
func withImports(f *ast.File, pkg, rest string) string {
	imported := map[string]bool{}
	for _, spec := range f.Imports {
		path := strings.Trim(spec.Path.Value, `"`)
		name := path[strings.LastIndexByte(path, '/')+1:]
		if spec.Name != nil {
			name = spec.Name.Name
		}
		imported[name] = true
	}
	// Object resolution is deprecated but is exactly what this needs: the
	// identifiers that no declaration in the file resolves.
	fset := token.NewFileSet()
	resolved, err := parser.ParseFile(fset, "", pkg+rest, 0)
	if err != nil {
		return pkg + rest
	}
	need := map[string]bool{}
	for _, id := range resolved.Unresolved {
		if _, ok := knownImports[id.Name]; ok && !imported[id.Name] {
			need[id.Name] = true
		}
	}
	if len(need) == 0 {
		return pkg + rest
	}
	names := make([]string, 0, len(need))
	for name := range need {
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(pkg)
	b.WriteString("import (\n")
	for _, name := range names {
		fmt.Fprintf(&b, "\t%s %q\n", name, knownImports[name])
	}
	b.WriteString(")\n")
	b.WriteString(rest)
	return b.String()
}

// tolerated reports whether a type error is one a snippet may have:
// something declared or imported for the reader and then not used.
func tolerated(err types.Error) bool {
	return err.Soft && (strings.Contains(err.Msg, "declared and not used") ||
		strings.Contains(err.Msg, "imported and not used"))
}

// exportData runs go list once to build the export data of the packages
// the files import, and returns an importer that reads it.
func exportData(t *testing.T, root string, files []*ast.File) types.Importer {
	t.Helper()
	var paths []string
	for _, f := range files {
		for _, spec := range f.Imports {
			p := strings.Trim(spec.Path.Value, `"`)
			if p != "C" && p != "unsafe" && !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	exports := map[string]string{}
	if len(paths) > 0 {
		args := append([]string{"list", "-e", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, paths...)
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -export: %v\n%s", err, stderr.Bytes())
		}
		for line := range strings.Lines(string(out)) {
			path, export, _ := strings.Cut(strings.TrimSpace(line), "\t")
			if export != "" {
				exports[path] = export
			}
		}
	}
	fset := token.NewFileSet()
	return importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		export, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q (not in the workspace, or does not build)", path)
		}
		return os.Open(export)
	})
}

// check type-checks the snippets and returns the errors of each that does
// not compile, keyed by the snippet.
func check(t *testing.T, root string, snippets []snippet) map[snippet][]string {
	t.Helper()
	fset := token.NewFileSet()
	failed := map[snippet][]string{}
	files := make([]*ast.File, len(snippets))
	for i, s := range snippets {
		src, err := source(s)
		if err != nil {
			failed[s] = append(failed[s], err.Error())
			continue
		}
		f, err := parser.ParseFile(fset, genName, src, parser.SkipObjectResolution)
		if err != nil {
			failed[s] = append(failed[s], err.Error())
			continue
		}
		files[i] = f
	}
	imp := exportData(t, root, slices.DeleteFunc(slices.Clone(files), func(f *ast.File) bool { return f == nil }))
	for i, f := range files {
		if f == nil {
			continue
		}
		s := snippets[i]
		conf := types.Config{
			Importer: imp,
			Error: func(err error) {
				var te types.Error
				if errors.As(err, &te) && tolerated(te) {
					return
				}
				failed[s] = append(failed[s], err.Error())
			},
		}
		conf.Check("snippet", fset, []*ast.File{f}, nil) // errors go to conf.Error
	}
	return failed
}

// repoRoot is the library module's root: two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

// otherModules are the repository's modules besides the library, which a
// snippet can import only when go.work is in use.
var otherModules = []string{
	"github.com/spillway-go/spillway/embedded",
	"github.com/spillway-go/spillway/cmd",
	"github.com/spillway-go/spillway/examples",
}

// workspace reports whether the go command uses the repository's go.work.
func workspace(t *testing.T, root string) bool {
	t.Helper()
	cmd := exec.Command("go", "env", "GOWORK")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go env GOWORK: %v", err)
	}
	gowork := strings.TrimSpace(string(out))
	return gowork != "" && gowork != "off"
}

func needGo(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found:", err)
	}
}

func report(t *testing.T, failed map[snippet][]string) {
	t.Helper()
	keys := make([]snippet, 0, len(failed))
	for s := range failed {
		keys = append(keys, s)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].file != keys[j].file {
			return keys[i].file < keys[j].file
		}
		return keys[i].line < keys[j].line
	})
	for _, s := range keys {
		t.Errorf("snippet at %s does not compile:\n\t%s", s, strings.Join(failed[s], "\n\t"))
	}
}

// TestSnippetsCompile type-checks every ```go block of README.md and
// docs/*.md against the library in the working tree.
func TestSnippetsCompile(t *testing.T) {
	needGo(t)
	root := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var all []snippet
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		rel, err := filepath.Rel(root, path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := extract(filepath.ToSlash(rel), f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got...)
	}
	if len(all) == 0 {
		t.Fatal("found no ```go blocks; is the repository root right?")
	}
	if !workspace(t, root) {
		// The library module alone cannot resolve the other modules of
		// the repository; go.work can.
		all = slices.DeleteFunc(all, func(s snippet) bool {
			for _, m := range otherModules {
				if strings.Contains(s.code, `"`+m) {
					t.Logf("%s: skipped: imports module %s, outside go.work", s, m)
					return true
				}
			}
			return false
		})
	}
	report(t, check(t, root, all))
	t.Logf("%d snippets checked", len(all))
}

// TestCheckerCatches keeps the checker honest: it must accept the three
// shapes with their tolerated slack, and name the markdown line of a
// snippet that does not compile.
func TestCheckerCatches(t *testing.T) {
	needGo(t)
	doc := strings.Join([]string{
		"# Example", // 1
		"```go",     // 2
		"budget, err := middleware.NewVertexBudget(10)", // 3: unused: tolerated
		"_ = time.Second",                     // 4
		"```",                                 // 5
		"```go",                               // 6
		"func f(ctx context.Context) error {", // 7
		"\treturn ctx.Err()",                  // 8
		"}",                                   // 9
		"```",                                 // 10
		"```go",                               // 11
		"package main",                        // 12
		"import \"fmt\"",                      // 13
		"func main() { fmt.Println() }",       // 14
		"```",                                 // 15
		"```go",                               // 16
		"import \"strings\"",                  // 17
		"var b strings.Builder",               // 18
		"b.WriteString(\"x\")",                // 19
		"```",                                 // 20
		"```go-pseudo",                        // 21
		"this is not Go",                      // 22
		"```",                                 // 23
		"```go",                               // 24
		"ok := true",                          // 25
		"budget := cost.NoSuchThing(ok)",      // 26: does not compile
		"```",                                 // 27
		"```go",                               // 28
		"return undeclared",                   // 29: does not compile
		"```",                                 // 30
		"```go",                               // 31
		"func g() int { return \"x\" }",       // 32: does not compile
		"```",                                 // 33
	}, "\n") + "\n"
	snippets, err := extract("docs/example.md", strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	if len(snippets) != 7 {
		t.Fatalf("extracted %d snippets, want 7 (go-pseudo skipped)", len(snippets))
	}
	failed := check(t, repoRoot(t), snippets)
	want := map[string]string{
		"docs/example.md:25": "docs/example.md:26:", // the line of the error
		"docs/example.md:29": "docs/example.md:29:",
		"docs/example.md:32": "docs/example.md:32:",
	}
	for s, errs := range failed {
		prefix, ok := want[s.String()]
		if !ok {
			t.Errorf("snippet at %s should compile, got:\n\t%s", s, strings.Join(errs, "\n\t"))
			continue
		}
		if !strings.HasPrefix(errs[0], prefix) {
			t.Errorf("snippet at %s: error %q does not name %s", s, errs[0], prefix)
		}
	}
	for s := range want {
		if !slices.ContainsFunc(snippets, func(x snippet) bool { return x.String() == s && failed[x] != nil }) {
			t.Errorf("snippet at %s should not compile, but passed", s)
		}
	}
}
