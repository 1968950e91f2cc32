// Command spillway is Spillway's command-line tool.
//
//	spillway size --sample FILE.ndjson [flags]   compute a vertex budget from a sample
//	spillway demo [flags]                        a message-count consumer and a Spillway consumer, side by side
//	spillway bench [flags]                       the scaling curve: Spillway against the bare upstream subscriber
//	spillway bench autoscale [flags]             the fleet experiment: scaling consumers on drain time or message lag
//	spillway config check FILE                   validate a router configuration (file and SPILLWAY_* environment)
//	spillway config print FILE                   print the effective configuration and each value's source
//	spillway lag FILE --handler NAME=TOPIC       backlog in messages and vertices, drain time, processes for a target
//	spillway --version                           the module version and VCS revision
//
// Run "spillway help <command>" for a command's flags. Exit codes (see
// exitHelp): 0 on success, 2 for bad input (command line, sample, sizing
// inputs, an invalid configuration), 1 for anything else.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"

	"github.com/spillway-go/spillway/cmd/internal/autoscale"
	"github.com/spillway-go/spillway/cmd/internal/kafkaproc"
)

// Exit codes. run maps an error to one with errors.As: an [inputError]
// anywhere in its chain is exitBadInput, any other error exitFailure.
const (
	exitOK       = 0
	exitFailure  = 1
	exitBadInput = 2
)

// exitHelp documents the exit codes in the root command's help.
const exitHelp = `Exit codes:
  0  success
  1  failure: anything else (a broker that cannot be reached, an output that cannot be written)
  2  bad input: unknown command or flag, wrong arguments, bad flag values, an unreadable
     sample, or a configuration that does not load or validate (spillway config, spillway lag)`

// inputError marks an error caused by what the user gave: it exits with
// code 2. Commands return it for bad flag values and files; run wraps
// cobra's own command-line errors (unknown command, flag or argument
// count) in it where cobra reports them (the flag error function, the
// commands' argument validators and parentRunE).
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
		Long: "spillway sizes and inspects the vertex budgets of Spillway consumers, checks router\n" +
			"configurations, and demonstrates them. The library is github.com/spillway-go/spillway;\n" +
			"this tool wraps its sizing API and router.LoadConfig.\n\n" + exitHelp,
		Version:       version(debug.ReadBuildInfo()),
		RunE:          parentRunE,
		SilenceErrors: true, // run prints the error itself
		SilenceUsage:  true,
	}
	root.SetVersionTemplate("spillway {{.Version}}\n")
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	// Flag errors are bad input too.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return inputError{err} })
	root.AddCommand(newSizeCmd(e))
	root.AddCommand(newDemoCmd(e))
	root.AddCommand(newBenchCmd(e))
	root.AddCommand(newConfigCmd(e))
	root.AddCommand(newLagCmd(e))
	typedArgs(root)
	return root
}

// parentRunE runs a command that only groups subcommands: without
// arguments it prints its help; an argument is a subcommand that does not
// exist (cobra hands it here because the command is runnable).
func parentRunE(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return cmd.Help()
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2 // cobra's default, which SuggestionsFor does not apply
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return inputError{errors.New(msg)}
}

// typedArgs makes the argument validator of cmd and its subcommands return
// an inputError, so that a wrong argument count exits with exitBadInput.
func typedArgs(cmd *cobra.Command) {
	if v := cmd.Args; v != nil {
		cmd.Args = func(cmd *cobra.Command, args []string) error {
			if err := v(cmd, args); err != nil {
				return inputError{err}
			}
			return nil
		}
	} else if cmd.HasSubCommands() {
		// Let an unknown subcommand reach parentRunE instead of cobra's
		// untyped legacy check.
		cmd.Args = cobra.ArbitraryArgs
	}
	for _, c := range cmd.Commands() {
		typedArgs(c)
	}
}

// version renders the build information: the main module's version and,
// when the binary was built from a VCS checkout, the revision, its time and
// whether the tree was modified; then the Go version. A development build
// without a revision says how to get one: go run and -buildvcs=false leave
// it out, go build in a git clone records it.
func version(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "(unknown version: no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	switch {
	case rev != "":
		v += " (revision " + rev
		if at != "" {
			v += ", " + at
		}
		if modified {
			v += ", modified"
		}
		v += ")"
	case v == "(devel)":
		v += " (no VCS revision: go run and -buildvcs=false leave it out; " +
			"go build or go install ./cmd/spillway in a git clone (not a worktree) records it)"
	}
	if bi.GoVersion != "" {
		v += " " + bi.GoVersion
	}
	return v
}

// run executes the command line args and returns the exit code. Errors are
// printed on stderr as "<command path>: <problem>", one line per problem
// (spillway config lists every bad field).
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
	for _, line := range strings.Split(err.Error(), "\n") {
		fmt.Fprintf(e.stderr, "%s: %s\n", path, line)
	}
	var in inputError
	if errors.As(err, &in) {
		return exitBadInput
	}
	return exitFailure
}

func main() {
	// "spillway bench" runs its Kafka broker, and "spillway bench
	// autoscale" its workers, as child processes of this executable.
	if kafkaproc.ServeIfAsked() || autoscale.ServeWorkerIfAsked() {
		return
	}
	e := &env{stdout: os.Stdout, stderr: os.Stderr, stderrTTY: isTerminal(os.Stderr)}
	os.Exit(run(os.Args[1:], e))
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
