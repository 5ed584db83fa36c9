package server

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
	"client": {summary: "Connection details: CLIENT ID|GETNAME|SETNAME|SETINFO|INFO|LIST|HELP.", group: "connection",
		args: []docArg{{name: "subcommand", typ: "string"}, {name: "arg", typ: "string", optional: true, multiple: true}}},
	"command": {summary: "The command table: COMMAND [COUNT|LIST|INFO|DOCS|HELP].", group: "server",
		args: []docArg{{name: "subcommand", typ: "string", optional: true}, {name: "command-name", typ: "string", optional: true, multiple: true}}},
	"config": {summary: "CONFIG GET pattern: the settings whose names match; they are set only by flags at startup.", group: "server",
		args: []docArg{{name: "subcommand", typ: "string"}, {name: "pattern", typ: "pattern", multiple: true}}},
	"time":  {summary: "Replies the server time: [unix seconds, microseconds].", group: "server"},
	"ready": {summary: "Replies 1 while the server can serve writes, else 0.", group: "server"},
	"info": {summary: "Server information and statistics, by section.", group: "server",
		args: []docArg{{name: "section", typ: "string", optional: true, multiple: true}}},
	"dbsize":  {summary: "Replies the number of stored records, of every kind.", group: "server"},
	"compact": {summary: "Runs a whole idle sweep and a compaction of the store now.", group: "server"},
	"checkpoint": {summary: "Writes a consistent copy of the store under --backup-dir; replies its path.", group: "server",
		args: []docArg{{name: "name", typ: "string", optional: true}}},
	"lastsave": {summary: "Replies the Unix time of the last successful CHECKPOINT.", group: "server"},
	"hit": {summary: "Counts a request under the --policy rules; replies [allowed, credits left, seconds until reset].", group: "rate-limit",
		args: []docArg{{name: "field=value", typ: "string", optional: true, multiple: true}}},
	"policy": {summary: "POLICY RELOAD reads the --policy file again; POLICY SHOW lists the rules in use.", group: "server",
		args: []docArg{{name: "subcommand", typ: "string"}}},
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
