package replication

import (
	"bytes"
	"errors"
	"testing"
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

func TestDecodeRoundRefuses(t *testing.T) {
	good := (&Round{Ops: []Op{{Key: []byte("k"), Value: []byte("v")}}}).Append(nil)
	for name, b := range map[string][]byte{
		"empty":           nil,
		"version 2":       append([]byte{2}, good[1:]...),
		"truncated":       good[:len(good)-1],
		"trailing byte":   append(bytes.Clone(good), 0),
		"unknown op":      {roundVersion, 0, 0, 1, 'x', 1, 'k'},
		"empty key":       {roundVersion, 0, 0, 1, opDelete, 0},
		"reserved key":    {roundVersion, 0, 0, 1, opDelete, 2, 0xff, 'x'},
		"count too large": {roundVersion, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"length too long": {roundVersion, 0, 0, 1, opDelete, 9, 'k'},
	} {
		if _, err := DecodeRound(b); !errors.Is(err, ErrBadRound) {
			t.Errorf("%s: %v, want ErrBadRound", name, err)
		}
	}
}

// Any input decodes to a round or an error, never a panic; a round that
// decodes encodes to bytes that decode to the same round.
func FuzzDecodeRound(f *testing.F) {
	f.Add((&Round{Proposer: 1, Seq: 2, Ops: []Op{{Key: []byte("k"), Value: []byte("v")}, {Key: []byte("d"), Delete: true}}}).Append(nil))
	f.Add([]byte{roundVersion, 0, 0, 0})
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
		if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) || x.Delete != y.Delete {
			return false
		}
	}
	return true
}
