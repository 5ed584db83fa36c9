package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// inspectConfig is what `sluice inspect` reads from flags and environment.
type inspectConfig struct {
	data   string
	prefix string
	limit  int
	format string
	kind   string
	at     int64
}

// newInspectFlagSet defines the flags of sluice inspect on cfg.
func newInspectFlagSet(cfg *inspectConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.data, "data", "./sluice-data", "data directory to read (a stopped server's, or a CHECKPOINT copy)")
	fs.StringVar(&cfg.prefix, "prefix", "", "list only records whose key starts with this")
	fs.StringVar(&cfg.kind, "kind", "", "list only records of this kind ("+kindNames()+"); empty for all")
	intVar(fs, &cfg.limit, "limit", 0, "list at most this many records; 0 for all")
	fs.StringVar(&cfg.format, "format", "text", "output: text (a table) or json (one object per line)")
	int64Var(fs, &cfg.at, "at", 0, "unix time in milliseconds at which to compute tokens and idleness; 0 for now")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice inspect [flags]\n\nLists the records stored in a data directory (token buckets, divvy counters,\nGCRA, fixed-window and sliding-log records), read-only: a read-only directory\nor mount is read without writing anything. The directory must not be in use\nby a running server. Flags also read SLUICE_<NAME>.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// inspectCommand is sluice inspect: it lists the records of a data
// directory, of every kind, without a server: read only, and refused while
// a server holds the directory.
type inspectCommand struct{}

func (inspectCommand) run(inv invocation, args []string) error {
	lookupEnv, stdout, stderr := inv.lookupEnv, inv.stdout, inv.stderr
	var cfg inspectConfig
	fs := newInspectFlagSet(&cfg, stderr)
	if err := parseArgs(fs, args, lookupEnv); err != nil {
		return err
	}
	if cfg.format != "text" && cfg.format != "json" {
		return fmt.Errorf("--format %q: want text or json", cfg.format)
	}
	if cfg.limit < 0 {
		return fmt.Errorf("--limit %d: want 0 (all) or more", cfg.limit)
	}
	var onlyKind *keyspace.Kind
	if cfg.kind != "" {
		for _, k := range keyspace.Kinds() {
			if k.Name == cfg.kind {
				onlyKind = k
			}
		}
		if onlyKind == nil {
			return fmt.Errorf("--kind %q: want one of %s", cfg.kind, kindNames())
		}
	}
	now := cfg.at
	if now == 0 {
		now = time.Now().UnixMilli()
	}
	if now > math.MaxInt64/int64(1e6) || now < math.MinInt64/int64(1e6) {
		return fmt.Errorf("--at %d: out of range: want unix milliseconds from %d to %d", cfg.at, math.MinInt64/int64(1e6), math.MaxInt64/int64(1e6))
	}
	nowNs := now * 1e6

	var (
		tw     *tabwriter.Writer
		listed int
		other  int
		bad    int // records that do not decode
		werr   error
		line   []byte
	)
	if cfg.format == "text" {
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KIND\tSLOT\tKEY\tPARAMS\tSTATE\tIDLE")
	}
	prefix := []byte(cfg.prefix)
	err := storage.Inspect(cfg.data, func(k, v []byte) bool {
		r, err := keyspace.Parse(k)
		if err != nil {
			other++
			return true
		}
		if (onlyKind != nil && r.Kind != onlyKind) || !bytes.HasPrefix(r.Key, prefix) {
			return true
		}
		d, err := r.Describe(v, nowNs)
		if err != nil {
			// Report it and go on: the rest of the store is worth seeing.
			bad++
			fmt.Fprintf(stderr, "corrupt record: %s %s (%d value bytes): %v; skipped\n", r.Kind.Name, strconv.Quote(string(r.Key)), len(v), err)
			return true
		}
		if tw != nil {
			params := d.Params
			if params == "" {
				params = "-"
			}
			_, werr = fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", r.Kind.Name, r.Slot, strconv.Quote(string(r.Key)), params, d.State, yesNo(d.Idle))
		} else {
			line, werr = appendInspectJSON(line[:0], r, d)
			if werr == nil {
				_, werr = stdout.Write(line)
			}
		}
		listed++
		return werr == nil && (cfg.limit == 0 || listed < cfg.limit)
	}, func(c storage.Corruption) {
		if tw != nil {
			tw.Flush() // the rows before it first
		}
		fmt.Fprintf(stderr, "corrupt table %s, keys %s to %s: %v; its records not listed above are skipped\n",
			c.File, strconv.Quote(string(c.Start)), strconv.Quote(string(c.End)), c.Err)
	})
	if err != nil && !errors.Is(err, storage.ErrCorrupt) {
		return err
	}
	if werr != nil {
		return werr
	}
	if tw != nil {
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(stderr, "%d records listed", listed)
	if other > 0 {
		fmt.Fprintf(stderr, "; %d records of no known kind skipped", other)
	}
	fmt.Fprintln(stderr)
	switch {
	case err != nil:
		return err
	case bad > 0:
		return fmt.Errorf("inspect %s: %d records could not be decoded (listed on stderr); the rest is listed", cfg.data, bad)
	}
	return nil
}

// appendInspectJSON appends one record of `sluice inspect --format json`:
// kind, slot, the key ("key", or "key_hex" when it is not UTF-8), the kind's
// own fields in their order, and idle, on one line.
func appendInspectJSON(b []byte, r keyspace.Record, d keyspace.Description) ([]byte, error) {
	b = append(b, `{"kind":`...)
	b = strconv.AppendQuote(b, r.Kind.Name)
	b = append(b, `,"slot":`...)
	b = strconv.AppendUint(b, uint64(r.Slot), 10)
	if utf8.Valid(r.Key) {
		b = append(b, `,"key":`...)
		k, err := json.Marshal(string(r.Key))
		if err != nil {
			return b, err
		}
		b = append(b, k...)
	} else {
		b = append(b, `,"key_hex":"`...)
		b = hex.AppendEncode(b, r.Key)
		b = append(b, '"')
	}
	for _, f := range d.Fields {
		v, err := json.Marshal(f.Value)
		if err != nil {
			return b, err
		}
		b = append(b, ',')
		b = strconv.AppendQuote(b, f.Name)
		b = append(b, ':')
		b = append(b, v...)
	}
	b = append(b, `,"idle":`...)
	b = strconv.AppendBool(b, d.Idle)
	return append(b, "}\n"...), nil
}

func kindNames() string {
	var names []string
	for _, k := range keyspace.Kinds() {
		names = append(names, k.Name)
	}
	return strings.Join(names, ", ")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
