package storage

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// How Repair takes a table out of the store. Pebble has no call that drops
// one table from its MANIFEST; what it supports is Excise, which removes
// every key of a range from every level in one MANIFEST edit (its own tool
// offers it as `pebble db excise`), and IngestAndExcise, which does the
// same and adds a table of the caller's in that edit. Repair excises, for
// each group of overlapping unreadable tables, the range from the smallest
// to the largest key their MANIFEST entries give (the tables lie wholly
// inside it, so Pebble drops them without opening them), and in the same
// edit ingests a table holding the newest readable version of every record
// of the range (and the format marker, if only those tables held it). The
// store is then what it was without the unreadable tables: a record they
// changed comes back as it was before (older, which
// for every limit kind is no more permissive than starting afresh), and a
// record only they held starts afresh. A flushed table usually spans most
// of the key space; clearing its whole range instead would have dropped every
// limit of the store to lose one table. Rewriting the MANIFEST by hand
// would need Pebble's internal formats.
//
// Open checks that every table's file has the size the MANIFEST gives;
// Repair turns that off (Pebble's option for a store that cannot be opened
// normally because tables are missing or damaged) so that a truncated or
// missing table does not keep it from opening.

// RepairOptions configures Repair.
type RepairOptions struct {
	// DryRun reports what Repair would do and changes nothing: the store is
	// opened read-only.
	DryRun bool
	// LostDir is where Repair creates the directory it moves unreadable
	// tables to, named after the time; "" means DIR/lost.
	LostDir string
	// Now names that directory; nil means time.Now.
	Now func() time.Time
	// Dropped, if set, is called with the key of every record of a readable
	// table that Repair drops (see ClearedRange.NoKeep). The key is valid
	// only during the call.
	Dropped func(key []byte)

	// afterRange, for tests, is called after each range is cleared; an
	// error stops Repair there, as a crash would.
	afterRange func() error
}

// LostTable is a table Repair found unreadable.
type LostTable struct {
	File  string // its file in the data directory, such as 000041.sst
	Level int
	Size  uint64 // bytes, as the MANIFEST gives it
	// Smallest and Largest are its first and last keys, as the MANIFEST
	// gives them. LargestExclusive says Largest itself is not in it.
	Smallest, Largest []byte
	LargestExclusive  bool
	// SmallestSeq and LargestSeq bound the sequence numbers of its writes.
	SmallestSeq, LargestSeq uint64
	// Records is how many records (entries other than deletions) its
	// properties count, or -1 when they cannot be read.
	Records int64
	Err     error  // why it cannot be read
	Missing bool   // its file is gone
	SavedAs string // where its file was moved; "" in a dry run or if Missing
}

// ClearedRange is a range of keys Repair cleared: [Start, End).
type ClearedRange struct {
	Start, End []byte
	Lost       []string // the unreadable tables in it
	// Kept counts the records of readable tables in the range written back
	// (their newest version). Of those, Older were written before the last
	// write of an unreadable table spanning them: if that table held a newer
	// version, they are back as they were before it. Dropped counts the
	// records of readable tables dropped, which happens only with NoKeep.
	Kept, Older, Dropped int64
	// Entries counts, per readable table, the entries (every version and
	// deletion) it held in the range.
	Entries []TableEntries
	// NoKeep says no record was written back, and the range was cleared,
	// because a readable table in the range holds range deletions, which
	// Repair does not apply (sluice writes none).
	NoKeep bool
}

// TableEntries is how many entries of a table a cleared range held.
type TableEntries struct {
	File    string
	Entries int64
}

// RepairReport is what Repair found and did.
type RepairReport struct {
	Checked int // tables checked
	Tables  []LostTable
	Ranges  []ClearedRange
	// StaleMeta names the server's own records (SetMeta: the cluster's
	// topology, its moves, the node's identity) that came back in a version
	// older than the lost tables' last write: those tables may have held a
	// newer one. They are named in the store too (StaleMeta), in the same
	// step, so that a server does not act on them unawares.
	StaleMeta []string
	// MarkerRewritten says the store's format marker was in a cleared range
	// and has been written again.
	MarkerRewritten bool
	// LostDir is the directory the tables were moved to, with a copy of the
	// MANIFEST as it was; "" when nothing was moved.
	LostDir string
}

// Repair checks every table the store in dir references, wholly (footer,
// index, every block's checksum), moves the unreadable ones aside into a
// new directory under LostDir and removes them from the store, keeping
// every record the readable tables hold (see the top of the file), then
// checks that every record of the store reads. It
// refuses a store another process has open (ErrLocked). Without unreadable
// tables it changes nothing and returns a report without tables. It cannot
// mend a store Pebble cannot open at all (a damaged MANIFEST, or a log
// Pebble refuses to replay): that is an error wrapping ErrCorrupt.
func Repair(ctx context.Context, dir string, o RepairOptions) (rep RepairReport, err error) {
	if _, err := os.Stat(dir); err != nil {
		return rep, fmt.Errorf("repair %s: %w", dir, err)
	}
	if err := checkDir(vfs.Default, dir); err != nil {
		return rep, err
	}
	if desc, err := pebble.Peek(dir, vfs.Default); err != nil || !desc.Exists {
		return rep, fmt.Errorf("%w: %s holds no store", ErrNotStore, dir)
	}
	defer func() {
		// Some damage makes Pebble panic rather than return an error.
		if r := recover(); r != nil {
			err = fmt.Errorf("repair %s: %w: pebble panicked: %v", dir, ErrCorrupt, r)
		}
	}()
	po := &pebble.Options{
		ReadOnly:                    o.DryRun,
		FormatMajorVersion:          pebble.FormatNewest,
		DisableConsistencyCheck:     true,
		DisableAutomaticCompactions: true,
		DisableTableStats:           true,
		Logger:                      pebbleLogger{l: slog.New(slog.DiscardHandler)},
		EventListener:               &pebble.EventListener{DataCorruption: func(pebble.DataCorruptionInfo) {}},
	}
	po.EnsureDefaults() // Open would on a copy; the table reader and writer need them
	db, err := pebble.Open(dir, po)
	if err != nil {
		if lockHeld(err) {
			return rep, fmt.Errorf("%w: %s (is a sluice serving it? stop it first): %w", ErrLocked, dir, err)
		}
		if pebble.IsCorruptionError(err) {
			return rep, fmt.Errorf("repair %s: %w: Pebble cannot open it, and no table is to blame (its MANIFEST or a log is damaged): %w; restore a CHECKPOINT copy", dir, ErrCorrupt, err)
		}
		return rep, fmt.Errorf("repair %s: open: %w", dir, err)
	}
	r := &repairer{dir: dir, db: db, po: po, o: o}
	err = r.run(ctx, &rep)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("repair %s: close: %w", dir, cerr)
	}
	if err != nil || o.DryRun || len(rep.Tables) == 0 {
		return rep, err
	}
	if err := verifyStore(dir); err != nil {
		return rep, fmt.Errorf("repair %s: the store still does not read after the repair: %w", dir, err)
	}
	return rep, nil
}

// repairer is one run of Repair on an open store.
type repairer struct {
	dir string
	db  *pebble.DB
	po  *pebble.Options
	o   RepairOptions
	// backings are the checked table files by number: their properties, or
	// why they cannot be read.
	backings map[uint64]*backing
	kept     int // tables of kept records written
	// markerWritten says a table of kept records holds the format marker
	// anew: no readable table held it.
	markerWritten bool
	stale         []string // RepairReport.StaleMeta
}

type backing struct {
	props   *sstable.Properties
	err     error
	missing bool
}

// tableMeta is a table of the store's current version.
type tableMeta struct {
	level              int
	backing            uint64 // the number of the file holding it
	virtual            bool   // a part of its file (what an excise leaves)
	smallest, largest  pebble.InternalKey
	smallSeq, largeSeq uint64
	size, backingSize  uint64
}

// file is the table's file name in the data directory.
func (t *tableMeta) file() string { return fmt.Sprintf("%06d.sst", t.backing) }

// contains reports whether user key k lies within the table's bounds.
func (t *tableMeta) contains(k []byte) bool {
	if bytes.Compare(k, t.smallest.UserKey) < 0 {
		return false
	}
	c := bytes.Compare(k, t.largest.UserKey)
	return c < 0 || c == 0 && !t.largest.IsExclusiveSentinel()
}

// end is the exclusive upper bound of the table's user keys.
func (t *tableMeta) end() []byte {
	if t.largest.IsExclusiveSentinel() {
		return t.largest.UserKey
	}
	return append(slices.Clip(t.largest.UserKey), 0)
}

func (r *repairer) run(ctx context.Context, rep *RepairReport) error {
	if !r.o.DryRun {
		// Open flushed what the log held; flush again, so that every record
		// is in a table Repair reads.
		if err := r.db.Flush(); err != nil {
			return fmt.Errorf("repair %s: flush: %w", r.dir, err)
		}
	}
	tables := r.tables()
	r.backings = map[uint64]*backing{}
	var bad []*tableMeta
	for _, t := range tables {
		b, ok := r.backings[t.backing]
		if !ok {
			b = r.check(t)
			r.backings[t.backing] = b
			rep.Checked++
		}
		if b.err != nil {
			bad = append(bad, t)
		}
	}
	if len(bad) == 0 {
		if err := scanAll(r.db); err != nil {
			return fmt.Errorf("repair %s: %w: every table checks out, yet a read fails: %w; restore a CHECKPOINT copy", r.dir, ErrCorrupt, err)
		}
		return nil
	}
	for _, t := range bad {
		b := r.backings[t.backing]
		lt := LostTable{
			File: t.file(), Level: t.level, Size: t.size,
			Smallest: t.smallest.UserKey, Largest: t.largest.UserKey, LargestExclusive: t.largest.IsExclusiveSentinel(),
			SmallestSeq: t.smallSeq, LargestSeq: t.largeSeq,
			Records: -1, Err: b.err, Missing: b.missing,
		}
		if b.props != nil && !t.virtual {
			lt.Records = int64(b.props.NumEntries - b.props.NumDeletions)
		}
		rep.Tables = append(rep.Tables, lt)
	}
	spans := mergeSpans(bad)
	if err := r.checkLegacy(spans); err != nil {
		return err
	}
	if !r.o.DryRun {
		if err := r.saveAside(bad, rep); err != nil {
			return err
		}
		for i := range rep.Tables {
			if lt := &rep.Tables[i]; !lt.Missing {
				lt.SavedAs = filepath.Join(rep.LostDir, lt.File)
			}
		}
	}
	for _, s := range spans {
		cr, err := r.clear(ctx, s, tables, rep.LostDir)
		if err != nil {
			return err
		}
		rep.Ranges = append(rep.Ranges, cr)
		if r.o.afterRange != nil && !r.o.DryRun {
			if err := r.o.afterRange(); err != nil {
				return err
			}
		}
	}
	slices.Sort(r.stale)
	rep.StaleMeta = slices.Compact(r.stale)
	if r.o.DryRun {
		return nil
	}
	rep.MarkerRewritten = r.markerWritten
	return nil
}

// tables lists the tables of the store's current version. It reads the
// version's own metadata: DB.SSTables fails on a table whose file is gone.
func (r *repairer) tables() []*tableMeta {
	v := r.db.DebugCurrentVersion()
	var out []*tableMeta
	for level := range v.Levels {
		for m := range v.Levels[level].All() {
			out = append(out, &tableMeta{
				level: level, backing: uint64(m.TableBacking.DiskFileNum), virtual: m.Virtual,
				smallest: m.Smallest().Clone(), largest: m.Largest().Clone(),
				smallSeq: uint64(m.SmallestSeqNum), largeSeq: uint64(m.LargestSeqNum),
				size: m.Size, backingSize: m.TableBacking.Size,
			})
		}
	}
	return out
}

// check reads t's file wholly: its footer, properties, index and every
// block, each against its checksum.
func (r *repairer) check(t *tableMeta) (b *backing) {
	b = &backing{}
	defer func() {
		if p := recover(); p != nil {
			b.err = fmt.Errorf("%w: reading it panicked: %v", ErrCorrupt, p)
		}
	}()
	path := filepath.Join(r.dir, t.file())
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		b.err, b.missing = fmt.Errorf("its file is missing: %w", err), true
		return b
	case err != nil:
		b.err = err
		return b
	case uint64(fi.Size()) != t.backingSize:
		// Still read what can be read: its properties may survive.
		b.err = fmt.Errorf("its file has %d bytes, the MANIFEST says %d", fi.Size(), t.backingSize)
	}
	rd, err := r.openTable(path)
	if err != nil {
		if b.err == nil {
			b.err = err
		}
		return b
	}
	defer rd.Close()
	props, err := rd.ReadPropertiesBlock(context.Background(), nil)
	if err == nil {
		b.props = &props
	}
	if b.err == nil {
		b.err = rd.ValidateBlockChecksums()
	}
	return b
}

// openTable opens the table file path for reading.
func (r *repairer) openTable(path string) (*sstable.Reader, error) {
	f, err := vfs.Default.Open(path)
	if err != nil {
		return nil, err
	}
	readable, err := sstable.NewSimpleReadable(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	rd, err := sstable.NewReader(context.Background(), readable, r.po.MakeReaderOptions())
	if err != nil {
		readable.Close()
		return nil, err
	}
	return rd, nil
}

// span is a range of user keys, [start, end), and the unreadable tables
// that lie in it.
type span struct {
	start, end []byte
	bad        []*tableMeta
}

// mergeSpans groups the unreadable tables whose key ranges overlap, so that
// each span holds its tables wholly.
func mergeSpans(bad []*tableMeta) []span {
	sorted := slices.Clone(bad)
	slices.SortFunc(sorted, func(a, b *tableMeta) int { return bytes.Compare(a.smallest.UserKey, b.smallest.UserKey) })
	var out []span
	for _, t := range sorted {
		if n := len(out); n > 0 && bytes.Compare(t.smallest.UserKey, out[n-1].end) < 0 {
			last := &out[n-1]
			if e := t.end(); bytes.Compare(e, last.end) > 0 {
				last.end = e
			}
			last.bad = append(last.bad, t)
			continue
		}
		out = append(out, span{start: t.smallest.UserKey, end: t.end(), bad: []*tableMeta{t}})
	}
	return out
}

// covered reports whether k lies in one of spans.
func covered(spans []span, k []byte) bool {
	for _, s := range spans {
		if bytes.Compare(k, s.start) >= 0 && bytes.Compare(k, s.end) < 0 {
			return true
		}
	}
	return false
}

// checkLegacy refuses a store of format 1, and one that is not sluice's:
// their markers differ, and an older sluice's store is upgraded by a
// server before anything else. A marker in a range to clear cannot be
// read; the other one tells, except that a store without a readable
// format 2 marker is not of format 2, whatever the other says: every
// format 2 store has one, and stamping a format 1 store with it would
// have its records read as keys of another layout. With both markers in
// ranges to clear, nothing tells, and the store is taken as format 2.
func (r *repairer) checkLegacy(spans []span) error {
	refuse := func(what string) error {
		return fmt.Errorf("repair %s: %w: %s, which repair does not mend; restore a CHECKPOINT copy", r.dir, ErrNotStore, what)
	}
	if !covered(spans, formatKey) {
		v, err := getString(r.db, formatKey)
		switch {
		case err != nil:
			return fmt.Errorf("repair %s: read format marker: %w", r.dir, err)
		case v == formatVersion:
			return nil
		case v != "":
			return refuse(fmt.Sprintf("it holds a store of format %q", v))
		case covered(spans, legacyFormatKey):
			return refuse(fmt.Sprintf("it has no format %s marker, and its format %s marker, if it has one, is in a table that cannot be read: it holds a store of format %s, or none of sluice's", formatVersion, legacyFormatVersion, legacyFormatVersion))
		}
	} else if covered(spans, legacyFormatKey) {
		return nil
	}
	v, err := getString(r.db, legacyFormatKey)
	switch {
	case err != nil:
		return fmt.Errorf("repair %s: read format marker: %w", r.dir, err)
	case v == legacyFormatVersion || v == upgradingVersion:
		return refuse("it holds a store of format " + legacyFormatVersion)
	case !covered(spans, formatKey):
		return refuse("it holds a Pebble store without sluice's format marker")
	}
	return nil
}

// saveAside creates the directory the unreadable tables go to, links each
// one's file into it (the store's own name for it disappears once the
// table is dropped) and copies the MANIFEST as it is now.
func (r *repairer) saveAside(bad []*tableMeta, rep *RepairReport) error {
	parent := r.o.LostDir
	if parent == "" {
		parent = filepath.Join(r.dir, "lost")
	}
	now := time.Now
	if r.o.Now != nil {
		now = r.o.Now
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("repair %s: %w", r.dir, err)
	}
	stamp := now().UTC().Format("20060102T150405Z")
	lost := filepath.Join(parent, stamp)
	for i := 2; ; i++ {
		err := os.Mkdir(lost, 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("repair %s: %w", r.dir, err)
		}
		lost = filepath.Join(parent, fmt.Sprintf("%s-%d", stamp, i))
	}
	rep.LostDir = lost
	saved := map[uint64]bool{}
	for _, t := range bad {
		if saved[t.backing] || r.backings[t.backing].missing {
			continue
		}
		saved[t.backing] = true
		if err := linkOrCopy(filepath.Join(r.dir, t.file()), filepath.Join(lost, t.file())); err != nil {
			return fmt.Errorf("repair %s: move %s aside: %w", r.dir, t.file(), err)
		}
	}
	desc, err := pebble.Peek(r.dir, vfs.Default)
	if err != nil {
		return fmt.Errorf("repair %s: %w", r.dir, err)
	}
	manifest := desc.ManifestFilename
	if !filepath.IsAbs(manifest) && filepath.Dir(manifest) == "." {
		manifest = filepath.Join(r.dir, manifest)
	}
	if err := copyFile(manifest, filepath.Join(lost, filepath.Base(manifest))); err != nil {
		return fmt.Errorf("repair %s: copy the MANIFEST: %w", r.dir, err)
	}
	return syncDir(lost)
}

// linkOrCopy gives src's file the name dst too: a hard link, or a copy
// where the filesystem has none.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return copyFile(src, dst)
}

// copyFile copies src to the new file dst, synced.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// clear takes s's unreadable tables out: it reads every readable table
// overlapping s, writes the newest version of each of their live records
// into a table of its own, and, unless this is a dry run, ingests that table
// while excising s, or excises s when there is nothing to keep.
func (r *repairer) clear(ctx context.Context, s span, tables []*tableMeta, lostDir string) (cr ClearedRange, err error) {
	cr = ClearedRange{Start: s.start, End: s.end}
	for _, t := range s.bad {
		cr.Lost = append(cr.Lost, t.file())
	}
	m := &mergeIter{}
	defer m.close()
	for _, t := range tables {
		if r.backings[t.backing].err != nil || bytes.Compare(t.smallest.UserKey, s.end) >= 0 || bytes.Compare(t.end(), s.start) <= 0 {
			continue
		}
		if p := r.backings[t.backing].props; p != nil && (p.NumRangeDeletions > 0 || p.NumRangeKeys() > 0) {
			cr.NoKeep = true
		}
		if err := m.add(r, t, s); err != nil {
			return cr, fmt.Errorf("repair %s: read %s: %w", r.dir, t.file(), err)
		}
	}

	// The records kept go into a table of their own, made at the first.
	var (
		w    *sstable.Writer
		path string
	)
	defer func() {
		if w != nil {
			w.Close()
		}
		if path != "" {
			os.Remove(path) // once ingested, Pebble has its own link to it
		}
	}()
	startKept := func() error {
		r.kept++
		path = filepath.Join(lostDir, fmt.Sprintf("kept-%d.sst", r.kept))
		f, err := vfs.Default.Create(path, vfs.WriteCategoryUnspecified)
		if err != nil {
			return err
		}
		w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), r.po.MakeWriterOptions(0, r.db.TableFormat()))
		return nil
	}
	set := func(k, v []byte) error {
		if w == nil {
			if err := startKept(); err != nil {
				return err
			}
		}
		if err := w.Set(k, v); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		return nil
	}
	// The format marker, when s holds it and no readable table does, goes
	// into the table of kept records: written afterwards, a crash or a
	// full disk in between would leave a store that neither opens (no
	// marker) nor has anything left to repair. checkLegacy has made sure
	// the store is of format 2.
	needMarker := !r.o.DryRun && covered([]span{s}, formatKey)
	marker := func() error {
		needMarker = false
		if err := set(formatKey, []byte(formatVersion)); err != nil {
			return fmt.Errorf("repair %s: %w", r.dir, err)
		}
		r.markerWritten = true
		return nil
	}
	// The server's own records that may come back older are named in
	// staleMetaKey, in the same table, so that the names are there exactly
	// when the older versions are.
	stale, err := r.staleMeta(s, tables, cr.NoKeep)
	if err != nil {
		return cr, err
	}
	// Raft state that comes back older than it was could make a replica
	// vote twice in a term, or forget entries it acknowledged: the
	// replication keys of the range are dropped, the rest of them after
	// the range is cleared, and the loss named, so that the server has
	// its replicas rejoin under new identities.
	replicaLost := bytes.Compare(s.start, replicaEnd) < 0 && bytes.Compare(s.end, []byte(ReplicaPrefix)) > 0
	// Records that come back older than a replica's applied index says
	// would never be applied again: with replication state in the store,
	// losing records loses the replicas too.
	if !replicaLost && bytes.Compare(s.start, recordsEnd) < 0 {
		replicaLost = r.holdsReplicaKeys()
	}
	if replicaLost {
		stale = append(stale, ReplicaLostName)
		slices.Sort(stale)
		stale = slices.Compact(stale)
	}
	r.stale = append(r.stale, stale...)
	needStale := !r.o.DryRun && len(stale) > 0
	staleValue := []byte(strings.Join(stale, " "))
	if needStale && !covered([]span{s}, staleMetaKey) {
		// Outside the range the excise clears: written, synced, before it.
		needStale = false
		if err := r.addStale(stale); err != nil {
			return cr, err
		}
	}
	entries := map[int]int64{}
	var key, val []byte
	for m.Len() > 0 {
		// The first of a key's versions is its newest.
		top := m.top()
		key = append(key[:0], top.key...)
		kind, seq := top.trailer.Kind(), uint64(top.trailer.SeqNum())
		live := kind == pebble.InternalKeyKindSet || kind == pebble.InternalKeyKindSetWithDelete
		replica := replicaKey(key)
		keep := live && !cr.NoKeep && !replica
		if needStale && bytes.Compare(key, staleMetaKey) >= 0 {
			needStale = false
			if err := set(staleMetaKey, staleValue); err != nil {
				return cr, fmt.Errorf("repair %s: %w", r.dir, err)
			}
			if bytes.Equal(key, staleMetaKey) {
				// Its names are in the new value (staleMeta reads them).
				keep, live = false, false
			}
		}
		if needMarker {
			switch c := bytes.Compare(key, formatKey); {
			case c == 0 && keep:
				needMarker = false // kept as it is
			case c >= 0:
				if err := marker(); err != nil {
					return cr, err
				}
			}
		}
		if keep && !r.o.DryRun {
			v, _, err := top.value(nil)
			if err != nil {
				return cr, fmt.Errorf("repair %s: read %s: %w", r.dir, top.file, err)
			}
			val = append(val[:0], v...)
		}
		// Step past every version of the key.
		for m.Len() > 0 && bytes.Equal(m.top().key, key) {
			i := m.h[0]
			entries[i]++
			if err := m.next(); err != nil {
				return cr, fmt.Errorf("repair %s: read %s: %w", r.dir, m.srcs[i].file, err)
			}
		}
		switch {
		case keep:
			cr.Kept++
			if seq <= maxSeqAt(s.bad, key) {
				cr.Older++
			}
			if r.o.DryRun {
				break
			}
			if err := set(key, val); err != nil {
				return cr, fmt.Errorf("repair %s: %w", r.dir, err)
			}
		case live && !replica:
			cr.Dropped++
			if r.o.Dropped != nil {
				r.o.Dropped(key)
			}
		}
	}
	if needMarker {
		if err := marker(); err != nil {
			return cr, err
		}
	}
	if needStale {
		if err := set(staleMetaKey, staleValue); err != nil {
			return cr, fmt.Errorf("repair %s: %w", r.dir, err)
		}
	}
	for i, src := range m.srcs {
		if n := entries[i]; n > 0 {
			cr.Entries = append(cr.Entries, TableEntries{File: src.file, Entries: n})
		}
	}
	if r.o.DryRun {
		return cr, nil
	}
	kr := pebble.KeyRange{Start: s.start, End: s.end}
	if w != nil {
		err = w.Close()
		w = nil
		if err != nil {
			return cr, fmt.Errorf("repair %s: write %s: %w", r.dir, path, err)
		}
		_, err = r.db.IngestAndExcise(ctx, []string{path}, nil, nil, kr)
	} else {
		err = r.db.Excise(ctx, kr)
	}
	if err != nil {
		return cr, fmt.Errorf("repair %s: clear the range of %v: %w", r.dir, cr.Lost, err)
	}
	if replicaLost {
		if err := r.db.Excise(ctx, pebble.KeyRange{Start: []byte(ReplicaPrefix), End: replicaEnd}); err != nil {
			return cr, fmt.Errorf("repair %s: clear the replication keys: %w", r.dir, err)
		}
	}
	return cr, nil
}

// staleMetaKey is where Repair names the server's own records it brought
// back older than they may have been (StaleMeta).
var staleMetaKey = []byte(metaPrefix + StaleMetaName)

// StaleMetaName is the Meta name under which Repair lists, separated by
// spaces, the names of the server's own records (Meta) it brought back in a
// version older than a lost table's last write. The server reads it before
// trusting them, and removes it (SetMeta with nil) once an operator has
// said they are current.
const StaleMetaName = "repair.stale"

// holdsReplicaKeys reports whether the store holds replication keys;
// true when they cannot be read, which Repair then treats as lost.
func (r *repairer) holdsReplicaKeys() bool {
	it, err := r.db.NewIter(&pebble.IterOptions{LowerBound: []byte(ReplicaPrefix), UpperBound: replicaEnd})
	if err != nil {
		return true
	}
	found := it.First() || it.Error() != nil
	it.Close()
	return found
}

// ReplicaLostName is the name Repair adds to StaleMeta's list when an
// unreadable table held replication keys (ReplicaPrefix): it removes them
// all, and the node's replicas must rejoin their groups under new
// identities, as after a lost volume.
const ReplicaLostName = "replication.lost"

// staleMeta returns the names of the server's own records in s whose newest
// readable version is older than the last write of an unreadable table
// spanning them, with the names an earlier repair left in staleMetaKey. With
// drop (the range is cleared: NoKeep), every one of them counts.
func (r *repairer) staleMeta(s span, tables []*tableMeta, drop bool) ([]string, error) {
	lo, hi := []byte(metaPrefix), []byte(metaPrefix+"\xff")
	sub := span{start: s.start, end: s.end, bad: s.bad}
	if bytes.Compare(sub.start, lo) < 0 {
		sub.start = lo
	}
	if bytes.Compare(sub.end, hi) > 0 {
		sub.end = hi
	}
	if bytes.Compare(sub.start, sub.end) >= 0 {
		return nil, nil
	}
	m := &mergeIter{}
	defer m.close()
	for _, t := range tables {
		if r.backings[t.backing].err != nil || bytes.Compare(t.smallest.UserKey, sub.end) >= 0 || bytes.Compare(t.end(), sub.start) <= 0 {
			continue
		}
		if err := m.add(r, t, sub); err != nil {
			return nil, fmt.Errorf("repair %s: read %s: %w", r.dir, t.file(), err)
		}
	}
	var names []string
	var key []byte
	for m.Len() > 0 {
		top := m.top()
		key = append(key[:0], top.key...)
		kind, seq := top.trailer.Kind(), uint64(top.trailer.SeqNum())
		live := kind == pebble.InternalKeyKindSet || kind == pebble.InternalKeyKindSetWithDelete
		name := string(key[len(metaPrefix):])
		switch {
		case !live:
		case name == StaleMetaName:
			v, _, err := top.value(nil)
			if err != nil {
				return nil, fmt.Errorf("repair %s: read %s: %w", r.dir, top.file, err)
			}
			names = append(names, strings.Fields(string(v))...)
		case drop || seq <= maxSeqAt(s.bad, key):
			names = append(names, name)
		}
		for m.Len() > 0 && bytes.Equal(m.top().key, key) {
			i := m.h[0]
			if err := m.next(); err != nil {
				return nil, fmt.Errorf("repair %s: read %s: %w", r.dir, m.srcs[i].file, err)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// addStale adds names to those staleMetaKey lists, with a synced write.
func (r *repairer) addStale(names []string) error {
	v, closer, err := r.db.Get(staleMetaKey)
	switch {
	case err == nil:
		names = append(slices.Clone(names), strings.Fields(string(v))...)
		closer.Close()
	case !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("repair %s: read %s: %w", r.dir, StaleMetaName, err)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if err := r.db.Set(staleMetaKey, []byte(strings.Join(names, " ")), pebble.Sync); err != nil {
		return fmt.Errorf("repair %s: write %s: %w", r.dir, StaleMetaName, err)
	}
	return nil
}

// maxSeqAt is the largest sequence number of the unreadable tables whose
// bounds hold k: a version of k newer than that was not overwritten by
// what they held; an older one may have been.
func maxSeqAt(bad []*tableMeta, k []byte) uint64 {
	var seq uint64
	for _, t := range bad {
		if t.contains(k) {
			seq = max(seq, t.largeSeq)
		}
	}
	return seq
}

// mergeIter merges the entries of several tables in Pebble's order: by
// user key, then newest first.
type mergeIter struct {
	srcs    []mergeSrc
	h       []int // indexes into srcs with a current entry, a heap
	readers []*sstable.Reader
}

// mergeSrc is one table's entries and the current one. The key is a copy;
// value reads the current entry's value while it is current.
type mergeSrc struct {
	file    string
	it      sstable.Iterator
	key     []byte
	trailer pebble.InternalKeyTrailer
	value   func(buf []byte) ([]byte, bool, error)
}

// step moves src to its first entry, or its next, and reports whether it
// has one.
func (src *mergeSrc) step(first bool) (bool, error) {
	move := src.it.Next
	if first {
		move = src.it.First
	}
	kv := move()
	if kv == nil {
		return false, src.it.Error()
	}
	src.key = append(src.key[:0], kv.K.UserKey...)
	src.trailer = kv.K.Trailer
	src.value = kv.Value
	return true, nil
}

// add adds the entries of t within s.
func (m *mergeIter) add(r *repairer, t *tableMeta, s span) error {
	rd, err := r.openTable(filepath.Join(r.dir, t.file()))
	if err != nil {
		return err
	}
	m.readers = append(m.readers, rd)
	lower, upper := s.start, s.end
	if bytes.Compare(t.smallest.UserKey, lower) > 0 {
		lower = t.smallest.UserKey
	}
	if e := t.end(); bytes.Compare(e, upper) < 0 {
		upper = e
	}
	it, err := rd.NewIter(sstable.NoTransforms, lower, upper, sstable.AssertNoBlobHandles)
	if err != nil {
		return err
	}
	m.srcs = append(m.srcs, mergeSrc{file: t.file(), it: it})
	i := len(m.srcs) - 1
	ok, err := m.srcs[i].step(true)
	if ok {
		heap.Push(m, i)
	}
	return err
}

// top is the current source: the newest version of the smallest key.
func (m *mergeIter) top() *mergeSrc { return &m.srcs[m.h[0]] }

// next steps the current source past its entry.
func (m *mergeIter) next() error {
	ok, err := m.top().step(false)
	if ok {
		heap.Fix(m, 0)
	} else {
		heap.Pop(m)
	}
	return err
}

func (m *mergeIter) close() {
	for _, s := range m.srcs {
		s.it.Close()
	}
	for _, rd := range m.readers {
		rd.Close()
	}
}

func (m *mergeIter) Len() int { return len(m.h) }
func (m *mergeIter) Less(i, j int) bool {
	a, b := &m.srcs[m.h[i]], &m.srcs[m.h[j]]
	if c := bytes.Compare(a.key, b.key); c != 0 {
		return c < 0
	}
	return cmp.Compare(a.trailer, b.trailer) > 0 // newest first
}
func (m *mergeIter) Swap(i, j int) { m.h[i], m.h[j] = m.h[j], m.h[i] }
func (m *mergeIter) Push(x any)    { m.h = append(m.h, x.(int)) }
func (m *mergeIter) Pop() any {
	x := m.h[len(m.h)-1]
	m.h = m.h[:len(m.h)-1]
	return x
}

// scanAll reads every key and value of db.
func scanAll(db *pebble.DB) error {
	it, err := db.NewIter(nil)
	if err != nil {
		return err
	}
	for valid := it.First(); valid; valid = it.Next() {
		if _, err := it.ValueAndErr(); err != nil {
			it.Close()
			return err
		}
	}
	return it.Close()
}

// verifyStore opens the store in dir as a server would, with Pebble's own
// checks, and reads all of it.
func verifyStore(dir string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: pebble panicked: %v", ErrCorrupt, r)
		}
	}()
	db, err := pebble.Open(dir, &pebble.Options{
		ReadOnly: true,
		Logger:   pebbleLogger{l: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		return err
	}
	err = scanAll(db)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}
