package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/storage"
)

// inspectConfig is what `sluice inspect` reads from flags and environment.
type inspectConfig struct {
	data   string
	prefix string
	limit  int
	format string
	at     int64
}

// runInspect lists the buckets of a data directory without a server: read
// only, and refused while a server holds the directory.
func runInspect(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	var cfg inspectConfig
	fs := flag.NewFlagSet("sluice inspect", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.data, "data", "./sluice-data", "data directory to read (a stopped server's, or a CHECKPOINT copy)")
	fs.StringVar(&cfg.prefix, "prefix", "", "list only buckets whose key starts with this")
	fs.IntVar(&cfg.limit, "limit", 0, "list at most this many buckets; 0 for all")
	fs.StringVar(&cfg.format, "format", "text", "output: text (a table) or json (one object per line)")
	fs.Int64Var(&cfg.at, "at", 0, "unix time in milliseconds at which to compute tokens; 0 for now")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: sluice inspect [flags]\n\nLists the buckets stored in a data directory, read-only. The directory must\nnot be in use by a running server. Flags also read SLUICE_<NAME>.\n\n")
		fs.PrintDefaults()
	}
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
		return fmt.Errorf("unexpected argument %q: sluice inspect takes only flags", fs.Arg(0))
	}
	if cfg.format != "text" && cfg.format != "json" {
		return fmt.Errorf("--format %q: want text or json", cfg.format)
	}
	if cfg.limit < 0 {
		return fmt.Errorf("--limit %d: want 0 (all) or more", cfg.limit)
	}
	now := cfg.at
	if now == 0 {
		now = time.Now().UnixMilli()
	}

	var (
		tw     *tabwriter.Writer
		enc    *json.Encoder
		listed int
		other  int
		bad    int // records that do not decode
		werr   error
	)
	if cfg.format == "text" {
		tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tMAX\tREFILL\tREFILL_MS\tTOKENS\tIDLE\tLAST_WRITE")
	} else {
		enc = json.NewEncoder(stdout)
	}
	prefix := []byte(cfg.prefix)
	err := storage.Inspect(cfg.data, func(k, v []byte) bool {
		p, key, err := bucket.ParseKey(k)
		if err != nil {
			other++
			return true
		}
		if !bytes.HasPrefix(key, prefix) {
			return true
		}
		st, err := bucket.DecodeState(v)
		if err != nil {
			// Report it and go on: the rest of the store is worth seeing.
			bad++
			fmt.Fprintf(stderr, "corrupt record: bucket %s (%d value bytes): %v; skipped\n", strconv.Quote(string(key)), len(v), err)
			return true
		}
		tokens, _ := p.Available(st, true, now)
		row := inspectRow{
			Max: p.Max, Refill: p.RefillAmount, RefillMs: p.RefillMs,
			Tokens: tokens, StoredTokens: st.Amount, AnchorMs: st.Anchor,
			LastWriteMs: st.LastReduce, Idle: p.Idle(st, now),
		}
		if st.HasSession {
			row.SessionStartMs = &st.SessionStart
		}
		if utf8.Valid(key) {
			row.Key = string(key)
		} else {
			row.KeyHex = fmt.Sprintf("%x", key)
		}
		if enc != nil {
			werr = enc.Encode(row)
		} else {
			_, werr = fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\t%s\n", strconv.Quote(string(key)), p.Max, p.RefillAmount, p.RefillMs,
				tokens, yesNo(row.Idle), time.UnixMilli(st.LastReduce).UTC().Format("2006-01-02T15:04:05.000Z"))
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
	fmt.Fprintf(stderr, "%d buckets listed", listed)
	if other > 0 {
		fmt.Fprintf(stderr, "; %d records that are not buckets skipped", other)
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

// inspectRow is one bucket in `sluice inspect --format json`.
type inspectRow struct {
	Key            string `json:"key,omitempty"`
	KeyHex         string `json:"key_hex,omitempty"` // keys that are not UTF-8
	Max            int64  `json:"max"`
	Refill         int64  `json:"refill"`
	RefillMs       int64  `json:"refill_ms"`
	Tokens         int64  `json:"tokens"`        // available at --at
	StoredTokens   int64  `json:"stored_tokens"` // as stored, before refill
	AnchorMs       int64  `json:"anchor_ms"`
	LastWriteMs    int64  `json:"last_write_ms"`
	SessionStartMs *int64 `json:"session_start_ms,omitempty"`
	Idle           bool   `json:"idle"` // full again: the sweep deletes it
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
