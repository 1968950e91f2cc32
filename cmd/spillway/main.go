// Command spillway is Spillway's command-line tool.
//
//	spillway size --sample FILE.ndjson [flags]   compute a vertex budget from a sample
//	spillway demo [flags]                        a message-count consumer and a Spillway consumer, side by side
//
// Run "spillway help <command>" for a command's flags. Exit codes: 0 on
// success, 2 for bad input (flags, sample, sizing inputs), 1 for anything
// else.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2
)

// inputError marks an error caused by what the user gave: it exits with
// code 2.
type inputError struct{ err error }

func (e inputError) Error() string { return e.err.Error() }
func (e inputError) Unwrap() error { return e.err }

// badInput wraps err (or a new error from format and args) as an input error.
func badInput(format string, args ...any) error {
	return inputError{fmt.Errorf(format, args...)}
}

// env is what a command reads and writes, so tests can run commands
// in-process.
type env struct {
	stdout, stderr io.Writer
	// stderrTTY says whether stderr is a terminal (progress bars go there).
	stderrTTY bool
}

// newRootCmd builds the command tree. Each subcommand lives in its own file
// and is added here.
func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "spillway",
		Short: "Work-aware backpressure for spatial message streams",
		Long: "spillway sizes and inspects the vertex budgets of Spillway consumers, and demonstrates them.\n" +
			"The library is github.com/spillway-go/spillway; this tool wraps its sizing API.",
		SilenceErrors: true, // run prints one line itself
		SilenceUsage:  true,
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	// Flag errors are bad input too.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return inputError{err} })
	root.AddCommand(newSizeCmd(e))
	root.AddCommand(newDemoCmd(e))
	return root
}

// run executes the command line args and returns the exit code. Errors are
// printed as one line, "<command path>: <problem>", on stderr.
func run(args []string, e *env) int {
	root := newRootCmd(e)
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	path := "spillway"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(e.stderr, "%s: %v\n", path, err)
	var in inputError
	if errors.As(err, &in) || isCobraUsageError(err) {
		return exitBadInput
	}
	return exitFailure
}

// isCobraUsageError recognises the errors cobra returns itself for an
// unknown command or a wrong number of arguments.
func isCobraUsageError(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "accepts ", "requires ", "invalid argument"} {
		if strings.Contains(msg, p) {
			return true
		}
	}
	return false
}

func main() {
	e := &env{stdout: os.Stdout, stderr: os.Stderr, stderrTTY: isTerminal(os.Stderr)}
	os.Exit(run(os.Args[1:], e))
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
