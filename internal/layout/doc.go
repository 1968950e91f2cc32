// Package layout holds the tests that keep the repository's shape: what a
// user's module graph gets from the library, and which library packages
// may import which. It has no code of its own.
package layout
