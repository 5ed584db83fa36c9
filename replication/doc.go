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
//     holds twice Config.LogKeep applied entries, or entries of twice
//     Config.LogKeepBytes bytes (then keeping what the followers the
//     leader hears from lack). Time is Tick, which the
//     caller drives: tests tick by hand and need no clock.
//   - Snapshots (snapshot.go): Raft's snapshot is only metadata; the
//     shard's records are streamed in pages from a Pebble snapshot on the
//     leader, each page replacing its key range on the follower, and the
//     log's tail follows by ordinary appends. A replica that lost its
//     volume comes back under a new identity as a learner, catches up this
//     way, and is promoted (ChangeMembers): Raft assumes a replica never
//     forgets what it acknowledged, and an old identity with an empty log
//     fails its group with ErrReplicaLost instead of taking part.
//   - Committers (committers.go): the store's storage.Replicator. With it,
//     the store's committers propose their rounds to their shard's group
//     instead of writing them to Pebble, and a Batch.Commit in --fsync
//     always returns once the group has committed its round. The leader
//     applies its own rounds without touching its table (which holds them,
//     or later changes); a round the group does not commit is dropped from
//     the leader's table, and so is every change it made as leader when it
//     is deposed (Store.DiscardDirty), so that a deposed leader shows the
//     group's state, never a decision the group did not take.
//   - Host (host.go): the replicas one node holds of a cluster placed by
//     cluster.Place, one group per shard (ShardGroup, ShardBounds) over one
//     transport and one clock, each group the Replicator of its shard's
//     committer. A shard's leadership is handed back to its home node (its
//     first replica) once that one has caught up, so load stays spread,
//     after the leader stopped serving and had every decision it made
//     committed (HostConfig.Handoff), so that the handback loses none. A
//     new leader serves (Status.Serving) once it has applied an entry of
//     its own term, and so every round committed before it.
//   - The placement group (placement.go): group 1, on every node (the
//     first MaxPlacementVoters vote, the others learn), whose state is
//     each shard's replicas under an epoch, kept among the package's own
//     keys. Host.Move proposes a move to it; every node follows what it
//     applied (SetReplicas): a node that now holds a shard opens a replica
//     that joins the group (a learner, caught up by snapshot, promoted in
//     place of a replica that leaves), a leader that leaves hands its
//     leadership on as a handback does, and a removed replica, once the
//     other replicas' committed members no longer name it (AskMembers),
//     deletes its records and Raft state. Once a node is added
//     (Host.AddNode) the placement holds the nodes' addresses too: the
//     node added asks for it before it knows its ordinal
//     (Transport.AskPlacement), then joins under a new incarnation. A node
//     removed (Host.RemoveNode) keeps its ordinal, marked removed, so that
//     no other node ever takes it.
//   - Transport (transport.go): one connection per pair of nodes carrying
//     the messages of every group, bounded queues that drop on overflow
//     (Raft retries), write timeouts, TLS when configured; snapshots on a
//     connection of their own so that they never delay heartbeats.
//
// What the transport guarantees, and what it does not:
//
//   - Delivery is at most once, in order per pair of nodes while a
//     connection lasts; a message may be dropped (a full queue, no
//     connection, a failed write, a frame it cannot fit), and Raft is told
//     the peer is unreachable, and sends again. Nothing is retried by the
//     transport itself, and Send never blocks.
//   - Either node of a pair gets a connection when it has to send: the
//     node of lower identity dials, and the other asks it to (a helloDial
//     connection) whenever they are not connected, so a learner or a
//     replica that is not yet a member, which sends nothing first, is
//     reached whatever its identity.
//   - A connection is taken only from another node of the configuration
//     (Addr knows it). With TLS (ClientTLS and ServerTLS, mutual), its
//     certificate must come from ClientCAs and name the host of that
//     node's address; this is checked before anything of the connection
//     reaches the node, so no other connection can replace a peer's.
//     Without TLS, the network is trusted: whoever reaches the port can
//     pose as a node of the configuration. Run it without TLS only on a
//     network that only the nodes reach.
//   - A message that names another sender than its connection's node is
//     dropped, and Group.Step and ReadSnapshot refuse (ErrBadMessage)
//     what no working replica sends and Raft would act on wrongly or
//     panic on. A message that is well formed but contradicts what the
//     replica holds (a commit beyond its log, entries conflicting with
//     committed ones) still fails the group with ErrReplicaLost: from an
//     authenticated peer it means the replica forgot what it had
//     acknowledged.
//   - Bounds: MaxConns connections from other nodes, MaxSnapshots
//     snapshots received at once (one more is closed at once), Queue
//     messages waiting per peer, MaxFrame bytes per frame; a connection
//     keeps a read buffer of at most 64 KiB between frames. Snapshots
//     sent are not bounded beyond Raft's own (one in flight per follower
//     of each group).
//   - Timeouts: DialTimeout for a dial, its handshake and a hello;
//     WriteTimeout for each write and each read of a snapshot. An idle
//     connection between nodes stays open; a peer that vanished without
//     a reset is found when a write times out.
//
// Everything here is safe for concurrent use unless its documentation says
// otherwise.
package replication
