package server

import "github.com/sluicehq/sluice/internal/resp"

// builtinDocs are the COMMAND DOCS records of the commands whose table
// entry has none: redis-cli builds its HELP text and Tab completion from
// them, so a command without a record gets neither.
var builtinDocs = map[string]*cmdDoc{
	"rl.reduce":      rlDoc("Takes TAKE tokens (default 1) from the token bucket of key, which holds max tokens and gets REFILL (default max) back every refill_s seconds. Replies the tokens before the take.", "refill_s", "unix_s", true),
	"rl.preduce":     rlDoc("RL.REDUCE with the refill period and AT in milliseconds.", "refill_ms", "unix_ms", true),
	"rl.get":         rlDoc("Replies the tokens available in the token bucket of key, without taking any.", "refill_s", "unix_s", false),
	"rl.pget":        rlDoc("RL.GET with the refill period and AT in milliseconds.", "refill_ms", "unix_ms", false),
	"rl.sessionize":  rlDoc("RL.REDUCE, always strict; replies [tokens before the take, session start in ms].", "refill_s", "unix_s", true),
	"rl.psessionize": rlDoc("RL.SESSIONIZE with the refill period and AT in milliseconds.", "refill_ms", "unix_ms", true),
	"ping": {summary: "Replies PONG, or the message.", group: "connection",
		args: []docArg{{name: "message", typ: "string", optional: true}}},
	"echo": {summary: "Replies the message.", group: "connection",
		args: []docArg{{name: "message", typ: "string"}}},
	"quit":   {summary: "Replies OK and closes the connection.", group: "connection"},
	"select": {summary: "Selects database 0, the only one.", group: "connection", args: []docArg{{name: "index", typ: "integer"}}},
	"hello": {summary: "Sets the protocol version (2 or 3), authenticates and names the connection; replies the server's details.", group: "connection",
		args: []docArg{
			{name: "protover", typ: "integer", optional: true},
			{name: "username password", typ: "string", token: "AUTH", optional: true},
			{name: "clientname", typ: "string", token: "SETNAME", optional: true},
		}},
	"auth": {summary: "Authenticates the connection with the --requirepass password (user default).", group: "connection",
		args: []docArg{{name: "username", typ: "string", optional: true}, {name: "password", typ: "string"}}},
	"client":  {summary: "A container for connection commands: CLIENT ID, GETNAME, SETNAME, SETINFO, INFO, LIST and HELP.", group: "connection"},
	"command": {summary: "A container for the command table: COMMAND with no subcommand replies every command's details; COMMAND COUNT, LIST, INFO, DOCS and HELP.", group: "server"},
	"config":  {summary: "A container for the settings: CONFIG GET; sluice's are set only by flags at startup.", group: "server"},
	"time":    {summary: "Replies the server time: [unix seconds, microseconds].", group: "server"},
	"ready":   {summary: "Replies 1 while the server can serve writes, else 0.", group: "server"},
	"info": {summary: "Server information and statistics, by section.", group: "server",
		args: []docArg{{name: "section", typ: "string", optional: true, multiple: true}}},
	"dbsize":  {summary: "Replies the number of stored records, of every kind.", group: "server"},
	"compact": {summary: "Runs a whole idle sweep and a compaction of the store now.", group: "server"},
	"checkpoint": {summary: "Writes a consistent copy of the store under --backup-dir; replies its path.", group: "server",
		args: []docArg{{name: "name", typ: "string", optional: true}}},
	"lastsave": {summary: "Replies the Unix time of the last successful CHECKPOINT.", group: "server"},
	"hit": {summary: "Counts a request under the --policy rules; replies [allowed, credits left, seconds until reset].", group: "rate-limit",
		args: []docArg{{name: "field=value", typ: "string", optional: true, multiple: true}}},
	"policy": {summary: "A container for the --policy rules: POLICY RELOAD and POLICY SHOW.", group: "server"},
}

// rlDoc is the record of an RL.* command; take says whether it has TAKE.
func rlDoc(summary, period, at string, take bool) *cmdDoc {
	args := []docArg{
		{name: "key", typ: "key"},
		{name: "max", typ: "integer"},
		{name: period, typ: "integer"},
		{name: "refill", typ: "integer", token: "REFILL", optional: true},
	}
	if take {
		args = append(args, docArg{name: "take", typ: "integer", token: "TAKE", optional: true})
	}
	args = append(args,
		docArg{name: at, typ: "unix-time", token: "AT", optional: true},
		docArg{name: "strict", typ: "pure-token", token: "STRICT", optional: true})
	return &cmdDoc{summary: summary, group: "rate-limit", args: args}
}

// subcommand is a subcommand of a container command (CLIENT, COMMAND,
// CONFIG, POLICY), named like Redis' "client|info". COMMAND and COMMAND
// DOCS list it under its container, as Redis 7 does, which is how
// redis-cli learns "CLIENT SETNAME" for HELP and Tab completion; CLIENT
// LIST's cmd field names it.
type subcommand struct {
	name  string
	arity int
	flags []string
	doc   cmdDoc
}

// builtinSubs are the subcommands of the container commands. The
// containers' handlers parse them; these records only describe them.
var builtinSubs = map[string][]subcommand{
	"client": {
		{name: "client|getname", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the connection's name, or nil when it has none.", group: "connection"}},
		{name: "client|help", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the CLIENT subcommands and what they do.", group: "connection"}},
		{name: "client|id", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the connection's ID.", group: "connection"}},
		{name: "client|info", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the connection's line of CLIENT LIST.", group: "connection"}},
		{name: "client|list", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies a line per connection: its ID, addresses, age, idle time, buffers, last command and library, in Redis' fields.", group: "connection"}},
		{name: "client|setinfo", arity: 4, flags: connFlags, doc: cmdDoc{summary: "Records the client library's name or version, shown by CLIENT LIST.", group: "connection",
			args: []docArg{{name: "attr", typ: "oneof", args: []docArg{
				{name: "libname", typ: "string", token: "LIB-NAME"},
				{name: "libver", typ: "string", token: "LIB-VER"},
			}}}}},
		{name: "client|setname", arity: 3, flags: connFlags, doc: cmdDoc{summary: "Names the connection: printable ASCII without spaces, at most 256 bytes.", group: "connection",
			args: []docArg{{name: "connection-name", typ: "string"}}}},
	},
	"command": {
		{name: "command|count", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the number of commands.", group: "server"}},
		{name: "command|docs", arity: -2, flags: connFlags, doc: cmdDoc{summary: "Replies the documentation records (summary, since, group, arguments, subcommands) of every command, or of the named ones.", group: "server",
			args: []docArg{{name: "command-name", typ: "string", optional: true, multiple: true}}}},
		{name: "command|help", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the COMMAND subcommands and what they do.", group: "server"}},
		{name: "command|info", arity: -2, flags: connFlags, doc: cmdDoc{summary: "Replies the details (arity, flags, key positions, subcommands) of the named commands.", group: "server",
			args: []docArg{{name: "command-name", typ: "string", optional: true, multiple: true}}}},
		{name: "command|list", arity: 2, flags: connFlags, doc: cmdDoc{summary: "Replies the names of all commands.", group: "server"}},
	},
	"config": {
		{name: "config|get", arity: -3, flags: []string{"admin", "loading", "stale"}, doc: cmdDoc{summary: "Replies the settings whose names match a pattern, as name and value pairs.", group: "server",
			args: []docArg{{name: "parameter", typ: "string", multiple: true}}}},
		{name: "config|resetstat", arity: 2, flags: []string{"admin"}, doc: cmdDoc{summary: "Refused: sluice's counters run from the start of the process.", group: "server"}},
		{name: "config|rewrite", arity: 2, flags: []string{"admin"}, doc: cmdDoc{summary: "Refused: sluice has no configuration file to rewrite; it is set by flags and SLUICE_* variables.", group: "server"}},
		{name: "config|set", arity: -4, flags: []string{"admin"}, doc: cmdDoc{summary: "Refused: sluice is configured by flags and SLUICE_* environment variables at startup.", group: "server",
			args: []docArg{{name: "parameter", typ: "string"}, {name: "value", typ: "string"}}}},
	},
	"policy": {
		{name: "policy|reload", arity: 2, flags: []string{"admin"}, doc: cmdDoc{summary: "Reads the --policy file and the --rls-config directory again, as SIGHUP; a bad one is refused and what is in use is kept.", group: "server"}},
		{name: "policy|show", arity: 2, flags: []string{"admin"}, doc: cmdDoc{summary: "Replies the rules in use, one flat array of names and values per rule.", group: "server"}},
	},
}

// connFlags are the flags of the subcommands that only look at the
// connection or the command table.
var connFlags = []string{"loading", "stale"}

// fullName is the name of the command or subcommand args invoke: Redis'
// "client|info" for a container's known subcommand, else the command's.
func (cmd *command) fullName(args [][]byte) string {
	if len(cmd.subs) == 0 || len(args) < 2 {
		return cmd.name
	}
	for i := range cmd.subs {
		sc := &cmd.subs[i]
		if resp.EqualFold(args[1], sc.name[len(cmd.name)+1:]) {
			return sc.name
		}
	}
	return cmd.name
}
