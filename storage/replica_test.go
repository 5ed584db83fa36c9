package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// The replication keys share the Pebble database with the records, yet
// nothing that walks the records sees them: Scan (which the cluster
// migration pages with), the sweep, the record counts at Open and after,
// and sluice inspect.
func TestReplicaKeysAreNotRecords(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Options{Sync: SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	for i := range 10 {
		add(t, b, fmt.Sprintf("k%d", i), 1)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	rb := s.NewReplicaBatch()
	for i := range 20 {
		if err := rb.Set([]byte(fmt.Sprintf("%sg1.e%04d", ReplicaPrefix, i)), u64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rb.PutRecord([]byte("r0"), u64(1)); err != nil {
		t.Fatal(err)
	}
	if err := rb.Commit(true); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	notReplica := func(what string, k []byte) {
		t.Helper()
		if strings.HasPrefix(string(k), ReplicaPrefix) {
			t.Fatalf("%s saw replication key %q", what, k)
		}
	}
	scanned := 0
	if err := s.Scan(nil, nil, func(k, v []byte) bool { notReplica("Scan", k); scanned++; return true }); err != nil {
		t.Fatal(err)
	}
	if scanned != 11 {
		t.Fatalf("Scan listed %d records, want 11", scanned)
	}
	if got := s.Records(); got != 11 {
		t.Fatalf("Records = %d, want 11", got)
	}
	// A sweep that finds every record idle deletes the records only.
	res := sweepAll(t, s, 4, func(k, v []byte) bool { notReplica("Sweep", k); return true })
	if res.Scanned != 11 || res.Deleted != 11 {
		t.Fatalf("sweep %+v, want 11 scanned and deleted", res)
	}
	rb = s.NewReplicaBatch()
	if err := rb.PutRecord([]byte("r1"), u64(1)); err != nil {
		t.Fatal(err)
	}
	if err := rb.Commit(false); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	listed := 0
	if err := Inspect(dir, func(k, v []byte) bool { notReplica("Inspect", k); listed++; return true }, nil); err != nil {
		t.Fatal(err)
	}
	if listed != 1 {
		t.Fatalf("Inspect listed %d records, want 1", listed)
	}
	s, err = Open(dir, Options{Sync: SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Records(); got != 1 {
		t.Fatalf("Records after reopen = %d, want 1", got)
	}
	n := 0
	if err := s.ReplicaScan([]byte(ReplicaPrefix), []byte(ReplicaPrefix+"\xff"), func(k, v []byte) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Fatalf("ReplicaScan found %d keys after reopen, want 20", n)
	}
}

// A replicated record is what every reader sees next, whether the reader
// had it cached, had cached its absence, or the key filter had never seen
// it; the record counts follow.
func TestReplicaBatchUpdatesCachedState(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	b := s.NewBatch()
	add(t, b, "cached", 1)
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	read(t, s, "cached")
	read(t, s, "absent") // caches the miss
	rb := s.NewReplicaBatch()
	for _, k := range []string{"cached", "absent", "new"} {
		if err := rb.PutRecord([]byte(k), u64(7)); err != nil {
			t.Fatal(err)
		}
	}
	if err := rb.Commit(false); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"cached", "absent", "new"} {
		if v, ok := read(t, s, k); !ok || v != 7 {
			t.Fatalf("%s = %d, %v after a replicated put of 7", k, v, ok)
		}
	}
	if got := s.Records(); got != 3 {
		t.Fatalf("Records = %d, want 3", got)
	}
	if err := rb.DeleteRecord([]byte("cached")); err != nil {
		t.Fatal(err)
	}
	if err := rb.DeleteRecord([]byte("never")); err != nil {
		t.Fatal(err)
	}
	if err := rb.Commit(false); err != nil {
		t.Fatal(err)
	}
	if _, ok := read(t, s, "cached"); ok {
		t.Fatal("cached still found after a replicated delete")
	}
	if got := s.Records(); got != 2 {
		t.Fatalf("Records = %d, want 2", got)
	}
}

func TestReplicaBatchRefusesKeysOutsideItsRange(t *testing.T) {
	s := openMem(t, vfs.NewMem(), SyncEverySec)
	defer s.Close()
	rb := s.NewReplicaBatch()
	defer rb.Close()
	for name, err := range map[string]error{
		"Set record key":      rb.Set([]byte("k"), nil),
		"Set format marker":   rb.Set(formatKey, nil),
		"PutRecord own key":   rb.PutRecord([]byte(ReplicaPrefix+"x"), nil),
		"DeleteRecord marker": rb.DeleteRecord(formatKey),
		"DeleteRange records": rb.DeleteRange([]byte("a"), []byte("z")),
	} {
		if !errors.Is(err, ErrNotReplicaKey) {
			t.Errorf("%s: %v, want ErrNotReplicaKey", name, err)
		}
	}
	if _, _, err := s.ReplicaGet([]byte("k")); !errors.Is(err, ErrNotReplicaKey) {
		t.Errorf("ReplicaGet of a record key: %v, want ErrNotReplicaKey", err)
	}
}

// Repair never brings Raft state back older than it was (a replica could
// then vote twice in a term): when an unreadable table held replication
// keys, every one of them goes, the records stay, and the loss is named
// in StaleMeta for the server.
func TestRepairDropsReplicationState(t *testing.T) {
	s := repairReplicaStore(t, func(b *pebble.Batch) {
		for i := 50; i < 60; i++ {
			b.Set(replicaTestKey(i), u64(2), nil)
		}
	}, replicaTestKey(50))
	if got := s.Records(); got != 100 {
		t.Fatalf("%d records after repair, want 100", got)
	}
	if v, err := s.Meta(StaleMetaName); err != nil || !strings.Contains(string(v), ReplicaLostName) {
		t.Fatalf("stored stale names %q, %v; want %s among them", v, err, ReplicaLostName)
	}
}

// A replica's records are its applied index's: when an unreadable table
// held records of a store that holds replication state, the records come
// back older than the applied index says, and nothing would ever apply
// them again (the replica, and any snapshot it sends, would keep the older
// values for good). The replication state goes and the loss is named, as
// when the table held replication keys.
func TestRepairOfRecordsDropsReplicationState(t *testing.T) {
	repairReplicaStore(t, func(b *pebble.Batch) { // a round applied: records only
		for i := 50; i < 60; i++ {
			b.Set(replicaTestRecord(i), u64(2), nil)
		}
	}, replicaTestRecord(50))
}

func replicaTestKey(i int) []byte    { return fmt.Appendf([]byte(ReplicaPrefix), "g1.e%04d", i) }
func replicaTestRecord(i int) []byte { return fmt.Appendf(nil, "k%04d", i) }

// repairReplicaStore writes 100 records and 100 replication keys in one
// table, then what newer writes in a table of its own, which it damages
// (the table whose first key is first), repairs the store, checks that
// every replication key went and that the loss is named, and opens it.
func repairReplicaStore(t *testing.T, newer func(b *pebble.Batch), first []byte) *Store {
	t.Helper()
	dir := t.TempDir()
	db := openRawPebble(t, dir)
	write := func(set func(b *pebble.Batch)) {
		t.Helper()
		b := db.NewBatch()
		set(b)
		if err := b.Commit(pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	write(func(b *pebble.Batch) {
		b.Set(formatKey, []byte(formatVersion), nil)
		for i := range 100 {
			b.Set(replicaTestRecord(i), u64(1), nil)
			b.Set(replicaTestKey(i), u64(1), nil)
		}
	})
	if err := db.Compact(context.Background(), []byte("k"), []byte{0xff, 0xff}, false); err != nil {
		t.Fatal(err)
	}
	write(newer)
	levels, err := db.SSTables()
	if err != nil {
		t.Fatal(err)
	}
	var top string
	for _, level := range levels {
		for _, tab := range level {
			if bytes.Equal(tab.Smallest.UserKey, first) {
				top = filepath.Join(dir, fmt.Sprintf("%s.sst", tab.BackingSSTNum))
			}
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if top == "" {
		t.Fatal("no table of the newer writes")
	}
	damage(t, top, "zeroed")
	rep, err := Repair(context.Background(), dir, RepairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(rep.StaleMeta, ReplicaLostName) {
		t.Fatalf("StaleMeta %v does not name %s", rep.StaleMeta, ReplicaLostName)
	}
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	n := 0
	if err := s.ReplicaScan([]byte(ReplicaPrefix), replicaEnd, func(k, v []byte) bool { n++; return true }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d replication keys survived the repair, want none", n)
	}
	return s
}

// mirror is a Replicator that commits each round at once into the
// leader's store, as its own records, and into a follower's store as a
// replica applies a round: by the Prior of each change.
type mirror struct{ leader, follower *Store }

func (m *mirror) Replicate(c int, ops []ReplicaOp) (<-chan error, error) {
	for _, st := range []*Store{m.follower, m.leader} {
		b := st.NewReplicaBatch()
		for _, op := range ops {
			if err := b.Record(op, st == m.leader); err != nil {
				return nil, err
			}
		}
		if err := b.Commit(false); err != nil {
			return nil, err
		}
		if err := b.Close(); err != nil {
			return nil, err
		}
	}
	done := make(chan error, 1)
	done <- nil
	return done, nil
}

// The Prior of each change of a leader's round is what the rounds before
// it left: a follower that counts by it, reading nothing, counts what the
// leader counts, through creates, updates, deletes, a key created and
// deleted in one round, reads that cache what Pebble holds, and records
// evicted from a small cache, or no cache at all (the record then read
// from Pebble again).
func TestRoundPriorsKeepFollowerCounts(t *testing.T) {
	for name, opts := range map[string]Options{
		"cache":       {},
		"small cache": {CacheMemory: 64 << 10},
		"no cache":    {NoCache: true},
	} {
		t.Run(name, func(t *testing.T) {
			follower, err := Open(filepath.Join(t.TempDir(), "f"), Options{Sync: SyncAlways})
			if err != nil {
				t.Fatal(err)
			}
			defer follower.Close()
			m := &mirror{follower: follower}
			opts.Sync, opts.Committers, opts.Replicator = SyncAlways, 1, m
			dir := filepath.Join(t.TempDir(), "l")
			leader, err := Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { leader.Close() }()
			m.leader = leader
			del := mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return nil, Delete, nil })
			read := mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return nil, Keep, nil })
			rng := rand.New(rand.NewPCG(1, 2))
			for round := range 300 {
				if round == 150 {
					// An empty table: what it holds comes from Pebble.
					if err := leader.Close(); err != nil {
						t.Fatal(err)
					}
					if leader, err = Open(dir, opts); err != nil {
						t.Fatal(err)
					}
					m.leader = leader
				}
				b := leader.NewBatch()
				for range 20 {
					key := fmt.Appendf([]byte{0, 1}, "k%d", rng.IntN(500))
					var mut Mutator = putValue{v: fmt.Appendf(nil, "v%d", round)}
					switch rng.IntN(4) {
					case 0:
						mut = del
					case 1:
						mut = read // caches what Pebble holds
					}
					if err := b.Modify(key, mut); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Commit(); err != nil {
					t.Fatal(err)
				}
				if l, f := leader.Records(), follower.Records(); l != f {
					t.Fatalf("after round %d: the follower counts %d records, the leader %d", round, f, l)
				}
			}
			n := 0
			if err := follower.Scan([]byte{0}, []byte{0xfe}, func(k, v []byte) bool { n++; return true }); err != nil {
				t.Fatal(err)
			}
			if c := follower.Records(); c != int64(n) {
				t.Fatalf("the follower counts %d records and holds %d", c, n)
			}
		})
	}
}
