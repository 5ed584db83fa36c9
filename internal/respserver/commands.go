package respserver

import (
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/conncmd"
	"github.com/sluicehq/sluice/internal/dispatch"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/limitcmd"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/internal/rules"
)

// client is one connection's state. Only the goroutine serving the
// connection touches it, except for the fields CLIENT LIST reads, which
// are atomic or fixed at accept.
type client struct {
	id      int64
	addr    string
	laddr   string
	fd      int       // the socket's, for CLIENT LIST; -1 if none
	created time.Time // server clock
	conn    *conn

	resp    int // 2 or 3, set by HELLO
	name    string
	libName string
	libVer  string
	quit    bool
	// failed asks the connection to close gently after an error reply
	// (conn.lingerClose): the client may have pipelined more behind it.
	failed bool
	// silent closes the connection without the replies not yet sent: a
	// cross-protocol attack (crossProtocol).
	silent bool
	authed bool // AUTH done, or no password configured
	// pipes counts the pipelines begun and ended (odd: one under way),
	// for MIGRATE PAUSE's grace period (waitPipelines).
	pipes atomic.Int64
	// authFails counts failed AUTH and HELLO AUTH attempts, for
	// MaxAuthFailures.
	authFails int

	// Ctx is the command context of the families (internal/dispatch): the
	// reply buffer, the pipeline's batch, the scratch store key and what a
	// limit command decided, shared with the server's own commands.
	dispatch.Ctx
	// batchBytes is the bytes of this pipeline's commands that wrote: the
	// batch keeps room for their keys, so a large total replaces it.
	batchBytes int
	ran        int // commands executed and not yet counted in the stats
	writes     []span
	// replyStart is where the reply of the command being executed begins.
	replyStart int
	lname      [32]byte
	// del and delEnds hold the record keys DEL found, back to back.
	del     []byte
	delEnds []int

	tx txState // MULTI and WATCH, see tx.go

	tally   []tally    // per command, this pipeline
	touched []*command // commands with a tally in this pipeline
	cur     *tally     // the tally of the command being executed

	// For CLIENT INFO and LIST (clientinfo.go).
	lastCmd string // full name of the command being or last executed
	lastAt  int64  // server clock, unix ms, when the last pipeline was read
	outPeak int    // the most reply bytes queued at once
	shown   struct {
		sync.Mutex
		v clientView // published by the connection's goroutine
	}
}

// command is an entry of the command table: a family's (Run) or the
// server's own (run).
type command struct {
	dispatch.Command
	// run is a server command's handler, nil for a family's.
	run func(s *Server, c *client, args [][]byte)
	// subs are a container's subcommands (cmddoc.Subs), for COMMAND,
	// COMMAND DOCS and CLIENT LIST.
	subs []cmddoc.Sub

	idx  int // position in the table, and in each client's tally
	stat struct {
		calls, errors, allowed, denied atomic.Int64
	}
}

// tally counts one command's outcomes within a pipeline; flushTally adds
// them to the command's shared counters once per pipeline, so concurrent
// clients do not contend on a counter per command.
type tally struct{ calls, errors, allowed, denied int64 }

// commandTable builds the command table: the commands the families
// register (internal/limitcmd, whose HIT hits the rules f has in use;
// internal/conncmd), then the server's own.
func commandTable(f *rules.File) map[string]*command {
	var families dispatch.Table
	limitcmd.Register(&families)
	limitcmd.RegisterHit(&families, f)
	conncmd.Register(&families)
	var list []*command
	for _, fc := range families.Commands() {
		list = append(list, &command{Command: fc})
	}
	list = append(list, []*command{
		{Command: dispatch.Command{Name: "quit", Arity: -1, Flags: []string{"fast"}}, run: cmdQuit},
		{Command: dispatch.Command{Name: "hello", Arity: -1, Flags: []string{"fast"}}, run: cmdHello},
		{Command: dispatch.Command{Name: "auth", Arity: -2, Flags: []string{"fast"}}, run: cmdAuth},
		{Command: dispatch.Command{Name: "client", Arity: -2, Flags: []string{"admin"}}, run: cmdClient},
		{Command: dispatch.Command{Name: "command", Arity: -1, Flags: []string{"loading"}}, run: cmdCommand},
		{Command: dispatch.Command{Name: "config", Arity: -2, Flags: []string{"admin"}}, run: cmdConfig},
		{Command: dispatch.Command{Name: "ready", Arity: 1, Flags: []string{"fast"}}, run: cmdReady},
		{Command: dispatch.Command{Name: "info", Arity: -1, Flags: []string{"loading"}}, run: cmdInfo},
		{Command: dispatch.Command{Name: "del", Arity: -2, Flags: []string{"write"}, First: 1, Last: -1, Step: 1, Doc: delDoc}, run: cmdDel},
		{Command: dispatch.Command{Name: "dbsize", Arity: 1, Flags: []string{"readonly", "fast"}}, run: cmdDBSize},
		{Command: dispatch.Command{Name: "compact", Arity: 1, Flags: []string{"admin"}}, run: cmdCompact},
		{Command: dispatch.Command{Name: "checkpoint", Arity: -1, Flags: []string{"admin"}}, run: cmdCheckpoint},
		{Command: dispatch.Command{Name: "lastsave", Arity: 1, Flags: []string{"fast"}}, run: cmdLastSave},
		{Command: dispatch.Command{Name: "policy", Arity: -2, Flags: []string{"admin"}}, run: cmdPolicy},
		{Command: dispatch.Command{Name: "rls.override", Arity: -3, Flags: []string{"admin"}}, run: cmdRLSOverride},
		{Command: dispatch.Command{Name: "rls.overrides", Arity: -2, Flags: []string{"admin"}}, run: cmdRLSOverrides},
		{Command: dispatch.Command{Name: "multi", Arity: 1, Flags: []string{"noscript", "loading", "stale", "fast"}, Doc: multiDoc}, run: cmdMulti},
		{Command: dispatch.Command{Name: "exec", Arity: 1, Flags: []string{"noscript", "loading", "stale"}, Doc: execDoc}, run: cmdExec},
		{Command: dispatch.Command{Name: "discard", Arity: 1, Flags: []string{"noscript", "loading", "stale", "fast"}, Doc: discDoc}, run: cmdDiscard},
		{Command: dispatch.Command{Name: "watch", Arity: -2, Flags: []string{"noscript", "loading", "stale", "fast"}, First: 1, Last: -1, Step: 1, Doc: watchDoc}, run: cmdWatch},
		{Command: dispatch.Command{Name: "unwatch", Arity: 1, Flags: []string{"noscript", "loading", "stale", "fast"}, Doc: unwatchDoc}, run: cmdUnwatch},
		{Command: dispatch.Command{Name: "cluster", Arity: -2, Flags: []string{"admin"}, Doc: clusterDoc}, run: cmdCluster},
		{Command: dispatch.Command{Name: "asking", Arity: 1, Flags: []string{"fast"}, Doc: askingDoc}, run: cmdAsking},
		{Command: dispatch.Command{Name: "readonly", Arity: 1, Flags: []string{"fast"}, Doc: readonlyDoc}, run: cmdAsking},
		{Command: dispatch.Command{Name: "readwrite", Arity: 1, Flags: []string{"fast"}, Doc: readwriteDoc}, run: cmdAsking},
		{Command: dispatch.Command{Name: "debug", Arity: -2, Flags: []string{"admin", "noscript", "loading", "stale"}}, run: cmdDebug},
		{Command: dispatch.Command{Name: "sluice.counterhit", Arity: 6, Flags: []string{"write"}, Doc: counterHitDoc}, run: cmdCounterHit},
	}...)
	m := make(map[string]*command, len(list))
	for i, c := range list {
		if c.Doc == nil {
			c.Doc = cmddoc.Builtin(c.Name)
		}
		c.subs = cmddoc.Subs(c.Name)
		c.idx = i
		m[c.Name] = c
	}
	return m
}

// count starts the tally of one execution of cmd.
func (c *client) count(cmd *command) *tally {
	t := &c.tally[cmd.idx]
	if *t == (tally{}) {
		c.touched = append(c.touched, cmd)
	}
	t.calls++
	c.cur = t
	return t
}

// flushTally adds the pipeline's tallies to the shared counters.
func (s *Server) flushTally(c *client) {
	for _, cmd := range c.touched {
		t := &c.tally[cmd.idx]
		cmd.stat.calls.Add(t.calls)
		if t.errors != 0 {
			cmd.stat.errors.Add(t.errors)
		}
		if t.allowed != 0 {
			cmd.stat.allowed.Add(t.allowed)
			s.stats.RlAllowed.Add(t.allowed)
		}
		if t.denied != 0 {
			cmd.stat.denied.Add(t.denied)
			s.stats.RlDenied.Add(t.denied)
		}
		*t = tally{}
	}
	c.touched = c.touched[:0]
	c.cur = nil
}

// exec runs one command, appending its reply to c.Out, and does the
// command's accounting, once for every command: handlers only answer (and
// set c.Result when they decide a limit).
func (s *Server) exec(c *client, args [][]byte) {
	start := len(c.Out)
	t := s.dispatch(c, args)
	s.tallyReply(c, t, start)
}

// dispatch runs one command and returns its tally, nil for a command that
// is not counted as one (unknown, or queued by MULTI).
func (s *Server) dispatch(c *client, args [][]byte) *tally {
	// Before anything else, as Redis: in MULTI, before AUTH.
	if isCrossProtocol(args[0]) {
		s.crossProtocol(c)
		return nil
	}
	cmd := s.lookup(c, args[0])
	c.Result = dispatch.None
	if c.tx.on && s.queue(c, cmd, args) {
		return nil
	}
	if cmd == nil {
		c.cur = nil
		c.Out = resp.AppendError(c.Out, unknownCommand(args))
		s.stats.UnknownCommands.Add(1)
		return nil
	}
	t := c.count(cmd)
	if !c.tx.running { // CLIENT INFO in EXEC shows cmd=exec, as in Redis
		c.lastCmd = cmd.fullName(args)
	}
	if (cmd.Arity > 0 && len(args) != cmd.Arity) || (cmd.Arity < 0 && len(args) < -cmd.Arity) {
		s.replyErr(c, errs.WrongArgs(cmd.Name))
		return t
	}
	if !c.authed && !allowedBeforeAuth(cmd.Name) {
		s.replyErr(c, errNoAuth)
		return t
	}
	// EXEC checked its commands' slot as a whole (execHeld).
	if cmd.First > 0 && s.clus != nil && !c.tx.running && !s.routeKeys(c, cmd, args) {
		return t
	}
	if cmd.run != nil {
		cmd.run(s, c, args)
	} else if err := cmd.Run(&c.Ctx, args); err != nil {
		s.replyErr(c, err)
	}
	return t
}

// tallyReply counts the reply c.Out[start:] of one command in t (nil for
// none): an error reply, or the decision of a limit command (c.Result).
func (s *Server) tallyReply(c *client, t *tally, start int) {
	if len(c.Out) > start && c.Out[start] == '-' {
		s.stats.ErrorReplies.Add(1)
		if t != nil {
			t.errors++
		}
		return
	}
	if t == nil {
		return
	}
	switch c.Result {
	case dispatch.Allowed:
		t.allowed++
	case dispatch.Denied:
		t.denied++
	}
}

// lookup returns the command named name, any case, or nil.
func (s *Server) lookup(c *client, name []byte) *command {
	if len(name) > len(c.lname) {
		return nil
	}
	for i, b := range name {
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		c.lname[i] = b
	}
	return s.cmds[string(c.lname[:len(name)])]
}

// replyErr answers err as the command's reply (exec counts it).
func (s *Server) replyErr(c *client, err error) {
	c.Out = resp.AppendError(c.Out, s.errorText(err))
}

// unknownCommand words the error like Redis, quoting a bounded preview of
// the arguments.
func unknownCommand(args [][]byte) string {
	var b strings.Builder
	b.WriteString("ERR unknown command '")
	b.WriteString(resp.Preview(args[0]))
	b.WriteString("', with args beginning with: ")
	for _, a := range args[1:min(len(args), 4)] {
		b.WriteString("'")
		b.WriteString(resp.Preview(a))
		b.WriteString("' ")
	}
	return b.String()
}

func cmdQuit(s *Server, c *client, args [][]byte) {
	c.Out = resp.AppendSimple(c.Out, "OK")
	c.quit = true
}

// cmdAuth implements AUTH [username] password. With no password configured
// the default user needs none, as in Redis.
func cmdAuth(s *Server, c *client, args [][]byte) {
	if len(args) > 3 {
		s.replyErr(c, errs.Syntax)
		return
	}
	if s.cfg.Password == "" {
		// As in Redis: without a password the default user takes any.
		if len(args) == 2 {
			s.replyErr(c, errNoPass)
			return
		}
		if string(args[1]) != "default" {
			s.authFailed(c)
			return
		}
		c.Out = resp.AppendSimple(c.Out, "OK")
		return
	}
	user, pass := []byte("default"), args[1]
	if len(args) == 3 {
		user, pass = args[1], args[2]
	}
	if !s.CheckAuth(user, pass) {
		s.authFailed(c)
		return
	}
	c.authed = true
	c.Out = resp.AppendSimple(c.Out, "OK")
}

// cmdHello implements HELLO [protover [AUTH username password] [SETNAME name]].
func cmdHello(s *Server, c *client, args [][]byte) {
	proto := c.resp
	if len(args) > 1 {
		v, ok := resp.ParseInt(args[1])
		if !ok {
			s.replyErr(c, resp.Error("ERR Protocol version is not an integer or out of range"))
			return
		}
		if v != 2 && v != 3 {
			s.replyErr(c, resp.Error("NOPROTO unsupported protocol version"))
			return
		}
		proto = int(v)
	}
	var name []byte
	setName, authed := false, false
	for i := 2; i < len(args); i++ {
		switch {
		case resp.EqualFold(args[i], "auth") && i+2 < len(args):
			if s.cfg.Password == "" && string(args[i+1]) == "default" {
				i += 2
				continue
			}
			if !s.CheckAuth(args[i+1], args[i+2]) {
				s.authFailed(c)
				return
			}
			authed = true
			i += 2
		case resp.EqualFold(args[i], "setname") && i+1 < len(args):
			name, setName = args[i+1], true
			i++
		default:
			s.replyErr(c, resp.Error("ERR Syntax error in HELLO option '"+resp.Preview(args[i])+"'"))
			return
		}
	}
	if !c.authed && !authed {
		s.replyErr(c, resp.Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time"))
		return
	}
	if setName {
		if err := checkClientName("client name", name, errClientName); err != nil {
			s.replyErr(c, err)
			return
		}
	}
	c.authed = true
	c.resp = proto
	if setName {
		c.name = string(name)
	}
	r3 := c.resp == 3
	c.Out = resp.AppendMap(c.Out, 7, r3)
	c.Out = resp.AppendBulkString(c.Out, "server")
	c.Out = resp.AppendBulkString(c.Out, "sluice")
	c.Out = resp.AppendBulkString(c.Out, "version")
	// The Redis version, as INFO's redis_version: clients pick features
	// by it (rueidis asks CLUSTER SHARDS from 8 on); sluice's own version
	// is INFO's sluice_version.
	c.Out = resp.AppendBulkString(c.Out, RedisCompatVersion)
	c.Out = resp.AppendBulkString(c.Out, "proto")
	c.Out = resp.AppendInt(c.Out, int64(c.resp))
	c.Out = resp.AppendBulkString(c.Out, "id")
	c.Out = resp.AppendInt(c.Out, c.id)
	c.Out = resp.AppendBulkString(c.Out, "mode")
	c.Out = resp.AppendBulkString(c.Out, s.helloMode())
	c.Out = resp.AppendBulkString(c.Out, "role")
	c.Out = resp.AppendBulkString(c.Out, "master")
	c.Out = resp.AppendBulkString(c.Out, "modules")
	c.Out = resp.AppendArray(c.Out, 0)
}

var errClientName = resp.Error("ERR Client names cannot contain spaces, newlines or special characters.")

// MaxClientName is the longest client name, library name or version a
// connection may set. Redis has no limit; here each is kept for the life of
// the connection and not counted in --maxmemory-clients, so a fixed cap
// keeps three of them from costing up to 3 × --max-bulk per connection.
const MaxClientName = 256

// checkClientName refuses a client name, library name or version (what)
// longer than MaxClientName, or with characters other than printable
// ASCII: then bad.
func checkClientName(what string, b []byte, bad error) error {
	if len(b) > MaxClientName {
		return resp.Error("ERR " + what + " is " + strconv.Itoa(len(b)) + " bytes, longer than the limit of " + strconv.Itoa(MaxClientName) + " bytes")
	}
	for _, ch := range b {
		if ch < '!' || ch > '~' {
			return bad
		}
	}
	return nil
}

func cmdClient(s *Server, c *client, args [][]byte) {
	sub := strings.ToLower(string(args[1]))
	switch {
	case sub == "id" && len(args) == 2:
		c.Out = resp.AppendInt(c.Out, c.id)
	case sub == "getname" && len(args) == 2:
		if c.name == "" {
			c.Out = resp.AppendNull(c.Out, c.resp == 3)
		} else {
			c.Out = resp.AppendBulkString(c.Out, c.name)
		}
	case sub == "setname" && len(args) == 3:
		if err := checkClientName("client name", args[2], errClientName); err != nil {
			s.replyErr(c, err)
			return
		}
		c.name = string(args[2])
		c.Out = resp.AppendSimple(c.Out, "OK")
	case sub == "setinfo" && len(args) == 4:
		attr := strings.ToLower(string(args[2]))
		if attr == "lib-name" || attr == "lib-ver" { // else refused below, as in Redis
			if err := checkClientName(attr, args[3], resp.Error("ERR "+attr+" cannot contain spaces, newlines or special characters.")); err != nil {
				s.replyErr(c, err)
				return
			}
		}
		switch attr {
		case "lib-name":
			c.libName = string(args[3])
		case "lib-ver":
			c.libVer = string(args[3])
		default:
			s.replyErr(c, resp.Error("ERR Unrecognized option '"+resp.Preview(args[2])+"'"))
			return
		}
		c.Out = resp.AppendSimple(c.Out, "OK")
	case sub == "info" && len(args) == 2:
		s.clientInfo(c)
	case sub == "list":
		s.clientListCmd(c, args)
	case sub == "kill" && len(args) < 3:
		s.replyErr(c, errs.WrongArgs("client|kill"))
	case sub == "kill":
		s.clientKill(c, args)
	case sub == "help":
		lines := []string{
			"CLIENT <subcommand> [<arg> ...]. Subcommands are:",
			"ID", "    Return the ID of the current connection.",
			"GETNAME", "    Return the name of the current connection.",
			"SETNAME <name>", "    Assign the name <name> to the current connection.",
			"SETINFO <LIB-NAME|LIB-VER> <value>", "    Record the client library's name or version.",
			"INFO", "    Return information about the current connection.",
			"LIST [TYPE <NORMAL|MASTER|REPLICA|PUBSUB> | ID <id> [<id> ...]]",
			"    Return information about the connections, all or those given; every sluice connection is of type normal.",
			"KILL <ip:port>", "    Kill the connection made from <ip:port>.",
			"KILL <option> <value> [<option> <value> [...]]",
			"    Kill the connections that match every option. Options are:",
			"    * ID <client-id>", "      the connection with this ID.",
			"    * ADDR <ip:port>", "      connections made from this address.",
			"    * LADDR <ip:port>", "      connections made to this local address.",
			"    * USER <username>", "      connections of this user: only default exists.",
			"    * TYPE <NORMAL|MASTER|REPLICA|PUBSUB>", "      connections of this type: every one is normal.",
			"    * MAXAGE <seconds>", "      connections at least this old.",
			"    * SKIPME <YES|NO>", "      skip the connection running the command (default: yes).",
		}
		c.Out = appendHelp(c.Out, lines)
	default:
		s.replyErr(c, resp.Error("ERR unknown subcommand or wrong number of arguments for '"+resp.Preview(args[1])+"'. Try CLIENT HELP."))
	}
}

// appendHelp appends a HELP reply: one simple string per line, as Redis.
func appendHelp(b []byte, lines []string) []byte {
	b = resp.AppendArray(b, len(lines))
	for _, l := range lines {
		b = resp.AppendSimple(b, l)
	}
	return b
}

// cmdCommand implements COMMAND, COMMAND COUNT|LIST|INFO|DOCS, enough for
// client libraries and redis-cli's interactive mode.
func cmdCommand(s *Server, c *client, args [][]byte) {
	names := make([]string, 0, len(s.cmds))
	for n := range s.cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(args) == 1 {
		c.Out = resp.AppendArray(c.Out, len(names))
		for _, n := range names {
			c.Out = s.cmds[n].appendInfo(c.Out)
		}
		return
	}
	switch strings.ToLower(string(args[1])) {
	case "count":
		c.Out = resp.AppendInt(c.Out, int64(len(names)))
	case "list":
		c.Out = resp.AppendArray(c.Out, len(names))
		for _, n := range names {
			c.Out = resp.AppendBulkString(c.Out, n)
		}
	case "info":
		c.Out = resp.AppendArray(c.Out, len(args)-2)
		for _, a := range args[2:] {
			cmd, sub := s.lookupCommand(a)
			switch {
			case sub != nil:
				c.Out = cmddoc.AppendSubInfo(c.Out, sub)
			case cmd != nil:
				c.Out = cmd.appendInfo(c.Out)
			default:
				c.Out = resp.AppendNull(c.Out, c.resp == 3)
			}
		}
	case "help":
		lines := []string{
			"COMMAND [<subcommand> [<arg> ...]]. Subcommands are:",
			"(no subcommand)", "    Return details about all commands.",
			"COUNT", "    Return the total number of commands.",
			"LIST", "    Return the names of all commands.",
			"INFO <command-name> [<command-name> ...]", "    Return details about the named commands.",
			"DOCS [<command-name> ...]", "    Return documentation records (summary, since, group, arguments) of every command, or of the named ones.",
		}
		c.Out = appendHelp(c.Out, lines)
	case "getkeys":
		s.commandGetKeys(c, args)
	case "docs":
		// As Redis: every command's record, or the named ones (a
		// subcommand by its full name, "client|info"); names without a
		// record are left out.
		type rec struct {
			name string
			doc  *cmddoc.Doc
			subs []cmddoc.Sub
		}
		var docs []rec
		if len(args) == 2 {
			for _, n := range names {
				if cmd := s.cmds[n]; cmd.Doc != nil {
					docs = append(docs, rec{cmd.Name, cmd.Doc, cmd.subs})
				}
			}
		} else {
			for _, a := range args[2:] {
				cmd, sub := s.lookupCommand(a)
				switch {
				case sub != nil:
					docs = append(docs, rec{sub.Name, &sub.Doc, nil})
				case cmd != nil && cmd.Doc != nil:
					docs = append(docs, rec{cmd.Name, cmd.Doc, cmd.subs})
				}
			}
		}
		r3 := c.resp == 3
		c.Out = resp.AppendMap(c.Out, len(docs), r3)
		for _, d := range docs {
			c.Out = resp.AppendBulkString(c.Out, d.name)
			c.Out = d.doc.Append(c.Out, r3, d.subs)
		}
	default:
		s.replyErr(c, resp.Error("ERR unknown subcommand '"+resp.Preview(args[1])+"'. Try COMMAND HELP."))
	}
}

// fullName is the name of the command or subcommand args invoke: Redis'
// "client|info" for a container's known subcommand, else the command's.
func (cmd *command) fullName(args [][]byte) string {
	if len(cmd.subs) == 0 || len(args) < 2 {
		return cmd.Name
	}
	for i := range cmd.subs {
		sc := &cmd.subs[i]
		if resp.EqualFold(args[1], sc.Name[len(cmd.Name)+1:]) {
			return sc.Name
		}
	}
	return cmd.Name
}

// appendInfo appends cmd's COMMAND reply.
func (cmd *command) appendInfo(b []byte) []byte {
	return cmddoc.AppendInfo(b, cmd.Name, cmd.Arity, cmd.Flags, cmd.First, cmd.Last, cmd.Step, cmd.subs)
}

// lookupCommand finds a command by name, or a subcommand by its full
// name ("client|info"), ignoring case; it returns nil, nil for neither.
func (s *Server) lookupCommand(name []byte) (*command, *cmddoc.Sub) {
	lower := strings.ToLower(string(name))
	parent, _, isSub := strings.Cut(lower, "|")
	cmd := s.cmds[parent]
	if cmd == nil || !isSub {
		return cmd, nil
	}
	for i := range cmd.subs {
		if cmd.subs[i].Name == lower {
			return nil, &cmd.subs[i]
		}
	}
	return nil, nil
}

// cmdReady answers 1 while the server can serve writes: not shutting down
// and the store neither failed nor refusing changes.
func cmdReady(s *Server, c *client, args [][]byte) {
	if !s.Ready() {
		c.Out = resp.AppendInt(c.Out, 0)
		return
	}
	c.Out = resp.AppendInt(c.Out, 1)
}

// Ready reports whether the server can serve changes now: not shutting
// down, and the store neither failed nor refusing changes because writes to
// its disk fail.
func (s *Server) Ready() bool { return s.NotReady() == "" }

// NotReady says why the server should get no traffic (/readyz, the
// health service of Envoy's rate limit service), or "" when it should.
func (s *Server) NotReady() string {
	switch {
	case s.closing.Load():
		return "shutting down"
	case s.store.Failed() != nil:
		return "store failed: " + s.store.Failed().Error()
	case s.store.Unavailable() != nil:
		return "store unavailable: " + s.store.Unavailable().Error()
	}
	return ""
}
