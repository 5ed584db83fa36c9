package replication

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/storage"
)

// BenchmarkFollowerRound is what a follower does with each round its
// shard's leader sends, as Process does with a Ready: the round appended
// to its log with the hard state (synced), then applied (decoded, its
// records written with the applied index, the table, key filter and
// record counts brought in line), and the log truncated as it grows.
// Rounds of 256 changes of 32-byte values, to keys drawn at random among
// 1M (a key's first change creates it), on a store in t.TempDir().
//
// cpu-ns/key is the process's user and system CPU time (getrusage) over
// the timed rounds per change applied: Pebble's flushes and compactions,
// which run on goroutines of their own, count with the foreground, as
// they do in a follower's CPU per request. Only the rounds' making is
// left out (before the clock starts). With prior=unknown, the rounds are
// of version 1 (no Prior): the follower reads whether each record exists.
func BenchmarkFollowerRound(b *testing.B) {
	for _, known := range []bool{true, false} {
		b.Run(fmt.Sprintf("prior=%s", map[bool]string{true: "known", false: "unknown"}[known]), func(b *testing.B) {
			benchFollowerRound(b, known, 0)
		})
	}
}

// BenchmarkFollowerRoundKeepBytes is BenchmarkFollowerRound (the Prior
// known) with the log truncated by bytes at each Config.LogKeepBytes, and
// at 1 TiB: by entries alone (LogKeep), as before there was a bound in
// bytes. It is how DefaultLogKeepBytes was chosen (docs/benchmarks.md).
func BenchmarkFollowerRoundKeepBytes(b *testing.B) {
	for _, keep := range []uint64{64 << 10, 256 << 10, 1 << 20, 4 << 20, 1 << 40} {
		name := fmt.Sprintf("keep=%dKiB", keep>>10)
		if keep == 1<<40 {
			name = "keep=entries"
		}
		b.Run(name, func(b *testing.B) {
			benchFollowerRound(b, true, keep)
		})
	}
}

const (
	benchRoundKeys = 256
	benchKeySpace  = 1 << 20
)

func benchFollowerRound(b *testing.B, known bool, keepBytes uint64) {
	s, err := storage.Open(filepath.Join(b.TempDir(), "f"), storage.Options{Sync: storage.SyncAlways})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	g, err := NewGroup(Config{
		Group: testGroup, Node: 2, Bootstrap: []uint64{1, 2, 3},
		Lower: testLower, Upper: testUpper, Store: s,
		Send:         func(uint64, []*pb.Message) {},
		LogKeepBytes: keepBytes,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Stop()
	last, err := g.log.LastIndex()
	if err != nil {
		b.Fatal(err)
	}
	term, err := g.log.Term(last)
	if err != nil {
		b.Fatal(err)
	}
	term++
	// The rounds, made as the leader makes them.
	rng := rand.New(rand.NewPCG(1, 2))
	seen := make([]bool, benchKeySpace)
	val := make([]byte, 32)
	ents := make([]*pb.Entry, b.N)
	var ops []Op
	for i := range ents {
		ops = ops[:0]
		for range benchRoundKeys {
			n := rng.IntN(benchKeySpace)
			op := Op{Key: strconv.AppendInt([]byte{0x01, 0x02, 'b'}, int64(n), 10), Value: val}
			if known {
				op.Prior = storage.PriorAbsent
				if seen[n] {
					op.Prior = storage.PriorPresent
				}
			}
			seen[n] = true
			ops = append(ops, op)
		}
		last++
		r := Round{Proposer: 1, Seq: uint64(i + 1), Ops: ops}
		ents[i] = &pb.Entry{Term: proto.Uint64(term), Index: proto.Uint64(last), Type: pb.EntryNormal.Enum(), Data: r.Append(nil)}
	}
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for i, e := range ents {
		rd := raft.Ready{
			Entries: []*pb.Entry{e}, CommittedEntries: []*pb.Entry{e},
			HardState: &pb.HardState{Term: proto.Uint64(term), Commit: proto.Uint64(e.GetIndex())},
		}
		if err := g.handle(&rd); err != nil {
			b.Fatalf("round %d: %v", i, err)
		}
	}
	b.StopTimer()
	keys := float64(b.N) * benchRoundKeys
	b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/keys, "cpu-ns/key")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/keys, "ns/key")
	// What Pebble was left to flush and compact: the log's entries among
	// the records unless they were deleted in the memtable.
	st := s.Stats()
	b.ReportMetric(float64(st.TableBytes)/keys, "table-B/key")
	b.ReportMetric(float64(st.Compactions), "compactions")
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
