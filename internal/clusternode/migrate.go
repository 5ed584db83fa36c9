package clusternode

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// Online resharding: moving slots, with their records, from this node (the
// source) to another (the target), driven by `sluice cluster move` and
// `sluice cluster rebalance` (cmd/sluice). The steps, each a CLUSTER
// subcommand:
//
//  1. IMPORT START ranges on the target: it drops its leftovers in those
//     slots and notes, in the store, that it is copying them.
//  2. MIGRATE START ranges on the source: from now, every write to a record
//     of those slots notes its key (NoteWrites, before the commit).
//  3. DUMP on the source pages through the slots' records as the store holds
//     them; the tool writes them to the target with RESTORE, which only
//     slots being copied take.
//  4. MIGRATE DIRTY on the source hands over the keys changed meanwhile,
//     with their current values (or none: deleted), until few are left.
//  5. MIGRATE PAUSE on the source: commands on those slots get TRYAGAIN, and
//     it returns once every RESP pipeline under way when the pause began has
//     ended (a grace period: each connection counts its pipelines), and
//     every line-protocol batch, GET /check and ShouldRateLimit too (their
//     engine.Round counts itself in the engine's write gate: one may have
//     applied a hit here before START and commit it after the hand-over), so the last MIGRATE DIRTY
//     calls see every change. While a slot migrates, a
//     HIT counter of it is forwarded to this node over RESP, so the line
//     protocol's writes take the same path.
//  6. IMPORT DONE ranges epoch on the target: the copy is complete; it is
//     synced, and only the topology of that epoch may give the target the
//     slots.
//  7. The tool pushes the topology giving the slots to the target, epoch
//     bumped, to the target first, then the source (which then answers
//     MOVED for them and forgets their migration state), then the others.
//  8. DROP ranges on the source deletes the slots' records.
//
// A target that restarts while copying has lost what it had not synced:
// it drops its copy as it starts, and neither RESTORE nor a topology
// giving it those slots is taken until a new IMPORT START (the move run
// again) or a DROP. So a partial copy never becomes served data, and the
// source serves the slots until the push.
//
// The idle sweep may delete an idle record on the source after it was
// copied, without noting it: the target then holds an idle record, which
// reads as the absent one does (a full bucket, an ended window), and its
// own sweep deletes it.

// Migration states of a slot.
const (
	slotServing   = 0
	slotMigrating = 1 // writes note their keys
	slotPaused    = 2 // and commands get TRYAGAIN
)

// migration is the source side of slot moves. One move at a time: START
// is refused while another is under way, since the dirty set, PAUSE and
// CANCEL are the node's, not a move's.
type migration struct {
	active atomic.Bool // some slot is not slotServing
	state  [cluster.Slots]atomic.Uint32
	mu     struct {
		sync.Mutex
		dirty  map[string]struct{}
		ranges string // START's, while a move is under way
	}
}

var errNotMigrating = refuse("no slot of this node is migrating (did it restart since CLUSTER MIGRATE START?): start the move again")

// errTryAgain answers a key of a slot paused for its hand-over: the
// cluster's condition, which a client retries (forwardErr).
var errTryAgain = forwardErr("TRYAGAIN", "Slot is being handed over to another node; retry shortly")

// NoteWrites implements engine.Cluster: the keys of b's changes in
// migrating slots are noted, before b's changes are committed or handed
// over, so that no write escapes a move.
func (s *Node) NoteWrites(b *storage.Batch) {
	m := &s.mig
	if !m.active.Load() {
		return
	}
	b.Keys(func(k []byte) {
		if slot, ok := keyspace.RecordSlot(k); !ok || m.state[slot].Load() == slotServing {
			return
		}
		m.mu.Lock()
		if m.mu.dirty == nil {
			m.mu.dirty = make(map[string]struct{})
		}
		m.mu.dirty[string(k)] = struct{}{}
		m.mu.Unlock()
	})
}

// SlotMigrating reports whether slot is being moved off this node.
func (s *Node) SlotMigrating(slot uint16) bool {
	return s.mig.active.Load() && s.mig.state[slot].Load() != slotServing
}

// forgetMigrations clears the migration state of the slots v does not give
// this node: after a push, they answer MOVED.
func (s *Node) forgetMigrations(v *view) {
	m := &s.mig
	any := false
	for slot := range m.state {
		if m.state[slot].Load() == slotServing {
			continue
		}
		if v.owner[slot] != v.self || v.self == 0 {
			m.state[slot].Store(slotServing)
			continue
		}
		any = true
	}
	if !any {
		m.active.Store(false)
		m.mu.Lock()
		m.mu.dirty = nil
		m.mu.ranges = ""
		m.mu.Unlock()
	}
}

// migrateCommand runs the CLUSTER subcommands of resharding. It reports
// false for a subcommand that is not one of them.
func (s *Node) migrateCommand(x *dispatch.Ctx, c Caller, sub string, args [][]byte) (bool, error) {
	switch {
	case sub == "migrate" && len(args) >= 3:
		return true, s.clusterMigrate(x, c, strings.ToLower(string(args[2])), args[3:])
	case sub == "import" && len(args) >= 3:
		return true, s.clusterImport(x, c, strings.ToLower(string(args[2])), args[3:])
	case sub == "dump" && len(args) == 6:
		return true, s.clusterDump(x, args[2:])
	case sub == "restore" && len(args) >= 4 && len(args)%2 == 0:
		return true, s.clusterRestore(x, args[2:])
	case sub == "drop" && len(args) == 3:
		return true, s.clusterDrop(x, c, string(args[2]))
	}
	return false, nil
}

// ownedRanges parses ranges and refuses them unless this node owns (own
// true) or does not own (own false) every slot of them.
func (s *Node) ownedRanges(arg string, own bool) ([]cluster.Range, error) {
	rs, err := cluster.ParseRanges(arg)
	if err != nil {
		return nil, refuseErr(err)
	}
	v := s.view.Load()
	for _, r := range rs {
		for slot := int(r.First); slot <= int(r.Last); slot++ {
			mine := v.self != 0 && v.owner[slot] == v.self
			if mine != own {
				if own {
					return nil, refuse("slot " + strconv.Itoa(slot) + " is not this node's: migrate slots from the node that owns them")
				}
				return nil, refuse("slot " + strconv.Itoa(slot) + " is this node's: refusing to overwrite or drop the records of a slot it serves")
			}
		}
	}
	return rs, nil
}

func (s *Node) clusterMigrate(x *dispatch.Ctx, c Caller, op string, args [][]byte) error {
	m := &s.mig
	switch {
	case op == "start" && len(args) == 1:
		rs, err := s.ownedRanges(string(args[0]), true)
		if err != nil {
			return err
		}
		if err := s.startMigration(rs); err != nil {
			return err
		}
		x.Out = resp.AppendSimple(x.Out, "OK")
	case (op == "pause" && len(args) == 0) || (op == "dirty" && len(args) == 1):
		// A node restarted since START has forgotten the migration, and
		// the keys written meanwhile: the move must start over.
		if !m.active.Load() {
			return errNotMigrating
		}
		if op == "dirty" {
			n, ok := resp.ParseInt(args[0])
			if !ok || n < 1 {
				return errs.NotInteger
			}
			s.popDirty(x, int(n))
			return nil
		}
		for slot := range m.state {
			m.state[slot].CompareAndSwap(slotMigrating, slotPaused)
		}
		// This connection's own pipeline may have written before PAUSE:
		// commit it first.
		if err := c.Commit(); err != nil {
			return err
		}
		wait := s.pauseWait()
		if !c.Quiesce(time.Now().Add(wait)) {
			for slot := range m.state {
				m.state[slot].CompareAndSwap(slotPaused, slotMigrating)
			}
			return refuse("pipelines and line-protocol, /check or ShouldRateLimit writes under way did not finish within " + wait.String() + "; the slots serve again, retry the pause")
		}
		x.Out = resp.AppendSimple(x.Out, "OK")
	case op == "cancel" && len(args) == 0:
		for slot := range m.state {
			m.state[slot].Store(slotServing)
		}
		m.active.Store(false)
		m.mu.Lock()
		m.mu.dirty = nil
		m.mu.ranges = ""
		m.mu.Unlock()
		x.Out = resp.AppendSimple(x.Out, "OK")
	default:
		return refuse("CLUSTER MIGRATE: want START <slots>, PAUSE, DIRTY <count> or CANCEL")
	}
	return nil
}

// startMigration begins START's move of rs, refusing while another is
// under way: the dirty set, PAUSE and CANCEL are the node's, so a second
// move would hand over the first's keys and cancel it.
func (s *Node) startMigration(rs []cluster.Range) error {
	m := &s.mig
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active.Load() {
		return refuse("CLUSTER MIGRATE START: slots " + m.mu.ranges + " are being moved off this node already; one move at a time per source: let it finish, or end it with CLUSTER MIGRATE CANCEL")
	}
	m.mu.ranges = cluster.FormatRanges(rs)
	m.active.Store(true)
	for _, r := range rs {
		for slot := int(r.First); slot <= int(r.Last); slot++ {
			m.state[slot].CompareAndSwap(slotServing, slotMigrating)
		}
	}
	return nil
}

// DefaultPauseWait bounds MIGRATE PAUSE's wait for pipelines and writes
// in flight when Config.PauseWait is zero.
const DefaultPauseWait = 10 * time.Second

func (s *Node) pauseWait() time.Duration {
	if d := s.cfg.PauseWait; d > 0 {
		return d
	}
	return DefaultPauseWait
}

// readMutator reads a record and changes nothing.
type readMutator struct {
	val   []byte
	found bool
}

func (m *readMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	m.val = append(m.val[:0], old...)
	m.found = found
	return nil, storage.Keep, nil
}

// popDirty answers up to n keys changed in the migrating slots since START
// (or the last DIRTY), each with its current value, or an empty value when
// it has none (deleted), as a flat array of keys and values.
func (s *Node) popDirty(x *dispatch.Ctx, n int) {
	m := &s.mig
	m.mu.Lock()
	keys := make([]string, 0, min(n, len(m.mu.dirty)))
	for k := range m.mu.dirty {
		if len(keys) == n {
			break
		}
		keys = append(keys, k)
		delete(m.mu.dirty, k)
	}
	m.mu.Unlock()
	b := s.store.NewBatch()
	var r readMutator
	x.Out = resp.AppendArray(x.Out, 2*len(keys))
	for _, k := range keys {
		if err := b.Modify([]byte(k), &r); err != nil {
			// Put it back: the next DIRTY tries again.
			m.mu.Lock()
			if m.mu.dirty != nil {
				m.mu.dirty[k] = struct{}{}
			}
			m.mu.Unlock()
			r.found = false
		}
		x.Out = resp.AppendBulkString(x.Out, k)
		if r.found {
			x.Out = resp.AppendBulk(x.Out, r.val)
		} else {
			x.Out = resp.AppendBulkString(x.Out, "")
		}
	}
}

// maxDumpCount bounds a DUMP page, so that one reply stays small (the tool
// asks for --cluster-page, at most 500).
const maxDumpCount = 10000

// clusterDump answers DUMP first last cursor count: up to count records of
// slots first to last, from cursor (a store key, or "" for the start), as
// [next cursor ("" when done), key, value, ...].
func (s *Node) clusterDump(x *dispatch.Ctx, args [][]byte) error {
	first, ok1 := resp.ParseInt(args[0])
	last, ok2 := resp.ParseInt(args[1])
	count, ok3 := resp.ParseInt(args[3])
	if !ok1 || !ok2 || !ok3 || first < 0 || last >= cluster.Slots || first > last || count < 1 || count > maxDumpCount {
		return refuse("CLUSTER DUMP: want <first slot> <last slot> <cursor> <count>, slots 0 to 16383, count 1 to " + strconv.Itoa(maxDumpCount))
	}
	if err := s.store.Flush(); err != nil {
		return engine.StoreErr(err)
	}
	lo, _ := keyspace.SlotRange(uint16(first))
	var hi []byte
	if last < cluster.Slots-1 {
		h, _ := keyspace.SlotRange(uint16(last + 1))
		hi = h[:]
	} else {
		hi = []byte{0xff}
	}
	from := lo[:]
	if cur := args[2]; len(cur) > 0 && bytes.Compare(cur, from) > 0 {
		from = cur
	}
	var recs [][]byte
	var next []byte
	err := s.store.Scan(from, hi, func(k, v []byte) bool {
		if len(recs) == 2*int(count) {
			next = append([]byte(nil), k...)
			return false
		}
		recs = append(recs, append([]byte(nil), k...), append([]byte(nil), v...))
		return true
	})
	if err != nil {
		return engine.StoreErr(err)
	}
	x.Out = resp.AppendArray(x.Out, 1+len(recs))
	x.Out = resp.AppendBulk(x.Out, next)
	for _, r := range recs {
		x.Out = resp.AppendBulk(x.Out, r)
	}
	return nil
}

// restoreMutator sets a record to val, or deletes it when val is empty.
type restoreMutator struct{ val []byte }

func (m *restoreMutator) Mutate([]byte, bool) ([]byte, storage.Op, error) {
	if len(m.val) == 0 {
		return nil, storage.Delete, nil
	}
	return m.val, storage.Put, nil
}

// clusterRestore writes RESTORE's key-value pairs (an empty value deletes)
// into slots this node does not serve yet; the replies wait for the
// commit, as every write's.
func (s *Node) clusterRestore(x *dispatch.Ctx, args [][]byte) error {
	v := s.view.Load()
	for i := 0; i < len(args); i += 2 {
		k := args[i]
		slot, ok := keyspace.RecordSlot(k)
		if len(k) < keyspace.HeaderLen || !ok {
			return refuse("CLUSTER RESTORE: not a record key")
		}
		if v.self != 0 && v.owner[slot] == v.self {
			return refuse("CLUSTER RESTORE: slot " + strconv.Itoa(int(slot)) + " is this node's: refusing to overwrite a slot it serves")
		}
		// Only records as DUMP hands them out: a key of a known kind, and
		// a value its kind decodes (once the slot is served, it is read
		// and swept as such).
		rec, err := keyspace.Parse(k)
		if err != nil {
			return refuse("CLUSTER RESTORE: pair " + strconv.Itoa(i/2+1) + ": not a record key (" + resp.OneLine(err.Error()) + "); expected a key CLUSTER DUMP gave")
		}
		if val := args[i+1]; len(val) > 0 {
			if _, err := rec.Describe(val, 0); err != nil {
				return refuse("CLUSTER RESTORE: pair " + strconv.Itoa(i/2+1) + ": the value is not a record of its key's kind (" + resp.OneLine(err.Error()) + "); expected the value CLUSTER DUMP gave")
			}
		}
		if st := s.importState(slot); st != importCopying {
			return refuse("CLUSTER RESTORE: slot " + strconv.Itoa(int(slot)) + " is not being copied to this node (" + importStateNames[st] + "): send CLUSTER IMPORT START first; a node that restarted while copying has dropped its copy: run the move again")
		}
	}
	var m restoreMutator
	for i := 0; i < len(args); i += 2 {
		m.val = args[i+1]
		if err := x.Round.Apply(args[i], &m); err != nil {
			return err
		}
	}
	x.Out = resp.AppendInt(x.Out, int64(len(args)/2))
	return nil
}

// clusterDrop deletes every record of slots this node does not own: the
// source's copy after a move, or a target's leftovers before one. It ends
// any import of those slots.
func (s *Node) clusterDrop(x *dispatch.Ctx, c Caller, arg string) error {
	rs, err := s.ownedRanges(arg, false)
	if err != nil {
		return err
	}
	if err := c.Commit(); err != nil {
		return err
	}
	n, err := s.dropSlots(rs)
	if err == nil {
		// The deletes reach Pebble before the import's end, which is
		// synced, and are synced with it: with write-behind, a kill
		// after the end alone would bring the partial copy back with
		// nothing left to drop it.
		err = s.store.Flush()
	}
	if err == nil {
		err = s.setImport(rs, importNone)
	}
	if err != nil {
		return engine.StoreErr(err)
	}
	x.Out = resp.AppendInt(x.Out, n)
	return nil
}

// dropSlots deletes every record of the slots rs and returns how many.
func (s *Node) dropSlots(rs []cluster.Range) (int64, error) {
	if err := s.store.Flush(); err != nil {
		return 0, err
	}
	var n int64
	var keys [][]byte
	var del dropMutator
	b := s.store.NewBatch()
	for _, r := range rs {
		lo, _ := keyspace.SlotRange(r.First)
		hi := []byte{0xff}
		if r.Last < cluster.Slots-1 {
			h, _ := keyspace.SlotRange(r.Last + 1)
			hi = h[:]
		}
		for from := lo[:]; from != nil; {
			keys = keys[:0]
			from2 := from
			from = nil
			err := s.store.Scan(from2, hi, func(k, _ []byte) bool {
				if len(keys) == 1000 {
					from = append([]byte(nil), k...)
					return false
				}
				keys = append(keys, append([]byte(nil), k...))
				return true
			})
			if err != nil {
				return n, err
			}
			for _, k := range keys {
				if err := b.Modify(k, &del); err != nil {
					return n, err
				}
			}
			if err := b.Commit(); err != nil {
				return n, err
			}
			n += int64(len(keys))
		}
	}
	return n, nil
}

// dropMutator deletes a record that exists.
type dropMutator struct{}

func (dropMutator) Mutate(_ []byte, found bool) ([]byte, storage.Op, error) {
	if !found {
		return nil, storage.Keep, nil
	}
	return nil, storage.Delete, nil
}

// Import states of a slot on the target of a move.
const (
	importNone        = 0
	importCopying     = 1 // IMPORT START: RESTORE takes its records
	importDone        = 2 // IMPORT DONE: complete and synced, for one epoch's topology
	importInterrupted = 3 // a restart or a push ended the copy: it is not served
)

// importStateNames are the states as MetaImport and errors name them.
var importStateNames = [...]string{"none", "copying", "done", "interrupted"}

// MetaImport is the store's metadata name of the slots this node is
// importing: "v1", then groups of a state name (with "done", the epoch)
// and slot ranges, e.g. "v1 copying 0-99 done 7 200-299".
const MetaImport = "cluster.import"

// importSlot is one slot's import state.
type importSlot struct {
	state uint8
	epoch uint64 // importDone's
}

// importTable is the target side of slot moves, kept in the store so that
// a restart knows which copies it cannot trust.
type importTable [cluster.Slots]importSlot

// imports holds the import table (allocated in cluster mode only).
type imports struct {
	sync.Mutex
	table *importTable
}

// encode is t as MetaImport's value.
func (t *importTable) encode() []byte {
	type group struct {
		state uint8
		epoch uint64
	}
	var order []group
	ranges := map[group][]cluster.Range{}
	for slot, is := range t {
		if is.state == importNone {
			continue
		}
		g := group{is.state, is.epoch}
		if _, ok := ranges[g]; !ok {
			order = append(order, g)
		}
		ranges[g] = append(ranges[g], cluster.Range{First: uint16(slot), Last: uint16(slot)})
	}
	b := []byte("v1")
	for _, g := range order {
		b = append(b, ' ')
		b = append(b, importStateNames[g.state]...)
		if g.state == importDone {
			b = append(b, ' ')
			b = strconv.AppendUint(b, g.epoch, 10)
		}
		b = append(b, ' ')
		b = append(b, cluster.FormatRanges(cluster.Merge(ranges[g]))...)
	}
	return b
}

// decodeImports reads what encode wrote.
func decodeImports(b []byte) (*importTable, error) {
	t := new(importTable)
	f := strings.Fields(string(b))
	if len(f) == 0 || f[0] != "v1" {
		return nil, fmt.Errorf("%q does not start with v1", b)
	}
	for i := 1; i < len(f); {
		st := slices.Index(importStateNames[:], f[i])
		if st <= importNone {
			return nil, fmt.Errorf("%q: unknown import state %q", b, f[i])
		}
		var epoch uint64
		if st == importDone {
			if i+1 >= len(f) {
				return nil, fmt.Errorf("%q: done without an epoch", b)
			}
			e, err := strconv.ParseUint(f[i+1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%q: done epoch %q: %w", b, f[i+1], err)
			}
			epoch = e
			i++
		}
		if i+1 >= len(f) {
			return nil, fmt.Errorf("%q: %s without slots", b, f[i])
		}
		rs, err := cluster.ParseRanges(f[i+1])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", b, err)
		}
		t.set(rs, importSlot{uint8(st), epoch})
		i += 2
	}
	return t, nil
}

// importState is slot's import state.
func (s *Node) importState(slot uint16) uint8 {
	im := &s.imp
	im.Lock()
	defer im.Unlock()
	return im.table[slot].state
}

// setImport gives the slots rs state and stores the table, synced.
func (s *Node) setImport(rs []cluster.Range, state uint8) error {
	im := &s.imp
	im.Lock()
	defer im.Unlock()
	im.table.set(rs, importSlot{state: state})
	return s.storeImportsLocked()
}

// finishImport marks the slots rs, every one copying, done for the
// topology of epoch, and stores the table, synced.
func (s *Node) finishImport(rs []cluster.Range, epoch uint64) error {
	im := &s.imp
	im.Lock()
	defer im.Unlock()
	for _, r := range rs {
		for slot := int(r.First); slot <= int(r.Last); slot++ {
			if st := im.table[slot].state; st != importCopying {
				return refuse("CLUSTER IMPORT DONE: slot " + strconv.Itoa(slot) + " is not being copied to this node (" + importStateNames[st] + "): a node that restarted while copying has dropped its copy: run the move again")
			}
		}
	}
	im.table.set(rs, importSlot{importDone, epoch})
	return s.storeImportsLocked()
}

// set gives every slot of rs the state is.
func (t *importTable) set(rs []cluster.Range, is importSlot) {
	for _, r := range rs {
		for slot := int(r.First); slot <= int(r.Last); slot++ {
			t[slot] = is
		}
	}
}

func (s *Node) storeImportsLocked() error {
	if err := s.store.SetMeta(MetaImport, s.imp.table.encode()); err != nil {
		return fmt.Errorf("store the slots being imported: %w", err)
	}
	return nil
}

// loadImports reads the import table at startup, against the topology v
// in use: a slot v gives this node was imported (the push was taken, its
// end not stored); a slot still copying was cut short by the restart, and
// a done slot whose epoch v has reached without giving it to this node
// can no longer be taken: both are interrupted, and their records
// dropped, so that no partial copy counts as this node's.
func (s *Node) loadImports(v *view) error {
	im := &s.imp
	im.table = new(importTable)
	b, err := s.store.Meta(MetaImport)
	if err != nil || b == nil {
		return err
	}
	t, err := decodeImports(b)
	if err != nil {
		return fmt.Errorf("the slots being imported, stored in %s: %w", s.store.Dir(), err)
	}
	var drop []cluster.Range
	for slot := range t {
		is := &t[slot]
		switch {
		case is.state == importNone:
			continue
		case v.self != 0 && v.owner[slot] == v.self:
			*is = importSlot{}
			continue
		case is.state == importCopying || is.state == importDone && v.top.Epoch >= is.epoch:
			*is = importSlot{state: importInterrupted}
		}
		if is.state == importInterrupted {
			drop = append(drop, cluster.Range{First: uint16(slot), Last: uint16(slot)})
		}
	}
	im.Lock()
	im.table = t
	if !bytes.Equal(t.encode(), b) {
		err = s.storeImportsLocked()
	}
	im.Unlock()
	if err != nil || len(drop) == 0 {
		return err
	}
	drop = cluster.Merge(drop)
	n, err := s.dropSlots(drop)
	if err != nil {
		return fmt.Errorf("drop the copy of slots %s, left by a move cut short: %w", cluster.FormatRanges(drop), err)
	}
	if n > 0 {
		s.log.Warn("cluster: dropped the partial copy of slots a move was importing when this node stopped; the source still serves them: run the move again", "slots", cluster.FormatRanges(drop), "records", n)
	}
	return nil
}

// importsAfterLocked is the import table once this node takes topology
// nv in place of cur, or an error refusing nv: nv may give this node a
// slot it does not own in cur only when no move is importing it, or when
// its copy is done for nv's epoch. A done slot nv does not give this
// node, at or past its epoch, can no longer be taken: interrupted.
func (s *Node) importsAfterLocked(cur, nv *view) (*importTable, error) {
	next := *s.imp.table
	for slot := range next {
		is := next[slot]
		if is.state == importNone {
			continue
		}
		gained := nv.self != 0 && nv.owner[slot] == nv.self && (cur.self == 0 || cur.owner[slot] != cur.self)
		switch {
		case gained && (is.state != importDone || is.epoch != nv.top.Epoch):
			why := "its copy here is not complete (no CLUSTER IMPORT DONE): a move of it is under way or was abandoned"
			switch is.state {
			case importInterrupted:
				why = "its copy here was cut short (this node restarted while copying, or a later topology ended the move)"
			case importDone:
				why = "its copy here is complete for the topology of epoch " + strconv.FormatUint(is.epoch, 10) + ", not this one"
			}
			return nil, refuse("slot " + strconv.Itoa(slot) + " would be this node's, but " + why +
				": run the move again (sluice cluster move), or, to give this node the slot without its records, send it CLUSTER DROP " + strconv.Itoa(slot) + " first")
		case gained:
			next[slot] = importSlot{}
		case is.state == importDone && nv.top.Epoch >= is.epoch:
			next[slot] = importSlot{state: importInterrupted}
		}
	}
	return &next, nil
}

// clusterImport handles IMPORT START and IMPORT DONE, the target's side of
// a move.
func (s *Node) clusterImport(x *dispatch.Ctx, c Caller, op string, args [][]byte) error {
	if !(op == "start" && len(args) == 1) && !(op == "done" && len(args) == 2) {
		return refuse("CLUSTER IMPORT: want START <slots> or DONE <slots> <epoch>")
	}
	rs, err := s.ownedRanges(string(args[0]), false)
	if err != nil {
		return err
	}
	var epoch int64
	if op == "done" {
		var ok bool
		if epoch, ok = resp.ParseInt(args[1]); !ok || epoch < 0 || epoch > cluster.MaxEpoch {
			return refuse("CLUSTER IMPORT DONE: epoch " + resp.Preview(args[1]) + ": want the epoch of the topology that gives this node the slots, 0 to 2^53")
		}
	}
	if err := c.Commit(); err != nil {
		return err
	}
	var n int64
	if op == "start" {
		// Noted before the leftovers go: a restart in between drops them
		// as it starts.
		if err = s.setImport(rs, importCopying); err == nil {
			n, err = s.dropSlots(rs)
		}
	} else {
		// The records RESTORE wrote reach Pebble before the state is
		// synced, and are synced with it: done survives a restart with
		// the whole copy.
		if err = s.store.Flush(); err == nil {
			err = s.finishImport(rs, uint64(epoch))
		}
	}
	switch {
	case err != nil:
		return engine.StoreErr(err)
	case op == "start":
		x.Out = resp.AppendInt(x.Out, n)
	default:
		x.Out = resp.AppendSimple(x.Out, "OK")
	}
	return nil
}
