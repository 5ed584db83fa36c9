package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"
)

// sluice parses its command lines itself rather than with
// flag.FlagSet.Parse, which answers a mistyped flag with "flag provided
// but not defined" followed by the whole usage, and a bad number with
// "parse error". Here every flag's value type says what was wrong and what
// it wants, the error names the flag (or its environment variable) and
// gives an example, an unknown flag gets the closest known one, and only
// --help prints the usage. The FlagSet still holds the flags: their
// values, defaults, usage and which were set (Visit).

// parseArgs sets fs's flags from their SLUICE_* environment variables
// (those in noEnv have none), then from args, where a flag wins over its
// variable, and refuses arguments that are not flags. --help prints the
// usage and returns flag.ErrHelp.
func parseArgs(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	rest, err := parseArgsRest(fs, args, lookupEnv)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected argument %q: %s takes only flags (%s --help lists them)", rest[0], fs.Name(), fs.Name())
	}
	return nil
}

// parseArgsRest is parseArgs for a command that takes arguments after
// its flags (sluice cluster send: the command to send): it returns them.
func parseArgsRest(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) ([]string, error) {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if envErr != nil || noEnv[f.Name] {
			return
		}
		if v, ok := lookupEnv(envName(f.Name)); ok {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = newValueError(fs, f, v, true, err)
			}
		}
	})
	if envErr != nil {
		return nil, envErr
	}
	return parseFlags(fs, args)
}

// parseFlags sets fs's flags from args with flag.FlagSet.Parse's syntax
// (-name, --name, -name=value, -name value; a switch takes no separate
// value; -- ends the flags) and returns the arguments after the flags.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	for len(args) > 0 {
		a := args[0]
		if len(a) < 2 || a[0] != '-' {
			return args, nil
		}
		args = args[1:]
		name := a[1:]
		if name[0] == '-' {
			name = name[1:]
			if name == "" {
				return args, nil
			}
		}
		if name[0] == '-' || name[0] == '=' {
			return nil, fmt.Errorf("bad flag syntax %q: want --name value or --name=value (%s --help lists the flags)", a, fs.Name())
		}
		name, value, hasValue := strings.Cut(name, "=")
		f := fs.Lookup(name)
		if f == nil {
			if name == "help" || name == "h" {
				fs.Usage()
				return nil, flag.ErrHelp
			}
			return nil, unknownFlag(fs, name)
		}
		if isSwitch(f) {
			if !hasValue {
				if len(args) > 0 && isBoolWord(args[0]) {
					return nil, fmt.Errorf("--%s %s: --%s is a switch and takes no separate value: write --%s=%s, or --%s alone for true", name, args[0], name, name, args[0], name)
				}
				value = "true"
			}
		} else if !hasValue {
			if len(args) == 0 {
				return nil, fmt.Errorf("--%s needs a value, e.g. %s (%s --help describes it)", name, examples(fs, f, nil, false), fs.Name())
			}
			value, args = args[0], args[1:]
			if isFlag(fs, value) {
				// flag.FlagSet.Parse would take it as the value.
				return nil, fmt.Errorf("--%s needs a value before %s, e.g. %s", name, value, examples(fs, f, nil, false))
			}
		}
		if err := fs.Set(name, value); err != nil {
			return nil, newValueError(fs, f, value, false, err)
		}
	}
	return nil, nil
}

// isSwitch reports whether f is a boolean flag, given without a value.
func isSwitch(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// isFlag reports whether s names one of fs's flags, as -name, --name or
// --name=value.
func isFlag(fs *flag.FlagSet, s string) bool {
	name, _, _ := strings.Cut(strings.TrimLeft(s, "-"), "=")
	return strings.HasPrefix(s, "-") && name != "" && fs.Lookup(name) != nil
}

func isBoolWord(s string) bool {
	_, err := parseBool(s)
	return err == nil
}

// redisFlagNames maps the redis.conf names a Redis user may type as flags
// to the sluice flag that does their job, with how to write it.
var redisFlagNames = map[string]struct{ flag, how string }{
	"port":        {"addr", "sluice takes the port in --addr host:port, e.g. --addr 127.0.0.1:9049, or --addr :9049 for every interface"},
	"bind":        {"addr", "sluice takes the address in --addr host:port, e.g. --addr 0.0.0.0:9049"},
	"dir":         {"data", "the data directory is --data, e.g. --data /var/lib/sluice"},
	"appendfsync": {"fsync", "sluice's is --fsync, with Redis' values: always, everysec or no"},
	"loglevel":    {"log-level", "sluice's is --log-level: debug, info, warn or error"},
}

// unknownFlag is the error for a flag fs does not define: it names the
// flag fs has for a redis.conf name, or the closest flag when a typo could
// explain it.
func unknownFlag(fs *flag.FlagSet, name string) error {
	if r, ok := redisFlagNames[strings.ToLower(name)]; ok && fs.Lookup(r.flag) != nil {
		return fmt.Errorf("unknown flag --%s: %s", name, r.how)
	}
	best, closest := -1, ""
	fs.VisitAll(func(f *flag.Flag) {
		d := editDistance(strings.ToLower(name), f.Name)
		// As for environment variables (findUnknownEnv): enough for
		// typos, too few to pair unrelated names.
		if d <= max(2, len(f.Name)/4) && (best < 0 || d < best) {
			best, closest = d, f.Name
		}
	})
	if closest != "" {
		return fmt.Errorf("unknown flag --%s: did you mean --%s? (%s --help lists the flags)", name, closest, fs.Name())
	}
	return fmt.Errorf("unknown flag --%s (%s --help lists the flags)", name, fs.Name())
}

// valueError is a flag value that its flag's type refused, from the
// command line or from the flag's environment variable.
type valueError struct {
	source  string // --name, or SLUICE_NAME=value
	value   string
	problem string // what was wrong and what is wanted
	example string // --name value, or SLUICE_NAME=value
	err     error
}

func (e *valueError) Error() string {
	if strings.HasPrefix(e.source, "--") {
		return fmt.Sprintf("%s %q: %s; e.g. %s", e.source, e.value, e.problem, e.example)
	}
	return fmt.Sprintf("environment variable %s: %s; e.g. %s", e.source, e.problem, e.example)
}

func (e *valueError) Unwrap() error { return e.err }

// newValueError wraps err, which f's value refused v with: it names the
// flag (or, from the environment, its variable and the flag) and gives
// examples of what f takes.
func newValueError(fs *flag.FlagSet, f *flag.Flag, v string, fromEnv bool, err error) error {
	problem := err.Error()
	var p *badValue
	var sugg []string
	if errors.As(err, &p) {
		problem, sugg = p.problem, p.suggest
	}
	if fromEnv {
		return &valueError{
			source:  fmt.Sprintf("%s=%q (--%s)", envName(f.Name), v, f.Name),
			value:   v,
			problem: problem,
			example: examples(fs, f, sugg, true),
			err:     err,
		}
	}
	return &valueError{source: "--" + f.Name, value: v, problem: problem, example: examples(fs, f, sugg, false), err: err}
}

// examples gives values f takes, written as flags (--name value) or as its
// variable (SLUICE_NAME=value): those suggested for a refused value, else
// f's default where it shows the form, else its type's example.
func examples(fs *flag.FlagSet, f *flag.Flag, suggested []string, env bool) string {
	vals := suggested
	if len(vals) == 0 {
		switch {
		case f.DefValue != "" && f.DefValue != "0" && f.DefValue != "-1" && f.DefValue != "false":
			vals = []string{f.DefValue}
		default:
			if ex, ok := f.Value.(interface{ example() string }); ok {
				vals = []string{ex.example()}
			} else { // a string flag, whose every value is taken
				vals = []string{"VALUE"}
			}
		}
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		if env {
			out[i] = envName(f.Name) + "=" + v
		} else {
			out[i] = "--" + f.Name + " " + v
		}
	}
	return strings.Join(out, " or ")
}

// badValue is what a flag value type says about a value it refuses: the
// problem, and values to suggest in its place ("" for the flag's usual
// example).
type badValue struct {
	problem string
	suggest []string
}

func (b *badValue) Error() string { return b.problem }

// intValue is an int flag; flag.IntVar's says only "parse error".
type intValue int

func intVar(fs *flag.FlagSet, p *int, name string, def int, usage string) {
	*p = def
	fs.Var((*intValue)(p), name, usage)
}

func (v *intValue) String() string  { return strconv.Itoa(int(*v)) }
func (v *intValue) example() string { return "100" }

func (v *intValue) Set(s string) error {
	n, err := parseInt(s, strconv.IntSize)
	if err != nil {
		return err
	}
	*v = intValue(n)
	return nil
}

// int64Value is an int64 flag.
type int64Value int64

func int64Var(fs *flag.FlagSet, p *int64, name string, def int64, usage string) {
	*p = def
	fs.Var((*int64Value)(p), name, usage)
}

func (v *int64Value) String() string  { return strconv.FormatInt(int64(*v), 10) }
func (v *int64Value) example() string { return "1700000000000" }

func (v *int64Value) Set(s string) error {
	n, err := parseInt(s, 64)
	if err != nil {
		return err
	}
	*v = int64Value(n)
	return nil
}

// parseInt reads a whole number of bits bits as flag's ints do (decimal,
// or 0x, 0o, 0b), saying what is wrong with one it refuses.
func parseInt(s string, bits int) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 0, bits)
	if errors.Is(err, strconv.ErrRange) {
		lo, hi := int64(math.MinInt64)>>(64-bits), int64(math.MaxInt64)>>(64-bits)
		return 0, &badValue{problem: fmt.Sprintf("out of range: want a whole number from %d to %d", lo, hi)}
	}
	if err != nil {
		if _, ferr := strconv.ParseFloat(strings.TrimSpace(s), 64); ferr == nil {
			return 0, &badValue{problem: "not a whole number: want one without a fraction or exponent"}
		}
		return 0, &badValue{problem: "not a number: want a whole number"}
	}
	return n, nil
}

// durationValue is a time.Duration flag. flag.DurationVar says only
// "parse error", also for a number without a unit, which Redis users
// write for seconds: here it is refused with the value in seconds as the
// example, as a bare number could as well be meant in milliseconds.
type durationValue time.Duration

func durationVar(fs *flag.FlagSet, p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var((*durationValue)(p), name, usage)
}

func (v *durationValue) example() string { return "30s" }

// String writes the duration without Go's zero parts: 10m, not 10m0s.
func (v *durationValue) String() string {
	s := time.Duration(*v).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (v *durationValue) Set(s string) error {
	t := strings.TrimSpace(s)
	d, err := time.ParseDuration(t)
	if err == nil {
		*v = durationValue(d)
		return nil
	}
	if _, ferr := strconv.ParseFloat(t, 64); ferr == nil {
		if t == "0" {
			*v = 0
			return nil
		}
		return &badValue{problem: "a duration needs a unit: ms, s, m or h", suggest: []string{t + "s"}}
	}
	return &badValue{problem: "not a duration: want a number with a unit (ms, s, m or h)"}
}

// boolValue is a switch; its value, when written, is true or false, or
// Redis' yes or no.
type boolValue bool

func boolVar(fs *flag.FlagSet, p *bool, name string, def bool, usage string) {
	*p = def
	fs.Var((*boolValue)(p), name, usage)
}

func (v *boolValue) IsBoolFlag() bool { return true }
func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) example() string  { return "true" }

func (v *boolValue) Set(s string) error {
	b, err := parseBool(s)
	if err != nil {
		return err
	}
	*v = boolValue(b)
	return nil
}

func parseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "yes", "1", "t":
		return true, nil
	case "false", "no", "0", "f":
		return false, nil
	}
	return false, &badValue{problem: "not a boolean: want true or false (or yes or no)"}
}

// addrValue is a listen address: host:port, where an empty host is every
// interface. net.Listen's own error for a port alone ("missing port in
// address") comes only once the store is open.
type addrValue struct {
	p        *string
	optional bool   // empty turns the listener off
	ex       string // an example
}

func addrVar(fs *flag.FlagSet, p *string, name, def, example string, optional bool, usage string) {
	*p = def
	fs.Var(&addrValue{p: p, optional: optional, ex: example}, name, usage)
}

func (v *addrValue) String() string {
	if v.p == nil { // the zero value flag.PrintDefaults makes
		return ""
	}
	return *v.p
}

func (v *addrValue) example() string { return v.ex }

func (v *addrValue) Set(s string) error {
	if s == "" && v.optional {
		*v.p = ""
		return nil
	}
	if err := checkListenAddr(s, v.ex); err != nil {
		return err
	}
	*v.p = s
	return nil
}

// checkListenAddr checks that s is host:port with a numeric port.
func checkListenAddr(s, example string) error {
	_, ex, _ := strings.Cut(example, ":")
	if s == "" {
		return &badValue{problem: "empty: want host:port", suggest: []string{example}}
	}
	if _, err := strconv.ParseUint(s, 10, 16); err == nil {
		return &badValue{problem: "a port alone is not an address: want host:port, with the host empty for every interface", suggest: []string{"127.0.0.1:" + s, ":" + s}}
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return &badValue{problem: "not host:port (an IPv6 host goes in brackets, [::1]:" + ex + ")", suggest: []string{example, ":" + ex}}
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return &badValue{problem: fmt.Sprintf("port %q is not a number from 0 to 65535 (0 picks a free one)", port), suggest: []string{net.JoinHostPort(host, ex)}}
	}
	return nil
}

// byteSize is a flag value in bytes: a whole number, optionally followed
// by a unit, any case, as redis.conf takes them (k = 1000, kb = 1024,
// m = 1000², mb = 1024², g = 1000³, gb = 1024³, b = 1), or as sluice
// writes them (KiB, MiB, GiB: powers of 1024). 512, 64mb, 1gb, 100k, 16MiB.
type byteSize int64

// String writes the size in the largest binary unit that divides it
// (64MiB), so --help shows defaults as they are written.
func (b *byteSize) String() string { return humanSize(int64(*b)) }

func (b *byteSize) example() string { return "64mb" }

func (b *byteSize) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// sizeUnits are the units parseSize takes, in lower case.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1e3, "kb": 1 << 10, "kib": 1 << 10,
	"m": 1e6, "mb": 1 << 20, "mib": 1 << 20,
	"g": 1e9, "gb": 1 << 30, "gib": 1 << 30,
}

// maxSize bounds sizes, far above any that makes sense, so that sums of a
// few of them cannot overflow.
const maxSize = 1 << 62

func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && '0' <= t[i] && t[i] <= '9' {
		i++
	}
	unit := strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := sizeUnits[unit]
	switch {
	case strings.HasPrefix(t, "-"):
		return 0, &badValue{problem: "a size cannot be negative"}
	case i == 0 || !ok:
		return 0, &badValue{problem: "not a size: want bytes, or a whole number with a unit as in redis.conf (k, kb, m, mb, g, gb; k = 1000, kb = 1024) or KiB, MiB, GiB"}
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n > maxSize/mult {
		return 0, &badValue{problem: fmt.Sprintf("out of range: want at most %d bytes (%s)", int64(maxSize), humanSize(maxSize))}
	}
	return n * mult, nil
}

// humanSize writes n bytes in the largest unit parseSize takes back that
// divides it.
func humanSize(n int64) string {
	for _, u := range []struct {
		mult int64
		name string
	}{{1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}
