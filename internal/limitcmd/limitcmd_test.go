package limitcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
)

// t0 is an instant of the tests, unix ms.
const t0 = int64(1_700_000_000_000)

// keepBuf is the largest array a connection keeps, as server's connKeepBuf.
const keepBuf = 8 << 10

// splitArgs turns fuzz input into arguments, split at NUL bytes.
func splitArgs(in []byte) [][]byte {
	return bytes.Split(in, []byte{0})
}

// FuzzParseCL: any arguments parse to an error reply or a valid request.
func FuzzParseCL(f *testing.F) {
	for _, seed := range []string{
		"user123\x0015\x0030\x0060", "k\x0015\x0030\x0060\x001\x00AT\x001700000000", "k\x000\x001\x001\x000\x00at\x00-5\x00AT\x006",
		"k\x009223372036854775807\x001\x001", "k\x000\x009223372036854775807\x001", "k\x00 1 \x00+1\x00-0\x00\xff", "\xff\x001\x001\x001\x00AT",
	} {
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, ms bool) {
		unit := bucket.Second
		if ms {
			unit = bucket.Millisecond
		}
		args := splitArgs(in)
		var r CLRequest
		err := ParseCL(unit, "cl.throttle", args, &r)
		if err != nil {
			checkErrReply(t, args, err)
			return
		}
		if !bytes.Equal(r.Key, args[0]) || r.Quantity < 0 || r.GCRA.Limit() < 1 || r.GCRA.EmissionInterval() < 1 {
			t.Fatalf("%q parsed to %+v", args, r)
		}
		if r.HasAt {
			if _, err := unit.Nanos(r.At); err != nil {
				checkErrReply(t, args, ArgErr(err))
			}
		}
	})
}

// FuzzParseFW: any arguments parse to an error reply or a request that
// NewWindow accepts or refuses with an error reply.
func FuzzParseFW(f *testing.F) {
	for _, seed := range []string{
		"user:42\x005\x00300\x00AT\x001700000000", "k\x005\x00300\x00COST\x002\x00NOCOUNTBLOCKED\x00STAGGER\x00at\x001", "k\x000\x001\x00cost\x000",
		"k\x005\x009223372036854775807\x00AT\x00-9223372036854775808", "k\x005\x00300\x00COST", "\xff\xfe\x00-1\x00x\x00stagger",
	} {
		f.Add([]byte(seed), uint8(0))
	}
	f.Fuzz(func(t *testing.T, in []byte, form uint8) {
		spec := FWSpec{Get: form&1 == 1, Unit: bucket.Unit(form >> 1 & 1)}
		args := splitArgs(in)
		var r FWRequest
		err := ParseFW(spec, args, &r)
		if err != nil {
			checkErrReply(t, args, err)
			return
		}
		if !bytes.Equal(r.Key, args[0]) || (spec.Get && r.Params.NoCountBlocked) || r.Params.Unit != spec.Unit {
			t.Fatalf("%q parsed to %+v", args, r)
		}
		w, err := bucket.NewWindow(r.Params, r.Key)
		if err != nil {
			checkErrReply(t, args, ArgErrIn(err, spec.Unit))
			return
		}
		if w.Millis() < 1 || w.Offset() < 0 || w.Offset() >= w.Millis() {
			t.Fatalf("%q: window %d ms, offset %d", args, w.Millis(), w.Offset())
		}
		if r.HasAt {
			if _, err := spec.Unit.Millis(r.At); err != nil {
				checkErrReply(t, args, ArgErr(err))
			}
		}
	})
}

func checkErrReply(t *testing.T, args [][]byte, err error) {
	t.Helper()
	e, ok := err.(*errs.Error)
	if !ok || e.Kind != errs.Request || !strings.HasPrefix(resp.ErrorText(e), "ERR ") {
		t.Fatalf("%q: error %v (%T), want an ERR reply", args, err, err)
	}
}

// A log's arrays are reused between commands, and let go of after a
// pipeline that grew them past the connection's keepBuf.
func TestRollBuffersShrink(t *testing.T) {
	var m RollMutator
	l, _ := bucket.NewLog(bucket.LogParams{Interval: 60_000, Max: bucket.MaxLogMax})
	m.L = l
	big := bucket.LogState{Interval: 60_000}
	for i := range bucket.MaxLogMax + 1 {
		big.Entries = append(big.Entries, t0*1000+int64(i))
	}
	m.Now = t0*1000 + bucket.MaxLogMax + 1
	if _, _, err := m.Mutate(bucket.AppendLogState(nil, big), true); err != nil {
		t.Fatal(err)
	}
	if m.Footprint() < bucket.MaxLogMax*8 {
		t.Fatalf("footprint %d after a log of %d entries", m.Footprint(), bucket.MaxLogMax+1)
	}
	m.Resize(keepBuf)
	if m.Footprint() != 0 {
		t.Fatalf("footprint %d after resize", m.Footprint())
	}
}

// FuzzParseRoll: any arguments parse to an error reply or a request that
// NewLog accepts or refuses with an error reply.
func FuzzParseRoll(f *testing.F) {
	for _, seed := range []string{
		"rl:1\x0010\x003\x00MINDIFF\x002\x00AT\x005000", "k\x004000\x002\x00NOCOUNTBLOCKED\x00at\x00-1\x00mindiff\x000",
		"k\x009223372036854775807\x00100001", "k\x001\x001\x00AT", "\xff\xfe\x00-1\x00x\x00nocountblocked",
	} {
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, in []byte, would bool) {
		args := splitArgs(in)
		var r RollRequest
		err := ParseRoll(would, args, &r)
		if err != nil {
			checkErrReply(t, args, err)
			return
		}
		if !bytes.Equal(r.Key, args[0]) || (would && r.Params.NoCountBlocked) {
			t.Fatalf("%q parsed to %+v", args, r)
		}
		l, err := bucket.NewLog(r.Params)
		if err != nil {
			checkErrReply(t, args, ArgErr(err))
			return
		}
		if l.IntervalMillis() != r.Params.Interval {
			t.Fatalf("%q: interval %d", args, l.IntervalMillis())
		}
	})
}
