package clustercmd

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/resp"
)

// A node that masters no shard is a slave of the master of the first
// shard it is a replica of; one that masters a shard is a master however
// many it follows; a failure flag shows with the link down. CLUSTER SLOTS
// lists a replica with the same single role (a master of other slots is
// left out, as is a failed replica); SHARDS gives every replica with its
// health.
func TestRepliesWithReplicas(t *testing.T) {
	top := cluster.Topology{Epoch: 4, Nodes: []cluster.Node{
		{ID: "id0", Addr: "10.0.0.1:7000", Slots: []cluster.Range{{First: 0, Last: 99}}},
		{ID: "id1", Addr: "10.0.0.2:7000", Slots: []cluster.Range{{First: 100, Last: 199}}},
		{ID: "id2", Addr: "10.0.0.3:7000"},
	}}
	shards := []Shard{
		{Slots: []cluster.Range{{First: 0, Last: 99}}, Replicas: []Replica{
			{Node: 0, Master: true, Health: HealthOnline, Offset: 7},
			{Node: 1, Health: HealthOnline, Offset: 7},
			{Node: 2, Health: HealthFailed},
		}},
		{Slots: []cluster.Range{{First: 100, Last: 199}}, Replicas: []Replica{
			{Node: 1, Master: true, Health: HealthOnline, Offset: 3},
			{Node: 2, Health: HealthLoading},
			{Node: 0, Health: HealthOnline, Offset: 3},
		}},
	}
	got := Nodes(top, 0, shards, []string{"", "", "fail"})
	want := "id0 10.0.0.1:7000@0 myself,master - 0 0 4 connected 0-99\n" +
		"id1 10.0.0.2:7000@0 master - 0 0 4 connected 100-199\n" +
		"id2 10.0.0.3:7000@0 slave,fail id0 0 0 4 disconnected\n"
	if got != want {
		t.Errorf("CLUSTER NODES:\n%s\nwant\n%s", got, want)
	}

	slots := string(AppendSlots(nil, top, shards))
	// 0-99: node 1 masters other slots, node 2 failed; 100-199: node 2,
	// loading, is a replica, node 0 masters other slots.
	wantSlots := "*2\r\n" +
		"*3\r\n:0\r\n:99\r\n*3\r\n$8\r\n10.0.0.1\r\n:7000\r\n$3\r\nid0\r\n" +
		"*4\r\n:100\r\n:199\r\n*3\r\n$8\r\n10.0.0.2\r\n:7000\r\n$3\r\nid1\r\n*3\r\n$8\r\n10.0.0.3\r\n:7000\r\n$3\r\nid2\r\n"
	if slots != wantSlots {
		t.Errorf("CLUSTER SLOTS:\n%q\nwant\n%q", slots, wantSlots)
	}

	sh := string(AppendShards(nil, top, shards, false))
	for _, part := range []string{
		"$4\r\nrole\r\n$7\r\nreplica\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$6\r\nfailed\r\n",
		"$4\r\nrole\r\n$7\r\nreplica\r\n$18\r\nreplication-offset\r\n:0\r\n$6\r\nhealth\r\n$7\r\nloading\r\n",
		"$4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:3\r\n$6\r\nhealth\r\n$6\r\nonline\r\n",
	} {
		if !strings.Contains(sh, part) {
			t.Errorf("CLUSTER SHARDS lacks %q:\n%q", part, sh)
		}
	}
	if !strings.HasPrefix(sh, string(resp.AppendArray(nil, 2))) {
		t.Errorf("CLUSTER SHARDS: %q; want 2 shards", sh)
	}
}
