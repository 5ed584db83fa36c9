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

// subcommand runs sluice's subcommand args[0] with the rest of args, and
// reports false when args name none: then sluice serves. Each subcommand
// has its own flags and environment variables.
func subcommand(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) (bool, error) {
	if len(args) == 0 {
		return false, nil
	}
	rest := args[1:]
	switch {
	case args[0] == "inspect":
		return true, runInspect(rest, lookupEnv, stdout, stderr)
	case args[0] == "health":
		return true, runHealth(rest, lookupEnv, stdout, stderr)
	case args[0] == "backup":
		return true, runBackup(ctx, rest, lookupEnv, stdout, stderr)
	case args[0] == "repair":
		return true, runRepair(ctx, rest, lookupEnv, stdout, stderr)
	case args[0] == "cluster":
		return true, runCluster(ctx, rest, lookupEnv, stdout, stderr)
	}
	return false, nil
}
