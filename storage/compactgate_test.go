package storage

import (
	"sync"

	"github.com/cockroachdb/pebble/v2"
)

// compactionGate is a Pebble CompactionScheduler that starts compactions
// only while it is open, as many at once as Pebble allows (its
// CompactionConcurrencyRange): with it closed a test flushes level 0 into
// the shape it wants, then opens it and sees what Pebble's own picker
// starts from that shape. It also counts the compactions running and
// their inputs, from Pebble's events.
type compactionGate struct {
	db pebble.DBForCompaction
	// grantMu serializes grants, and the ends of compactions with them,
	// as Pebble's ConcurrencyLimitScheduler does.
	grantMu sync.Mutex
	mu      struct {
		sync.Mutex
		open, closed bool
		running      int
	}
	// ended gets a value when a compaction ends.
	ended chan struct{}
	// stats is kept by the EventListener that options installs.
	stats struct {
		sync.Mutex
		compactionStats
	}
}

// compactionStats is what a gate saw of the compactions out of level 0
// since its last reset.
type compactionStats struct {
	compactions int // that ended without error
	inFlight    int
	maxInFlight int    // the most compactions running at once
	inputBytes  uint64 // of every table they read
	largest     uint64 // the input bytes of the biggest one
	fromL0Bytes uint64 // of the level 0 tables they read
}

// options installs g in o as Pebble's scheduler and its listener.
func (g *compactionGate) options(o *Options) {
	g.ended = make(chan struct{}, 1)
	o.pebble = func(po *pebble.Options) {
		po.Experimental.CompactionScheduler = g
		l := po.EventListener
		l.CompactionBegin = g.begin
		l.CompactionEnd = g.end
	}
}

func (g *compactionGate) begin(info pebble.CompactionInfo) {
	g.stats.Lock()
	defer g.stats.Unlock()
	g.stats.inFlight++
	g.stats.maxInFlight = max(g.stats.maxInFlight, g.stats.inFlight)
}

func (g *compactionGate) end(info pebble.CompactionInfo) {
	g.stats.Lock()
	defer g.stats.Unlock()
	g.stats.inFlight--
	select {
	case g.ended <- struct{}{}:
	default:
	}
	if info.Err != nil {
		return
	}
	var in, l0 uint64
	for _, l := range info.Input {
		for _, t := range l.Tables {
			in += t.Size
			if l.Level == 0 {
				l0 += t.Size
			}
		}
	}
	g.stats.compactions++
	g.stats.inputBytes += in
	g.stats.fromL0Bytes += l0
	g.stats.largest = max(g.stats.largest, in)
}

// take returns the stats since the last take and starts afresh, with the compactions running.
func (g *compactionGate) take() compactionStats {
	g.stats.Lock()
	defer g.stats.Unlock()
	s := g.stats.compactionStats
	g.stats.compactionStats = compactionStats{inFlight: s.inFlight}
	return s
}

// setOpen opens or closes the gate; opening it starts every compaction
// Pebble has waiting, up to its concurrency, and returns how many run.
func (g *compactionGate) setOpen(open bool) int {
	g.grantMu.Lock()
	defer g.grantMu.Unlock()
	g.mu.Lock()
	g.mu.open = open
	g.mu.Unlock()
	g.grantLocked()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.running
}

// grantLocked starts the waiting compactions that the gate and Pebble
// allow; grantMu is held. Pebble's mutexes come before the gate's: mu is
// never held across a call into the DB other than
// GetAllowedWithoutPermission.
func (g *compactionGate) grantLocked() {
	for {
		g.mu.Lock()
		ok := g.mu.open && !g.mu.closed && g.mu.running < g.db.GetAllowedWithoutPermission()
		if ok {
			g.mu.running++
		}
		g.mu.Unlock()
		if !ok {
			return
		}
		waiting, _ := g.db.GetWaitingCompaction()
		if !waiting || !g.db.Schedule(g) {
			g.mu.Lock()
			g.mu.running--
			g.mu.Unlock()
			return
		}
	}
}

func (g *compactionGate) Register(_ int, db pebble.DBForCompaction) { g.db = db }

func (g *compactionGate) Unregister() {
	g.mu.Lock()
	g.mu.closed = true
	g.mu.Unlock()
	g.grantMu.Lock() // waits for a grant under way
	g.grantMu.Unlock()
}

func (g *compactionGate) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.mu.open || g.mu.closed || g.mu.running >= g.db.GetAllowedWithoutPermission() {
		return false, nil
	}
	g.mu.running++
	return true, g
}

// UpdateGetAllowedWithoutPermission is called with Pebble's mutex held;
// the concurrency the store sets does not change, so there is nothing to
// grant.
func (g *compactionGate) UpdateGetAllowedWithoutPermission() {}

// The gate is its own grant handle.

func (g *compactionGate) Started()                                          {}
func (g *compactionGate) MeasureCPU(pebble.CompactionGoroutineKind)         {}
func (g *compactionGate) CumulativeStats(pebble.CompactionGrantHandleStats) {}

// Done is called without Pebble's mutexes held. It waits for a grant
// under way, so that setOpen counts every compaction it started.
func (g *compactionGate) Done() {
	g.grantMu.Lock()
	defer g.grantMu.Unlock()
	g.mu.Lock()
	g.mu.running--
	g.mu.Unlock()
	g.grantLocked()
}
