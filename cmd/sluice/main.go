// Command sluice is a persistent rate-limit server that speaks the Redis
// protocol. Run it with no flags to serve on 127.0.0.1:9049 with its data in
// ./sluice-data; sluice --help lists every flag and environment variable.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/cluster"
	// Before the heavy packages: see its doc.
	_ "github.com/sluicehq/sluice/cmd/sluice/internal/earlyhup"
	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

// version and revision are stamped at build time with -ldflags
// "-X main.version=v1.2.3 -X main.revision=<commit>" (scripts/release.sh,
// the Dockerfile); when they are not, buildVersion and buildRevision ask
// the Go build information.
var version = ""

var revision = ""

func main() {
	// Signals first: a SIGHUP that arrives while the store opens must wait
	// for the server rather than kill the process (its default action) or,
	// under nohup, be ignored.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal, a second one stops the process at once.
		<-ctx.Done()
		stop()
	}()
	err := runReloading(ctx, hup, os.Args[1:], os.LookupEnv, os.Environ(), os.Stdout, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		if !errors.As(err, new(loggedError)) {
			fmt.Fprintln(os.Stderr, "sluice:", err)
		}
		os.Exit(1)
	}
}

// loggedError is an error run has already logged.
type loggedError struct{ err error }

func (e loggedError) Error() string { return e.err.Error() }
func (e loggedError) Unwrap() error { return e.err }

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
	memoryLimit     memoryLimit
	shutdownTimeout time.Duration
	sweepInterval   time.Duration
	sweepRate       int
	backupDir       string
	moveStoreFrom   string
	logFormat       string
	logLevel        string
	showVersion     bool

	policyFile       string
	divvyAddr        string
	divvyMaxLine     byteSize
	divvyMaxPipeline int
	divvyTimeout     int

	check              checkFlags
	clusterNodes       string
	clusterSize        int
	clusterOrdinal     int
	clusterTimeout     time.Duration
	clusterClockSkew   time.Duration
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
	cfg.maxBulk = server.DefaultMaxBulk
	cfg.maxKeySize = server.DefaultMaxKeySize
	cfg.maxInline = server.DefaultMaxInline
	cfg.maxQueryBuffer = server.DefaultMaxQueryBuffer
	cfg.maxReplyBuffer = server.DefaultMaxReplyBuffer
	cfg.maxMemClients = server.DefaultMaxMemoryClients
	cfg.maxMultiBytes = server.DefaultMaxMultiBytes
	cfg.cacheSize = storage.DefaultCacheSize
	cfg.cacheMemory = storage.DefaultCacheMemory
	cfg.memtableSize = storage.DefaultMemTableSize
	cfg.keyFilterSize = storage.DefaultKeyFilter
	cfg.commitQueueMem = storage.DefaultMaxQueuedBytes
	cfg.divvyMaxLine = server.DefaultDivvyMaxLine
	cfg.memoryLimit = memoryLimit{auto: true}
	addrVar(fs, &cfg.addr, "addr", "127.0.0.1:9049", "127.0.0.1:9049", false, "RESP listen address (host:port; port 0 picks a free one)")
	fs.StringVar(&cfg.data, "data", "./sluice-data", "data directory, created if missing")
	fs.StringVar(&cfg.fsync, "fsync", "everysec", "durability: always (reply after fsync), everysec (lose at most ~1s on a crash), no (the OS decides)")
	addrVar(fs, &cfg.httpAddr, "http-addr", "127.0.0.1:9050", "127.0.0.1:9050", true, "HTTP listen address for /metrics, /healthz and /readyz; empty turns HTTP off")
	cfg.httpMaxHeaderBytes = server.DefaultHTTPMaxHeaderBytes
	fs.Var(&cfg.httpMaxHeaderBytes, "http-max-header-bytes", "most bytes of one request's header on --http-addr and --check-addr (request line, names and values); a longer one is answered 431")
	fs.StringVar(&cfg.requirePass, "requirepass", "", "password clients must give with AUTH (visible in process listings: prefer --requirepass-file)")
	fs.StringVar(&cfg.requirePassFile, "requirepass-file", "", "file holding the password clients must give with AUTH (one line; a trailing newline is ignored)")
	fs.StringVar(&cfg.protectedMode, "protected-mode", "yes", "yes: without a password or TLS client certificates, refuse clients not on loopback; no: serve everyone")
	intVar(fs, &cfg.maxClients, "maxclients", server.DefaultMaxClients, "most connections at once, RESP, divvy and HTTP together; more are answered with an error and closed; lowered to what the open-file limit allows")
	intVar(fs, &cfg.maxAuthFailures, "max-auth-failures", server.DefaultMaxAuthFailures, "failed AUTH attempts after which a connection is closed; 0 never closes")
	intVar(fs, &cfg.timeout, "timeout", 0, "close a connection idle for this many seconds; 0 never does")
	fs.Var(&cfg.maxMultiBytes, "max-multi-bytes", "most bytes of one connection's transaction: the commands queued after MULTI plus 64 for each command and WATCHed key; past it the transaction is discarded (EXEC answers EXECABORT)")
	fs.Var(&cfg.maxReplyBuffer, "max-reply-buffer", "most bytes of replies queued for a client (one reply, as long pipelines are answered in 16 KiB chunks) before the connection is closed")
	fs.Var(&cfg.maxMemClients, "maxmemory-clients", "most bytes of all RESP clients' query and reply buffers, rate limit service calls in flight and HTTP request headers being read, together; a RESP client or HTTP connection that grows them past it gets an error and is closed, a call is refused (RESOURCE_EXHAUSTED); 0 for no bound")
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM certificate file: serve RESP and HTTP over TLS only (with --tls-key); reloaded on SIGHUP")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	fs.StringVar(&cfg.tlsCA, "tls-ca", "", "PEM CA file: require RESP clients to present a certificate it signed")
	fs.StringVar(&cfg.onStoreError, "on-store-error", "deny", "when the disk refuses writes (full, I/O error): deny answers limit commands with an error; allow answers them from the last known state without storing the change")
	intVar(fs, &cfg.maxArgs, "max-args", server.DefaultMaxArgs, "most arguments in one command")
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
	fs.Var(&cfg.memoryLimit, "memory-limit", "the Go runtime's soft memory limit: auto computes the sizing rule from the memory flags (README.md), 0 sets none, or a size; the GOMEMLIMIT environment variable wins over it")
	fs.Var(&cfg.keyFilterSize, "key-filter-size", "in-memory filter of stored keys that spares a disk lookup for new buckets (about 10 bits per key); 0 turns it off")
	durationVar(fs, &cfg.shutdownTimeout, "shutdown-timeout", server.DefaultShutdownTimeout, "on SIGTERM, the most the shutdown takes: connections finish their last pipeline, then the store is written, fsynced and closed; past it, sluice exits with status 1 and logs what may be lost")
	durationVar(fs, &cfg.sweepInterval, "sweep-interval", server.DefaultSweepInterval, "pause between passes of the sweep that deletes idle records (buckets refilled to full, ended windows, GCRA keys whose allowance is whole); 0 turns it off (COMPACT still sweeps)")
	intVar(fs, &cfg.sweepRate, "sweep-rate", server.DefaultSweepRate, "most records the background sweep examines per second; 0 for no limit")
	fs.StringVar(&cfg.backupDir, "backup-dir", "./sluice-backups", "directory where CHECKPOINT writes its copies of the store")
	fs.StringVar(&cfg.moveStoreFrom, "move-store-from", "", "a directory that may hold a store directly (the image's volume, /data, as laid out before the store moved to /data/store): before opening, its store is moved into --data, which must be directly inside it; a move cut short is finished at the next start; empty: none")
	fs.StringVar(&cfg.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&cfg.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.policyFile, "policy", "", "divvy rule file (.ini or .json) for HIT and the line protocol; reloaded on SIGHUP and POLICY RELOAD")
	addrVar(fs, &cfg.divvyAddr, "divvy-addr", "", "127.0.0.1:8321", true, "listen address for divvy's line protocol (conventionally 127.0.0.1:8321); empty turns it off")
	fs.Var(&cfg.divvyMaxLine, "divvy-max-line", "longest line the divvy line protocol accepts")
	intVar(fs, &cfg.divvyMaxPipeline, "divvy-max-pipeline", server.DefaultDivvyMaxPipeline, "most HIT lines of one divvy connection executed before their replies are sent and more are read")
	intVar(fs, &cfg.divvyTimeout, "divvy-timeout", 300, "close a divvy connection idle for this many seconds; 0 never does")
	addCheckFlags(fs, &cfg.check)
	fs.StringVar(&cfg.clusterNodes, "cluster-nodes", "", "cluster mode: the nodes' announced host:port in ordinal order, comma-separated, or a template with {i} (sluice-{i}.sluice:9049) and --cluster-size; empty: standalone")
	intVar(fs, &cfg.clusterSize, "cluster-size", 0, "cluster mode: the number of initial nodes when --cluster-nodes is a template")
	intVar(fs, &cfg.clusterOrdinal, "cluster-ordinal", -1, "cluster mode: this node's ordinal in --cluster-nodes; -1 takes the number after the last - of the hostname (a StatefulSet pod's)")
	durationVar(fs, &cfg.clusterTimeout, "cluster-forward-timeout", server.DefaultForwardTimeout, "cluster mode: the most one HIT counter forwarded to the node owning it may take, connecting included")
	fs.StringVar(&cfg.clusterReassign, "cluster-reassign-from", "", "cluster mode: the node (announced host:port) a data directory was recorded as, to start it as this node anyway, on purpose: it then records this node; without it, a directory of another node is refused")
	boolVar(fs, &cfg.acceptRepaired, "accept-repaired-cluster-state", false, "start on a store whose cluster state (topology, moves, identity) sluice repair brought back older than it may have been, after checking it against the rest of the cluster; without it such a store is refused")
	durationVar(fs, &cfg.clusterClockSkew, "cluster-max-clock-skew", server.DefaultMaxClockSkew, "cluster mode: how far the clock of a node forwarding a HIT counter may be from this node's; a forwarded time further off is clamped to this node's clock plus or minus it")
	cfg.rlsMaxMessage = server.DefaultRLSMaxMessage
	addrVar(fs, &cfg.rlsAddr, "rls-addr", "", "127.0.0.1:8081", true, "gRPC listen address for Envoy's rate limit service (ShouldRateLimit and gRPC health; conventionally 127.0.0.1:8081); empty turns it off")
	fs.StringVar(&cfg.rlsConfig, "rls-config", "", "directory of envoyproxy/ratelimit YAML files (*.yaml, *.yml) for --rls-addr; reloaded on SIGHUP")
	boolVar(fs, &cfg.rlsResponseHeaders, "rls-response-headers", false, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to rate limit service replies (envoyproxy/ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.Var(&cfg.rlsMaxMessage, "rls-max-message", "largest gRPC request the rate limit service accepts")
	intVar(fs, &cfg.rlsMaxStreams, "rls-max-streams", server.DefaultRLSMaxStreams, "most rate limit service calls in flight on one gRPC connection")
	addMaxConfigFile(fs, &cfg.maxConfigFile)
	durationVar(fs, &cfg.reloadTimeout, "reload-timeout", server.DefaultReloadTimeout, "the most a reload (SIGHUP, POLICY RELOAD) is waited for, reading its files or waiting for the one before (a network file system that hangs); past it POLICY RELOAD answers an error and the reload goes on, logging its outcome when it ends; SIGTERM never waits for a reload")
	intVar(fs, &cfg.rlsMaxDescriptors, "rls-max-descriptors", server.DefaultRLSMaxDescriptors, "most descriptors in one rate limit service call; more is refused (INVALID_ARGUMENT)")
	cfg.rlsMaxHeaderBytes = server.DefaultRLSMaxHeaderBytes
	fs.Var(&cfg.rlsMaxHeaderBytes, "rls-max-header-bytes", "most bytes of one rate limit service call's header list (names, values and 32 per field, as HTTP/2 counts them); a longer one resets the stream")
	boolVar(fs, &cfg.showVersion, "version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: sluice [flags]\n       sluice inspect [flags]   (lists stored records offline; see sluice inspect --help)\n       sluice health [flags]    (exits 0 when a server is ready, for a HEALTHCHECK; see sluice health --help)\n       sluice backup [flags]    (takes a backup of a running server over HTTP; see sluice backup --help)\n       sluice repair [flags]    (moves unreadable tables of a stopped server's store aside; see sluice repair --help)\n       sluice cluster rebalance|move|show|push|renumber [flags]   (reshards a cluster online; see sluice cluster rebalance --help)\n\nsluice is a persistent rate-limit server that speaks the Redis protocol.\nEvery flag can also be set with the environment variable shown; a flag on\nthe command line wins.\n\n")
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
	for name, v := range map[string]int{"max-args": cfg.maxArgs, "maxclients": cfg.maxClients, "divvy-max-pipeline": cfg.divvyMaxPipeline, "rls-max-streams": cfg.rlsMaxStreams, "rls-max-descriptors": cfg.rlsMaxDescriptors} {
		if v < 1 {
			return cfg, fmt.Errorf("--%s %d: want at least 1", name, v)
		}
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

// run is the whole program: it returns when ctx is done (a signal) or the
// server fails, after a graceful shutdown. SIGHUP reloads the TLS
// certificates and the rule file from the time run starts.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return runReloading(ctx, hup, args, lookupEnv, nil, stdout, stderr)
}

// runReloading is run with the SIGHUP channel given: main registers it
// before anything else, so that a SIGHUP received while the store opens is
// acted on once the server runs. environ is the whole environment, whose
// SLUICE_* variables that no flag reads are warned about (run, for tests,
// passes none).
func runReloading(ctx context.Context, hup <-chan os.Signal, args []string, lookupEnv func(string) (string, bool), environ []string, stdout, stderr io.Writer) (err error) {
	if len(args) > 0 && args[0] == "inspect" {
		return runInspect(args[1:], lookupEnv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "health" {
		return runHealth(args[1:], lookupEnv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "backup" {
		return runBackup(ctx, args[1:], lookupEnv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "repair" {
		return runRepair(ctx, args[1:], lookupEnv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "cluster" {
		return runCluster(ctx, args[1:], lookupEnv, stdout, stderr)
	}
	cfg, err := parseConfig(args, lookupEnv, stderr)
	if err != nil {
		return err
	}
	if cfg.showVersion {
		fmt.Fprintln(stdout, versionLine(buildVersion(), buildRevision()))
		return nil
	}
	log, err := newLogger(cfg.logFormat, cfg.logLevel, stderr)
	if err != nil {
		return err
	}
	defer func() {
		// Once there is a logger, the reason for stopping goes through it
		// too, so that --log-format json holds for every line.
		if err != nil {
			log.Error("sluice stopped", "err", err)
			err = loggedError{err}
		}
	}()
	warnUnknownEnv(environ, log)
	if cfg.cacheBucketsSet {
		msg := "--cache-buckets (SLUICE_CACHE_BUCKETS) is deprecated: the bucket cache is bounded in bytes by --cache-memory (SLUICE_CACHE_MEMORY); set that instead"
		if cfg.cacheMemorySet {
			log.Warn(msg+"; ignored, as --cache-memory is given", "cache_buckets", cfg.cacheBuckets, "cache_memory", int64(cfg.cacheMemory))
		} else {
			log.Warn(msg+"; converted at the documented charge per bucket", "cache_buckets", cfg.cacheBuckets, "bytes_per_bucket", storage.CacheBucketCharge, "cache_memory", int64(cfg.cacheMemory))
		}
	}
	mode, err := storage.ParseSyncMode(cfg.fsync)
	if err != nil {
		return fmt.Errorf("--fsync: %w", err)
	}
	password, err := readPassword(cfg.requirePass, cfg.requirePassFile, cfg.maxConfigFile)
	if err != nil {
		return err
	}
	if cfg.policyFile != "" {
		// Refuse a bad rule file before opening the store, which can take
		// a while.
		if _, err := policy.Load(cfg.policyFile, int64(cfg.maxConfigFile)); err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
	}
	clusterCfg, err := clusterConfig(cfg.clusterNodes, cfg.clusterSize, cfg.clusterOrdinal, os.Hostname)
	if err != nil {
		return err
	}
	if clusterCfg != nil {
		clusterCfg.ForwardTimeout = cfg.clusterTimeout
		clusterCfg.MaxClockSkew = cfg.clusterClockSkew
		clusterCfg.ReassignFrom = cfg.clusterReassign
	}
	if cfg.rlsConfig != "" {
		if _, err := rls.Load(cfg.rlsConfig, int64(cfg.maxConfigFile)); err != nil {
			return fmt.Errorf("--rls-config: %w", err)
		}
	}
	files, err := fdBudget(log)
	if err != nil {
		return err
	}
	if err := prepareDataDir(cfg.data, cfg.moveStoreFrom, log); err != nil {
		return err
	}
	warnAboutVolume(cfg.data, log)
	// Before the store opens, so that replaying a long log is collected
	// within the limit too. restore matters only to tests that call run.
	memLimit, memLimitSource, restoreMemLimit := applyMemoryLimit(cfg, lookupEnv, log)
	defer restoreMemLimit()
	var tlsFiles *server.TLSFiles
	if cfg.tlsCert != "" {
		tlsFiles = &server.TLSFiles{Cert: cfg.tlsCert, Key: cfg.tlsKey, CA: cfg.tlsCA}
	}
	// A signal stops the open too: replaying a long log, or a store that
	// cannot be opened, must not make the process ignore SIGTERM.
	store, err := storage.OpenContext(ctx, cfg.data, server.StoreOptions(storage.Options{
		Sync:           mode,
		CacheSize:      int64(cfg.cacheSize),
		CacheMemory:    offIfZero(int64(cfg.cacheMemory)),
		KeyFilterSize:  offIfZero(int64(cfg.keyFilterSize)),
		MemTableSize:   int64(cfg.memtableSize),
		MaxOpenFiles:   files.StoreFiles,
		MaxQueuedBytes: int(cfg.commitQueueMem),
		Committers:     cfg.committers,
		Logger:         log,
	}))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stopped by a signal while opening the store: %w", err)
		}
		return err
	}
	srv, err := server.New(server.Config{
		Store:           store,
		Logger:          log,
		MaxArgs:         cfg.maxArgs,
		MaxBulk:         int64(cfg.maxBulk),
		MaxKeySize:      int(cfg.maxKeySize),
		MaxInline:       int(cfg.maxInline),
		MaxQueryBuffer:  int(cfg.maxQueryBuffer),
		ShutdownTimeout: cfg.shutdownTimeout,
		Version:         buildVersion(),
		Revision:        buildRevision(),
		SweepInterval:   time.Duration(offIfZero(int64(cfg.sweepInterval))),
		SweepRate:       int(offIfZero(int64(cfg.sweepRate))),
		BackupDir:       cfg.backupDir,

		MemoryLimit:       memLimit,
		MemoryLimitSource: memLimitSource,

		AllowOnStoreError: cfg.onStoreError == "allow",

		Password:               password,
		AllowRemoteWithoutAuth: cfg.protectedMode == "no",
		MaxClients:             cfg.maxClients,
		Files:                  files,
		MaxAuthFailures:        int(offIfZero(int64(cfg.maxAuthFailures))),
		IdleTimeout:            time.Duration(cfg.timeout) * time.Second,
		MaxReplyBuffer:         int(cfg.maxReplyBuffer),
		MaxMultiBytes:          int(cfg.maxMultiBytes),
		MaxMemoryClients:       offIfZero(int64(cfg.maxMemClients)),
		TLS:                    tlsFiles,

		PolicyFile:       cfg.policyFile,
		DivvyMaxLine:     int(cfg.divvyMaxLine),
		DivvyMaxPipeline: cfg.divvyMaxPipeline,
		DivvyIdleTimeout: time.Duration(cfg.divvyTimeout) * time.Second,

		Check:                      cfg.check.serverConfig(),
		Cluster:                    clusterCfg,
		AcceptRepairedClusterState: cfg.acceptRepaired,
		RLSConfigDir:               cfg.rlsConfig,
		RLSResponseHeaders:         cfg.rlsResponseHeaders,
		RLSMaxMessage:              int(cfg.rlsMaxMessage),
		RLSMaxStreams:              cfg.rlsMaxStreams,

		MaxConfigFile:      int64(cfg.maxConfigFile),
		ReloadTimeout:      cfg.reloadTimeout,
		RLSMaxDescriptors:  cfg.rlsMaxDescriptors,
		RLSMaxHeaderBytes:  int(cfg.rlsMaxHeaderBytes),
		HTTPMaxHeaderBytes: int(cfg.httpMaxHeaderBytes),
	})
	if err != nil {
		store.Close()
		return err
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		store.Close()
		return fmt.Errorf("listen on --addr %s: %w", cfg.addr, err)
	}
	var httpLn net.Listener
	if cfg.httpAddr != "" {
		if httpLn, err = net.Listen("tcp", cfg.httpAddr); err != nil {
			ln.Close()
			store.Close()
			return fmt.Errorf("listen on --http-addr %s: %w", cfg.httpAddr, err)
		}
	}
	var divvyLn net.Listener
	if cfg.divvyAddr != "" {
		if divvyLn, err = net.Listen("tcp", cfg.divvyAddr); err != nil {
			ln.Close()
			if httpLn != nil {
				httpLn.Close()
			}
			store.Close()
			return fmt.Errorf("listen on --divvy-addr %s: %w", cfg.divvyAddr, err)
		}
	}
	var checkLn net.Listener
	if cfg.check.addr != "" {
		if checkLn, err = net.Listen("tcp", cfg.check.addr); err != nil {
			for _, l := range []net.Listener{ln, httpLn, divvyLn} {
				if l != nil {
					l.Close()
				}
			}
			store.Close()
			return fmt.Errorf("listen on --check-addr %s: %w", cfg.check.addr, err)
		}
	}
	var rlsLn net.Listener
	if cfg.rlsAddr != "" {
		if rlsLn, err = net.Listen("tcp", cfg.rlsAddr); err != nil {
			for _, l := range []net.Listener{ln, httpLn, divvyLn, checkLn} {
				if l != nil {
					l.Close()
				}
			}
			store.Close()
			return fmt.Errorf("listen on --rls-addr %s: %w", cfg.rlsAddr, err)
		}
	}
	httpAddr, divvyAddr, checkAddr, rlsAddr := "", "", "", ""
	if checkLn != nil {
		checkAddr = checkLn.Addr().String()
	}
	if rlsLn != nil {
		rlsAddr = rlsLn.Addr().String()
	}
	if httpLn != nil {
		httpAddr = httpLn.Addr().String()
	}
	if divvyLn != nil {
		divvyAddr = divvyLn.Addr().String()
	}
	log.Info("sluice starting", "version", buildVersion(), "revision", buildRevision(), "addr", ln.Addr().String(), "http_addr", httpAddr, "divvy_addr", divvyAddr, "check_addr", checkAddr, "rls_addr", rlsAddr, "policy", cfg.policyFile, "rls_config", cfg.rlsConfig, "data", cfg.data, "fsync", mode.String(), "auth", password != "", "tls", tlsFiles != nil, "fd_limit", files.Limit)
	serveErr := make(chan error, 5)
	go func() { serveErr <- srv.Serve(ln) }()
	if httpLn != nil {
		go func() {
			if err := srv.ServeHTTP(httpLn); err != nil {
				serveErr <- fmt.Errorf("HTTP: %w", err)
			}
		}()
	}
	if divvyLn != nil {
		go func() {
			if err := srv.ServeDivvy(divvyLn); err != nil {
				serveErr <- fmt.Errorf("divvy line protocol: %w", err)
			}
		}()
	}
	if checkLn != nil {
		go func() {
			if err := srv.ServeCheck(checkLn); err != nil {
				serveErr <- fmt.Errorf("/check: %w", err)
			}
		}()
	}
	if rlsLn != nil {
		go func() {
			if err := srv.ServeRLS(rlsLn); err != nil {
				serveErr <- fmt.Errorf("rate limit service: %w", err)
			}
		}()
	}
wait:
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down: finishing in-flight commands")
			break wait
		case err = <-serveErr:
			log.Error("server stopped", "err", err)
			break wait
		case <-store.FailedC():
			// Nothing more can be made durable: stop, so that a restart
			// replays the log. Shutdown below says what may be lost.
			err = fmt.Errorf("the store failed: %w", store.Failed())
			log.Error("store failed; shutting down, exit status 1 (restart to replay the log)", "dir", cfg.data, "err", store.Failed())
			break wait
		case <-hup:
			// In a goroutine: a reload that hangs on its file system must
			// not keep this loop from SIGTERM. Reload logs each outcome;
			// a bad file keeps what is in use.
			go func() { _ = srv.Reload() }()
		}
	}
	if cerr := shutdown(srv, store, cfg.shutdownTimeout, log); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err == nil {
		log.Info("shutdown complete")
	}
	return err
}

// shutdown closes the server, then the store, within about timeout in
// every state: connections get up to nine tenths of it to finish their
// pipelines, and the store what is left, at least a tenth. A store that
// cannot be closed cleanly in time (a disk that fails, a Pebble that does
// not close) is left to the process exit, and the error says what may be
// lost.
func shutdown(srv *server.Server, store *storage.Store, timeout time.Duration, log *slog.Logger) error {
	deadline := time.Now().Add(timeout)
	closed := make(chan struct{})
	go func() {
		srv.Close()
		close(closed)
	}()
	t := time.NewTimer(timeout - timeout/10)
	select {
	case <-closed:
	case <-t.C:
		log.Warn("connections still busy; closing the store anyway", "timeout", timeout)
	}
	t.Stop()
	if least := time.Now().Add(timeout / 10); deadline.Before(least) {
		deadline = least
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := store.Shutdown(ctx); err != nil {
		log.Error("the store was not closed cleanly; exit status 1", "dir", store.Dir(), "err", err)
		return err
	}
	return nil
}

// fdBudget raises the open-file limit to its hard limit and shares it
// between the store, the process and connections (server.BudgetFDs). It
// fails when the limit is too low to run; when the limit cannot be read it
// warns and returns a zero budget, which leaves --maxclients as given.
func fdBudget(log *slog.Logger) (server.FDBudget, error) {
	now, was, err := raiseFDLimit()
	if err != nil {
		log.Warn("cannot read the open-file limit; --maxclients is not checked against it", "err", err)
		return server.FDBudget{}, nil
	}
	if now > was {
		log.Info("raised the open-file limit (soft RLIMIT_NOFILE) to the hard limit", "from", was, "to", now)
	}
	return server.BudgetFDs(now)
}

// readPassword returns the password from --requirepass or from the file
// --requirepass-file names, without its trailing line break; the file is
// read as every configuration file is (addMaxConfigFile).
func readPassword(pass, file string, limit byteSize) (string, error) {
	if file == "" {
		return pass, nil
	}
	b, err := conffile.Read(file, int64(limit))
	if err != nil {
		return "", fmt.Errorf("--requirepass-file: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("--requirepass-file %s is empty: want the password", file)
	}
	if strings.ContainsAny(p, "\r\n") {
		return "", fmt.Errorf("--requirepass-file %s has more than one line: want only the password", file)
	}
	return p, nil
}

// addMaxConfigFile defines --max-config-file on fs, for the server and for
// the subcommands, which read the same kinds of file.
func addMaxConfigFile(fs *flag.FlagSet, v *byteSize) {
	*v = server.DefaultMaxConfigFile
	fs.Var(v, "max-config-file", "most bytes read from a file sluice is given: the --policy file, each TLS and password file, the files of --rls-config together; a bigger one is refused, and so is anything but a regular file or a symlink to one (a named pipe, a device)")
}

// loadKeyPair reads a PEM certificate and its key as addMaxConfigFile says.
func loadKeyPair(certFile, keyFile string, limit byteSize) (tls.Certificate, error) {
	certPEM, err := conffile.Read(certFile, int64(limit))
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := conffile.Read(keyFile, int64(limit))
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// offIfZero maps a flag where 0 means off to storage.Options, where 0 means
// the default and a negative number means off.
func offIfZero(n int64) int64 {
	if n == 0 {
		return -1
	}
	return n
}
