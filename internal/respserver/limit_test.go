package respserver

import (
	"testing"
	"time"
)

// A Limit's zero is its field's default, NoLimit is off and bounds
// nothing, and a set bound stays.
func TestLimit(t *testing.T) {
	var zero Limit[int64]
	if l := zero.OrDefault(64); l.Off() || l.N() != 64 || !l.Within(64) || l.Within(65) {
		t.Errorf("zero Limit with default 64: off %v, n %d", l.Off(), l.N())
	}
	if l := NoLimit[int64]().OrDefault(64); !l.Off() || l.N() != 0 || !l.Within(1<<62) {
		t.Errorf("NoLimit: off %v, n %d", l.Off(), l.N())
	}
	if l := LimitOf(time.Second).OrDefault(time.Minute); l.Off() || l.N() != time.Second {
		t.Errorf("LimitOf(1s) with default 1m: off %v, n %v", l.Off(), l.N())
	}
	if l := LimitOf(-5).OrDefault(5); l.Off() || l.N() != 5 {
		t.Errorf("LimitOf(-5) with default 5: off %v, n %d; a negative bound is not off", l.Off(), l.N())
	}
}

// TestConfigDefaults: a zero field of Config is its documented default,
// and a field set stays as it is.
func TestConfigDefaults(t *testing.T) {
	got := Config{Tuning: Tuning{MaxArgs: 7, SweepInterval: NoLimit[time.Duration]()}}.withDefaults()
	want := Config{Tuning: Tuning{
		MaxArgs: 7, MaxBulk: DefaultMaxBulk, MaxInline: DefaultMaxInline, MaxQueryBuffer: DefaultMaxQueryBuffer,
		MaxAuthFailures: LimitOf(DefaultMaxAuthFailures), MaxReplyBuffer: DefaultMaxReplyBuffer, MaxMultiBytes: DefaultMaxMultiBytes,
		SweepInterval: NoLimit[time.Duration](), SweepRate: LimitOf(DefaultSweepRate),
		MaxMemoryClients: LimitOf[int64](DefaultMaxMemoryClients), BackupDir: DefaultBackupDir,
	},
		Version: "dev",
	}
	if got != want {
		t.Errorf("withDefaults:\n got %+v\nwant %+v", got, want)
	}
}
