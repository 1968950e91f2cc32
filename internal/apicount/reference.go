package main

import (
	"fmt"
	"go/doc"
	"sort"
	"strings"
)

// Entry is one exported name and the first sentence of its doc comment.
type Entry struct {
	Name, Summary string
}

// conventional says what a method does that implements a standard
// interface, when it has no doc comment of its own.
var conventional = map[string]string{
	"Error":       "Error implements the error interface.",
	"Unwrap":      "Unwrap returns the wrapped error, for errors.Is and errors.As.",
	"String":      "String implements fmt.Stringer.",
	"GoString":    "GoString implements fmt.GoStringer (the %#v verb).",
	"MarshalText": "MarshalText implements encoding.TextMarshaler.",
}

// Entries returns the exported names of every package of the library
// module under root, by package path relative to root, sorted by name.
func Entries(root string) (map[string][]Entry, error) {
	out := map[string][]Entry{}
	var p doc.Package
	err := walkPackages(root, func(rel, dir string) error {
		var es []Entry
		_, ok, err := walkDir(dir, func(name, text string) {
			sum := p.Synopsis(text)
			if sum == "" {
				sum = conventional[name[strings.LastIndexByte(name, '.')+1:]]
			}
			es = append(es, Entry{Name: name, Summary: sum})
		})
		if err != nil || !ok {
			return err
		}
		sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
		out[rel] = es
		return nil
	})
	return out, err
}

// Reference renders docs/api.md for the library module under root.
func Reference(root string) (string, error) {
	entries, err := Entries(root)
	if err != nil {
		return "", err
	}
	pkgs := make([]string, 0, len(entries))
	total := 0
	for p, es := range entries {
		pkgs = append(pkgs, p)
		total += len(es)
	}
	sort.Strings(pkgs)

	var b strings.Builder
	b.WriteString(`# API reference

Every name the library exports, with the first sentence of its doc
comment; ` + "`go doc`" + ` shows the rest (for example ` + "`go doc github.com/spillway-go/spillway/middleware.Lane`" + `).
The other modules (` + "`embedded`, `cmd`, `examples`" + `) are not part of the library.
This page is generated, and a test fails when it is out of date:

` + "```sh" + `
go run ./internal/apicount -md > docs/api.md
go run ./internal/apicount               # the counts per package
go run ./internal/apicount -list sizing  # the names one package exports
` + "```" + `

The counts below are every name a user can write: functions, types,
methods of exported types, constants, variables, and the exported fields
of exported structs. ` + "`internal/apicount`" + `'s test keeps them under a ceiling
for the library, ` + "`router`" + ` and ` + "`middleware`" + `, lowered as names go.

| package | names |
| --- | ---: |
`)
	for _, p := range pkgs {
		fmt.Fprintf(&b, "| [%s](#%s) | %d |\n", short(p), strings.ReplaceAll(short(p), "/", ""), len(entries[p]))
	}
	fmt.Fprintf(&b, "| total | %d |\n", total)
	for _, p := range pkgs {
		fmt.Fprintf(&b, "\n## %s\n\n`import %q`\n\n| name | what it is |\n| --- | --- |\n", short(p), importPath(p))
		for _, e := range entries[p] {
			fmt.Fprintf(&b, "| `%s` | %s |\n", e.Name, cell(e.Summary))
		}
	}
	return b.String(), nil
}

// importPath is the package's import path.
func importPath(rel string) string {
	if rel == "." {
		return "github.com/spillway-go/spillway"
	}
	return "github.com/spillway-go/spillway/" + rel
}

// short is the heading of a package's section: its path inside the
// module, or spillway for the root package.
func short(rel string) string {
	if rel == "." {
		return "spillway"
	}
	return rel
}

// cell makes a summary safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}
