package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// repairConfig is what `sluice repair` reads from flags and environment.
type repairConfig struct {
	data   string
	dryRun bool
}

// newRepairFlagSet defines the flags of sluice repair on cfg.
func newRepairFlagSet(cfg *repairConfig, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice repair", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.data, "data", "./sluice-data", "data directory to repair (a stopped server's)")
	boolVar(fs, &cfg.dryRun, "dry-run", false, "report what a repair would do, and change nothing")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice repair --data DIR [--dry-run]\n\nChecks every table of a stopped server's store and, when some cannot be\nread, moves them aside into DIR/lost/ and removes them from the store. The\nlimits only they held start afresh; those they changed come back as they\nwere before (older); every other limit is kept. It reports each table, its\nkeys and what was kept, and leaves a store that opens. Exits 0\nwhen the store is repaired or needs no repair, 1 when it cannot be repaired.\nFlags also read SLUICE_<NAME>.\n\n")
		fs.PrintDefaults()
	}
	return fs
}

// repairCommand is sluice repair: it repairs a data directory whose tables
// cannot all be read, and prints what it found and did, which it also
// saves beside the tables it moved aside.
type repairCommand struct{}

func (repairCommand) run(inv invocation, args []string) error {
	ctx, lookupEnv, stdout, stderr := inv.ctx, inv.lookupEnv, inv.stdout, inv.stderr
	var cfg repairConfig
	fs := newRepairFlagSet(&cfg, stderr)
	if err := parseArgs(fs, args, lookupEnv); err != nil {
		return err
	}
	dropped := map[string]int64{}
	rep, err := storage.Repair(ctx, cfg.data, storage.RepairOptions{
		DryRun:  cfg.dryRun,
		Dropped: func(k []byte) { dropped[keyKindName(k)]++ },
	})
	if err != nil && rep.Checked == 0 {
		return err
	}
	var b bytes.Buffer
	writeRepairReport(&b, cfg, rep, dropped, err)
	if _, werr := stdout.Write(b.Bytes()); werr != nil && err == nil {
		err = werr
	}
	if rep.LostDir != "" {
		if werr := os.WriteFile(filepath.Join(rep.LostDir, "report.txt"), b.Bytes(), 0o644); werr != nil && err == nil {
			err = fmt.Errorf("save the report: %w", werr)
		}
	}
	return err
}

// writeRepairReport writes what Repair found and did, in words. failed is
// Repair's error, if it stopped part of the way.
func writeRepairReport(w io.Writer, cfg repairConfig, rep storage.RepairReport, dropped map[string]int64, failed error) {
	fmt.Fprintf(w, "checked %s in %s: ", count(rep.Checked, "table"), cfg.data)
	if len(rep.Tables) == 0 {
		if failed == nil {
			fmt.Fprintln(w, "every one reads; nothing to repair")
		} else {
			fmt.Fprintln(w, "every one reads")
		}
		return
	}
	fmt.Fprintf(w, "%d cannot be read\n", len(rep.Tables))
	for _, t := range rep.Tables {
		fmt.Fprintf(w, "table %s (level %d, %d bytes) cannot be read: %v\n", t.File, t.Level, t.Size, t.Err)
		last := describeKey(t.Largest)
		if t.LargestExclusive {
			last = "just before " + last
		}
		fmt.Fprintf(w, "  keys from %s to %s (%s)\n", describeKey(t.Smallest), last, slotSpan(t.Smallest, t.Largest))
		if t.Records >= 0 {
			fmt.Fprintf(w, "  records in it: %d, as its properties count them\n", t.Records)
		} else {
			fmt.Fprintf(w, "  records in it: unknown (its properties cannot be read; its writes have sequence numbers %d to %d)\n", t.SmallestSeq, t.LargestSeq)
		}
		switch {
		case t.Missing:
			fmt.Fprintln(w, "  its file is missing: nothing to move aside")
		case t.SavedAs != "":
			fmt.Fprintf(w, "  moved to %s\n", t.SavedAs)
		}
	}
	for _, r := range rep.Ranges {
		first, last := describeRange(r.Start, r.End)
		fmt.Fprintf(w, "key range rewritten without %s, from %s to %s (%s):\n", strings.Join(r.Lost, ", "), first, last, slotSpan(r.Start, r.End))
		fmt.Fprintf(w, "  %s of readable tables kept, as their newest readable version\n", count(r.Kept, "record"))
		fmt.Fprintf(w, "  %s of them written before the lost tables' last write: any change the lost tables made to them is lost, and they are back as they were before it\n", count(r.Older, "record"))
		fmt.Fprintln(w, "  records only the lost tables held are gone: those limits start afresh")
		if r.NoKeep {
			fmt.Fprintf(w, "  %s of readable tables dropped too: a readable table in the range holds range deletions, which repair does not apply\n", count(r.Dropped, "record"))
		}
		if len(r.Entries) > 0 {
			var parts []string
			for _, e := range r.Entries {
				parts = append(parts, fmt.Sprintf("%s %d", e.File, e.Entries))
			}
			fmt.Fprintf(w, "  entries (versions and deletions) the readable tables held in it: %s\n", strings.Join(parts, ", "))
		}
	}
	if len(rep.StaleMeta) > 0 {
		fmt.Fprintf(w, "server records brought back as they were before a lost table's writes: %s", strings.Join(rep.StaleMeta, ", "))
		if slices.ContainsFunc(rep.StaleMeta, func(n string) bool { return strings.HasPrefix(n, "cluster.") }) {
			fmt.Fprint(w, "; the cluster state may be older than the rest of the cluster's, so the server refuses to start on this store until --accept-repaired-cluster-state says it is current (docs/operations.md, sluice repair)")
		}
		fmt.Fprintln(w)
	}
	if len(dropped) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(dropped)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, dropped[k]))
		}
		fmt.Fprintf(w, "records dropped, by kind: %s\n", strings.Join(parts, ", "))
	}
	switch {
	case failed != nil:
		fmt.Fprintf(w, "repair stopped: %v\n", failed)
	case cfg.dryRun:
		fmt.Fprintf(w, "dry run: nothing changed. Records still only in the log are not counted: they are newer than every table and are kept. Run sluice repair --data %s to repair.\n", cfg.data)
	default:
		if rep.MarkerRewritten {
			fmt.Fprintln(w, "the store's format marker was in a lost table: written again")
		}
		fmt.Fprintf(w, "repaired: the store opens. The lost tables, a copy of the MANIFEST as it was and this report (report.txt) are in %s\n", rep.LostDir)
	}
}

// describeRange names the first and last key of [start, end) for a
// report.
func describeRange(start, end []byte) (first, last string) {
	if n := len(end); n > 0 && end[n-1] == 0 {
		// end is the key just after an inclusive last one.
		return describeKey(start), describeKey(end[:n-1])
	}
	return describeKey(start), "just before " + describeKey(end)
}

// describeKey names a store key in a user's terms: its slot, kind and
// client key where the layout of keyspace allows.
func describeKey(k []byte) string {
	switch {
	case len(k) == 0:
		return "the first key"
	case k[0] == 0xff:
		return "the store's own key " + strconv.Quote(string(k))
	}
	if r, err := keyspace.Parse(k); err == nil {
		return fmt.Sprintf("slot %d %s %s", r.Slot, r.Kind.Name, strconv.Quote(string(r.Key)))
	}
	if slot, ok := keyspace.RecordSlot(k); ok {
		s := fmt.Sprintf("slot %d", slot)
		if kind := keyspace.KindOf(k); kind != nil {
			s += " " + kind.Name
		}
		return s + " (key bytes " + strconv.Quote(string(k)) + ")"
	}
	return strconv.Quote(string(k))
}

// slotSpan names the hash slots the keys from first to last lie in.
func slotSpan(first, last []byte) string {
	slot := func(k []byte, dflt uint16) (uint16, bool) {
		switch {
		case len(k) > 0 && k[0] == 0xff:
			return keyspace.Slots - 1, true
		case len(k) < 2:
			return dflt, false
		}
		if s, ok := keyspace.RecordSlot(k); ok {
			return s, false
		}
		return keyspace.Slots - 1, false // past every slot's records
	}
	a, _ := slot(first, 0)
	b, own := slot(last, 0)
	s := fmt.Sprintf("hash slots %d to %d", a, b)
	if a == b {
		s = fmt.Sprintf("hash slot %d", a)
	}
	if len(first) > 0 && first[0] == 0xff {
		return "the store's own keys only"
	}
	if own {
		s += ", and the store's own keys (its format marker and settings)"
	}
	return s
}

// count is n nouns, in words: "1 table", "2 tables".
func count[N int | int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// keyKindName is the kind of a store key, for the counts of records
// dropped.
func keyKindName(k []byte) string {
	if len(k) > 0 && k[0] == 0xff {
		return "store's own"
	}
	if r, err := keyspace.Parse(k); err == nil {
		return r.Kind.Name
	}
	return "of no known kind"
}
