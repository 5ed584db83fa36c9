package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/storage"
)

// onStoreError is the engine's tuning with --on-store-error allow when
// allow is set, deny (the default) otherwise.
func onStoreError(allow bool) engine.Tuning {
	if allow {
		return engine.Tuning{OnStoreError: engine.Allow}
	}
	return engine.Tuning{}
}

// TestDiskFullAnswersErrorsThenRecovers serves from a store whose disk
// starts refusing writes: limit commands answer a clear error (or, with
// AllowOnStoreError, a normal reply that is not stored), reads and other
// clients keep working, nothing crashes, and once writes succeed again the
// server takes changes by itself.
func TestDiskFullAnswersErrorsThenRecovers(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			disk := storage.NewMemDisk()
			store, err := storage.Open("db", storage.Options{Sync: storage.SyncAlways, Disk: disk})
			if err != nil {
				t.Fatal(err)
			}
			srv, err := New(Config{Store: store, Engine: onStoreError(allow)})
			if err != nil {
				t.Fatal(err)
			}
			serveOn(t, srv, store)
			ctx := context.Background()
			c := newClient(t, srv)
			reduce := func() (int64, error) {
				return c.Do(ctx, "RL.REDUCE", "k", 10, 3600, "AT", 1000).Int64()
			}
			if n, err := reduce(); err != nil || n != 10 {
				t.Fatalf("first reduce = %d, %v; want 10", n, err)
			}

			disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
			// The write of this reduce fails; its change stays queued and
			// is stored once the disk recovers. (Replies are the tokens
			// the bucket held before the command.)
			n, err := reduce()
			if allow {
				if err != nil || n != 9 {
					t.Fatalf("reduce as the disk fills, allow: %d, %v; want 9", n, err)
				}
			} else if err == nil || !strings.Contains(err.Error(), "store unavailable") {
				t.Fatalf("reduce as the disk fills: %d, %v; want a store unavailable error", n, err)
			}
			for range 3 {
				n, err := reduce()
				if allow {
					// Answered from the bucket's state; nothing is taken.
					if err != nil || n != 8 {
						t.Fatalf("reduce on a full disk, allow: %d, %v; want 8", n, err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), "disk full or I/O error") {
					t.Fatalf("reduce on a full disk: %d, %v; want the store unavailable error", n, err)
				}
			}
			// Reads work. In always mode a reply may only show synced
			// state, and k's last change is not synced: without allow,
			// reading k is refused too.
			n, err = c.Do(ctx, "RL.GET", "k", 10, 3600, "AT", 1000).Int64()
			if allow && (err != nil || n != 8) || !allow && err == nil {
				t.Fatalf("RL.GET k on a full disk = %d, %v", n, err)
			}
			if n, err := c.Do(ctx, "RL.GET", "other", 10, 3600).Int64(); err != nil || n != 10 {
				t.Fatalf("RL.GET other on a full disk = %d, %v; want 10", n, err)
			}
			if r, err := newClient(t, srv).Do(ctx, "READY").Int64(); err != nil || r != 0 {
				t.Fatalf("READY on a full disk = %d, %v; want 0", r, err)
			}
			info := c.Info(ctx, "persistence").Val()
			for _, want := range []string{"store_status:unavailable", "store_unavailable_times:1"} {
				if !strings.Contains(info, want) {
					t.Fatalf("INFO persistence on a full disk lacks %q:\n%s", want, info)
				}
			}

			disk.FailWrites(nil)
			deadline := time.Now().Add(20 * time.Second)
			for c.Do(ctx, "READY").Val() != int64(1) {
				if time.Now().After(deadline) {
					t.Fatal("the server did not take writes again after the disk recovered")
				}
				time.Sleep(time.Millisecond)
			}
			if n, err := reduce(); err != nil || n != 8 {
				t.Fatalf("reduce after recovery = %d, %v; want 8", n, err)
			}
			if !strings.Contains(c.Info(ctx, "persistence").Val(), "store_status:ok") {
				t.Fatal("INFO persistence does not say ok after recovery")
			}
		})
	}
}

// TestWritesBeforeMaintenanceFailWithIt: COMPACT and CHECKPOINT commit the
// writes pipelined before them first. When that commit fails, those
// writes' replies must be the error too, never a success for a change that
// is not as durable as --fsync always promises.
func TestWritesBeforeMaintenanceFailWithIt(t *testing.T) {
	for _, cmd := range []string{"CHECKPOINT", "COMPACT"} {
		t.Run(cmd, func(t *testing.T) {
			disk := storage.NewMemDisk()
			store, err := storage.Open("db", storage.Options{Sync: storage.SyncAlways, Disk: disk})
			if err != nil {
				t.Fatal(err)
			}
			srv, err := New(Config{Store: store, RESP: respserver.Tuning{BackupDir: t.TempDir(), SweepInterval: respserver.NoLimit[time.Duration]()}})
			if err != nil {
				t.Fatal(err)
			}
			serveOn(t, srv, store)
			nc, err := net.Dial("tcp", srv.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(time.Minute))
			r := bufio.NewReader(nc)
			// The disk fails before the pipeline: the reduce is made in
			// memory, and its commit, in the maintenance command, fails.
			disk.FailWrites(fmt.Errorf("injected: %w", syscall.ENOSPC))
			if _, err := io.WriteString(nc, "RL.REDUCE k 10 3600 AT 1000\r\n"+cmd+"\r\n"); err != nil {
				t.Fatal(err)
			}
			first, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			second, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			disk.FailWrites(nil)
			for store.Unavailable() != nil { // the retried write goes through
				time.Sleep(time.Millisecond)
			}
			if !strings.HasPrefix(second, "-ERR") {
				t.Fatalf("%s on a failing disk answered %q, want an error", cmd, second)
			}
			if !strings.HasPrefix(first, "-ERR store unavailable") {
				t.Fatalf("the reduce before %s answered %q although its commit failed (%s said %q)", cmd, first, cmd, second)
			}
		})
	}
}
