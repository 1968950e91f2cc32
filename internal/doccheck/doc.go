// Package doccheck holds the test that keeps the Go snippets in README.md
// and docs/*.md compiling against the library in the working tree. It has
// no code of its own.
//
// Every block fenced as ```go is type-checked; a block that is deliberately
// not Go (pseudo-code) is fenced as ```go-pseudo and is skipped. A block is
// read as one of three shapes:
//
//   - a whole file, when it starts with a package clause;
//   - a file body, when it is a list of top-level declarations
//     (import, const, var, type, func);
//   - otherwise a statement list, optionally after import declarations.
//     The statements become the body of a function returning error, so a
//     snippet may end in "return err".
//
// A snippet may leave out its imports: the test adds the import of every
// well-known package name (see knownImports in the test) that the snippet
// uses without declaring. Any other name a snippet uses it must declare
// itself, for example as the parameters of a function or in a short
// var block, so that what a reader sees is what compiles. Unused variables
// and imports are tolerated; every other type error fails the test, named
// by the markdown file and line.
//
// Snippets are checked against the packages as go list sees them from the
// repository root, so with go.work (the default here) a snippet may import
// the embedded, cmd and examples modules too; with GOWORK=off such snippets
// are skipped and logged.
package doccheck
