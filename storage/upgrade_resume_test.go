package storage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/sluicehq/sluice/keyspace"
)

// An upgrade of the format 1 store in cmd/sluice/testdata, interrupted
// after 20 moves and resumed with the real keyspace.UpgradeKey, leaves its
// 60 records, every one under a key of the new layout. Meanwhile the store
// says the upgrade began, so that a sluice that reads only format 1 refuses
// it rather than serve it without the records already moved.
func TestResumedUpgradeWithKeyspace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	if err := os.CopyFS(dir, os.DirFS("../cmd/sluice/testdata/format1/store")); err != nil {
		t.Fatal(err)
	}
	n := 0
	stop := errors.New("interrupted")
	up := func(dst, k []byte) ([]byte, bool, error) {
		nk, moved, err := keyspace.UpgradeKey(dst, k)
		if moved {
			if n++; n > 20 {
				return nil, false, stop
			}
		}
		return nk, moved, err
	}
	if _, err := Open(dir, Options{Upgrade: up, upgradeChunk: 10}); !errors.Is(err, stop) {
		t.Fatalf("first open: %v, want the interruption", err)
	}
	db, err := pebble.Open(dir, &pebble.Options{})
	if err != nil {
		t.Fatal(err)
	}
	marker, _ := getString(db, legacyFormatKey)
	db.Close()
	if marker != upgradingVersion {
		t.Fatalf("format 1 marker after the interruption: %q, want %q", marker, upgradingVersion)
	}

	s, err := Open(dir, Options{Upgrade: keyspace.UpgradeKey})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	total, bad := 0, 0
	if err := s.Scan(nil, nil, func(k, _ []byte) bool {
		total++
		if _, err := keyspace.Parse(k); err != nil {
			bad++
			t.Errorf("record key %q is in no layout: %v", k, err)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if total != 60 || bad != 0 || s.Records() != 60 {
		t.Errorf("after the resumed upgrade: %d records (Records %d), %d in no layout; want 60, 0", total, s.Records(), bad)
	}
}
