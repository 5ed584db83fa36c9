package server

import (
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The ROLL.* commands: the npm rolling-rate-limiter's sliding log with a
// minimum gap between actions, computed by bucket.Log.

// rollRequest is a parsed ROLL.LIMIT or ROLL.WOULDLIMIT.
type rollRequest struct {
	key    []byte // aliases the command's arguments
	params bucket.LogParams
	at     int64 // unix µs; valid when hasAt
	hasAt  bool
}

// parseRoll parses the arguments after the command name:
//
//	key interval_ms max [MINDIFF ms] [AT unix_us] [NOCOUNTBLOCKED]
//
// The keywords come in any order, the last one wins; ROLL.WOULDLIMIT takes
// no NOCOUNTBLOCKED, since it records nothing. The ranges are checked by
// bucket.NewLog, after every integer has parsed.
func parseRoll(would bool, args [][]byte, r *rollRequest) error {
	if len(args) < 3 {
		if would {
			return resp.WrongArgs("roll.wouldlimit")
		}
		return resp.WrongArgs("roll.limit")
	}
	*r = rollRequest{key: args[0]}
	p := &r.params
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
			if r.at, err = intArg("AT", args[i]); err != nil {
				return err
			}
			r.hasAt = true
		case would:
			return unexpectedArg(args[i], "MINDIFF or AT")
		default:
			return unexpectedArg(args[i], "MINDIFF, AT or NOCOUNTBLOCKED")
		}
	}
	return nil
}

// rollMutator applies one parsed ROLL.LIMIT or ROLL.WOULDLIMIT to a stored
// log. One lives in each client and is reused with its arrays, so a command
// on a log that fits them allocates nothing; conn.resize lets go of arrays
// a large log grew.
type rollMutator struct {
	would bool
	l     bucket.Log
	now   int64 // unix µs

	r       bucket.LogResult // the result
	entries []int64          // the decoded log
	val     []byte           // the encoded log
}

// Mutate implements storage.Mutator.
func (m *rollMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	s := bucket.LogState{Entries: m.entries[:0]}
	if found {
		var err error
		if s, err = bucket.DecodeLogState(m.entries, old); err != nil {
			return nil, storage.Keep, err
		}
		m.entries = s.Entries[:0]
	}
	if m.would {
		r, err := m.l.WouldLimit(s, m.now)
		if err != nil {
			return nil, storage.Keep, argErr(err)
		}
		m.r = r
		return nil, storage.Keep, nil
	}
	next, write, r, err := m.l.Limit(s, m.now)
	if err != nil {
		return nil, storage.Keep, argErr(err)
	}
	m.r = r
	if cap(next.Entries) > cap(m.entries) {
		m.entries = next.Entries[:0] // appending now grew the array
	}
	if !write {
		return nil, storage.Keep, nil
	}
	m.val = bucket.AppendLogState(m.val[:0], next)
	return m.val, storage.Put, nil
}

// resize lets go of arrays a large log grew.
func (m *rollMutator) resize() {
	if cap(m.entries)*8 > connKeepBuf {
		m.entries = nil
	}
	if cap(m.val) > connKeepBuf {
		m.val = nil
	}
}

func (m *rollMutator) footprint() int { return 8*cap(m.entries) + cap(m.val) }

func rollRunner(would bool) func(*Server, *client, [][]byte) {
	return func(s *Server, c *client, args [][]byte) {
		s.runRoll(c, would, args)
	}
}

func (s *Server) runRoll(c *client, would bool, args [][]byte) {
	m := &c.roll
	req := &c.rollReq
	if err := parseRoll(would, args[1:], req); err != nil {
		s.replyErr(c, err)
		return
	}
	var err error
	if m.l, err = bucket.NewLog(req.params); err != nil {
		s.replyErr(c, argErr(err))
		return
	}
	if err := s.checkKeySize("key", len(req.key)); err != nil {
		s.replyErr(c, err)
		return
	}
	if req.hasAt {
		m.now = req.at
	} else {
		m.now = s.clock().UnixMicro()
	}
	m.would = would
	c.key = keyspace.AppendLogKey(c.key[:0], req.key)
	if err := s.modify(c.batch, c.key, m); err != nil {
		s.replyErr(c, err)
		return
	}
	if !would {
		if m.r.Blocked {
			c.result = rlDenied
		} else {
			c.result = rlAllowed
		}
	}
	r := m.r.Reply()
	c.out = resp.AppendArray(c.out, len(r))
	for _, v := range r {
		c.out = resp.AppendInt(c.out, v)
	}
}

// cmdRollClear is ROLL.CLEAR key: it deletes key's log, and only its log
// (DEL removes every kind), and answers 1 if there was one, else 0.
func cmdRollClear(s *Server, c *client, args [][]byte) {
	key := args[1]
	if err := s.checkKeySize("key", len(key)); err != nil {
		s.replyErr(c, err)
		return
	}
	c.key = keyspace.AppendLogKey(c.key[:0], key)
	c.clear = delMutator{}
	if err := c.batch.Modify(c.key, &c.clear); err != nil {
		s.replyErr(c, wrapStoreErr(err))
		return
	}
	var n int64
	if c.clear.deleted {
		n = 1
	}
	c.out = resp.AppendInt(c.out, n)
}

var (
	rollLimitDoc = rollDoc("Records an action in key's sliding log, as the npm rolling-rate-limiter's limitWithInfo: at most max actions per interval_ms, none closer than MINDIFF ms to the previous one. Replies [blocked, blocked_by_count, blocked_by_min_difference, ms_until_allowed, actions_remaining].", false)
	rollWouldDoc = rollDoc("ROLL.LIMIT's reply without recording anything, as wouldLimitWithInfo.", true)
	rollClearDoc = &cmdDoc{
		summary: "Deletes key's sliding log, as the npm rolling-rate-limiter's clear; returns 1 if there was one, else 0.",
		group:   "rate-limit",
		args:    []docArg{{name: "key", typ: "key"}},
	}
)

func rollDoc(summary string, would bool) *cmdDoc {
	args := []docArg{
		{name: "key", typ: "key"},
		{name: "interval_ms", typ: "integer"},
		{name: "max", typ: "integer"},
		{name: "ms", typ: "integer", token: "MINDIFF", optional: true},
		{name: "unix_us", typ: "unix-time", token: "AT", optional: true},
	}
	if !would {
		args = append(args, docArg{name: "nocountblocked", typ: "pure-token", token: "NOCOUNTBLOCKED", optional: true})
	}
	return &cmdDoc{summary: summary, group: "rate-limit", args: args}
}
