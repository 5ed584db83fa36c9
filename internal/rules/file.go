package rules

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/policy"
)

// File is the rule file (--policy) in use and its reloads. The rules in
// use are replaced as a whole: a hit reads Current once, so it never sees
// a mix of two files; the counters of a label are kept across reloads, so
// they never go back. A File is safe for concurrent use.
type File struct {
	// Path is the rule file, "" when there is none.
	Path string
	// MaxBytes bounds the rule file's size (policy.Load's maxBytes).
	MaxBytes int64

	cur atomic.Pointer[Set]
	mu  struct {
		sync.Mutex // one load at a time
		byLabel    map[string]*Counts
	}

	// Reloads and ReloadFailures count Reload's outcomes.
	Reloads, ReloadFailures atomic.Int64
	lastErr                 atomic.Pointer[string] // of the last failed reload, until one succeeds
}

// Current returns the rules in use, nil before the first Load.
func (f *File) Current() *Set { return f.cur.Load() }

// Load reads the rule file and puts it in use. It returns the validation
// error, naming the file, rule and problem, and leaves the rules in use as
// they were when the file is bad.
func (f *File) Load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, err := policy.Load(f.Path, f.MaxBytes)
	if err != nil {
		return err
	}
	if f.mu.byLabel == nil {
		f.mu.byLabel = make(map[string]*Counts)
	}
	rs := p.Rules()
	lp := &Set{Policy: p, Counts: make([]*Counts, len(rs)), At: time.Now(), ByID: Index(rs)}
	for i, r := range rs {
		hc := f.mu.byLabel[r.Label]
		if hc == nil {
			hc = &Counts{Label: r.Label}
			f.mu.byLabel[r.Label] = hc
		}
		lp.Counts[i] = hc
	}
	f.cur.Store(lp)
	return nil
}

// Reload is Load, counted in Reloads or ReloadFailures; a failure's error
// is LastError's until a reload succeeds.
func (f *File) Reload() error {
	if err := f.Load(); err != nil {
		f.ReloadFailures.Add(1)
		msg := err.Error()
		f.lastErr.Store(&msg)
		return err
	}
	f.Reloads.Add(1)
	f.lastErr.Store(nil)
	return nil
}

// LastError is the error of the last reload if it failed, else "".
func (f *File) LastError() string {
	if p := f.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// LabelCounts returns the hit counters by label, sorted, for the metrics.
func (f *File) LabelCounts() []*Counts {
	f.mu.Lock()
	out := make([]*Counts, 0, len(f.mu.byLabel))
	for _, hc := range f.mu.byLabel {
		out = append(out, hc)
	}
	f.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Label < out[j].Label })
	return out
}
