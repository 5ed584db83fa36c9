package respserver

import (
	"slices"
	"strconv"

	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
)

// Transactions: MULTI, EXEC, DISCARD, WATCH and UNWATCH, as Redis defines
// them. MULTI makes exec queue every command (after the checks exec makes
// before running one) and answer QUEUED; EXEC runs the queue under
// storage.Batch.Hold, which keeps every key the queue touches locked until
// the last command has run and hands all its writes to the committer as
// one unit, so that no other client's command on those keys falls between
// the queued ones and the log receives all of them or none. Its reply, one
// array, is a write's reply like any other: sent once the writes are as
// durable as --fsync promises, replaced by the error when their commit
// fails.

// DefaultMaxMultiBytes bounds one connection's queued transaction: the
// queued commands' bytes plus TxEntryCost for each command and watched
// key. 1 MiB holds thousands of limit commands, far more than a
// transaction needs, while an EXEC holds its keys locked, and the
// committer waits, for as long as its queue takes to run.
const DefaultMaxMultiBytes = 1 << 20

// TxEntryCost is what a queued command or a watched key is charged beside
// its bytes: its share of the bookkeeping, and the bound on their number.
const TxEntryCost = 64

// txState is a connection's transaction: MULTI's queue and WATCH's keys.
type txState struct {
	on      bool // between MULTI and EXEC or DISCARD
	running bool // EXEC runs the queue
	aborted bool // a command was refused while queuing: EXEC answers EXECABORT
	writes  bool // a queued command writes
	n       int  // commands queued
	// buf holds the queued commands, in the framer's canonical RESP, back
	// to back, for resp.NextCommand.
	buf    []byte
	charge int // bytes charged against MaxMultiBytes
	// grew says buf or watches grew since the connection last counted its
	// memory against --maxmemory-clients.
	grew     bool
	args     [][]byte // the arguments of the queued command EXEC runs
	watching bool     // registered with the store's Watch
	watches  []watch
	// slot is the hash slot of the queued commands' keys in cluster mode,
	// where, as in Redis, a transaction's keys must share one slot, owned
	// here; slotSet says a keyed command set it.
	slot    uint16
	slotSet bool
}

// watch is a key WATCH watches: its hash slot, and the slot's write count
// when WATCH ran.
type watch struct {
	slot   uint16
	writes uint64
}

var (
	errExecAbort    = resp.Error("EXECABORT Transaction discarded because of previous errors.")
	errNestedMulti  = resp.Error("ERR MULTI calls can not be nested")
	errExecNoMulti  = resp.Error("ERR EXEC without MULTI")
	errDiscNoMulti  = resp.Error("ERR DISCARD without MULTI")
	errWatchInMulti = resp.Error("ERR WATCH inside MULTI is not allowed")
)

var (
	multiDoc = &cmddoc.Doc{Summary: "Starts a transaction: the commands that follow are queued (each answers QUEUED) until EXEC runs them or DISCARD drops them.", Group: "transactions"}
	execDoc  = &cmddoc.Doc{Summary: "Runs the queued commands as one atomic, durable unit; replies an array of their replies, or null if a watched key was written.", Group: "transactions"}
	discDoc  = &cmddoc.Doc{Summary: "Drops the queued commands and the watched keys.", Group: "transactions"}
	watchDoc = &cmddoc.Doc{Summary: "Makes the next EXEC fail (reply null) if a record of a key is written before it, by anyone; keys in the same hash slot count as the same key.", Group: "transactions",
		Args: []cmddoc.Arg{{Name: "key", Type: "key", Multiple: true}}}
	unwatchDoc = &cmddoc.Doc{Summary: "Forgets the keys WATCH watches.", Group: "transactions"}
)

// multiCount is the number of commands queued, or -1 outside MULTI, for
// CLIENT INFO and LIST's multi field. Only the connection's own goroutine
// may call it: the transaction is not guarded (in CLIENT LIST, self's
// line only, as for the other fields that change).
func (c *client) multiCount() int {
	if !c.tx.on && !c.tx.running {
		return -1
	}
	return c.tx.n
}

// txImmediate reports whether a command runs at once inside MULTI instead
// of being queued, as in Redis: the transaction's own commands, and QUIT.
func txImmediate(name string) bool {
	switch name {
	case "exec", "discard", "multi", "watch", "quit":
		return true
	}
	return false
}

// txAllowed reports whether a command may be queued. EXEC runs the queue
// holding its keys' locks and keeping the committer waiting, so only
// commands that change or read their own keys' records (the limit
// commands, and HIT outside cluster mode) or touch only the connection
// may run in it; a command that reads or flushes the whole store (DEL,
// COMPACT, CHECKPOINT, INFO, DBSIZE, CLUSTER's DUMP, DROP and MIGRATE)
// would wait for the locks or the committer the EXEC holds, forever.
func (s *Server) txAllowed(cmd *command, args [][]byte) bool {
	switch cmd.Name {
	case "rl.reduce", "rl.preduce", "rl.get", "rl.pget", "rl.sessionize", "rl.psessionize",
		"cl.throttle", "cl.pthrottle", "fw.incr", "fw.pincr", "fw.get", "fw.pget",
		"roll.limit", "roll.wouldlimit", "roll.clear",
		"ping", "echo", "time", "select", "lastsave", "command", "unwatch",
		"asking", "readonly", "readwrite":
		return true
	case "hit":
		return s.clus == nil // counters other nodes own cannot change atomically
	case "config":
		return resp.EqualFold(args[1], "get")
	case "client":
		// Every CLIENT subcommand reads or sets the connection's own
		// fields (LIST reads the others' too, under the server's lock).
		for _, sub := range []string{"id", "getname", "setname", "setinfo", "info", "list", "help"} {
			if resp.EqualFold(args[1], sub) {
				return true
			}
		}
	}
	return false
}

// errExecArity is EXEC's reply to EXEC with arguments inside MULTI, which
// discards the transaction, as in Redis.
var errExecArity = resp.Error("EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' command")

// queue handles a command sent inside MULTI: it runs the checks exec makes
// before running a command and queues it, answering QUEUED, or answers the
// check's error and marks the transaction aborted. It reports false for a
// command that runs at once (txImmediate).
func (s *Server) queue(c *client, cmd *command, args [][]byte) bool {
	t := &c.tx
	if cmd != nil && txImmediate(cmd.Name) {
		if (cmd.Arity > 0 && len(args) == cmd.Arity) || (cmd.Arity < 0 && len(args) >= -cmd.Arity) {
			return false
		}
		// A wrong argument count aborts the transaction, as in Redis;
		// EXEC's ends it.
		c.cur = nil
		if cmd.Name == "exec" {
			s.txEnd(c)
			s.replyErr(c, errExecArity)
			return true
		}
		s.replyErr(c, errs.WrongArgs(cmd.Name))
		s.txAbort(c)
		return true
	}
	c.cur = nil
	var err error
	switch {
	case cmd == nil:
		s.stats.UnknownCommands.Add(1)
		err = resp.Error(unknownCommand(args))
	case (cmd.Arity > 0 && len(args) != cmd.Arity) || (cmd.Arity < 0 && len(args) < -cmd.Arity):
		err = errs.WrongArgs(cmd.Name)
	case !c.authed && !allowedBeforeAuth(cmd.Name):
		err = errNoAuth
	case s.clus != nil && cmd.Name == "hit":
		err = resp.Error("ERR Command not allowed inside a transaction in cluster mode: hit's counters may be owned by other nodes, which an EXEC cannot change atomically")
	case !s.txAllowed(cmd, args):
		err = resp.Error("ERR Command not allowed inside a transaction: " + cmd.fullName(args) + " (MULTI queues the limit commands and commands on the connection itself; see docs/protocol.md)")
	}
	if err == nil && !t.aborted && s.clus != nil && cmd.First > 0 && !s.txRoute(c, cmd, args) {
		s.txAbort(c) // txRoute answered MOVED, CROSSSLOT, CLUSTERDOWN or TRYAGAIN
		return true
	}
	if err == nil && !t.aborted {
		err = s.txAdd(c, args)
		if err == nil && slices.Contains(cmd.Flags, "write") {
			t.writes = true
		}
	}
	if err != nil {
		s.replyErr(c, err)
		s.txAbort(c)
		return true
	}
	t.n++
	c.Out = resp.AppendSimple(c.Out, "QUEUED")
	return true
}

// txAdd appends a command to the queue, within MaxMultiBytes.
func (s *Server) txAdd(c *client, args [][]byte) error {
	t := &c.tx
	size := TxEntryCost
	for _, a := range args {
		size += len(a) + 16
	}
	if t.charge+size > s.cfg.MaxMultiBytes {
		return s.errTxFull()
	}
	t.charge += size
	before := cap(t.buf)
	t.buf = append(t.buf, '*')
	t.buf = strconv.AppendInt(t.buf, int64(len(args)), 10)
	t.buf = append(t.buf, '\r', '\n')
	for _, a := range args {
		t.buf = append(t.buf, '$')
		t.buf = strconv.AppendInt(t.buf, int64(len(a)), 10)
		t.buf = append(t.buf, '\r', '\n')
		t.buf = append(t.buf, a...)
		t.buf = append(t.buf, '\r', '\n')
	}
	t.grew = t.grew || cap(t.buf) != before
	return nil
}

func (s *Server) errTxFull() error {
	return resp.Error("ERR transaction exceeds --max-multi-bytes " + strconv.Itoa(s.cfg.MaxMultiBytes) +
		" (queued commands' bytes plus " + strconv.Itoa(TxEntryCost) + " for each command and watched key); it is discarded: EXEC will answer EXECABORT")
}

// txAbort marks the transaction aborted and lets go of its queue, which
// will never run.
func (s *Server) txAbort(c *client) {
	t := &c.tx
	t.aborted = true
	t.buf = nil
	t.grew = true
}

// txEnd ends the transaction and forgets the watched keys, as EXEC and
// DISCARD do, and a closing connection.
// txRoute checks a keyed command queued in cluster mode as exec would run
// it (MOVED for a slot owned elsewhere), and that its keys share the slot
// of the commands queued before it (CROSSSLOT), answering the error.
func (s *Server) txRoute(c *client, cmd *command, args [][]byte) bool {
	t := &c.tx
	if !s.routeKeys(c, cmd, args) {
		return false
	}
	slot := keyspace.Slot(args[cmd.First])
	if t.slotSet && slot != t.slot {
		s.replyErr(c, errCrossSlot)
		return false
	}
	t.slot, t.slotSet = slot, true
	return true
}

func (s *Server) txEnd(c *client) {
	t := &c.tx
	t.on, t.aborted, t.writes, t.slotSet, t.running = false, false, false, false, false
	t.n, t.charge = 0, 0
	if cap(t.buf) > connKeepBuf {
		t.buf = nil
	}
	t.buf = t.buf[:0]
	if cap(t.args) > connKeepBuf/24 {
		t.args = nil
	}
	clear(t.args[:cap(t.args)]) // no pointers into the queue
	s.unwatch(c)
}

func (s *Server) unwatch(c *client) {
	t := &c.tx
	t.charge = max(t.charge-len(t.watches)*TxEntryCost, 0)
	if t.watching {
		s.store.Unwatch()
		t.watching = false
	}
	if cap(t.watches) > connKeepBuf/16 {
		t.watches = nil
	}
	t.watches = t.watches[:0]
}

func cmdMulti(s *Server, c *client, args [][]byte) {
	if c.tx.on {
		s.replyErr(c, errNestedMulti) // the transaction goes on, as in Redis
		return
	}
	c.tx.on = true
	c.Out = resp.AppendSimple(c.Out, "OK")
}

func cmdDiscard(s *Server, c *client, args [][]byte) {
	if !c.tx.on {
		s.replyErr(c, errDiscNoMulti)
		return
	}
	s.txEnd(c)
	c.Out = resp.AppendSimple(c.Out, "OK")
}

// cmdWatch records the write count of each key's hash slot. The store
// counts writes per slot only while someone watches; a write that began
// before the count started is one the client's next read of the key
// already sees, as it waits for the write's lock.
func cmdWatch(s *Server, c *client, args [][]byte) {
	t := &c.tx
	if t.on {
		s.replyErr(c, errWatchInMulti) // the transaction goes on, as in Redis
		return
	}
	for _, k := range args[1:] {
		if err := s.eng.CheckKeySize("key", len(k)); err != nil {
			s.replyErr(c, err)
			return
		}
	}
	if t.charge+len(args[1:])*TxEntryCost > s.cfg.MaxMultiBytes {
		s.replyErr(c, resp.Error("ERR WATCH exceeds --max-multi-bytes "+strconv.Itoa(s.cfg.MaxMultiBytes)+
			" ("+strconv.Itoa(TxEntryCost)+" bytes for each watched key); no key added"))
		return
	}
	if !t.watching {
		s.store.Watch()
		t.watching = true
	}
	before := cap(t.watches)
	for _, k := range args[1:] {
		slot := keyspace.Slot(k)
		t.watches = append(t.watches, watch{slot: slot, writes: s.store.PartitionWrites(int(slot))})
		t.charge += TxEntryCost
	}
	t.grew = t.grew || cap(t.watches) != before
	c.Out = resp.AppendSimple(c.Out, "OK")
}

func cmdUnwatch(s *Server, c *client, args [][]byte) {
	s.unwatch(c)
	c.Out = resp.AppendSimple(c.Out, "OK")
}

// cmdExec runs the queue: see the comment at the top of this file. A
// watched slot written since WATCH makes it answer a null array and run
// nothing; so does, with an error, a store that refuses writes, when a
// queued command writes (unless AllowOnStoreError), so that the
// transaction's writes are never partly made.
func cmdExec(s *Server, c *client, args [][]byte) {
	t := &c.tx
	if !t.on {
		s.replyErr(c, errExecNoMulti)
		return
	}
	if t.aborted {
		s.txEnd(c)
		s.replyErr(c, errExecAbort)
		return
	}
	if t.writes && !s.cfg.AllowOnStoreError {
		err := s.store.Failed()
		if err == nil {
			err = s.store.Unavailable()
		}
		if err != nil {
			s.txEnd(c)
			s.replyErr(c, err)
			return
		}
	}
	self := c.cur
	t.on, t.running = false, true // the queued commands run as usual
	s.execHeld(c)
	c.cur, c.Result = self, dispatch.None
	s.txEnd(c)
}

// execHeld runs the queue with the batch held (see storage.Batch.Hold),
// releasing it even if a command panics: the changes made before the
// panic are in memory, seen by other clients, and cannot be undone, so
// they go to the log like any other (the connection is closed with an
// error).
//
// In cluster mode the slot of the queued keys is checked once, under the
// hold, for the transaction as a whole (MOVED, TRYAGAIN, CLUSTERDOWN as
// EXEC's reply), as in Redis, and not again for each command: CLUSTER
// MIGRATE PAUSE waits for the pipeline an EXEC runs in, so a transaction
// runs whole before a pause or is refused whole after it. Its writes to
// migrating slots are noted before Release hands them over (the engine's
// Round.Release), as a commit does for a pipeline's.
//
// A reply past --max-reply-buffer, or one that takes the clients' buffers
// past --maxmemory-clients, does not stop the transaction, which must run
// whole: the commands still run, their replies are dropped, and EXEC
// answers the limit's error and the connection closes, as a pipeline's
// does.
func (s *Server) execHeld(c *client) {
	t := &c.tx
	c.Round.Hold(len(t.watches) > 0)
	defer c.Round.Release() // notes the writes to migrating slots first
	if s.clus != nil && t.slotSet && !s.routeSlot(c, t.slot) {
		return
	}
	for _, w := range t.watches {
		if s.store.PartitionWrites(int(w.slot)) != w.writes {
			c.Out = appendNullArray(c.Out, c.resp == 3)
			return
		}
	}
	start, cap0 := len(c.Out), cap(c.Out)
	c.Out = resp.AppendArray(c.Out, t.n)
	over, memOver := false, false
	for rest := t.buf; len(rest) > 0; {
		t.args, rest = resp.NextCommand(rest, t.args)
		s.exec(c, t.args)
		// The reply's growth counts against --maxmemory-clients beside
		// what the clients' buffers held when the EXEC began.
		if !over && cap(c.Out) != cap0 && !s.cfg.MaxMemoryClients.Within(s.stats.ClientMem.Load()+int64(cap(c.Out)-cap0)) {
			over, memOver = true, true
		}
		if over || len(c.Out) > s.cfg.MaxReplyBuffer {
			over = true
			c.Out = c.Out[:start]
		}
	}
	switch {
	case memOver:
		s.stats.EvictedClients.Add(1)
		s.log.Warn("closing a client whose EXEC reply takes the clients' buffers past --maxmemory-clients", "client", c.id, "remote", c.addr, "limit", s.cfg.MaxMemoryClients.N())
		c.Out = resp.AppendError(c.Out, "ERR client memory limit reached: the buffers of all clients exceed --maxmemory-clients; the transaction ran, its replies are dropped; closing the connection")
		c.failed, c.quit = true, true
	case over:
		s.stats.ReplyOverflows.Add(1)
		s.log.Warn("closing a client whose EXEC reply exceeds the reply buffer limit", "client", c.id, "remote", c.addr, "limit", s.cfg.MaxReplyBuffer)
		c.Out = resp.AppendError(c.Out, "ERR reply buffer limit reached (--max-reply-buffer); the transaction ran, its replies are dropped; closing the connection")
		c.failed, c.quit = true, true
	}
}

// appendNullArray appends a null array: EXEC's reply when a watched key
// was written.
func appendNullArray(b []byte, resp3 bool) []byte {
	if resp3 {
		return append(b, '_', '\r', '\n')
	}
	return append(b, '*', '-', '1', '\r', '\n')
}
