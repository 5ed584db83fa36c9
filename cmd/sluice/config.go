package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/replication"
	"github.com/sluicehq/sluice/storage"
)

// The least --cluster-log-keep-bytes and --cluster-log-memory take: less
// would truncate the log at about every round, or keep no round in memory.
const (
	minLogKeepBytes = 64 << 10
	minLogMemory    = 64 << 10
)

// config is everything the flags and environment set.
type config struct {
	addr            string
	data            string
	fsync           string
	onStoreError    string
	httpAddr        string
	requirePass     string
	requirePassFile string
	protectedMode   string
	enableDebug     string
	debug           respserver.DebugAccess // from enableDebug
	maxClients      int
	maxAuthFailures int
	timeout         int
	maxReplyBuffer  byteSize
	maxMemClients   byteSize
	maxMultiBytes   byteSize
	tlsCert         string
	tlsKey          string
	tlsCA           string
	maxArgs         int
	maxBulk         byteSize
	maxKeySize      byteSize
	maxInline       byteSize
	maxQueryBuffer  byteSize
	cacheSize       byteSize
	cacheBuckets    int // deprecated: sets cacheMemory, see parseConfig
	cacheMemory     byteSize
	// cacheBucketsSet says --cache-buckets (or SLUICE_CACHE_BUCKETS) was
	// given, and cacheMemorySet the same of --cache-memory.
	cacheBucketsSet bool
	cacheMemorySet  bool
	keyFilterSize   byteSize
	memtableSize    byteSize
	commitQueueMem  byteSize
	committers      int
	compactions     int // --store-compaction-concurrency
	memoryLimit     memoryLimit
	shutdownTimeout time.Duration
	sweepInterval   time.Duration
	sweepRate       int
	backupDir       string
	moveStoreFrom   string
	logFormat       string
	logLevel        string
	showVersion     bool

	policyFile         string
	divvyAddr          string
	divvyMaxLine       byteSize
	divvyMaxPipeline   int
	policyMaxOverrides int
	policyStatsDays    int
	divvyTimeout       int

	check              checkFlags
	clusterNodes       string
	clusterSize        int
	clusterOrdinal     int
	clusterTimeout     time.Duration
	clusterFwdQueue    int
	clusterClockSkew   time.Duration
	clusterReplicas    int
	clusterShards      int
	clusterBusNodes    string
	clusterElection    time.Duration
	clusterLogKeep     byteSize
	clusterLogMemory   byteSize
	clusterReassign    string
	acceptRepaired     bool
	rlsAddr            string
	rlsConfig          string
	rlsResponseHeaders bool
	rlsMaxMessage      byteSize
	rlsMaxStreams      int

	maxConfigFile      byteSize
	reloadTimeout      time.Duration
	rlsMaxDescriptors  int
	rlsMaxHeaderBytes  byteSize
	httpMaxHeaderBytes byteSize
}

func newFlagSet(cfg *config, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.maxBulk = respserver.DefaultMaxBulk
	cfg.maxKeySize = engine.DefaultMaxKeySize
	cfg.maxInline = respserver.DefaultMaxInline
	cfg.maxQueryBuffer = respserver.DefaultMaxQueryBuffer
	cfg.maxReplyBuffer = respserver.DefaultMaxReplyBuffer
	cfg.maxMemClients = respserver.DefaultMaxMemoryClients
	cfg.maxMultiBytes = respserver.DefaultMaxMultiBytes
	cfg.cacheSize = storage.DefaultCacheSize
	cfg.cacheMemory = storage.DefaultCacheMemory
	cfg.memtableSize = storage.DefaultMemTableSize
	cfg.keyFilterSize = storage.DefaultKeyFilter
	cfg.commitQueueMem = storage.DefaultMaxQueuedBytes
	cfg.divvyMaxLine = divvy.DefaultMaxLine
	cfg.memoryLimit = memoryLimit{auto: true}
	cfg.clusterLogKeep = replication.DefaultLogKeepBytes
	cfg.clusterLogMemory = clusternode.DefaultLogMemory
	addrVar(fs, &cfg.addr, "addr", "127.0.0.1:9049", "127.0.0.1:9049", false, "RESP listen address (host:port; port 0 picks a free one)")
	fs.StringVar(&cfg.data, "data", "./sluice-data", "data directory, created if missing")
	fs.StringVar(&cfg.fsync, "fsync", "everysec", "durability: always (reply after fsync), everysec (lose at most ~1s on a crash), no (the OS decides)")
	addrVar(fs, &cfg.httpAddr, "http-addr", "127.0.0.1:9050", "127.0.0.1:9050", true, "HTTP listen address for /metrics, /healthz and /readyz; empty turns HTTP off")
	cfg.httpMaxHeaderBytes = httpport.DefaultMaxHeaderBytes
	fs.Var(&cfg.httpMaxHeaderBytes, "http-max-header-bytes", "most bytes of one request's header on --http-addr and --check-addr (request line, names and values); a longer one is answered 431")
	fs.StringVar(&cfg.requirePass, "requirepass", "", "password clients must give with AUTH (visible in process listings: prefer --requirepass-file)")
	fs.StringVar(&cfg.requirePassFile, "requirepass-file", "", "file holding the password clients must give with AUTH (one line; a trailing newline is ignored)")
	fs.StringVar(&cfg.enableDebug, "enable-debug-command", "no", "who may run DEBUG (CLOCK-OFFSET shifts the server clock, for fault-injection tests): no, yes (every client), or local (clients on loopback)")
	fs.StringVar(&cfg.protectedMode, "protected-mode", "yes", "yes: without a password or TLS client certificates, refuse clients not on loopback; no: serve everyone")
	intVar(fs, &cfg.maxClients, "maxclients", admit.DefaultMaxClients, "most connections at once, RESP, divvy and HTTP together; more are answered with an error and closed; lowered to what the open-file limit allows")
	intVar(fs, &cfg.maxAuthFailures, "max-auth-failures", respserver.DefaultMaxAuthFailures, "failed AUTH attempts after which a connection is closed; 0 never closes")
	intVar(fs, &cfg.timeout, "timeout", 0, "close a connection idle for this many seconds; 0 never does")
	fs.Var(&cfg.maxMultiBytes, "max-multi-bytes", "most bytes of one connection's transaction: the commands queued after MULTI plus 64 for each command and WATCHed key; past it the transaction is discarded (EXEC answers EXECABORT)")
	fs.Var(&cfg.maxReplyBuffer, "max-reply-buffer", "most bytes of replies queued for a client (one reply, as long pipelines are answered in 16 KiB chunks) before the connection is closed")
	fs.Var(&cfg.maxMemClients, "maxmemory-clients", "most bytes of all RESP clients' query and reply buffers, rate limit service calls in flight and HTTP request headers being read, together; a RESP client or HTTP connection that grows them past it gets an error and is closed, a call is refused (RESOURCE_EXHAUSTED); 0 for no bound")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM certificate file: serve RESP and HTTP over TLS only (with --tls-key); reloaded on SIGHUP")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	fs.StringVar(&cfg.tlsCA, "tls-ca", "", "PEM CA file: require RESP clients to present a certificate it signed")
	fs.StringVar(&cfg.onStoreError, "on-store-error", "deny", "when the disk refuses writes (full, I/O error): deny answers limit commands with an error; allow answers them from the last known state without storing the change")
	intVar(fs, &cfg.maxArgs, "max-args", respserver.DefaultMaxArgs, "most arguments in one command")
	fs.Var(&cfg.maxBulk, "max-bulk", "most bytes in one argument")
	fs.Var(&cfg.maxKeySize, "max-key-size", "longest key a command may name (the key of RL.*, CL.*, FW.*, ROLL.* and DEL, a HIT actor value); a longer one gets an error reply and nothing is stored; bounds what one key costs in memory")
	fs.Var(&cfg.maxInline, "max-inline", "most bytes in one inline (telnet-style) command line")
	fs.Var(&cfg.maxQueryBuffer, "max-query-buffer", "most bytes of one incomplete command held per client")
	fs.Var(&cfg.cacheSize, "cache-size", "Pebble block cache size")
	intVar(fs, &cfg.cacheBuckets, "cache-buckets", 0, "deprecated, use --cache-memory: given without --cache-memory, sets it to this many buckets × 88 bytes (at least 1MiB); 0 turns the cache off")
	fs.Var(&cfg.cacheMemory, "cache-memory", "most bytes of memory the bucket cache holds, everything it allocates counted (about 70 bytes per RL bucket with a 16-byte key: the default holds about 2.2M); a bucket over 1/1024 of it is not cached; 0 turns the cache off, and 1 byte to 1MiB is refused")
	fs.Var(&cfg.memtableSize, "memtable-size", "Pebble memtable size")
	fs.Var(&cfg.commitQueueMem, "commit-queue-memory", "most bytes of written records (keys and values) waiting to be written to Pebble; a command that would pass it waits for the disk; bounds what large sliding logs cost")
	intVar(fs, &cfg.committers, "committers", 0, fmt.Sprintf("goroutines that write changes to the store, each those of its range of hash slots, sharing --commit-queue-memory; 0 is GOMAXPROCS (the CPU limit, or the machine's cores), at most %d", storage.MaxCommitters))
	intVar(fs, &cfg.compactions, "store-compaction-concurrency", 0, fmt.Sprintf("Pebble compactions that run at once, each over its own key range; 0 is GOMAXPROCS (the CPU limit, or the machine's cores), at most %d", storage.MaxCompactionConcurrency))
	fs.Var(&cfg.memoryLimit, "memory-limit", "the Go runtime's soft memory limit: auto computes the sizing rule from the memory flags (docs/operations.md, Sizing), 0 sets none, or a size; the GOMEMLIMIT environment variable wins over it")
	fs.Var(&cfg.keyFilterSize, "key-filter-size", "in-memory filter of stored keys that spares a disk lookup for new buckets (about 10 bits per key); 0 turns it off")
	durationVar(fs, &cfg.shutdownTimeout, "shutdown-timeout", admit.DefaultShutdownTimeout, "on SIGTERM, the most the shutdown takes: connections finish their last pipeline, then the store is written, fsynced and closed; past it, sluice exits with status 1 and logs what may be lost")
	durationVar(fs, &cfg.sweepInterval, "sweep-interval", respserver.DefaultSweepInterval, "pause between passes of the sweep that deletes idle records (buckets refilled to full, ended windows, GCRA keys whose allowance is whole); 0 turns it off (COMPACT still sweeps)")
	intVar(fs, &cfg.sweepRate, "sweep-rate", respserver.DefaultSweepRate, "most records the background sweep examines per second; 0 for no limit")
	fs.StringVar(&cfg.backupDir, "backup-dir", "./sluice-backups", "directory where CHECKPOINT writes its copies of the store")
	fs.StringVar(&cfg.moveStoreFrom, "move-store-from", "", "a directory that may hold a store directly (the image's volume, /data, as laid out before the store moved to /data/store): before opening, its store is moved into --data, which must be directly inside it; a move cut short is finished at the next start; empty: none")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.policyFile, "policy", "", "divvy rule file (.ini or .json) for HIT and the line protocol; reloaded on SIGHUP and POLICY RELOAD")
	intVar(fs, &cfg.policyMaxOverrides, "policy-max-overrides", engine.DefaultMaxOverrides, "most per-actor overrides (POLICY OVERRIDE) the server keeps (in a cluster, each node its own); a new one past it gets an error reply")
	intVar(fs, &cfg.policyStatsDays, "policy-stats-days", engine.DefaultStatsDays, "days (UTC) of threshold data POLICY STATS keeps per rule label, today included, at most 366; older days are dropped")
	addrVar(fs, &cfg.divvyAddr, "divvy-addr", "", "127.0.0.1:8321", true, "listen address for divvy's line protocol (conventionally 127.0.0.1:8321); empty turns it off")
	fs.Var(&cfg.divvyMaxLine, "divvy-max-line", "longest line the divvy line protocol accepts")
	intVar(fs, &cfg.divvyMaxPipeline, "divvy-max-pipeline", divvy.DefaultMaxPipeline, "most HIT lines of one divvy connection executed before their replies are sent and more are read")
	intVar(fs, &cfg.divvyTimeout, "divvy-timeout", 300, "close a divvy connection idle for this many seconds; 0 never does")
	addCheckFlags(fs, &cfg.check)
	fs.StringVar(&cfg.clusterNodes, "cluster-nodes", "", "cluster mode: the nodes' announced host:port in ordinal order, comma-separated, or a template with {i} (sluice-{i}.sluice:9049) and --cluster-size; empty: standalone")
	intVar(fs, &cfg.clusterSize, "cluster-size", 0, "cluster mode: the number of initial nodes when --cluster-nodes is a template")
	intVar(fs, &cfg.clusterOrdinal, "cluster-ordinal", -1, "cluster mode: this node's ordinal in --cluster-nodes; -1 takes the number after the last - of the hostname (a StatefulSet pod's)")
	intVar(fs, &cfg.clusterReplicas, "cluster-replicas", 1, "cluster mode: the replicas of each shard: 1 keeps one copy of each slot; 3 or 5 replicate each shard (a slot range placed from --cluster-nodes) with Raft, its leader alone deciding, with automatic failover")
	intVar(fs, &cfg.clusterShards, "cluster-shards", 0, "cluster mode with --cluster-replicas above 1: how many shards (slot ranges, each a Raft group) the cluster has, from one per node up to 64, each node the home of as many as another, give or take one; 0: one per node. Fixed when the cluster first starts")
	fs.StringVar(&cfg.clusterBusNodes, "cluster-bus-nodes", "", "cluster mode with --cluster-replicas above 1: the nodes' replication host:port in the order of --cluster-nodes, comma-separated; empty: each node's port plus 10000")
	durationVar(fs, &cfg.clusterElection, "cluster-election-timeout", clusternode.DefaultElectionTimeout, "cluster mode with --cluster-replicas above 1: how long a shard's replicas go without a word from its leader before electing another")
	fs.Var(&cfg.clusterLogKeep, "cluster-log-keep-bytes", "cluster mode with --cluster-replicas above 1: once a shard's Raft log takes twice this many bytes, its applied entries older than the newest this many are deleted, while still in the memtable; a replica further behind, that went silent, catches up by snapshot")
	fs.Var(&cfg.clusterLogMemory, "cluster-log-memory", "cluster mode with --cluster-replicas above 1: most bytes of Raft log entries kept in memory as well as in the store, all shards together (each shard's group, and the placement's, an equal share); counted in --memory-limit auto")
	durationVar(fs, &cfg.clusterTimeout, "cluster-forward-timeout", clusternode.DefaultForwardTimeout, "cluster mode: the most one HIT counter forwarded to the node owning it may take, connecting included")
	intVar(fs, &cfg.clusterFwdQueue, "cluster-forward-queue", clusternode.DefaultForwardQueue, "cluster mode: the most HIT counters forwarded to one node that wait for its replies at once, on the one connection to it; another waits for room, within --cluster-forward-timeout")
	fs.StringVar(&cfg.clusterReassign, "cluster-reassign-from", "", "cluster mode: the node (announced host:port) a data directory was recorded as, to start it as this node anyway, on purpose: it then records this node; without it, a directory of another node is refused")
	boolVar(fs, &cfg.acceptRepaired, "accept-repaired-cluster-state", false, "start on a store whose cluster state (topology, moves, identity) sluice repair brought back older than it may have been, after checking it against the rest of the cluster; without it such a store is refused")
	durationVar(fs, &cfg.clusterClockSkew, "cluster-max-clock-skew", clusternode.DefaultMaxClockSkew, "cluster mode: how far the clock of a node forwarding a HIT counter may be from this node's; a forwarded time further off is clamped to this node's clock plus or minus it")
	cfg.rlsMaxMessage = envoy.DefaultMaxMessage
	addrVar(fs, &cfg.rlsAddr, "rls-addr", "", "127.0.0.1:8081", true, "gRPC listen address for Envoy's rate limit service (ShouldRateLimit and gRPC health; conventionally 127.0.0.1:8081); empty turns it off")
	fs.StringVar(&cfg.rlsConfig, "rls-config", "", "directory of envoyproxy/ratelimit YAML files (*.yaml, *.yml) for --rls-addr; reloaded on SIGHUP")
	boolVar(fs, &cfg.rlsResponseHeaders, "rls-response-headers", false, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to rate limit service replies (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.Var(&cfg.rlsMaxMessage, "rls-max-message", "largest gRPC request the rate limit service accepts")
	intVar(fs, &cfg.rlsMaxStreams, "rls-max-streams", envoy.DefaultMaxStreams, "most rate limit service calls in flight on one gRPC connection")
	addMaxConfigFile(fs, &cfg.maxConfigFile)
	durationVar(fs, &cfg.reloadTimeout, "reload-timeout", reload.DefaultTimeout, "the most a reload (SIGHUP, POLICY RELOAD) is waited for, reading its files or waiting for the one before (a network file system that hangs); past it POLICY RELOAD answers an error and the reload goes on, logging its outcome when it ends; SIGTERM never waits for a reload")
	intVar(fs, &cfg.rlsMaxDescriptors, "rls-max-descriptors", envoy.DefaultMaxDescriptors, "most descriptors in one rate limit service call; more is refused (INVALID_ARGUMENT)")
	cfg.rlsMaxHeaderBytes = envoy.DefaultMaxHeaderBytes
	fs.Var(&cfg.rlsMaxHeaderBytes, "rls-max-header-bytes", "most bytes of one rate limit service call's header list (names, values and 32 per field, as HTTP/2 counts them); a longer one resets the stream")
	boolVar(fs, &cfg.showVersion, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice [flags]\n       sluice inspect [flags]   (lists stored records offline; see sluice inspect --help)\n       sluice health [flags]    (exits 0 when a server is ready, for a HEALTHCHECK; see sluice health --help)\n       sluice backup [flags]    (takes a backup of a running server over HTTP; see sluice backup --help)\n       sluice repair [flags]    (moves unreadable tables of a stopped server's store aside; see sluice repair --help)\n       sluice cluster rebalance|move|show|push|renumber|send|check-policy [flags]   (reshards a cluster online, or sends the policy dials to every node and compares them; see sluice cluster --help)\n\nsluice is a persistent rate-limit server that speaks the Redis protocol.\nEvery flag can also be set with the environment variable shown; a flag on\nthe command line wins.\n\n")
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" && f.DefValue != "false" {
				def = " (default " + f.DefValue + ")"
			}
			env := ", " + envName(f.Name)
			if noEnv[f.Name] {
				env = ""
			}
			fmt.Fprintf(fs.Output(), "  --%s%s\n        %s%s\n", f.Name, env, f.Usage, def)
		})
	}
	return fs
}

// noEnv lists flags that have no environment variable: SLUICE_VERSION is
// a name deployments use for their own purposes.
var noEnv = map[string]bool{"version": true}

// envName is the environment variable of a flag: --max-args is SLUICE_MAX_ARGS.
func envName(flagName string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseConfig reads the environment, then the command line over it.
func parseConfig(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (config, error) {
	var cfg config
	fs := newFlagSet(&cfg, stderr)
	if err := parseArgs(fs, args, lookupEnv); err != nil {
		return cfg, err
	}
	for name, v := range map[string]int{"max-args": cfg.maxArgs, "maxclients": cfg.maxClients, "divvy-max-pipeline": cfg.divvyMaxPipeline, "policy-max-overrides": cfg.policyMaxOverrides, "policy-stats-days": cfg.policyStatsDays, "rls-max-streams": cfg.rlsMaxStreams, "rls-max-descriptors": cfg.rlsMaxDescriptors} {
		if v < 1 {
			return cfg, fmt.Errorf("--%s %d: want at least 1", name, v)
		}
	}
	if cfg.policyStatsDays > engine.MaxStatsDays {
		return cfg, fmt.Errorf("--policy-stats-days %d: want at most %d", cfg.policyStatsDays, engine.MaxStatsDays)
	}
	for name, v := range map[string]byteSize{"max-bulk": cfg.maxBulk, "max-key-size": cfg.maxKeySize, "max-inline": cfg.maxInline, "max-query-buffer": cfg.maxQueryBuffer, "max-reply-buffer": cfg.maxReplyBuffer,
		"cache-size": cfg.cacheSize, "memtable-size": cfg.memtableSize, "divvy-max-line": cfg.divvyMaxLine, "commit-queue-memory": cfg.commitQueueMem, "rls-max-message": cfg.rlsMaxMessage,
		"rls-max-header-bytes": cfg.rlsMaxHeaderBytes, "http-max-header-bytes": cfg.httpMaxHeaderBytes, "max-config-file": cfg.maxConfigFile} {
		if v < 1 {
			return cfg, fmt.Errorf("--%s %s: want at least 1 byte", name, humanSize(int64(v)))
		}
	}
	for name, v := range map[string]int{"timeout": cfg.timeout, "divvy-timeout": cfg.divvyTimeout} {
		if v < 0 {
			return cfg, fmt.Errorf("--%s %d: want 0 (never) or a number of seconds", name, v)
		}
	}
	if cfg.maxMemClients < 0 {
		return cfg, fmt.Errorf("--maxmemory-clients %d: want 0 (no bound) or a number of bytes", cfg.maxMemClients)
	}
	if cfg.maxAuthFailures < 0 {
		return cfg, fmt.Errorf("--max-auth-failures %d: want 0 (never close) or more", cfg.maxAuthFailures)
	}
	if cfg.committers < 0 || cfg.committers > storage.MaxCommitters {
		return cfg, fmt.Errorf("--committers %d: want 0 (GOMAXPROCS) or 1 to %d", cfg.committers, storage.MaxCommitters)
	}
	if cfg.compactions < 0 || cfg.compactions > storage.MaxCompactionConcurrency {
		return cfg, fmt.Errorf("--store-compaction-concurrency %d: want 0 (GOMAXPROCS) or 1 to %d", cfg.compactions, storage.MaxCompactionConcurrency)
	}
	if cfg.cacheBuckets < 0 {
		return cfg, fmt.Errorf("--cache-buckets %d: want 0 (off) or more", cfg.cacheBuckets)
	}
	// --cache-buckets is deprecated but still read, so that a manifest
	// that sets it keeps working: without --cache-memory it sets the byte
	// budget to its count of buckets at the documented charge each.
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "cache-buckets":
			cfg.cacheBucketsSet = true
		case "cache-memory":
			cfg.cacheMemorySet = true
		}
	})
	if cfg.cacheBuckets > storage.MaxCacheEntries {
		return cfg, fmt.Errorf("--cache-buckets %d: want 0 (off) to %d (the most whose bytes, at %d each, an int64 holds); use --cache-memory", cfg.cacheBuckets, int64(storage.MaxCacheEntries), storage.CacheBucketCharge)
	}
	if cfg.cacheBucketsSet && !cfg.cacheMemorySet {
		cfg.cacheMemory = byteSize(int64(cfg.cacheBuckets) * storage.CacheBucketCharge)
		if cfg.cacheBuckets > 0 {
			// A count that used to cache a few buckets must not
			// become a budget that caches none.
			cfg.cacheMemory = max(cfg.cacheMemory, storage.MinCacheMemory)
		}
	}
	if cfg.cacheMemory > 0 && cfg.cacheMemory < storage.MinCacheMemory {
		return cfg, fmt.Errorf("--cache-memory %s: want 0 (off) or at least %s (1 KiB for each of the cache's 1024 stripes; less caches nothing)", humanSize(int64(cfg.cacheMemory)), humanSize(storage.MinCacheMemory))
	}
	if cfg.shutdownTimeout <= 0 {
		return cfg, fmt.Errorf("--shutdown-timeout %v: want a positive duration", cfg.shutdownTimeout)
	}
	if cfg.reloadTimeout <= 0 {
		return cfg, fmt.Errorf("--reload-timeout %v: want a positive duration", cfg.reloadTimeout)
	}
	if cfg.sweepInterval < 0 {
		return cfg, fmt.Errorf("--sweep-interval %v: want 0 (off) or a positive duration", cfg.sweepInterval)
	}
	if cfg.sweepRate < 0 {
		return cfg, fmt.Errorf("--sweep-rate %d: want 0 (no limit) or more", cfg.sweepRate)
	}
	if cfg.backupDir == "" {
		return cfg, errors.New("--backup-dir: want a directory")
	}
	if cfg.protectedMode != "yes" && cfg.protectedMode != "no" {
		return cfg, fmt.Errorf("--protected-mode %q: want yes or no", cfg.protectedMode)
	}
	var ok bool
	if cfg.debug, ok = debugAccess(cfg.enableDebug); !ok {
		return cfg, fmt.Errorf("--enable-debug-command %q: want no, yes or local", cfg.enableDebug)
	}
	if cfg.requirePass != "" && cfg.requirePassFile != "" {
		return cfg, errors.New("--requirepass and --requirepass-file: give one, not both")
	}
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return cfg, errors.New("--tls-cert and --tls-key: give both or neither")
	}
	if cfg.tlsCA != "" && cfg.tlsCert == "" {
		return cfg, errors.New("--tls-ca needs --tls-cert and --tls-key")
	}
	if cfg.divvyAddr != "" && cfg.policyFile == "" {
		return cfg, errors.New("--divvy-addr needs --policy: the line protocol answers HITs from a rule file")
	}
	if cfg.clusterNodes == "" && (cfg.clusterSize != 0 || cfg.clusterOrdinal != -1 || cfg.clusterReassign != "") {
		return cfg, errors.New("--cluster-size, --cluster-ordinal and --cluster-reassign-from need --cluster-nodes")
	}
	if cfg.clusterReassign != "" {
		if err := cluster.CheckAddr(cfg.clusterReassign); err != nil {
			return cfg, fmt.Errorf("--cluster-reassign-from: %w", err)
		}
	}
	if cfg.clusterClockSkew <= 0 {
		return cfg, fmt.Errorf("--cluster-max-clock-skew %v: want a positive duration", cfg.clusterClockSkew)
	}
	if cfg.clusterReplicas != 1 && cfg.clusterReplicas != 3 && cfg.clusterReplicas != 5 {
		return cfg, fmt.Errorf("--cluster-replicas %d: want 1, 3 or 5", cfg.clusterReplicas)
	}
	if cfg.clusterReplicas > 1 && cfg.clusterNodes == "" {
		return cfg, errors.New("--cluster-replicas needs --cluster-nodes")
	}
	if cfg.clusterShards < 0 || cfg.clusterShards > storage.MaxCommitters {
		return cfg, fmt.Errorf("--cluster-shards %d: want 0 (one per node) up to %d", cfg.clusterShards, storage.MaxCommitters)
	}
	if cfg.clusterShards != 0 && cfg.clusterReplicas == 1 {
		return cfg, fmt.Errorf("--cluster-shards %d needs --cluster-replicas 3 or 5: with one copy per slot each node owns the slots its topology gives it", cfg.clusterShards)
	}
	if cfg.clusterElection < 10*time.Millisecond {
		return cfg, fmt.Errorf("--cluster-election-timeout %v: want 10ms or more", cfg.clusterElection)
	}
	if cfg.clusterLogKeep < minLogKeepBytes {
		return cfg, fmt.Errorf("--cluster-log-keep-bytes %s: want at least %s", humanSize(int64(cfg.clusterLogKeep)), humanSize(minLogKeepBytes))
	}
	if cfg.clusterLogMemory < minLogMemory {
		return cfg, fmt.Errorf("--cluster-log-memory %s: want at least %s (1 KiB for each of up to 64 shards' groups)", humanSize(int64(cfg.clusterLogMemory)), humanSize(minLogMemory))
	}
	if cfg.clusterFwdQueue < 1 {
		return cfg, fmt.Errorf("--cluster-forward-queue %d: want 1 or more", cfg.clusterFwdQueue)
	}
	if cfg.clusterTimeout <= 0 {
		return cfg, fmt.Errorf("--cluster-forward-timeout %v: want a positive duration", cfg.clusterTimeout)
	}
	if cfg.rlsAddr != "" && cfg.rlsConfig == "" {
		return cfg, errors.New("--rls-addr needs --rls-config: the rate limit service answers from a directory of envoyproxy/ratelimit YAML files")
	}
	for name, v := range map[string]byteSize{"rls-max-message": cfg.rlsMaxMessage, "rls-max-header-bytes": cfg.rlsMaxHeaderBytes, "http-max-header-bytes": cfg.httpMaxHeaderBytes} {
		if v > 1<<30 {
			return cfg, fmt.Errorf("--%s %s: want at most 1GiB", name, humanSize(int64(v)))
		}
	}
	if cfg.onStoreError != "deny" && cfg.onStoreError != "allow" {
		return cfg, fmt.Errorf("--on-store-error %q: want deny or allow", cfg.onStoreError)
	}
	if err := cfg.check.validate(cfg.policyFile); err != nil {
		return cfg, err
	}
	return cfg, nil
}

func newLogger(format, level string, w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// debugAccess maps --enable-debug-command's values, Redis 7's, and
// reports false for another.
func debugAccess(v string) (respserver.DebugAccess, bool) {
	switch v {
	case "no":
		return respserver.DebugRefused, true
	case "yes":
		return respserver.DebugAllowed, true
	case "local":
		return respserver.DebugLocal, true
	}
	return respserver.DebugRefused, false
}
