package limitcmd

import (
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/storage"
)

// The ROLL.* commands: the npm rolling-rate-limiter's sliding log with a
// minimum gap between actions, computed by bucket.Log.

// RollRequest is a parsed ROLL.LIMIT or ROLL.WOULDLIMIT.
type RollRequest struct {
	Key    []byte // aliases the command's arguments
	Params bucket.LogParams
	At     int64 // unix µs; valid when hasAt
	HasAt  bool
}

// ParseRoll parses the arguments after the command name:
//
//	key interval_ms max [MINDIFF ms] [AT unix_us] [NOCOUNTBLOCKED]
//
// The keywords come in any order, the last one wins; ROLL.WOULDLIMIT takes
// no NOCOUNTBLOCKED, since it records nothing. The ranges are checked by
// bucket.NewLog, after every integer has parsed.
func ParseRoll(would bool, args [][]byte, r *RollRequest) error {
	if len(args) < 3 {
		if would {
			return errs.WrongArgs("roll.wouldlimit")
		}
		return errs.WrongArgs("roll.limit")
	}
	*r = RollRequest{Key: args[0]}
	p := &r.Params
	var err error
	if p.Interval, err = intArg("interval_ms", args[1]); err != nil {
		return err
	}
	if p.Max, err = intArg("max", args[2]); err != nil {
		return err
	}
	for i := 3; i < len(args); i++ {
		switch {
		case resp.EqualFold(args[i], "nocountblocked") && !would:
			p.NoCountBlocked = true
		case resp.EqualFold(args[i], "mindiff"):
			if i == len(args)-1 {
				return missingValue("MINDIFF", "ms")
			}
			i++
			if p.MinDiff, err = intArg("MINDIFF", args[i]); err != nil {
				return err
			}
		case resp.EqualFold(args[i], "at"):
			if i == len(args)-1 {
				return missingValue("AT", "unix_us")
			}
			i++
			if r.At, err = intArg("AT", args[i]); err != nil {
				return err
			}
			r.HasAt = true
		case would:
			return unexpectedArg(args[i], "MINDIFF or AT")
		default:
			return unexpectedArg(args[i], "MINDIFF, AT or NOCOUNTBLOCKED")
		}
	}
	return nil
}

// RollMutator applies one parsed ROLL.LIMIT or ROLL.WOULDLIMIT to a stored
// log. One lives in each client and is reused with its arrays, so a command
// on a log that fits them allocates nothing; Resize lets go of arrays
// a large log grew.
type RollMutator struct {
	Would bool
	L     bucket.Log
	Now   int64 // unix µs

	R       bucket.LogResult // the result
	entries []int64          // the decoded log
	val     []byte           // the encoded log
}

// Mutate implements storage.Mutator.
func (m *RollMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	s := bucket.LogState{Entries: m.entries[:0]}
	if found {
		var err error
		if s, err = bucket.DecodeLogState(m.entries, old); err != nil {
			return nil, storage.Keep, err
		}
		m.entries = s.Entries[:0]
	}
	var (
		next  bucket.LogState
		write bool
		r     bucket.LogResult
		err   error
	)
	if m.Would {
		next, write, r, err = m.L.WouldLimit(s, m.Now)
	} else {
		next, write, r, err = m.L.Limit(s, m.Now)
	}
	if err != nil {
		return nil, storage.Keep, ArgErr(err)
	}
	m.R = r
	if cap(next.Entries) > cap(m.entries) {
		m.entries = next.Entries[:0] // appending now grew the array
	}
	switch {
	case !write:
		return nil, storage.Keep, nil
	case len(next.Entries) == 0:
		return nil, storage.Delete, nil // a look dropped every entry
	}
	m.val = bucket.AppendLogState(m.val[:0], next)
	return m.val, storage.Put, nil
}

// Resize lets go of arrays a large log grew past keep bytes.
func (m *RollMutator) Resize(keep int) {
	if cap(m.entries)*8 > keep {
		m.entries = nil
	}
	if cap(m.val) > keep {
		m.val = nil
	}
}

// Footprint is the bytes of the mutator's arrays.
func (m *RollMutator) Footprint() int { return 8*cap(m.entries) + cap(m.val) }
