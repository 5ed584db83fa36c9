package storage

import (
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// MemDisk is an in-memory data directory whose writes can be made to fail,
// for tests of what a server does when its disk fills up or breaks. Pass it
// as Options.Disk; the directory name given to Open still names the store
// within it. Safe for concurrent use.
type MemDisk struct {
	fs   vfs.FS
	fail atomic.Pointer[error]
}

// NewMemDisk returns an empty MemDisk whose writes succeed.
func NewMemDisk() *MemDisk {
	d := &MemDisk{}
	d.fs = errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(d.maybeError))
	return d
}

// FailWrites makes every write and file creation fail with err from now
// on (wrap syscall.ENOSPC for a full disk); nil makes them succeed again.
// An fsync still succeeds, as it does on a full disk for data already
// written: a failed fsync makes the store fail for good (see diskguard.go),
// which is not what a full disk does.
func (d *MemDisk) FailWrites(err error) {
	if err == nil {
		d.fail.Store(nil)
		return
	}
	d.fail.Store(&err)
}

func (d *MemDisk) maybeError(op errorfs.Op) error {
	p := d.fail.Load()
	if p == nil || op.Kind.ReadOrWrite() != errorfs.OpIsWrite {
		return nil
	}
	switch op.Kind {
	case errorfs.OpFileClose, errorfs.OpRemove, errorfs.OpRemoveAll, errorfs.OpLock:
		// Failing these tells nothing about a full disk; Pebble only logs.
		return nil
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo, errorfs.OpFileFlush:
		return nil
	}
	return *p
}
