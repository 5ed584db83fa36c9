// Command sluice is a persistent rate-limit server that speaks the Redis
// protocol. Run it with no flags to serve on 127.0.0.1:9049 with its data in
// ./sluice-data; sluice --help lists every flag and environment variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	// Before the heavy packages: see its doc.
	_ "github.com/sluicehq/sluice/cmd/sluice/internal/earlyhup"
)

// version and revision are stamped at build time with -ldflags
// "-X main.version=v1.2.3 -X main.revision=<commit>" (scripts/release.sh,
// the Dockerfile); when they are not, buildVersion and buildRevision ask
// the Go build information.
var version = ""

var revision = ""

func main() {
	// Signals first: a SIGHUP that arrives while the store opens must wait
	// for the server rather than kill the process (its default action) or,
	// under nohup, be ignored.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal, a second one stops the process at once.
		<-ctx.Done()
		stop()
	}()
	err := runReloading(ctx, hup, os.Args[1:], os.LookupEnv, os.Environ(), os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		if !errors.As(err, new(loggedError)) {
			fmt.Fprintln(os.Stderr, "sluice:", err)
		}
		os.Exit(1)
	}
}

// loggedError is an error run has already logged.
type loggedError struct{ err error }

func (e loggedError) Error() string { return e.err.Error() }
func (e loggedError) Unwrap() error { return e.err }

// run is the whole program: it returns when ctx is done (a signal) or the
// server fails, after a graceful shutdown. SIGHUP reloads the TLS
// certificates and the rule file from the time run starts.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return runReloading(ctx, hup, args, lookupEnv, nil, stdout, stderr)
}

// invocation is what main hands the subcommand it runs.
type invocation struct {
	ctx context.Context
	// hup is SIGHUP, registered before anything else (serve reloads on it);
	// nil in tests.
	hup       <-chan os.Signal
	lookupEnv func(string) (string, bool)
	// environ is the whole environment, whose SLUICE_* variables that no
	// flag reads serve warns about; nil in tests.
	environ        []string
	stdout, stderr io.Writer
}

// command is one of sluice's subcommands. run parses args, the arguments
// after its name, with its own flags and environment variables, and runs
// it.
type command interface {
	run(inv invocation, args []string) error
}

// commands is sluice's table of subcommands, by the name its first
// argument gives. serve, whose name is "", runs when the first argument
// names no other: sluice serves by default.
func commands() map[string]command {
	return map[string]command{
		"":        serveCommand{},
		"inspect": inspectCommand{},
		"health":  healthCommand{},
		"backup":  backupCommand{},
		"repair":  repairCommand{},
		"cluster": clusterCommand{},
	}
}

// dispatch runs the subcommand args name, or serve.
func dispatch(inv invocation, args []string) error {
	table := commands()
	if len(args) > 0 && args[0] != "" {
		if c, ok := table[args[0]]; ok {
			return c.run(inv, args[1:])
		}
	}
	return table[""].run(inv, args)
}

// runReloading is the whole program, run with the SIGHUP channel given:
// main registers it before anything else, so that a SIGHUP received while
// the store opens is acted on once the server runs. environ is the whole
// environment (run, for tests, passes none).
func runReloading(ctx context.Context, hup <-chan os.Signal, args []string, lookupEnv func(string) (string, bool), environ []string, stdout, stderr io.Writer) error {
	return dispatch(invocation{ctx: ctx, hup: hup, lookupEnv: lookupEnv, environ: environ, stdout: stdout, stderr: stderr}, args)
}
