package clusternode

import "testing"

// The node's groups share Config.LogMemory: a node with 64 shards keeps
// no more Raft log entries in memory than one with 3.
func TestGroupConfigSharesLogMemory(t *testing.T) {
	for _, tc := range []struct {
		mem    int64
		shards int
		want   int
	}{
		{0, 3, DefaultLogMemory / 4},
		{0, 63, DefaultLogMemory / 64},
		{8 << 20, 3, 2 << 20},
		{64 << 10, 64, 64 << 10 / 65},
	} {
		gc := groupConfig(&Config{LogMemory: tc.mem, LogKeepBytes: 5 << 20}, tc.shards)
		if gc.LogMemory != tc.want || gc.LogKeepBytes != 5<<20 {
			t.Errorf("LogMemory %d, %d shards: each group keeps %d bytes and %d of log, want %d and %d", tc.mem, tc.shards, gc.LogMemory, gc.LogKeepBytes, tc.want, 5<<20)
		}
	}
}
