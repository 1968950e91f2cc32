// Command apicount counts the exported identifiers of the library module:
// functions, types, methods, constants, variables and struct fields that a
// user can name, per package and in all. Test files, internal packages,
// main packages and the other modules (embedded, cmd, examples) are left
// out. Run it from the repository root:
//
//	go run ./internal/apicount
//	go run ./internal/apicount -list sizing   # the names one package exports
//	go run ./internal/apicount -md > docs/api.md
//
// With -md it writes docs/api.md: every exported name with the first
// sentence of its doc comment. Its test fails when docs/api.md is out of
// date or a name has no doc comment.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	list := flag.String("list", "", "print the exported identifiers of this package directory (for example sizing)")
	md := flag.Bool("md", false, "print docs/api.md: every exported identifier with the first sentence of its doc comment")
	flag.Parse()
	if *md {
		page, err := Reference(".")
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(1)
		}
		fmt.Print(page)
		return
	}
	if *list != "" {
		names, err := Names(*list)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(1)
		}
		for _, n := range names {
			fmt.Println(n)
		}
		return
	}
	counts, err := Count(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(1)
	}
	pkgs := make([]string, 0, len(counts))
	total := 0
	for p, n := range counts {
		pkgs = append(pkgs, p)
		total += n
	}
	sort.Strings(pkgs)
	for _, p := range pkgs {
		fmt.Printf("%-24s %4d\n", p, counts[p])
	}
	fmt.Printf("%-24s %4d\n", "total", total)
}

// Count walks the library module under root and returns the number of
// exported identifiers per package directory (relative to root).
func Count(root string) (map[string]int, error) {
	counts := map[string]int{}
	err := walkPackages(root, func(rel, dir string) error {
		n, ok, err := countDir(dir)
		if err != nil {
			return err
		}
		if ok {
			counts[rel] = n
		}
		return nil
	})
	return counts, err
}

// walkPackages calls visit for every directory of the library module
// under root that may hold a package, with its path relative to root.
func walkPackages(root string, visit func(rel, dir string) error) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if rel != "." {
			name := d.Name()
			if strings.HasPrefix(name, ".") || name == "internal" || name == "testdata" || name == "docs" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		return visit(filepath.ToSlash(rel), path)
	})
}

// Names returns the exported identifiers of the package in dir, one per
// line as Type, Type.Field, Type.Method or Func.
func Names(dir string) ([]string, error) {
	var names []string
	_, _, err := walkDir(dir, func(n, _ string) { names = append(names, n) })
	sort.Strings(names)
	return names, err
}

func countDir(dir string) (int, bool, error) {
	return walkDir(dir, func(string, string) {})
}

// walkDir calls emit with each exported name of the package in dir and
// its doc comment, and returns how many there are and whether dir holds a
// package other than main.
func walkDir(dir string, emit func(name, doc string)) (int, bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, false, err
	}
	fset := token.NewFileSet()
	n, found := 0, false
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return 0, false, err
		}
		if f.Name.Name == "main" {
			continue
		}
		found = true
		n += countFile(f, emit)
	}
	return n, found, nil
}

func countFile(f *ast.File, emit func(name, doc string)) int {
	n := 0
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv != nil && !exportedRecv(d.Recv) {
				continue
			}
			n++
			if d.Recv != nil {
				emit(embeddedName(d.Recv.List[0].Type)+"."+d.Name.Name, d.Doc.Text())
			} else {
				emit(d.Name.Name, d.Doc.Text())
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					n++
					emit(s.Name.Name, first(s.Doc, d.Doc, s.Comment))
					n += exportedMembers(s.Name.Name, s.Type, emit)
				case *ast.ValueSpec:
					for _, id := range s.Names {
						if id.IsExported() {
							n++
							emit(id.Name, first(s.Doc, s.Comment, d.Doc))
						}
					}
				}
			}
		}
	}
	return n
}

// exportedMembers counts the exported fields of a struct type and the
// exported methods of an interface type.
func exportedMembers(owner string, t ast.Expr, emit func(name, doc string)) int {
	var fields *ast.FieldList
	switch tt := t.(type) {
	case *ast.StructType:
		fields = tt.Fields
	case *ast.InterfaceType:
		fields = tt.Methods
	default:
		return 0
	}
	n := 0
	for _, f := range fields.List {
		for _, id := range f.Names {
			if id.IsExported() {
				n++
				emit(owner+"."+id.Name, first(f.Doc, f.Comment))
			}
		}
		if len(f.Names) == 0 { // embedded
			if id := embeddedName(f.Type); id != "" && ast.IsExported(id) {
				n++
				text := first(f.Doc, f.Comment)
				if text == "" {
					text = "The embedded " + id + ", whose fields are promoted."
				}
				emit(owner+"."+id, text)
			}
		}
	}
	return n
}

func embeddedName(t ast.Expr) string {
	switch tt := t.(type) {
	case *ast.Ident:
		return tt.Name
	case *ast.StarExpr:
		return embeddedName(tt.X)
	case *ast.SelectorExpr:
		return tt.Sel.Name
	case *ast.IndexExpr:
		return embeddedName(tt.X)
	}
	return ""
}

func exportedRecv(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	return ast.IsExported(embeddedName(recv.List[0].Type))
}

// first returns the text of the first non-empty comment group.
func first(groups ...*ast.CommentGroup) string {
	for _, g := range groups {
		if t := g.Text(); t != "" {
			return t
		}
	}
	return ""
}
