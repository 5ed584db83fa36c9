package main

import (
	"flag"
	"fmt"
)

// parseSubcommand sets fs's flags from their SLUICE_* environment variables,
// then from args (a flag wins over its variable), and refuses arguments
// that are not flags: what `sluice inspect`, `sluice health` and `sluice
// backup` share.
func parseSubcommand(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := lookupEnv(envName(f.Name)); ok && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("environment variable %s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: %s takes only flags", fs.Arg(0), fs.Name())
	}
	return nil
}
