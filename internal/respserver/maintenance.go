package respserver

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
)

// The idle sweep, COMPACT, DBSIZE, CHECKPOINT and LASTSAVE.
//
// A bucket that has refilled to full is equivalent to a missing one, so the
// sweep deletes it, as the original server's compaction filter did. The
// sweep runs in the background, paced to SweepRate records per second; a
// pass starts SweepInterval after the previous one ended, and each pass
// goes on from the key where the last step stopped.

// Defaults for the sweep. Deleting is what costs live traffic: on the
// 2-core development machine, with a workload saturating both cores and a
// store whose buckets were all idle, 100000/s cost a third of the
// throughput, and 20000/s stayed within the noise at 400k buckets but cost
// about a quarter at 10M (docs/benchmarks.md, "Idle sweep"). At 20000/s a
// pass over 10M buckets takes about 8 minutes.
const (
	DefaultSweepInterval = 10 * time.Minute
	DefaultSweepRate     = 20_000
)

// sweepStep is the most records one Sweep call examines: small enough that
// pacing is smooth and a step holds no iterator for long.
const sweepStep = 1000

type sweeper struct {
	mu     sync.Mutex // one pass at a time: the background loop or COMPACT
	cursor []byte     // where the next step starts; nil at the first record

	running atomic.Bool
	// The last finished pass.
	lastAt      atomic.Int64 // unix ms of its end; 0 if none
	lastScanned atomic.Int64
	lastDeleted atomic.Int64
	lastTook    atomic.Int64 // ns

	stop chan struct{} // closed by Close
	done chan struct{} // closed when the loop has returned
	once sync.Once
}

// SweepStatus is the idle sweep's state, for the metrics.
type SweepStatus struct {
	Running  bool
	LastAt   int64         // unix ms of the last pass's end; 0 if none
	LastTook time.Duration // the last pass's
}

// Sweep returns the idle sweep's state.
func (s *Server) Sweep() SweepStatus {
	sw := &s.sweep
	return SweepStatus{Running: sw.running.Load(), LastAt: sw.lastAt.Load(), LastTook: time.Duration(sw.lastTook.Load())}
}

// idleFunc returns the sweep's test for one step, on the server clock: the
// registry of kinds judges each record. Records of no known kind, or whose
// state does not decode, are kept.
func (s *Server) idleFunc() func(key, val []byte) bool {
	now := s.clock().UnixNano()
	return func(key, val []byte) bool { return keyspace.Idle(key, val, now) && s.clus.Sweeps(key) }
}

// startSweeper starts the background sweep, once, unless it is off.
func (s *Server) startSweeper() {
	if s.cfg.SweepInterval.Off() {
		return
	}
	s.sweep.once.Do(func() {
		s.sweep.done = make(chan struct{})
		go s.sweepLoop()
	})
}

// stopSweeper stops the background sweep and waits for it.
func (s *Server) stopSweeper() {
	s.sweep.once.Do(func() {}) // a sweeper not started by now never starts
	close(s.sweep.stop)
	if s.sweep.done != nil {
		<-s.sweep.done
	}
}

func (s *Server) sweepLoop() {
	defer close(s.sweep.done)
	t := time.NewTimer(s.cfg.SweepInterval.N())
	defer t.Stop()
	for {
		select {
		case <-s.sweep.stop:
			return
		case <-t.C:
		}
		if err := s.sweepPass(s.cfg.SweepRate.N(), s.sweep.stop); err != nil && !s.closing.Load() {
			s.log.Warn("idle sweep stopped early; it resumes at the next interval", "err", err)
		}
		t.Reset(s.cfg.SweepInterval.N())
	}
}

// sweepPass sweeps from the saved cursor to the last record, at most rate
// records per second (no limit if rate <= 0), and returns early, keeping
// the cursor, when stop is closed or a step fails.
func (s *Server) sweepPass(rate int, stop <-chan struct{}) error {
	sw := &s.sweep
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.running.Store(true)
	defer sw.running.Store(false)
	t0 := time.Now()
	var scanned, deleted int64
	for {
		lp := s.pol.Current()
		next, res, err := s.store.SweepThen(sw.cursor, sweepStep, s.idleFunc(), func(k, v []byte) { s.eng.Swept(lp, k, v) })
		scanned += int64(res.Scanned)
		deleted += int64(res.Deleted)
		if err != nil {
			return err
		}
		sw.cursor = next
		if next == nil {
			break
		}
		var wait time.Duration
		if rate > 0 {
			wait = time.Duration(float64(scanned)/float64(rate)*float64(time.Second)) - time.Since(t0)
		}
		if wait > 0 {
			select {
			case <-stop:
				return nil
			case <-time.After(wait):
			}
		} else {
			select {
			case <-stop:
				return nil
			default:
			}
		}
	}
	took := time.Since(t0)
	sw.lastScanned.Store(scanned)
	sw.lastDeleted.Store(deleted)
	sw.lastTook.Store(int64(took))
	sw.lastAt.Store(time.Now().UnixMilli())
	s.log.Info("idle sweep done", "scanned", scanned, "deleted", deleted, "took", took.Round(time.Millisecond))
	return nil
}

// cmdCompact sweeps the whole store now, unpaced, then compacts it, and
// answers when both are done.
func cmdCompact(s *Server, c *client, args [][]byte) {
	// The connection's own changes so far go first, and every change
	// committed before the command is written to Pebble, so that the sweep
	// and the compaction see them.
	if err := s.commitWrites(c); err != nil {
		s.replyErr(c, s.maintenanceErr("compact", err))
		return
	}
	if err := s.store.Flush(); err != nil {
		s.replyErr(c, s.maintenanceErr("compact", err))
		return
	}
	s.sweep.mu.Lock()
	s.sweep.cursor = nil // a whole pass, from the first record
	s.sweep.mu.Unlock()
	if err := s.sweepPass(0, s.sweep.stop); err != nil {
		s.replyErr(c, s.maintenanceErr("compact", err))
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.sweep.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := s.store.Compact(ctx); err != nil {
		s.replyErr(c, s.maintenanceErr("compact", err))
		return
	}
	c.Out = resp.AppendSimple(c.Out, "OK")
}

// cmdDBSize answers the number of stored buckets: those found when the
// store opened, plus those created since, minus those deleted.
func cmdDBSize(s *Server, c *client, args [][]byte) {
	c.Out = resp.AppendInt(c.Out, s.store.Records())
}

// cmdCheckpoint writes a consistent copy of the store into a new directory
// under BackupDir, named by the argument or by the time, and answers its
// path. `sluice --data <path>` serves the copy.
func cmdCheckpoint(s *Server, c *client, args [][]byte) {
	if len(args) > 2 {
		s.replyErr(c, errs.WrongArgs("checkpoint"))
		return
	}
	name := "sluice-" + time.Now().UTC().Format("20060102T150405.000Z")
	if len(args) == 2 {
		name = string(args[1])
		if !validBackupName(name) {
			s.replyErr(c, resp.Error("ERR checkpoint name must be 1 to 128 letters, digits, '.', '_' or '-', and not start with '.'"))
			return
		}
	}
	if err := s.commitWrites(c); err != nil {
		s.replyErr(c, s.maintenanceErr("checkpoint", err))
		return
	}
	dir, err := filepath.Abs(filepath.Join(s.cfg.BackupDir, name))
	if err == nil {
		if _, serr := os.Stat(dir); serr == nil {
			s.replyErr(c, resp.Error("ERR checkpoint "+strconv.Quote(dir)+" already exists"))
			return
		}
	}
	if err == nil {
		err = s.store.Checkpoint(dir)
	}
	if err != nil {
		s.replyErr(c, s.maintenanceErr("checkpoint", err))
		return
	}
	s.Checkpointed()
	s.log.Info("checkpoint written", "dir", dir)
	c.Out = resp.AppendBulkString(c.Out, dir)
}

// Checkpointed notes that a checkpoint was taken (LASTSAVE), by
// CHECKPOINT or a backup over HTTP (httpport.BackupHost).
func (s *Server) Checkpointed() { s.stats.LastSave.Store(time.Now().Unix()) }

// CheckpointFailed implements httpport.BackupHost: the text of
// CHECKPOINT's error reply for a checkpoint that failed with err.
func (s *Server) CheckpointFailed(err error) string {
	return s.errorText(s.maintenanceErr("checkpoint", err))
}

func validBackupName(n string) bool {
	if n == "" || len(n) > 128 || n[0] == '.' {
		return false
	}
	for i := 0; i < len(n); i++ {
		b := n[i]
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			return false
		}
	}
	return true
}

// cmdLastSave answers the unix time of the last successful CHECKPOINT, or,
// as in Redis, the start time before the first.
func cmdLastSave(s *Server, c *client, args [][]byte) {
	c.Out = resp.AppendInt(c.Out, s.stats.LastSave.Load())
}
