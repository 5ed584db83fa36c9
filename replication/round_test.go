package replication

import (
	"bytes"
	"errors"
	"testing"

	"github.com/sluicehq/sluice/storage"
)

func TestRoundRoundTrip(t *testing.T) {
	r := Round{Proposer: 3, Seq: 1 << 40, Ops: []Op{
		{Key: []byte{0, 1, 'b', 'k'}, Value: []byte("v")},
		{Key: []byte{0, 2, 'g'}, Delete: true},
		{Key: []byte{0x3f, 0xff, 'w'}, Value: []byte{}},
	}}
	got, err := DecodeRound(r.Append(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !sameRound(got, r) {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
}

// A round whose changes say whether their records existed (the leader's
// committer's rounds) keeps that through its encoding, in version 2; one
// that says nothing is written in version 1, as older nodes wrote it.
func TestRoundPriorRoundTrip(t *testing.T) {
	r := Round{Proposer: 1, Seq: 9, Ops: []Op{
		{Key: []byte("c"), Value: []byte("new"), Prior: storage.PriorAbsent},
		{Key: []byte("u"), Value: []byte("changed"), Prior: storage.PriorPresent},
		{Key: []byte("r"), Delete: true, Prior: storage.PriorPresent},
		{Key: []byte("n"), Delete: true, Prior: storage.PriorAbsent},
		{Key: []byte("p"), Value: []byte("unknown")},
		{Key: []byte("d"), Delete: true},
	}}
	b := r.Append(nil)
	if b[0] != roundV2 {
		t.Fatalf("version %d, want %d", b[0], roundV2)
	}
	got, err := DecodeRound(b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameRound(got, r) {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
	old := Round{Proposer: 1, Seq: 9, Ops: r.Ops[4:]}
	if b := old.Append(nil); b[0] != roundV1 {
		t.Fatalf("a round of unknown Priors in version %d, want %d", b[0], roundV1)
	}
}

// A log entry written by a version before Prior existed still applies:
// its changes are of unknown Prior.
func TestDecodeRoundVersion1(t *testing.T) {
	// Round{Proposer: 3, Seq: 5, Ops: put "k"="v", delete "d"} as version
	// 1 wrote it.
	b := []byte{1, 3, 5, 2, 'p', 1, 'k', 1, 'v', 'd', 1, 'd'}
	got, err := DecodeRound(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Round{Proposer: 3, Seq: 5, Ops: []Op{{Key: []byte("k"), Value: []byte("v")}, {Key: []byte("d"), Delete: true}}}
	if !sameRound(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
}

func TestDecodeRoundRefuses(t *testing.T) {
	good := (&Round{Ops: []Op{{Key: []byte("k"), Value: []byte("v")}}}).Append(nil)
	for name, b := range map[string][]byte{
		"empty":           nil,
		"version 3":       append([]byte{3}, good[1:]...),
		"v2 op in v1":     {roundV1, 0, 0, 1, opRemove, 1, 'k'},
		"truncated":       good[:len(good)-1],
		"trailing byte":   append(bytes.Clone(good), 0),
		"unknown op":      {roundV1, 0, 0, 1, 'x', 1, 'k'},
		"empty key":       {roundV1, 0, 0, 1, opDelete, 0},
		"reserved key":    {roundV1, 0, 0, 1, opDelete, 2, 0xff, 'x'},
		"count too large": {roundV1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"length too long": {roundV1, 0, 0, 1, opDelete, 9, 'k'},
	} {
		if _, err := DecodeRound(b); !errors.Is(err, ErrBadRound) {
			t.Errorf("%s: %v, want ErrBadRound", name, err)
		}
	}
	// Nor is a round with a Prior that no kind of op says proposed.
	bad := Round{Ops: []Op{{Key: []byte("k"), Value: []byte("v"), Prior: storage.PriorPresent + 1}}}
	if err := bad.check(false); !errors.Is(err, ErrBadRound) {
		t.Errorf("Prior %d: %v, want ErrBadRound", bad.Ops[0].Prior, err)
	}
}

// Any input decodes to a round or an error, never a panic; a round that
// decodes encodes to bytes that decode to the same round.
func FuzzDecodeRound(f *testing.F) {
	f.Add((&Round{Proposer: 1, Seq: 2, Ops: []Op{{Key: []byte("k"), Value: []byte("v")}, {Key: []byte("d"), Delete: true}}}).Append(nil))
	f.Add([]byte{roundV1, 0, 0, 0})
	f.Add((&Round{Proposer: 1, Seq: 2, Ops: []Op{{Key: []byte("k"), Value: []byte("v"), Prior: storage.PriorAbsent}, {Key: []byte("d"), Delete: true, Prior: storage.PriorPresent}}}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRound(b)
		if err != nil {
			if !errors.Is(err, ErrBadRound) {
				t.Fatalf("error %v does not wrap ErrBadRound", err)
			}
			return
		}
		again, err := DecodeRound(r.Append(nil))
		if err != nil {
			t.Fatalf("re-encoded round does not decode: %v", err)
		}
		if !sameRound(again, r) {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
	})
}

func sameRound(a, b Round) bool {
	if a.Proposer != b.Proposer || a.Seq != b.Seq || len(a.Ops) != len(b.Ops) {
		return false
	}
	for i := range a.Ops {
		x, y := a.Ops[i], b.Ops[i]
		if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) || x.Delete != y.Delete || x.Prior != y.Prior {
			return false
		}
	}
	return true
}
