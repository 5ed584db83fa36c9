package main

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/keyspace"
)

func TestShardKeysFallInTheirShards(t *testing.T) {
	shards, err := cluster.Place(3, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range shardKeys(shards) {
		if sl := keyspace.Slot([]byte(k)); sl < shards[i].Slots.First || sl > shards[i].Slots.Last {
			t.Errorf("shard %d (slots %d-%d): key %s is in slot %d", i, shards[i].Slots.First, shards[i].Slots.Last, k, sl)
		}
	}
}

func TestFailoverStatsCountATimeoutAsTheWorst(t *testing.T) {
	s := time.Second
	st := statsOf([]time.Duration{2 * s, 0, 1 * s, 3 * s}, 30*s)
	if st.Median != 2500*time.Millisecond || st.Worst != 30*s || st.Best != s || st.Missed != 1 {
		t.Errorf("got %+v", st)
	}
	if !strings.Contains(st.String(), "1 timed out") {
		t.Errorf("%q does not say a kill timed out", st.String())
	}
	st = statsOf([]time.Duration{3 * s, 1 * s, 2 * s}, 30*s)
	if st.Median != 2*s || st.Worst != 3*s || st.Missed != 0 || strings.Contains(st.String(), "timed out") {
		t.Errorf("got %+v, %q", st, st.String())
	}
}
