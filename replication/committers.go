package replication

import (
	"fmt"
	"sync"

	"github.com/sluicehq/sluice/storage"
)

// Committers hands each committer's rounds of a store to the group of its
// shard: the storage.Replicator of a store whose records are replicated.
// The store's committers must be aligned with the shards (its Partition
// gives a key its shard), so that each group gets the rounds of one
// committer, in order. Safe for concurrent use.
type Committers struct {
	mu     sync.RWMutex
	groups []*Group
}

// Set makes g the group of committer c's rounds; nil takes it away, and
// the committer's rounds are lost until another is set.
func (r *Committers) Set(c int, g *Group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c >= len(r.groups) {
		r.groups = append(r.groups, make([]*Group, c+1-len(r.groups))...)
	}
	r.groups[c] = g
}

// Replicate proposes committer c's round to its group: see
// storage.Replicator. On a replica that is not the group's leader it
// refuses at once (a *NotLeaderError).
func (r *Committers) Replicate(c int, ops []storage.ReplicaOp) (<-chan error, error) {
	r.mu.RLock()
	var g *Group
	if c < len(r.groups) {
		g = r.groups[c]
	}
	r.mu.RUnlock()
	if g == nil {
		return nil, fmt.Errorf("replication: committer %d has no group", c)
	}
	return g.Propose(ops)
}
