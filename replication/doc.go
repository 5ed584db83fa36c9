// Package replication replicates a shard's records with etcd's Raft
// (go.etcd.io/raft/v3): what the library leaves to its user, and nothing
// of what it does. Elections, quorums, PreVote, CheckQuorum, membership
// changes and leadership transfer are the library's; this package has no
// election, quorum or failure detector of its own.
//
// It is not wired into the server yet. The pieces, for developers:
//
//   - Round (round.go): what a log entry carries, the changes of one round
//     of the leader's committer: record keys with their new values, and
//     deletes, after a version byte. Followers write these bytes; they
//     never run the command or read a clock, so replicas cannot diverge.
//   - Log (log.go): a group's Raft log, hard state, truncation point and
//     applied index in the store's own Pebble database, under
//     storage.ReplicaPrefix (which the sweep, inspect, the record counts and
//     cluster migration never see). It implements raft.Storage.
//   - Group (group.go): one replica's Ready loop. Each Ready's entries and
//     hard state are one synced write (one fsync per Ready); committed
//     rounds are applied with the applied index in one write that is not
//     synced, since the log is the record: after a crash the replica
//     applies again from its applied index. The log is truncated once it
//     holds twice Config.LogKeep applied entries. Time is Tick, which the
//     caller drives: tests tick by hand and need no clock.
//   - Snapshots (snapshot.go): Raft's snapshot is only metadata; the
//     shard's records are streamed in pages from a Pebble snapshot on the
//     leader, each page replacing its key range on the follower, and the
//     log's tail follows by ordinary appends. A replica that lost its
//     volume comes back under a new identity as a learner, catches up this
//     way, and is promoted (ChangeMembers): Raft assumes a replica never
//     forgets what it acknowledged, and an old identity with an empty log
//     fails its group with ErrReplicaLost instead of taking part.
//   - Transport (transport.go): one connection per pair of nodes carrying
//     the messages of every group, bounded queues that drop on overflow
//     (Raft retries), write timeouts, TLS when configured; snapshots on a
//     connection of their own so that they never delay heartbeats.
//
// Everything here is safe for concurrent use unless its documentation says
// otherwise.
package replication
