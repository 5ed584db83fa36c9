package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/cluster"
	"github.com/sluicehq/sluice/internal/admit"
	"github.com/sluicehq/sluice/internal/clusternode"
	"github.com/sluicehq/sluice/internal/conffile"
	"github.com/sluicehq/sluice/internal/divvy"
	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/envoy"
	"github.com/sluicehq/sluice/internal/httpport"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/internal/reload"
	"github.com/sluicehq/sluice/internal/respserver"
	"github.com/sluicehq/sluice/policy"
	"github.com/sluicehq/sluice/rls"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/storage"
)

// serveCommand is sluice itself, with no subcommand named: it serves
// until ctx is done (a signal) or the server fails, after a graceful
// shutdown, and reloads on SIGHUP (inv.hup).
type serveCommand struct{}

func (serveCommand) run(inv invocation, args []string) (err error) {
	ctx, hup, lookupEnv, environ, stdout, stderr := inv.ctx, inv.hup, inv.lookupEnv, inv.environ, inv.stdout, inv.stderr
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
		clusterCfg.ForwardQueue = cfg.clusterFwdQueue
		clusterCfg.MaxClockSkew = cfg.clusterClockSkew
		clusterCfg.ReassignFrom = cfg.clusterReassign
		clusterCfg.Replicas = cfg.clusterReplicas
		clusterCfg.Shards = cfg.clusterShards
		clusterCfg.ElectionTimeout = cfg.clusterElection
		clusterCfg.LogKeepBytes = uint64(cfg.clusterLogKeep)
		clusterCfg.LogMemory = int64(cfg.clusterLogMemory)
		if cfg.clusterBusNodes != "" {
			clusterCfg.BusNodes = strings.Split(cfg.clusterBusNodes, ",")
		}
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
	var tlsFiles *admit.TLSFiles
	if cfg.tlsCert != "" {
		tlsFiles = &admit.TLSFiles{Cert: cfg.tlsCert, Key: cfg.tlsKey, CA: cfg.tlsCA}
	}
	// A signal stops the open too: replaying a long log, or a store that
	// cannot be opened, must not make the process ignore SIGTERM.
	storeOpts := storeOptions(cfg, mode, files, log)
	if clusterCfg != nil && clusterCfg.Replicas > 1 {
		// One committer per shard, proposing its rounds to the shard's
		// group.
		if storeOpts, clusterCfg.Replicator, err = clusternode.ReplicatedStoreOptions(storeOpts, len(clusterCfg.Nodes), clusterCfg.Shards, clusterCfg.Replicas); err != nil {
			if errors.Is(err, cluster.ErrShards) {
				return fmt.Errorf("--cluster-shards: %w", err)
			}
			return fmt.Errorf("--cluster-replicas: %w", err)
		}
	}
	store, err := storage.OpenContext(ctx, cfg.data, storeOpts)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("stopped by a signal while opening the store: %w", err)
		}
		return err
	}
	srv, err := server.New(serverConfig(cfg, store, log, password, files, clusterCfg, tlsFiles, memLimit, memLimitSource))
	if err != nil {
		store.Close()
		return err
	}
	lns, err := listenAll(cfg, srv)
	if err != nil {
		store.Close()
		return err
	}
	log.Info("sluice starting", "version", buildVersion(), "revision", buildRevision(), "addr", lns[0].addr(), "http_addr", lns[1].addr(), "divvy_addr", lns[2].addr(), "check_addr", lns[3].addr(), "rls_addr", lns[4].addr(), "policy", cfg.policyFile, "rls_config", cfg.rlsConfig, "data", cfg.data, "fsync", mode.String(), "auth", password != "", "tls", tlsFiles != nil, "fd_limit", files.Limit)
	serveErr := make(chan error, len(lns))
	for _, l := range lns {
		if l.ln == nil {
			continue
		}
		go func() {
			if err := l.serve(l.ln); err != nil || l.what == "" {
				if l.what != "" {
					err = fmt.Errorf("%s: %w", l.what, err)
				}
				serveErr <- err
			}
		}()
	}
	err = waitForStop(ctx, hup, serveErr, srv, store, cfg.data, log)
	if cerr := shutdown(srv, store, cfg.shutdownTimeout, log); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err == nil {
		log.Info("shutdown complete")
	}
	return err
}

// storeOptions is the storage.Options of cfg: a size of 0 (--cache-memory
// 0, --key-filter-size 0) is the store's "off", not its default.
func storeOptions(cfg config, mode storage.SyncMode, files admit.FDBudget, log *slog.Logger) storage.Options {
	return server.StoreOptions(storage.Options{
		Sync:                  mode,
		CacheSize:             int64(cfg.cacheSize),
		CacheMemory:           int64(cfg.cacheMemory),
		NoCache:               cfg.cacheMemory == 0,
		KeyFilterSize:         int64(cfg.keyFilterSize),
		NoKeyFilter:           cfg.keyFilterSize == 0,
		MemTableSize:          int64(cfg.memtableSize),
		MaxOpenFiles:          files.StoreFiles,
		MaxQueuedBytes:        int(cfg.commitQueueMem),
		Committers:            cfg.committers,
		CompactionConcurrency: cfg.compactions,
		Logger:                log,
	})
}

// onStoreError is the engine's mode of --on-store-error v, which
// parseConfig checked is deny or allow.
func onStoreError(v string) engine.OnStoreError {
	if v == "allow" {
		return engine.Allow
	}
	return engine.Refuse
}

// serverConfig is the server.Config of cfg, for store, with what
// serveCommand read or derived from it.
func serverConfig(cfg config, store *storage.Store, log *slog.Logger, password string, files admit.FDBudget, clusterCfg *clusternode.Config, tlsFiles *admit.TLSFiles, memLimit int64, memLimitSource string) server.Config {
	return server.Config{
		Store:  store,
		Logger: log,
		RESP: respserver.Tuning{
			MaxArgs:           cfg.maxArgs,
			MaxBulk:           int64(cfg.maxBulk),
			MaxInline:         int(cfg.maxInline),
			MaxQueryBuffer:    int(cfg.maxQueryBuffer),
			MaxAuthFailures:   zeroIsOff(cfg.maxAuthFailures),
			IdleTimeout:       time.Duration(cfg.timeout) * time.Second,
			MaxReplyBuffer:    int(cfg.maxReplyBuffer),
			MaxMultiBytes:     int(cfg.maxMultiBytes),
			SweepInterval:     zeroIsOff(cfg.sweepInterval),
			SweepRate:         zeroIsOff(cfg.sweepRate),
			MemoryLimit:       memLimit,
			MemoryLimitSource: memLimitSource,
			Debug:             cfg.debug,
			MaxMemoryClients:  zeroIsOff(int64(cfg.maxMemClients)),
			BackupDir:         cfg.backupDir,
		},
		Engine: engine.Tuning{
			MaxKeySize:   int(cfg.maxKeySize),
			OnStoreError: onStoreError(cfg.onStoreError),
		},
		Listen: admit.Config{
			ShutdownTimeout:        cfg.shutdownTimeout,
			Password:               password,
			AllowRemoteWithoutAuth: cfg.protectedMode == "no",
			MaxClients:             cfg.maxClients,
			Files:                  files,
			TLS:                    tlsFiles,
		},
		Build: server.Build{Version: buildVersion(), Revision: buildRevision()},
		Files: reload.Config{
			MaxFileBytes: int64(cfg.maxConfigFile),
			Timeout:      cfg.reloadTimeout,
		},

		Policy: policycmd.Config{
			File:         cfg.policyFile,
			MaxOverrides: cfg.policyMaxOverrides,
			StatsDays:    cfg.policyStatsDays,
		},
		Divvy: divvy.Config{
			MaxLine:     int(cfg.divvyMaxLine),
			MaxPipeline: cfg.divvyMaxPipeline,
			IdleTimeout: time.Duration(cfg.divvyTimeout) * time.Second,
		},

		Check:   cfg.check.serverConfig(),
		Cluster: clusternode.Mode{Node: clusterCfg, AcceptRepairedState: cfg.acceptRepaired},
		RLS: envoy.Config{
			Dir:             cfg.rlsConfig,
			ResponseHeaders: cfg.rlsResponseHeaders,
			MaxMessage:      int(cfg.rlsMaxMessage),
			MaxStreams:      cfg.rlsMaxStreams,
			MaxDescriptors:  cfg.rlsMaxDescriptors,
			MaxHeaderBytes:  int(cfg.rlsMaxHeaderBytes),
		},

		HTTP: httpport.Config{MaxHeaderBytes: int(cfg.httpMaxHeaderBytes)},
	}
}

// waitForStop waits for a signal (ctx done), a front end's failure
// (serveErr) or the store's, reloading on each SIGHUP meanwhile; it
// returns why the server must stop, nil for a signal.
func waitForStop(ctx context.Context, hup <-chan os.Signal, serveErr <-chan error, srv *server.Server, store *storage.Store, data string, log *slog.Logger) error {
	for {
		select {
		case <-ctx.Done():
			log.Info("shutting down: finishing in-flight commands")
			return nil
		case err := <-serveErr:
			log.Error("server stopped", "err", err)
			return err
		case <-store.FailedC():
			// Nothing more can be made durable: stop, so that a restart
			// replays the log. Shutdown below says what may be lost.
			log.Error("store failed; shutting down, exit status 1 (restart to replay the log)", "dir", data, "err", store.Failed())
			return fmt.Errorf("the store failed: %w", store.Failed())
		case <-hup:
			// In a goroutine: a reload that hangs on its file system must
			// not keep this loop from SIGTERM. Reload logs each outcome;
			// a bad file keeps what is in use.
			go func() { _ = srv.Reload() }()
		}
	}
}

// listener is one of the server's listeners: the flag of its address,
// the address, what it serves, and, once listening, the listener.
type listener struct {
	flag, addrFlag string
	// what names the front end in the error its serve returns; "" for
	// RESP, whose Serve returns nil after Close as an error would.
	what  string
	serve func(net.Listener) error
	ln    net.Listener
}

// addr is the listening address, "" when the front end is off.
func (l *listener) addr() string {
	if l.ln == nil {
		return ""
	}
	return l.ln.Addr().String()
}

// listenAll listens on the address of every front end, in this order:
// RESP, HTTP, the divvy line protocol, /check, Envoy's rate limit service
// (RESP's always, the others' when their flag gives an address). On an
// error it closes the listeners it opened.
func listenAll(cfg config, srv *server.Server) ([]listener, error) {
	lns := []listener{
		{flag: "--addr", addrFlag: cfg.addr, serve: srv.Serve},
		{flag: "--http-addr", addrFlag: cfg.httpAddr, what: "HTTP", serve: srv.ServeHTTP},
		{flag: "--divvy-addr", addrFlag: cfg.divvyAddr, what: "divvy line protocol", serve: srv.ServeDivvy},
		{flag: "--check-addr", addrFlag: cfg.check.addr, what: "/check", serve: srv.ServeCheck},
		{flag: "--rls-addr", addrFlag: cfg.rlsAddr, what: "rate limit service", serve: srv.ServeRLS},
	}
	for i := range lns {
		l := &lns[i]
		if l.addrFlag == "" && i > 0 {
			continue
		}
		var err error
		if l.ln, err = net.Listen("tcp", l.addrFlag); err != nil {
			for _, o := range lns[:i] {
				if o.ln != nil {
					o.ln.Close()
				}
			}
			return nil, fmt.Errorf("listen on %s %s: %w", l.flag, l.addrFlag, err)
		}
	}
	return lns, nil
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
// between the store, the process and connections (admit.BudgetFDs). It
// fails when the limit is too low to run; when the limit cannot be read it
// warns and returns a zero budget, which leaves --maxclients as given.
func fdBudget(log *slog.Logger) (admit.FDBudget, error) {
	now, was, err := raiseFDLimit()
	if err != nil {
		log.Warn("cannot read the open-file limit; --maxclients is not checked against it", "err", err)
		return admit.FDBudget{}, nil
	}
	if now > was {
		log.Info("raised the open-file limit (soft RLIMIT_NOFILE) to the hard limit", "from", was, "to", now)
	}
	return admit.BudgetFDs(now)
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
	*v = conffile.DefaultLimit
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

// zeroIsOff maps a flag where 0 means off to a respserver.Limit, whose zero is
// the default.
func zeroIsOff[T int | int64 | time.Duration](n T) respserver.Limit[T] {
	if n == 0 {
		return respserver.NoLimit[T]()
	}
	return respserver.LimitOf(n)
}
