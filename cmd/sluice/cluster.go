package main

import (
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/clusternode"
)

// clusterConfig turns --cluster-nodes, --cluster-size and
// --cluster-ordinal into the server's cluster mode; nil when nodes is
// empty (standalone). With a template, a node whose ordinal is past the
// initial size (a pod added by kubectl scale) is still given its address,
// and joins owning no slot until a rebalance.
func clusterConfig(nodes string, size, ordinal int, hostname func() (string, error)) (*clusternode.Config, error) {
	if nodes == "" {
		return nil, nil
	}
	addrs, err := cluster.ExpandNodes(nodes, size)
	if err != nil {
		return nil, err
	}
	if ordinal < 0 {
		h, err := hostname()
		if err != nil {
			return nil, fmt.Errorf("--cluster-ordinal: read the hostname: %w", err)
		}
		if ordinal, err = cluster.OrdinalFromHostname(h); err != nil {
			return nil, err
		}
	}
	var self string
	switch {
	case ordinal < len(addrs):
		self = addrs[ordinal]
	case strings.Contains(nodes, "{i}"):
		self = cluster.Expand(nodes, ordinal)
	default:
		return nil, fmt.Errorf("--cluster-ordinal %d: --cluster-nodes lists %d nodes (ordinals 0 to %d)", ordinal, len(addrs), len(addrs)-1)
	}
	initial := addrs
	if size > 0 && size < len(addrs) {
		initial = addrs[:size] // the others join owning no slot
	}
	return &clusternode.Config{Nodes: initial, Self: self}, nil
}
