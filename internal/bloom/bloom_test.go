package bloom

import (
	"fmt"
	"hash/maphash"
	"testing"
)

func TestNoFalseNegativesFewPositives(t *testing.T) {
	seed := maphash.MakeSeed()
	const n = 100_000
	f := New(n * 10 / 8) // about 10 bits per key
	for i := range n {
		f.Add(maphash.String(seed, fmt.Sprintf("in-%d", i)))
	}
	for i := range n {
		if !f.MayContain(maphash.String(seed, fmt.Sprintf("in-%d", i))) {
			t.Fatalf("false negative for in-%d", i)
		}
	}
	fp := 0
	for i := range n {
		if f.MayContain(maphash.String(seed, fmt.Sprintf("out-%d", i))) {
			fp++
		}
	}
	// About 1% is expected at 10 bits per key with 6 probes per block;
	// 3% leaves room for the blocking.
	if rate := float64(fp) / n; rate > 0.03 {
		t.Fatalf("false positive rate %.2f%%, want under 3%%", rate*100)
	}
	if got := f.Bytes(); got != n*10/8/BlockBytes*BlockBytes {
		t.Fatalf("Bytes = %d, want %d rounded down to whole blocks", got, n*10/8)
	}
	if New(BlockBytes-1) != nil {
		t.Fatal("a filter smaller than one block should be off")
	}
}

// BenchmarkAdd adds keys to a filter of 16 MiB (the store's default),
// which no cache holds: keys it holds already (a bucket changed again, as
// most writes are), and keys it does not.
func BenchmarkAdd(b *testing.B) {
	f := New(16 << 20)
	seed := maphash.MakeSeed()
	const n = 1 << 20
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = maphash.String(seed, fmt.Sprintf("k%d", i))
	}
	for _, h := range hashes[:n/2] {
		f.Add(h)
	}
	for name, hs := range map[string][]uint64{"held": hashes[:n/2], "new": hashes[n/2:]} {
		b.Run(name, func(b *testing.B) {
			for i := range b.N {
				f.Add(hs[(i*7919)%len(hs)])
			}
		})
	}
}
