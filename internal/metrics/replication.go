package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/replication"
)

// The metrics of replicated shards (--cluster-replicas above 1), one
// series per shard this node holds a replica of.
var (
	shardLabel         = []string{"shard"}
	descReplLeader     = prometheus.NewDesc("sluice_replication_leader", "1 while this node leads the shard and serves its slots.", shardLabel, nil)
	descReplChanges    = prometheus.NewDesc("sluice_replication_leader_changes_total", "Leaders of the shard this node's replica came to know of: the first, and each other one after it.", shardLabel, nil)
	descReplProposals  = prometheus.NewDesc("sluice_replication_proposal_duration_seconds", "Time from a round's proposal on the shard's leader to its being applied there: a quorum has it in its log.", shardLabel, nil)
	descReplApplyLag   = prometheus.NewDesc("sluice_replication_apply_lag_entries", "Entries of the shard committed and not yet applied on this node.", shardLabel, nil)
	descReplFollowLag  = prometheus.NewDesc("sluice_replication_follower_lag_entries", "On the shard's leader, the most entries of its log a follower lacks; 0 elsewhere.", shardLabel, nil)
	descReplSnapSent   = prometheus.NewDesc("sluice_replication_snapshots_sent_total", "Snapshots of the shard this node streamed whole to a follower that was too far behind.", shardLabel, nil)
	descReplSnapSentB  = prometheus.NewDesc("sluice_replication_snapshot_sent_bytes_total", "Bytes of the snapshots counted by sluice_replication_snapshots_sent_total.", shardLabel, nil)
	descReplSnapRecv   = prometheus.NewDesc("sluice_replication_snapshots_received_total", "Snapshots of the shard this node received and applied.", shardLabel, nil)
	descReplSnapRecvB  = prometheus.NewDesc("sluice_replication_snapshot_received_bytes_total", "Bytes of the snapshots counted by sluice_replication_snapshots_received_total.", shardLabel, nil)
	replProposalBounds = func() []float64 {
		b := make([]float64, len(replication.ProposalBuckets))
		for i, d := range replication.ProposalBuckets {
			b[i] = d.Seconds()
		}
		return b
	}()
)

// The metrics of counter hits forwarded to the node owning the counter,
// in cluster mode.
var (
	descFwdHits     = prometheus.NewDesc("sluice_cluster_forwarded_hits_total", "Counter hits (HIT, the line protocol, /check, Envoy's service) this node forwarded to the node owning the counter: ok, the owner's outcome; refused, an error the owner answered; failed, no answer (unreachable, over --cluster-forward-timeout, a full --cluster-forward-queue, a shutdown) or no node serving the slot (CLUSTERDOWN).", []string{"result"}, nil)
	descFwdInFlight = prometheus.NewDesc("sluice_cluster_forward_in_flight", "Forwarded counter hits waiting for their owners' replies.", nil, nil)
	descFwdDials    = prometheus.NewDesc("sluice_cluster_forward_connections_total", "Connections this node opened to other nodes to forward counter hits: one per node, and one more each time one failed.", nil, nil)
)

// collectForwards sends the metrics of the hits this node forwarded.
func (s *Sources) collectForwards(ch chan<- prometheus.Metric) {
	if s.Cluster == nil {
		return
	}
	f := s.Cluster.ForwardMetrics()
	ch <- prometheus.MustNewConstMetric(descFwdHits, prometheus.CounterValue, float64(f.OK), "ok")
	ch <- prometheus.MustNewConstMetric(descFwdHits, prometheus.CounterValue, float64(f.Refused), "refused")
	ch <- prometheus.MustNewConstMetric(descFwdHits, prometheus.CounterValue, float64(f.Failed), "failed")
	ch <- prometheus.MustNewConstMetric(descFwdInFlight, prometheus.GaugeValue, float64(f.InFlight))
	ch <- prometheus.MustNewConstMetric(descFwdDials, prometheus.CounterValue, float64(f.Dials))
}

// collectReplication sends the metrics of the shards this node holds.
func (s *Sources) collectReplication(ch chan<- prometheus.Metric) {
	for _, m := range s.Cluster.ReplicationMetrics() {
		shard := strconv.Itoa(m.Shard)
		metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64) {
			ch <- prometheus.MustNewConstMetric(d, t, v, shard)
		}
		metric(descReplLeader, prometheus.GaugeValue, b2f(m.Serving))
		metric(descReplChanges, prometheus.CounterValue, float64(m.LeaderChanges))
		metric(descReplApplyLag, prometheus.GaugeValue, float64(m.ApplyLag))
		metric(descReplFollowLag, prometheus.GaugeValue, float64(m.FollowerLag))
		metric(descReplSnapSent, prometheus.CounterValue, float64(m.SnapshotsSent))
		metric(descReplSnapSentB, prometheus.CounterValue, float64(m.SnapshotsSentBytes))
		metric(descReplSnapRecv, prometheus.CounterValue, float64(m.SnapshotsReceived))
		metric(descReplSnapRecvB, prometheus.CounterValue, float64(m.SnapshotsReceivedBytes))
		h := m.Proposals
		buckets := make(map[float64]uint64, len(replProposalBounds))
		var cum uint64
		for i, le := range replProposalBounds {
			cum += h.Counts[i]
			buckets[le] = cum
		}
		ch <- prometheus.MustNewConstHistogram(descReplProposals, h.Count(), h.Sum.Seconds(), buckets, shard)
	}
}
