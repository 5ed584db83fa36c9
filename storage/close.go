package storage

import (
	"context"
	"fmt"
	"time"
)

// DefaultCloseTimeout bounds Close.
const DefaultCloseTimeout = 10 * time.Second

// Close is Shutdown bounded by DefaultCloseTimeout.
func (s *Store) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultCloseTimeout)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown writes everything queued, syncs the log and closes Pebble, and
// gives up when ctx is done or the store fails, whichever comes first: a
// write still being retried then stops (the store fails), and Pebble is
// left to the process exit. It returns nil when everything was written,
// synced and closed; otherwise a *CloseError, which says what may be lost.
// Callers must stop calling Modify and Commit first; Commits still waiting
// return when their writes are done or the store gives up. Only the first
// call does anything; later ones return its result.
func (s *Store) Shutdown(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown(ctx) })
	return s.closeErr
}

func (s *Store) shutdown(ctx context.Context) error {
	// A checkpoint in progress stops now. A write that fails while the
	// queue drains is still retried (a disk that is full for a moment must
	// not lose what was acknowledged) until ctx is done; then it is given
	// up and the store fails.
	s.guard.closing.Store(true)
	// A transaction under way finishes first, so that the log gets all
	// of it or none (see Batch.Hold); past ctx's deadline the store
	// closes anyway and Release drops what a transaction had changed.
	between := make(chan struct{})
	go func() {
		s.txMu.Lock()
		s.closed.Store(true)
		s.txMu.Unlock()
		close(between)
	}()
	select {
	case <-between:
	case <-ctx.Done():
		s.closed.Store(true)
	}
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case <-ctx.Done():
			s.guard.expired.Store(true)
		case <-finished:
		}
	}()
	wait := func(done <-chan struct{}) bool {
		select {
		case <-done:
			return true
		case <-s.failedC:
			return false
		case <-ctx.Done():
			return false
		}
	}
	ok := true
	if s.syncerStop != nil {
		close(s.syncerStop)
		ok = wait(s.syncerDone)
	}
	for _, q := range s.queues {
		q.Lock()
		q.closing = true
		q.work.Broadcast()
		q.done.Broadcast()
		q.Unlock()
	}
	ok = ok && wait(s.committerDone)
	if ok {
		synced := make(chan struct{})
		var err error
		go func() {
			err = s.syncApplied()
			close(synced)
		}()
		if ok = wait(synced); ok && err != nil {
			s.fail(fmt.Errorf("final sync: %w", err))
			ok = false
		}
	}
	var closeErr error
	if ok {
		closed := make(chan struct{})
		go func() {
			// A checkpoint holds closeMu for reading; its writes fail now.
			s.closeMu.Lock()
			s.dbClosed = true
			closeErr = s.db.Close()
			s.closeMu.Unlock()
			close(closed)
		}()
		ok = wait(closed)
	}
	if ok && closeErr == nil && s.failed.Load() == nil {
		return nil
	}
	ce := &CloseError{Dir: s.dir, Mode: s.opts.Sync, Unwritten: s.dirtyRecords()}
	for _, q := range s.queues {
		q.Lock()
		ce.Unsynced += q.appliedKeys - q.syncedKeys
		// A round whose fsync was under way, or failed, keeps its records
		// dirty: they are in the log, counted in Unsynced.
		ce.Unwritten -= q.syncingKeys
		q.Unlock()
	}
	ce.Unwritten = max(ce.Unwritten, 0)
	if ms := s.stats.lastSync.Load(); ms != 0 {
		ce.LastSync = time.UnixMilli(ms)
	}
	switch {
	case s.failed.Load() != nil:
		ce.Err = s.failedErr()
	case ok:
		// Pebble closed with an error, after the final sync succeeded.
		ce.Err, ce.Unsynced = fmt.Errorf("close Pebble: %w", closeErr), 0
	default:
		ce.Err = fmt.Errorf("not closed in time (%w)", ctx.Err())
		if err := s.guard.unavailable(); err != nil {
			ce.Err = fmt.Errorf("%w, while %w", ce.Err, err)
		}
	}
	return ce
}

// CloseError is Shutdown's error when the store could not be closed
// cleanly: it says what the next start will not find.
type CloseError struct {
	Dir  string
	Mode SyncMode
	Err  error // why
	// Unwritten is how many buckets have a change that never reached
	// Pebble: lost.
	Unwritten int64
	// Unsynced is how many keys were written to Pebble's log after its last
	// successful fsync: lost unless Pebble had handed them to the operating
	// system and the machine stays up.
	Unsynced int64
	LastSync time.Time // zero if never
}

func (e *CloseError) Unwrap() error { return e.Err }

func (e *CloseError) Error() string {
	last := "none since the start"
	if !e.LastSync.IsZero() {
		last = e.LastSync.UTC().Format(time.RFC3339Nano)
	}
	if e.Mode == SyncAlways {
		// Nothing unsynced was acknowledged in this mode.
		return fmt.Sprintf("store in %s not closed cleanly: %v; no acknowledged change is lost (--fsync always); buckets with changes not yet in the log: %d, keys written to the log since the last fsync (%s): %d; these were never acknowledged and may be lost",
			e.Dir, e.Err, e.Unwritten, last, e.Unsynced)
	}
	return fmt.Sprintf("store in %s not closed cleanly: %v; lost: acknowledged changes of %d buckets not yet in the log; may be lost (--fsync %s): %d keys written to the log since the last fsync (%s); everything else is replayed at the next start",
		e.Dir, e.Err, e.Unwritten, e.Mode, e.Unsynced, last)
}
