package storage

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// padCounter adds delta to the 8-byte counter at the start of the value and
// pads it to a random length, so values grow, shrink and move in the arena.
type padCounter struct {
	delta uint64
	pad   int
	buf   []byte
	bad   error
}

func (c *padCounter) Mutate(old []byte, found bool) ([]byte, Op, error) {
	n := uint64(0)
	if found {
		if len(old) < 8 {
			c.bad = fmt.Errorf("value of %d bytes", len(old))
			return nil, Keep, c.bad
		}
		n = binary.BigEndian.Uint64(old)
		for _, b := range old[8:] {
			if b != byte(len(old)) {
				c.bad = fmt.Errorf("padding corrupt: %x", old)
				return nil, Keep, c.bad
			}
		}
	}
	if c.delta == 0 {
		return nil, Keep, nil
	}
	c.buf = binary.BigEndian.AppendUint64(c.buf[:0], n+c.delta)
	for range c.pad {
		c.buf = append(c.buf, byte(8+c.pad))
	}
	return c.buf, Put, nil
}

// Many goroutines change counters of a few stripes, with a tiny cache (so
// records are evicted, reused, moved, compacted, and taken over their
// stripe's share), transactions holding every stripe, cached reads of
// absent keys, and a sweep deleting records of other keys of the same
// stripes (cache=false). Every acknowledged increment must be in Pebble
// after a reopen, and no record stays dirty once everything is flushed.
func TestTableStress(t *testing.T) {
	for _, mode := range []SyncMode{SyncAlways, SyncEverySec, SyncNo} {
		t.Run(mode.String(), func(t *testing.T) { tableStress(t, mode) })
	}
}

func tableStress(t *testing.T, mode SyncMode) {
	fs := vfs.NewMem()
	s, err := Open("db", Options{Sync: mode, fs: fs, CacheMemory: MinCacheMemory, SyncInterval: time.Millisecond, MaxQueued: 256, MaxQueuedBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	const nStripes = 4
	var counters, deads, absent []string
	var stripes []uint64
	for i := 0; len(counters) < 120 || len(deads) < 60 || len(absent) < 60; i++ {
		k := fmt.Sprintf("key-%d", i)
		st := maphash.Bytes(s.seed, []byte(k)) % numStripes
		if len(stripes) < nStripes {
			found := false
			for _, x := range stripes {
				found = found || x == st
			}
			if !found {
				stripes = append(stripes, st)
			}
		}
		in := false
		for _, x := range stripes {
			in = in || x == st
		}
		if !in {
			continue
		}
		switch i % 3 {
		case 0:
			if len(counters) < 120 {
				counters = append(counters, k)
			}
		case 1:
			if len(deads) < 60 {
				deads = append(deads, k)
			}
		case 2:
			if len(absent) < 60 {
				absent = append(absent, k)
			}
		}
	}
	const workers, ops = 4, 1500
	acked := make([]map[string]uint64, workers)
	lastDead := make([]map[string]string, workers) // deads owned by worker w
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := range workers {
		acked[w] = map[string]uint64{}
		lastDead[w] = map[string]string{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			b := s.NewBatch()
			pending := map[string]uint64{}
			c := &padCounter{}
			for i := range ops {
				switch op := rng.IntN(20); {
				case op < 12:
					k := counters[rng.IntN(len(counters))]
					c.delta, c.pad = 1, rng.IntN(3)*rng.IntN(120)
					if err := b.Modify([]byte(k), c); err != nil {
						errc <- err
						return
					}
					pending[k]++
				case op < 14: // a transaction over every stripe
					b.Hold(rng.IntN(2) == 0)
					for range 3 {
						k := counters[rng.IntN(len(counters))]
						c.delta, c.pad = 1, rng.IntN(40)
						if err := b.Modify([]byte(k), c); err != nil {
							b.Release()
							errc <- err
							return
						}
						pending[k]++
					}
					b.Release()
				case op < 17: // an absent key read: a cached miss
					c.delta = 0
					if err := b.Modify([]byte(absent[rng.IntN(len(absent))]), c); err != nil {
						errc <- err
						return
					}
				default: // this worker's dead keys: live values and dead ones
					k := deads[w+workers*rng.IntN(len(deads)/workers)]
					v := "dead"
					if rng.IntN(2) == 0 {
						v = fmt.Sprintf("live:%d:%d", w, i)
					}
					val := []byte(v)
					if err := b.Modify([]byte(k), mutatorFunc(func([]byte, bool) ([]byte, Op, error) { return val, Put, nil })); err != nil {
						errc <- err
						return
					}
					lastDead[w][k] = v
				}
				if c.bad != nil {
					errc <- c.bad
					return
				}
				if rng.IntN(4) == 0 || b.Full() {
					if err := b.Commit(); err != nil {
						errc <- err
						return
					}
					for k, n := range pending {
						acked[w][k] += n
					}
					clear(pending)
				}
			}
			if err := b.Commit(); err != nil {
				errc <- err
				return
			}
			for k, n := range pending {
				acked[w][k] += n
			}
		}()
	}
	stop := make(chan struct{})
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		var cur []byte
		for {
			select {
			case <-stop:
				return
			default:
			}
			next, _, err := s.Sweep(cur, 50, func(key, val []byte) bool { return string(val) == "dead" })
			if err != nil {
				errc <- err
				return
			}
			cur = next
		}
	}()
	wg.Wait()
	close(stop)
	<-sweepDone
	select {
	case err := <-errc:
		t.Fatal(err)
	default:
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	chargedBytes(t, s)
	for i := range s.stripe {
		sp := &s.stripe[i]
		sp.mu.Lock()
		tb := &sp.mu.t
		for j := range tb.recs {
			r := &tb.recs[j]
			if r.flags&fLive != 0 && r.flags&(fClean|fRound|fMod) != fClean {
				t.Errorf("stripe %d record %d (%q): flags %b after Flush with nothing queued", i, j, tb.key(r), r.flags)
			}
		}
		sp.mu.Unlock()
	}
	if st.Dirty != 0 {
		t.Errorf("Stats.Dirty = %d after Flush", st.Dirty)
	}
	t.Logf("%d records cached, %d of %d bytes, %d rounds", st.CacheEntries, st.CacheBytes, st.CacheMemory, st.Rounds)
	recs := s.Records()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open("db", Options{fs: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := map[string]uint64{}
	for _, a := range acked {
		for k, n := range a {
			want[k] += n
		}
	}
	got := map[string][]byte{}
	if err := s.Scan(nil, nil, func(k, v []byte) bool {
		got[string(k)] = append([]byte(nil), v...)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for k, n := range want {
		v := got[k]
		if len(v) < 8 || binary.BigEndian.Uint64(v) != n {
			t.Errorf("%s: %x after reopen, want count %d", k, v, n)
		}
	}
	for _, ld := range lastDead {
		for k, v := range ld {
			g, ok := got[k]
			if v == "dead" && (!ok || string(g) == "dead") {
				continue
			}
			if string(g) != v {
				t.Errorf("%s: %q after reopen, want %q", k, g, v)
			}
		}
	}
	for _, k := range absent {
		if _, ok := got[k]; ok {
			t.Errorf("absent key %s in Pebble", k)
		}
	}
	if recs != int64(len(got)) {
		t.Errorf("Records() = %d before close, Pebble holds %d", recs, len(got))
	}
}
