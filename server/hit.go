package server

import (
	"cmp"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/storage"
)

// Policy rules (divvy's model): HIT over RESP, the rules in use, their
// reload, and the counters behind the divvy_* metrics. The line protocol is
// in divvy.go; both execute hits with Server.hit.

// loadedPolicy is a rule file in use, with the metric counters of its
// rules. It is replaced as a whole on reload: a hit reads the pointer once,
// so it never sees a mix of two files.
type loadedPolicy struct {
	p      *policy.Policy
	counts []*hitCounts // by rule position - 1
	at     time.Time
	byID   map[ruleID]*policy.Rule // for forwarded hits (counterRule)
}

// hitCounts are the hits of the rules with one label, since the start.
type hitCounts struct {
	label                                              string
	accepted, rejected, canaryAccepted, canaryRejected atomic.Int64
}

// policyState is the server's rules and their bookkeeping.
type policyState struct {
	file string // reloaded by ReloadPolicy; "" when there is no policy
	cur  atomic.Pointer[loadedPolicy]

	mu      sync.Mutex            // one load at a time
	byLabel map[string]*hitCounts // kept across reloads, so counters never go back

	reloads, reloadFailures atomic.Int64
	lastErr                 atomic.Pointer[string] // of the last failed reload, until one succeeds

	// divvy_errors_total, by code.
	errUnknownCommand, errUnknown atomic.Int64
}

var errNoPolicy = resp.Error("ERR no policy loaded: start sluice with --policy FILE (a divvy .ini or .json rule file)")

// loadPolicy reads the rule file and puts it in use. It returns the
// validation error, naming the file, rule and problem, and leaves the
// rules in use as they were when the file is bad.
func (s *Server) loadPolicy() error {
	ps := &s.pol
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p, err := policy.Load(ps.file)
	if err != nil {
		return err
	}
	if ps.byLabel == nil {
		ps.byLabel = make(map[string]*hitCounts)
	}
	rules := p.Rules()
	lp := &loadedPolicy{p: p, counts: make([]*hitCounts, len(rules)), at: time.Now(), byID: indexRules(rules)}
	for i, r := range rules {
		hc := ps.byLabel[r.Label]
		if hc == nil {
			hc = &hitCounts{label: r.Label}
			ps.byLabel[r.Label] = hc
		}
		lp.counts[i] = hc
	}
	ps.cur.Store(lp)
	return nil
}

// ReloadPolicy reads the --policy file again and, if it is valid, puts it
// in use at once for every new hit; hits under way finish with the rules
// they started with. A bad file keeps the rules in use, is logged and
// counted, and its error is returned. Without a policy file it does
// nothing and returns errNoPolicy.
func (s *Server) ReloadPolicy() error {
	if s.pol.file == "" {
		return errNoPolicy
	}
	if err := s.loadPolicy(); err != nil {
		s.pol.reloadFailures.Add(1)
		msg := err.Error()
		s.pol.lastErr.Store(&msg)
		s.log.Error("policy reload failed; keeping the rules in use", "file", s.pol.file, "err", err)
		return err
	}
	s.pol.reloads.Add(1)
	s.pol.lastErr.Store(nil)
	s.log.Info("policy reloaded", "file", s.pol.file, "rules", len(s.pol.cur.Load().counts))
	return nil
}

// hitter is one connection's reusable state for executing hits, so that a
// hit allocates nothing.
type hitter struct {
	req      policy.Request
	canaries []*policy.Rule
	id, key  []byte
	m        ruleMutator
	// done holds the outcomes of this round's hits until its writes are
	// committed; the metrics count only what clients were told.
	done []hitDone
}

// Sizes of a hitter's elements, for its footprint.
const (
	fieldSize   = 48 // policy.Field: two slice headers
	hitDoneSize = 16 // hitDone: a pointer and three bools, padded
)

// resize lets go of what a pipeline's hits grew, as conn.resize does for
// the connection's buffers. req's fields point into the framer's output of
// the last pipeline, so its whole capacity is cleared: a slice header left
// beyond len would keep a dropped multi-MiB command reachable for the life
// of the connection.
func (h *hitter) resize() {
	if cap(h.req)*fieldSize > connKeepBuf {
		h.req = nil
	} else {
		clear(h.req[:cap(h.req)])
		h.req = h.req[:0]
	}
	if cap(h.canaries)*8 > connKeepBuf {
		h.canaries = nil
	} else {
		clear(h.canaries[:cap(h.canaries)]) // rules of a policy a reload may replace
		h.canaries = h.canaries[:0]
	}
	if cap(h.key) > connKeepBuf {
		h.key = nil
	}
	if cap(h.id) > connKeepBuf {
		h.id = nil
	}
	if cap(h.done)*hitDoneSize > connKeepBuf {
		h.done = nil
	}
	h.m.c.Shrink(connKeepBuf)
}

// footprint is the bytes of h's buffers, counted with the connection's.
func (h *hitter) footprint() int {
	return fieldSize*cap(h.req) + 8*cap(h.canaries) + cap(h.id) + cap(h.key) + hitDoneSize*cap(h.done) + h.m.c.Footprint()
}

type hitDone struct {
	counts        *hitCounts
	canary, wrote bool
	allowed       bool
}

// ruleMutator applies one hit of one rule to its stored counter, whatever
// the rule's algorithm (policy.Counter).
type ruleMutator struct {
	c policy.Counter
}

// Mutate implements storage.Mutator.
func (m *ruleMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	val, write, err := m.c.Apply(old, found)
	switch {
	case err != nil:
		return nil, storage.Keep, hitErr(err)
	case !write:
		return nil, storage.Keep, nil
	}
	return val, storage.Put, nil
}

// hitErr turns what policy.Counter refuses into the error a client is
// told: a hit count the rule cannot take, or arithmetic out of range,
// which the loader's checks leave only to extreme clocks. A stored value
// that does not decode is passed on as it is.
func hitErr(err error) error {
	var ae *bucket.ArgError
	switch {
	case errors.Is(err, policy.ErrHits):
		return resp.Error("ERR " + strings.TrimPrefix(err.Error(), "policy: "))
	case errors.As(err, &ae):
		return resp.Error("ERR rule arithmetic out of range: " + ae.Arg + ": " + ae.Msg)
	}
	return err
}

// hit is the entry point every front end uses to evaluate a request
// against the rules: HIT over RESP, the divvy line protocol, GET /check and
// (later) Envoy's rate-limit service. It evaluates req, the request's
// fields, at now (unix ns) under lp, for a cost of hits (Envoy's
// hits_addend; 1 for one request, 0 to read without counting): each canary
// rule matched before the deciding rule takes its hits, then the deciding
// rule answers. The answer carries the deciding rule (Outcome.Rule) and
// what rate-limit headers need.
//
// h is the caller's reusable state (one per connection or goroutine); req
// may be h.req. Changes are queued in b; the caller commits them before
// it answers, then calls h.countHits for the metrics.
func (s *Server) hit(h *hitter, lp *loadedPolicy, req policy.Request, hits int64, b *storage.Batch, now int64) (policy.Outcome, error) {
	decider, canaries := lp.p.Match(req, h.canaries[:0])
	h.canaries = canaries
	// Every key is checked before the first rule takes its credit, so a
	// refused hit changes nothing.
	if err := s.checkActorKey(req, decider); err != nil {
		return policy.Outcome{}, err
	}
	for _, r := range canaries {
		if err := s.checkActorKey(req, r); err != nil {
			return policy.Outcome{}, err
		}
	}
	for _, r := range canaries {
		if _, err := s.hitRule(h, lp, r, req, hits, true, b, now); err != nil {
			return policy.Outcome{}, err
		}
	}
	return s.hitRule(h, lp, decider, req, hits, false, b, now)
}

// checkActorKey refuses a hit whose value of r's actor field, the part of
// r's counter key the client chooses, is longer than MaxKeySize.
func (s *Server) checkActorKey(req policy.Request, r *policy.Rule) error {
	if !r.MayCount() || r.ActorField == "" {
		return nil
	}
	v, _ := req.Get(r.ActorField)
	if len(v) <= s.cfg.MaxKeySize { // before building the name: no allocation on the way
		return nil
	}
	return s.checkKeySize("value of actor field "+r.ActorField, len(v))
}

func (s *Server) hitRule(h *hitter, lp *loadedPolicy, r *policy.Rule, req policy.Request, hits int64, canary bool, b *storage.Batch, now int64) (policy.Outcome, error) {
	d := hitDone{counts: lp.counts[r.Pos-1], canary: canary}
	c := &h.m.c
	c.Rule, c.Hits, c.Now = r, hits, now
	var quota policy.QuotaStatus
	c.Limit, quota = r.Limit(req)
	if c.Limit > 0 && r.ResetSeconds > 0 {
		h.id = r.AppendCounterID(h.id[:0], req)
		c.ID = h.id
		h.key = keyspace.AppendRuleKey(h.key[:0], r, c.Limit, h.id)
		before := b.Len()
		// In cluster mode another node may own the counter's slot: it
		// applies the same hit (rule, counter ID, limit, hits, now) and
		// answers the whole outcome (forward.go).
		if fwd, o, err := s.forwardCounter(h.key, r, c.Limit, hits, now); fwd {
			if err != nil {
				return policy.Outcome{}, err
			}
			o.Rule = r
			c.Out = o
		} else if err := s.modify(b, h.key, &h.m); err != nil {
			return policy.Outcome{}, err
		}
		d.wrote = b.Len() > before
	} else if _, _, err := c.Apply(nil, false); err != nil {
		return policy.Outcome{}, hitErr(err)
	}
	out := c.Out
	out.Quota, out.Rate = quota, c.Limit
	d.allowed = out.Allowed
	h.done = append(h.done, d)
	return out, nil
}

// countHits adds the round's hits to the metrics; with committed false
// (the writes were not stored) only the hits that wrote nothing count.
func (h *hitter) countHits(committed bool) {
	for _, d := range h.done {
		if !committed && d.wrote {
			continue
		}
		switch {
		case d.canary && d.allowed:
			d.counts.canaryAccepted.Add(1)
		case d.canary:
			d.counts.canaryRejected.Add(1)
		case d.allowed:
			d.counts.accepted.Add(1)
		default:
			d.counts.rejected.Add(1)
		}
	}
	h.done = h.done[:0]
}

// cmdHit implements HIT key=value [key=value ...]: the reply is
// [allowed (1 or 0), credits left, seconds until the window resets].
func cmdHit(s *Server, c *client, args [][]byte) {
	lp := s.pol.cur.Load()
	if lp == nil {
		s.replyErr(c, errNoPolicy)
		return
	}
	h := &c.hit
	req, err := policy.ParseArgs(args[1:], h.req)
	h.req = req
	if err != nil {
		var pe *policy.ProtocolError
		if errors.As(err, &pe) {
			err = resp.Error("ERR HIT " + pe.Reason + "; expected HIT key=value [key=value ...]")
		}
		s.replyErr(c, err)
		return
	}
	out, err := s.hit(h, lp, h.req, 1, c.Batch, s.clock().UnixNano())
	if err != nil {
		s.replyErr(c, err)
		return
	}
	if out.Allowed {
		c.Result = dispatch.Allowed
	} else {
		c.Result = dispatch.Denied
	}
	c.Out = resp.AppendArray(c.Out, 3)
	c.Out = resp.AppendInt(c.Out, int64(b2i(out.Allowed)))
	c.Out = resp.AppendInt(c.Out, out.CreditsLeft)
	c.Out = resp.AppendInt(c.Out, out.SecondsUntilReset)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// cmdPolicy implements POLICY RELOAD and POLICY SHOW.
func cmdPolicy(s *Server, c *client, args [][]byte) {
	switch {
	case len(args) == 2 && resp.EqualFold(args[1], "reload"):
		// The rules of both front ends, as SIGHUP: the --policy file and
		// the --rls-config directory, each kept as it was when bad.
		var perr, rerr error
		if s.pol.file != "" || s.rls.dir == "" {
			perr = s.ReloadPolicy()
			if perr != nil && !errors.Is(perr, errNoPolicy) { // a bad file: say which, and that nothing changed
				perr = resp.Error("ERR " + oneLine(perr.Error()) + "; the rules in use are kept")
			}
		}
		if err := s.ReloadRLS(); err != nil {
			rerr = resp.Error("ERR --rls-config: " + oneLine(err.Error()) + "; the configuration in use is kept")
		}
		if err := cmp.Or(perr, rerr); err != nil {
			s.replyErr(c, err)
			return
		}
		c.Out = resp.AppendSimple(c.Out, "OK")
	case len(args) == 2 && resp.EqualFold(args[1], "show"):
		lp := s.pol.cur.Load()
		if lp == nil {
			s.replyErr(c, errNoPolicy)
			return
		}
		rules := lp.p.Rules()
		c.Out = resp.AppendArray(c.Out, len(rules))
		for _, r := range rules {
			c.Out = appendRule(c.Out, r)
		}
	default:
		s.replyErr(c, resp.Error("ERR unknown POLICY subcommand or wrong number of arguments; expected POLICY RELOAD or POLICY SHOW"))
	}
}

// appendRule appends one rule of POLICY SHOW as a flat array of names and
// values, in the fields' order in a rule file. Every field is shown, those
// of other algorithms with their zero value (burst 0 is the limit).
func appendRule(out []byte, r *policy.Rule) []byte {
	out = resp.AppendArray(out, 28)
	out = resp.AppendBulkString(out, "position")
	out = resp.AppendInt(out, int64(r.Pos))
	out = resp.AppendBulkString(out, "operation")
	out = resp.AppendBulkString(out, r.String())
	out = resp.AppendBulkString(out, "creditLimit")
	out = resp.AppendInt(out, r.CreditLimit)
	out = resp.AppendBulkString(out, "resetSeconds")
	out = resp.AppendInt(out, r.ResetSeconds)
	out = resp.AppendBulkString(out, "algorithm")
	out = resp.AppendBulkString(out, r.Algorithm.String())
	out = resp.AppendBulkString(out, "stagger")
	out = resp.AppendBulkString(out, strconv.FormatBool(r.Stagger))
	out = resp.AppendBulkString(out, "burst")
	out = resp.AppendInt(out, r.Burst)
	out = resp.AppendBulkString(out, "minGapMillis")
	out = resp.AppendInt(out, r.MinGapMillis)
	out = resp.AppendBulkString(out, "quotaField")
	out = resp.AppendBulkString(out, r.QuotaField)
	out = resp.AppendBulkString(out, "maxQuota")
	out = resp.AppendInt(out, r.MaxQuota)
	out = resp.AppendBulkString(out, "actorField")
	out = resp.AppendBulkString(out, r.ActorField)
	out = resp.AppendBulkString(out, "matchPolicy")
	out = resp.AppendBulkString(out, r.MatchPolicy.String())
	out = resp.AppendBulkString(out, "label")
	out = resp.AppendBulkString(out, r.Label)
	out = resp.AppendBulkString(out, "comment")
	return resp.AppendBulkString(out, r.Comment)
}

// oneLine keeps an error message fit for a one-line reply.
func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

// policyInfo is INFO's policy section.
func (s *Server) policyInfo(kv func(k, v string)) {
	ps := &s.pol
	lp := ps.cur.Load()
	kv("policy_file", ps.file)
	if lp != nil {
		kv("policy_rules", strconv.Itoa(len(lp.counts)))
		kv("policy_loaded_at", strconv.FormatInt(lp.at.Unix(), 10))
	} else {
		kv("policy_rules", "0")
		kv("policy_loaded_at", "0")
	}
	kv("policy_reloads", strconv.FormatInt(ps.reloads.Load(), 10))
	kv("policy_reload_failures", strconv.FormatInt(ps.reloadFailures.Load(), 10))
	last := ""
	if p := ps.lastErr.Load(); p != nil {
		last = *p
	}
	kv("policy_last_reload_error", last)
	kv("divvy_addr", s.divvyAddr())
	kv("divvy_connections", strconv.FormatInt(s.divvy.open.Load(), 10))
	// Envoy's rate limit service's configuration, reloaded with the rules.
	st := &s.rls
	kv("rls_config_dir", st.dir)
	limits, at := 0, int64(0)
	if ld := st.cur.Load(); ld != nil {
		limits, at = len(ld.cfg.Limits()), ld.at.Unix()
	}
	kv("rls_limits", strconv.Itoa(limits))
	kv("rls_loaded_at", strconv.FormatInt(at, 10))
	kv("rls_reloads", strconv.FormatInt(st.reloads.Load(), 10))
	kv("rls_reload_failures", strconv.FormatInt(st.reloadFailures.Load(), 10))
}

// labelCounts returns the hit counters by label, sorted, for the metrics.
func (s *Server) labelCounts() []*hitCounts {
	ps := &s.pol
	ps.mu.Lock()
	out := make([]*hitCounts, 0, len(ps.byLabel))
	for _, hc := range ps.byLabel {
		out = append(out, hc)
	}
	ps.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].label < out[j].label })
	return out
}
