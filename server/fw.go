package server

import (
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The FW.* commands: fixed windows aligned to the Unix epoch, counted by
// bucket.Window.

// fwSpec describes one FW.* command.
type fwSpec struct {
	get  bool // FW.GET, FW.PGET: nothing is counted or written
	unit bucket.Unit
}

func (sp fwSpec) name() string {
	switch {
	case sp.get && sp.unit == bucket.Millisecond:
		return "fw.pget"
	case sp.get:
		return "fw.get"
	case sp.unit == bucket.Millisecond:
		return "fw.pincr"
	}
	return "fw.incr"
}

// fwRequest is a parsed FW.* command.
type fwRequest struct {
	key    []byte // aliases the command's arguments
	params bucket.WindowParams
	at     int64 // in the command's unit; valid when hasAt
	hasAt  bool
}

// parseFW parses the arguments after the command name:
//
//	key limit window [COST n] [AT unix] [NOCOUNTBLOCKED] [STAGGER]
//
// The keywords come in any order, the last one wins; FW.GET and FW.PGET
// take no NOCOUNTBLOCKED, since they count nothing. The ranges are checked
// by bucket.NewWindow, after every integer has parsed.
func parseFW(spec fwSpec, args [][]byte, r *fwRequest) error {
	if len(args) < 3 {
		return resp.WrongArgs(spec.name())
	}
	*r = fwRequest{key: args[0]}
	p := &r.params
	p.Unit, p.Cost = spec.unit, 1
	var err error
	if p.Limit, err = intArg("limit", args[1]); err != nil {
		return err
	}
	window := "window"
	if spec.unit == bucket.Millisecond {
		window = "window_ms"
	}
	if p.Window, err = intArg(window, args[2]); err != nil {
		return err
	}
	for i := 3; i < len(args); i++ {
		switch {
		case resp.EqualFold(args[i], "stagger"):
			p.Stagger = true
		case resp.EqualFold(args[i], "nocountblocked") && !spec.get:
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
				return missingValue("AT", unitName(spec.unit))
			}
			i++
			if r.at, err = intArg("AT", args[i]); err != nil {
				return err
			}
			r.hasAt = true
		case spec.get:
			return unexpectedArg(args[i], "COST, AT or STAGGER")
		default:
			return unexpectedArg(args[i], "COST, AT, NOCOUNTBLOCKED or STAGGER")
		}
	}
	return nil
}

// fwMutator applies one parsed FW.* request to a stored window state. One
// lives in each client and is reused, so a command allocates nothing.
type fwMutator struct {
	get bool
	w   bucket.Window
	now int64 // unix ms

	d   bucket.Decision // the result
	val [bucket.MaxWindowStateLen]byte
}

// Mutate implements storage.Mutator.
func (m *fwMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var s bucket.WindowState
	if found {
		var err error
		if s, err = bucket.DecodeWindowState(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	if m.get {
		d, err := m.w.Get(s, found, m.now)
		if err != nil {
			return nil, storage.Keep, argErr(err)
		}
		m.d = d
		return nil, storage.Keep, nil
	}
	next, write, d, err := m.w.Incr(s, found, m.now)
	if err != nil {
		return nil, storage.Keep, argErr(err)
	}
	m.d = d
	if !write {
		return nil, storage.Keep, nil
	}
	return bucket.AppendWindowState(m.val[:0], next), storage.Put, nil
}

func fwRunner(spec fwSpec) func(*Server, *client, [][]byte) {
	return func(s *Server, c *client, args [][]byte) {
		s.runFW(c, spec, args)
	}
}

func (s *Server) runFW(c *client, spec fwSpec, args [][]byte) {
	m := &c.fw
	req := &c.fwReq
	if err := parseFW(spec, args[1:], req); err != nil {
		s.replyErr(c, err)
		return
	}
	var err error
	if m.w, err = bucket.NewWindow(req.params, req.key); err != nil {
		s.replyErr(c, argErrIn(err, spec.unit))
		return
	}
	if err := s.checkKeySize("key", len(req.key)); err != nil {
		s.replyErr(c, err)
		return
	}
	if req.hasAt {
		if m.now, err = spec.unit.Millis(req.at); err != nil {
			s.replyErr(c, argErr(err))
			return
		}
	} else {
		m.now = s.clock().UnixMilli()
	}
	m.get = spec.get
	c.key = keyspace.AppendWindowKey(c.key[:0], m.w.Millis(), m.w.Staggered(), req.key)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	d := &m.d
	if !spec.get {
		if d.Limited {
			c.result = rlDenied
		} else {
			c.result = rlAllowed
		}
	}
	r := d.Reply()
	c.out = resp.AppendArray(c.out, len(r))
	for _, v := range r {
		c.out = resp.AppendInt(c.out, v)
	}
}

var (
	fwIncrDoc  = fwDoc("Counts a request in key's fixed window of window seconds, aligned to the Unix epoch. Replies [limited, limit, remaining, retry_after, reset_after, used, reset_at] in seconds.", fwSpec{})
	fwPIncrDoc = fwDoc("FW.INCR with the window, AT and the reply's times in milliseconds.", fwSpec{unit: bucket.Millisecond})
	fwGetDoc   = fwDoc("FW.INCR's reply without counting: would a request of COST pass now.", fwSpec{get: true})
	fwPGetDoc  = fwDoc("FW.GET with the window, AT and the reply's times in milliseconds.", fwSpec{get: true, unit: bucket.Millisecond})
)

func fwDoc(summary string, spec fwSpec) *cmdDoc {
	window, at := "window", "unix_s"
	if spec.unit == bucket.Millisecond {
		window, at = "window_ms", "unix_ms"
	}
	args := []docArg{
		{name: "key", typ: "key"},
		{name: "limit", typ: "integer"},
		{name: window, typ: "integer"},
		{name: "n", typ: "integer", token: "COST", optional: true},
		{name: at, typ: "unix-time", token: "AT", optional: true},
	}
	if !spec.get {
		args = append(args, docArg{name: "nocountblocked", typ: "pure-token", token: "NOCOUNTBLOCKED", optional: true})
	}
	args = append(args, docArg{name: "stagger", typ: "pure-token", token: "STAGGER", optional: true})
	return &cmdDoc{summary: summary, group: "rate-limit", args: args}
}
