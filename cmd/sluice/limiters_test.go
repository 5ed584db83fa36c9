package main

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
)

// TestLimitersSurviveRestart: every CL.THROTTLE, FW.INCR and ROLL.LIMIT
// answered before
// a SIGTERM (in the default --fsync everysec: a clean shutdown writes
// everything) or a SIGKILL (with --fsync always) is in the store after the
// restart, and so is what a look stored (a CL look's TAT on a new key, a
// ROLL look's dropping of old entries).
func TestLimitersSurviveRestart(t *testing.T) {
	const lookAt = 4102444800660 // unix ms, in 2100
	for _, tc := range []struct {
		sig   syscall.Signal
		fsync string
	}{{syscall.SIGTERM, "everysec"}, {syscall.SIGKILL, "always"}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			p := startProc(t, dir, "--fsync", tc.fsync)
			rdb := p.client(t)
			ctx := context.Background()
			for i := range 20 {
				key := fmt.Sprintf("user:%d", i)
				for range i%5 + 1 {
					if err := rdb.Do(ctx, "CL.THROTTLE", key, 15, 30, 60, "AT", 1700000000).Err(); err != nil {
						t.Fatal(err)
					}
					if err := rdb.Do(ctx, "FW.PINCR", key, 100, 300000, "STAGGER", "AT", 1700000000000).Err(); err != nil {
						t.Fatal(err)
					}
					if err := rdb.Do(ctx, "ROLL.LIMIT", key, 60000, 10, "AT", 1700000000000000).Err(); err != nil {
						t.Fatal(err)
					}
				}
				// Issue 25's look, in 2100 so that the sweep keeps its TAT.
				if err := rdb.Do(ctx, "CL.PTHROTTLE", "look:"+key, 18, 58, 60000, 0, "AT", lookAt).Err(); err != nil {
					t.Fatal(err)
				}
				// A log whose one entry a look drops 10 ms later.
				if err := rdb.Do(ctx, "ROLL.LIMIT", "look:"+key, 10, 3, "AT", lookAt*1000).Err(); err != nil {
					t.Fatal(err)
				}
				if err := rdb.Do(ctx, "ROLL.WOULDLIMIT", "look:"+key, 10, 3, "AT", (lookAt+10)*1000).Err(); err != nil {
					t.Fatal(err)
				}
			}
			p.stop(t, tc.sig)
			p2 := startProc(t, dir, "--fsync", tc.fsync)
			rdb2 := p2.client(t)
			for i := range 20 {
				key := fmt.Sprintf("user:%d", i)
				n := int64(i%5 + 1)
				// A look (quantity 0) at the same instant: n emission
				// intervals of 2 s used.
				cl, err := rdb2.Do(ctx, "CL.THROTTLE", key, 15, 30, 60, 0, "AT", 1700000000).Int64Slice()
				if err != nil || !slices.Equal(cl, []int64{0, 16, 16 - n, -1, 2 * n}) {
					t.Fatalf("%s after %v: CL %v, %v; want %d used", key, tc.sig, cl, err, n)
				}
				fw, err := rdb2.Do(ctx, "FW.PGET", key, 100, 300000, "STAGGER", "AT", 1700000000000).Int64Slice()
				if err != nil || len(fw) != 7 || fw[5] != n {
					t.Fatalf("%s after %v: FW %v, %v; want %d used", key, tc.sig, fw, err, n)
				}
				// n actions logged: one more would leave 10 - n - 1.
				roll, err := rdb2.Do(ctx, "ROLL.WOULDLIMIT", key, 60000, 10, "AT", 1700000001000000).Int64Slice()
				if err != nil || !slices.Equal(roll, []int64{0, 0, 0, 0, 9 - n}) {
					t.Fatalf("%s after %v: ROLL %v, %v; want %d logged", key, tc.sig, roll, err, n)
				}
				// An earlier call counts from the TAT the look stored.
				cl, err = rdb2.Do(ctx, "CL.PTHROTTLE", "look:"+key, 18, 58, 60000, 1, "AT", lookAt-151).Int64Slice()
				if err != nil || !slices.Equal(cl, []int64{0, 19, 17, -1, 1186}) {
					t.Fatalf("%s after %v: CL after a look %v, %v; want [0 19 17 -1 1186]", key, tc.sig, cl, err)
				}
				// A longer interval does not bring the dropped entry back.
				roll, err = rdb2.Do(ctx, "ROLL.LIMIT", "look:"+key, 20, 3, "AT", (lookAt+10)*1000).Int64Slice()
				if err != nil || !slices.Equal(roll, []int64{0, 0, 0, 0, 2}) {
					t.Fatalf("%s after %v: ROLL after a look %v, %v; want [0 0 0 0 2]", key, tc.sig, roll, err)
				}
			}
		})
	}
}
