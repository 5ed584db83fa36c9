package server

import (
	"github.com/sluicehq/sluice/internal/clusternode"
)

// ClusterConfig turns cluster mode on (clusternode.Config).
type ClusterConfig = clusternode.Config

// Errors of a start in cluster mode, as clusternode makes them.
var (
	// ErrClusterIdentity is wrapped by the error of a start that would
	// serve a data directory as another node than the one it belongs to.
	ErrClusterIdentity = clusternode.ErrClusterIdentity
	// ErrClusterStateRepaired is wrapped by the error of a start on a
	// store whose cluster state sluice repair brought back older than it
	// may have been, without Config.AcceptRepairedClusterState.
	ErrClusterStateRepaired = clusternode.ErrClusterStateRepaired
)

// Defaults of ClusterConfig.
const (
	DefaultForwardTimeout  = clusternode.DefaultForwardTimeout
	DefaultMaxClockSkew    = clusternode.DefaultMaxClockSkew
	DefaultElectionTimeout = clusternode.DefaultElectionTimeout
)

// ReplicatedStoreOptions is clusternode.ReplicatedStoreOptions: the store
// options of a node of a cluster with replicated shards.
var ReplicatedStoreOptions = clusternode.ReplicatedStoreOptions
