package limitcmd

import (
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/storage"
)

// The FW.* commands: fixed windows aligned to the Unix epoch, counted by
// bucket.Window.

// FWSpec describes one FW.* command.
type FWSpec struct {
	Get  bool // FW.GET, FW.PGET: nothing is counted or written
	Unit bucket.Unit
}

// Name is the command's lower-case name.
func (sp FWSpec) Name() string {
	switch {
	case sp.Get && sp.Unit == bucket.Millisecond:
		return "fw.pget"
	case sp.Get:
		return "fw.get"
	case sp.Unit == bucket.Millisecond:
		return "fw.pincr"
	}
	return "fw.incr"
}

// FWRequest is a parsed FW.* command.
type FWRequest struct {
	Key    []byte // aliases the command's arguments
	Params bucket.WindowParams
	At     int64 // in the command's unit; valid when hasAt
	HasAt  bool
}

// ParseFW parses the arguments after the command name:
//
//	key limit window [COST n] [AT unix] [NOCOUNTBLOCKED] [STAGGER]
//
// The keywords come in any order, the last one wins; FW.GET and FW.PGET
// take no NOCOUNTBLOCKED, since they count nothing. The ranges are checked
// by bucket.NewWindow, after every integer has parsed.
func ParseFW(spec FWSpec, args [][]byte, r *FWRequest) error {
	if len(args) < 3 {
		return errs.WrongArgs(spec.Name())
	}
	*r = FWRequest{Key: args[0]}
	p := &r.Params
	p.Unit, p.Cost = spec.Unit, 1
	var err error
	if p.Limit, err = intArg("limit", args[1]); err != nil {
		return err
	}
	window := "window"
	if spec.Unit == bucket.Millisecond {
		window = "window_ms"
	}
	if p.Window, err = intArg(window, args[2]); err != nil {
		return err
	}
	for i := 3; i < len(args); i++ {
		switch {
		case resp.EqualFold(args[i], "stagger"):
			p.Stagger = true
		case resp.EqualFold(args[i], "nocountblocked") && !spec.Get:
			p.NoCountBlocked = true
		case resp.EqualFold(args[i], "cost"):
			if i == len(args)-1 {
				return missingValue("COST", "n")
			}
			i++
			if p.Cost, err = intArg("COST", args[i]); err != nil {
				return err
			}
		case resp.EqualFold(args[i], "at"):
			if i == len(args)-1 {
				return missingValue("AT", unitName(spec.Unit))
			}
			i++
			if r.At, err = intArg("AT", args[i]); err != nil {
				return err
			}
			r.HasAt = true
		case spec.Get:
			return unexpectedArg(args[i], "COST, AT or STAGGER")
		default:
			return unexpectedArg(args[i], "COST, AT, NOCOUNTBLOCKED or STAGGER")
		}
	}
	return nil
}

// FWMutator applies one parsed FW.* request to a stored window state. One
// lives in each client and is reused, so a command allocates nothing.
type FWMutator struct {
	Get bool
	W   bucket.Window
	Now int64 // unix ms

	D   bucket.Decision // the result
	val [bucket.MaxWindowStateLen]byte
}

// Mutate implements storage.Mutator.
func (m *FWMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var s bucket.WindowState
	if found {
		var err error
		if s, err = bucket.DecodeWindowState(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	if m.Get {
		d, err := m.W.Get(s, found, m.Now)
		if err != nil {
			return nil, storage.Keep, ArgErr(err)
		}
		m.D = d
		return nil, storage.Keep, nil
	}
	next, write, d, err := m.W.Incr(s, found, m.Now)
	if err != nil {
		return nil, storage.Keep, ArgErr(err)
	}
	m.D = d
	if !write {
		return nil, storage.Keep, nil
	}
	return bucket.AppendWindowState(m.val[:0], next), storage.Put, nil
}
