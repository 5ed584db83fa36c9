package engine

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/peakstats"
	"github.com/sluicehq/sluice/internal/rules"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/policy"
)

// Threshold data (POLICY STATS, issue 30): at each end of an actor's
// window, the peak used of the window that ended is added to its label's
// summary of the UTC day the window ended on (peakstats.Day), and to the
// label's histogram of used ÷ limit for the metrics. A window ends when a
// hit finds it over and opens a new one (Round.hitRule, ApplyCounter), or
// when the idle sweep deletes it (Swept): each window is counted once, by
// what replaced or removed it. The summaries are accumulated in
// memory and added to the stored ones (keyspace.StatsMeta) by a flush set
// to run StatsFlushInterval after the first window ended since the last
// one, and at FlushStats: a crash loses at most that interval. Days older than the
// retention (Config.StatsDays) are dropped.
//
// A hit that ends no window adds nothing; one that does appends its end
// to the round, which its commit adds to the summaries under one lock
// when the change was stored: a window whose replacement was not stored
// has not ended yet.

// DefaultStatsDays is the days of threshold data kept when
// Config.StatsDays is zero.
const DefaultStatsDays = 30

// MaxStatsDays is the most days of threshold data kept: POLICY STATS
// reads each of them.
const MaxStatsDays = 366

// StatsFlushInterval is how long after a window ends the threshold data
// in memory are added to the store's, at most, when Config.StatsFlush is
// zero.
const StatsFlushInterval = 10 * time.Second

const msPerDay = 24 * 60 * 60 * 1000

// StatsQuantiles are the quantiles of peak used POLICY STATS reports.
var StatsQuantiles = [...]float64{0.5, 0.9, 0.99, 0.999}

// RatioBounds are the upper bounds of the buckets of the histogram of
// peak used ÷ limit (sluice_policy_peak_used_ratio).
var RatioBounds = [...]float64{0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1}

// windowEnd is an actor-window that ended, until its round commits.
type windowEnd struct {
	label       string
	hash        uint64
	used, limit int64
	endMs       int64
}

// windowEndSize is the bytes of a windowEnd: a string header and four
// int64s.
const windowEndSize = 48

// Ratios is one label's histogram of peak used ÷ limit.
type Ratios struct {
	// Buckets counts the windows by RatioBounds' bucket (not cumulative);
	// Over those above 1, which only a limit lowered while a window was
	// open leaves.
	Buckets [len(RatioBounds)]uint64
	Over    uint64
	Count   uint64
	Sum     float64
}

type statsKey struct {
	label string
	day   int64 // days since 1970-01-01, UTC
}

// stats is an Engine's threshold data in memory.
type stats struct {
	days  int64
	every time.Duration // Config.StatsFlush
	mu    struct {
		sync.Mutex
		pending map[statsKey]*peakstats.Day // since the last flush
		spare   []*peakstats.Day
		ratios  map[string]*Ratios
	}
	flush   sync.Mutex   // one flush at a time
	armed   atomic.Bool  // a flush is set to run: the data in memory will be stored
	cleaned atomic.Int64 // the day whose retention was applied last, +1
}

// statsEligible reports whether hits of r are summarised: a labelled rule
// of the rule file whose counters are windows (divvy, fixedWindow) under
// the rule's limit. A quota rule's windows each have the request's limit,
// which neither a counter nor the sweep knows.
func statsEligible(r *policy.Rule) bool {
	return r.Label != "" && !r.Standalone() && r.QuotaField == "" &&
		(r.Algorithm == policy.Divvy || r.Algorithm == policy.FixedWindow)
}

// noteEnd notes the window the hit just set up in r.m replaced, if it
// ended one, for the commit.
func (r *Round) noteEnd(rule *policy.Rule) {
	c := &r.m.c
	if !c.Ended || !statsEligible(rule) {
		return
	}
	r.ends = append(r.ends, windowEnd{label: rule.Label, hash: peakstats.Hash(c.ID[policy.CounterIDLen:]), used: c.EndedUsed, limit: c.Limit, endMs: c.EndedAt})
}

// Swept adds the window of a rule counter the idle sweep deleted, key and
// val its record, to the threshold data, when lp has its rule and the
// rule's windows are summarised: its used is counted under the rule's
// limit as the dials make it, or the actor's override the counter
// carries. Other records are ignored.
func (e *Engine) Swept(lp *rules.Set, key, val []byte) {
	if lp == nil || lp.Policy == nil {
		return
	}
	rec, err := keyspace.Parse(key)
	if err != nil || (rec.Kind.ID != keyspace.KindCounter && rec.Kind.ID != keyspace.KindRuleWindow) {
		return
	}
	id := rec.ID()
	if len(id) < policy.CounterIDLen {
		return
	}
	r := lp.ByID[rules.ID(id[:policy.CounterIDLen])]
	if r == nil || !r.Counted() || !statsEligible(r) {
		return
	}
	limit := e.dials.load().ruleOf(lp, r).CreditLimit
	carried, ok, inner, err := keyspace.SplitMarked(val)
	if err != nil {
		return
	}
	if ok && e.ov.has(r.Label) {
		limit = carried
	}
	if limit <= 0 {
		return
	}
	w := windowEnd{label: r.Label, hash: peakstats.Hash(id[policy.CounterIDLen:]), limit: limit}
	switch r.Algorithm {
	case policy.Divvy:
		win, err := policy.DecodeWindow(inner)
		if err != nil {
			return
		}
		w.used, w.endMs = limit-min(win.Left, limit-1), win.End
	case policy.FixedWindow:
		s, err := bucket.DecodeWindowState(inner)
		if err != nil || s.Count == 0 {
			return
		}
		w.used, w.endMs = s.Count, s.End
	}
	e.addEnds([]windowEnd{w})
}

// settleEnds adds the round's ended windows to the summaries when their
// replacements were stored.
func (r *Round) settleEnds(stored bool) {
	if len(r.ends) == 0 {
		return
	}
	if stored {
		r.e.addEnds(r.ends)
	}
	clear(r.ends) // labels of rules a reload may drop
	r.ends = r.ends[:0]
}

// addEnds adds ended windows to the summaries in memory, and sets a flush
// to run within the interval unless one is set already.
func (e *Engine) addEnds(ends []windowEnd) {
	s := &e.stats
	now := e.clock().UnixNano()
	today := floorDiv(now/1e6, msPerDay)
	first := today - (s.days - 1)
	s.mu.Lock()
	for _, w := range ends {
		rt := s.mu.ratios[w.label]
		if rt == nil {
			if s.mu.ratios == nil {
				s.mu.ratios = make(map[string]*Ratios)
			}
			rt = new(Ratios)
			s.mu.ratios[w.label] = rt
		}
		rt.observe(w.used, w.limit)
		day := floorDiv(w.endMs, msPerDay)
		if day < first || day > today {
			// Past the retention already, or ahead of the server's clock
			// (a hit's AT): kept, it would never be dropped.
			continue
		}
		k := statsKey{w.label, day}
		d := s.mu.pending[k]
		if d == nil {
			d = s.newDayLocked()
			if s.mu.pending == nil {
				s.mu.pending = make(map[statsKey]*peakstats.Day)
			}
			s.mu.pending[k] = d
		}
		d.Add(w.hash, w.used, w.used >= w.limit)
	}
	s.mu.Unlock()
	if !s.armed.Swap(true) {
		// Real time, whatever the engine's clock: what is in memory is
		// stored within the interval even if no other window ends.
		time.AfterFunc(s.every, func() {
			s.armed.Store(false)
			// An error leaves the data in memory; the next window's end
			// sets another flush, and FlushStats (at Close, at POLICY
			// STATS) reports it.
			_ = e.FlushStats()
		})
	}
}

func (s *stats) newDayLocked() *peakstats.Day {
	if n := len(s.mu.spare); n > 0 {
		d := s.mu.spare[n-1]
		s.mu.spare = s.mu.spare[:n-1]
		return d
	}
	return peakstats.NewDay()
}

func (rt *Ratios) observe(used, limit int64) {
	if limit <= 0 {
		return
	}
	x := float64(used) / float64(limit)
	rt.Count++
	rt.Sum += x
	for i, b := range RatioBounds {
		if x <= b {
			rt.Buckets[i]++
			return
		}
	}
	rt.Over++
}

// PeakRatios calls fn with each label's histogram of peak used ÷ limit,
// since the start, for the metrics.
func (e *Engine) PeakRatios(fn func(label string, r Ratios)) {
	s := &e.stats
	s.mu.Lock()
	copies := make(map[string]Ratios, len(s.mu.ratios))
	for label, r := range s.mu.ratios {
		copies[label] = *r
	}
	s.mu.Unlock()
	for label, r := range copies {
		fn(label, r)
	}
}

// StatsDays is the days of threshold data kept.
func (e *Engine) StatsDays() int { return int(e.stats.days) }

func statsName(label string, day int64) string {
	return keyspace.StatsMeta + label + "." + dayString(day)
}

func dayString(day int64) string {
	return time.UnixMilli(day * msPerDay).UTC().Format(time.DateOnly)
}

// parseStatsName splits a name under keyspace.StatsMeta (without it).
func parseStatsName(name string) (label string, day int64, ok bool) {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return "", 0, false
	}
	t, err := time.Parse(time.DateOnly, name[i+1:])
	if err != nil {
		return "", 0, false
	}
	return name[:i], floorDiv(t.UnixMilli(), msPerDay), true
}

// FlushStats adds the threshold data in memory to the store's, and drops
// the stored days past the retention. On an error the data stay in
// memory, for the next flush.
func (e *Engine) FlushStats() error {
	s := &e.stats
	s.flush.Lock()
	defer s.flush.Unlock()
	now := e.clock().UnixNano()
	today := floorDiv(now/1e6, msPerDay)
	first := today - (s.days - 1)
	s.mu.Lock()
	pending := s.mu.pending
	s.mu.pending = nil
	s.mu.Unlock()
	set := make(map[string][]byte, len(pending))
	var bad error
	for k, d := range pending {
		if k.day < first {
			continue
		}
		name := statsName(k.label, k.day)
		old, err := e.store.Meta(name)
		if err != nil {
			s.putBack(pending)
			return Typed(err)
		}
		sum := d
		if old != nil {
			if od, err := peakstats.Decode(old); err != nil {
				// Replaced by what is in memory: kept, it would fail every
				// flush.
				bad = errors.Join(bad, fmt.Errorf("engine: the threshold data %s did not decode and were replaced: %w", name, err))
			} else {
				od.Merge(d)
				sum = od
			}
		}
		set[name] = sum.Append(nil)
	}
	var del []string
	if s.cleaned.Load() != today+1 {
		if err := e.store.ScanMeta(keyspace.StatsMeta, func(name string, _ []byte) bool {
			if _, day, ok := parseStatsName(name); ok && day < first {
				del = append(del, keyspace.StatsMeta+name)
			}
			return true
		}); err != nil {
			s.putBack(pending)
			return Typed(err)
		}
	}
	if len(set) > 0 || len(del) > 0 {
		if err := e.store.UpdateMeta(set, del); err != nil {
			s.putBack(pending)
			return Typed(err)
		}
	}
	s.cleaned.Store(today + 1)
	s.mu.Lock()
	for _, d := range pending {
		if len(s.mu.spare) < 16 {
			d.Reset()
			s.mu.spare = append(s.mu.spare, d)
		}
	}
	s.mu.Unlock()
	return bad
}

// putBack returns the data a flush could not store to memory.
func (s *stats) putBack(pending map[statsKey]*peakstats.Day) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.pending == nil {
		s.mu.pending = pending
		return
	}
	for k, d := range pending {
		if cur := s.mu.pending[k]; cur != nil {
			cur.Merge(d)
		} else {
			s.mu.pending[k] = d
		}
	}
}

// Stats are one label's threshold data over the retained days.
type Stats struct {
	Label string
	// From and To are the first and last day covered (UTC, 2006-01-02):
	// the retention ending today.
	From, To string
	// Day is the summary of the period, the days merged.
	Day *peakstats.Day
	// Rule is the rule file's rule with the label.
	Rule *policy.Rule
}

// Stats returns the threshold data of lp's rule labelled label over the
// retained days, those in memory included.
func (e *Engine) Stats(lp *rules.Set, label string) (*Stats, error) {
	r := ruleByLabel(lp, label)
	if r == nil {
		return nil, unknownLabel(lp, label)
	}
	if !statsEligible(r) {
		why := "its algorithm, " + r.Algorithm.String() + ", has no windows"
		if r.QuotaField != "" {
			why = "each request gives its limit (quotaField " + r.QuotaField + ")"
		}
		return nil, errs.New(errs.Request, fmt.Sprintf("label %s: the rule's threshold data are not kept: %s; expected the label of a divvy or fixedWindow rule without a quotaField", label, why))
	}
	if err := e.FlushStats(); err != nil {
		return nil, err
	}
	s := &e.stats
	today := floorDiv(e.clock().UnixMilli(), msPerDay)
	first := today - (s.days - 1)
	sum := peakstats.NewDay()
	var derr error
	err := e.store.ScanMeta(keyspace.StatsMeta+label+".", func(name string, v []byte) bool {
		_, day, ok := parseStatsName(label + "." + name)
		if !ok || day < first || day > today {
			return true
		}
		d, err := peakstats.Decode(v)
		if err != nil {
			derr = fmt.Errorf("engine: the threshold data %s: %w", statsName(label, day), err)
			return false
		}
		sum.Merge(d)
		return true
	})
	if err != nil {
		return nil, Typed(err)
	}
	if derr != nil {
		return nil, &errs.Error{Kind: errs.Corrupt, Err: derr}
	}
	return &Stats{Label: label, From: dayString(first), To: dayString(today), Day: sum, Rule: r}, nil
}

// floorDiv divides by b > 0 rounding toward minus infinity.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
