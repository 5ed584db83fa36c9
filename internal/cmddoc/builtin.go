package cmddoc

// builtin holds the COMMAND DOCS records of the server's commands whose table
// entry has none: redis-cli builds its HELP text and Tab completion from
// them, so a command without a record gets neither.
var builtin = map[string]*Doc{
	"ping": {Summary: "Replies PONG, or the message.", Group: "connection",
		Args: []Arg{{Name: "message", Type: "string", Optional: true}}},
	"echo": {Summary: "Replies the message.", Group: "connection",
		Args: []Arg{{Name: "message", Type: "string"}}},
	"quit":   {Summary: "Replies OK and closes the connection.", Group: "connection"},
	"select": {Summary: "Selects database 0, the only one.", Group: "connection", Args: []Arg{{Name: "index", Type: "integer"}}},
	"hello": {Summary: "Sets the protocol version (2 or 3), authenticates and names the connection; replies the server's details.", Group: "connection",
		Args: []Arg{
			{Name: "protover", Type: "integer", Optional: true},
			{Name: "username password", Type: "string", Token: "AUTH", Optional: true},
			{Name: "clientname", Type: "string", Token: "SETNAME", Optional: true},
		}},
	"auth": {Summary: "Authenticates the connection with the --requirepass password (user default).", Group: "connection",
		Args: []Arg{{Name: "username", Type: "string", Optional: true}, {Name: "password", Type: "string"}}},
	"client":  {Summary: "A container for connection commands: CLIENT ID, GETNAME, SETNAME, SETINFO, INFO, LIST, KILL and HELP.", Group: "connection"},
	"command": {Summary: "A container for the command table: COMMAND with no subcommand replies every command's details; COMMAND COUNT, LIST, INFO, DOCS and HELP.", Group: "server"},
	"config":  {Summary: "A container for the settings: CONFIG GET; sluice's are set only by flags at startup.", Group: "server"},
	"time":    {Summary: "Replies the server time: [unix seconds, microseconds].", Group: "server"},
	"ready":   {Summary: "Replies 1 while the server can serve writes, else 0.", Group: "server"},
	"info": {Summary: "Server information and statistics, by section.", Group: "server",
		Args: []Arg{{Name: "section", Type: "string", Optional: true, Multiple: true}}},
	"dbsize":  {Summary: "Replies the number of stored records, of every kind.", Group: "server"},
	"compact": {Summary: "Runs a whole idle sweep and a compaction of the store now.", Group: "server"},
	"checkpoint": {Summary: "Writes a consistent copy of the store under --backup-dir; replies its path.", Group: "server",
		Args: []Arg{{Name: "name", Type: "string", Optional: true}}},
	"lastsave": {Summary: "Replies the Unix time of the last successful CHECKPOINT.", Group: "server"},
	"debug":    {Summary: "A container for debugging commands, refused unless --enable-debug-command allows the client: DEBUG CLOCK-OFFSET and HELP.", Group: "server"},
	"policy":   {Summary: "A container for the --policy rules and their dials: POLICY RELOAD, SHOW, LIMIT, ENFORCE, OVERRIDE, OVERRIDES and STATS.", Group: "server"},
	"rls.override": {Summary: "Gives one Envoy descriptor of a --rls-config domain its own requests_per_unit, kept in the store across restarts and reloads; RESET removes it; without a limit, replies the descriptor's override or nil.", Group: "server",
		Args: []Arg{{Name: "domain", Type: "string"}, {Name: "entry", Type: "string", Multiple: true}, {Name: "limit", Type: "oneof", Optional: true, Args: []Arg{
			{Name: "reset", Type: "pure-token", Token: "RESET"},
			{Name: "requests-per-unit", Type: "integer"},
		}}}},
	"rls.overrides": {Summary: "Lists the per-descriptor overrides of a --rls-config domain, as HSCAN: the cursor to continue from (0: done) and descriptors (arrays of key=value) with their requests_per_unit.", Group: "server",
		Args: []Arg{{Name: "domain", Type: "string"},
			{Name: "cursor", Type: "string", Token: "CURSOR", Optional: true},
			{Name: "count", Type: "integer", Token: "COUNT", Optional: true}}},
}

// builtinSubs are the subcommands of the container commands. The
// containers' handlers parse them; these records only describe them.
var builtinSubs = map[string][]Sub{
	"client": {
		{Name: "client|getname", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the connection's name, or nil when it has none.", Group: "connection"}},
		{Name: "client|help", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the CLIENT subcommands and what they do.", Group: "connection"}},
		{Name: "client|id", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the connection's ID.", Group: "connection"}},
		{Name: "client|info", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the connection's line of CLIENT LIST.", Group: "connection"}},
		{Name: "client|kill", Arity: -3, Flags: []string{"admin", "loading", "stale"}, Doc: Doc{Summary: "Closes the connection made from ip:port (replies OK), or those that match every filter given (replies how many).", Group: "connection",
			Args: []Arg{{Name: "filter", Type: "oneof", Args: []Arg{
				{Name: "old-format", Type: "string"},
				{Name: "new-format", Type: "oneof", Multiple: true, Args: []Arg{
					{Name: "client-id", Type: "integer", Token: "ID", Optional: true},
					clientTypeArg,
					{Name: "username", Type: "string", Token: "USER", Optional: true},
					{Name: "addr", Type: "string", Token: "ADDR", Optional: true},
					{Name: "laddr", Type: "string", Token: "LADDR", Optional: true},
					{Name: "skipme", Type: "oneof", Token: "SKIPME", Optional: true, Args: []Arg{
						{Name: "yes", Type: "pure-token", Token: "YES"},
						{Name: "no", Type: "pure-token", Token: "NO"},
					}},
					{Name: "maxage", Type: "integer", Token: "MAXAGE", Optional: true},
				}},
			}}}}},
		{Name: "client|list", Arity: -2, Flags: connFlags, Doc: Doc{Summary: "Replies a line per connection, all or those of a type or with the IDs given: its ID, addresses, age, idle time, buffers, last command and library, in Redis' fields.", Group: "connection",
			Args: []Arg{
				clientTypeArg,
				{Name: "client-id", Type: "integer", Token: "ID", Optional: true, Multiple: true},
			}}},
		{Name: "client|setinfo", Arity: 4, Flags: connFlags, Doc: Doc{Summary: "Records the client library's name or version, shown by CLIENT LIST.", Group: "connection",
			Args: []Arg{{Name: "attr", Type: "oneof", Args: []Arg{
				{Name: "libname", Type: "string", Token: "LIB-NAME"},
				{Name: "libver", Type: "string", Token: "LIB-VER"},
			}}}}},
		{Name: "client|setname", Arity: 3, Flags: connFlags, Doc: Doc{Summary: "Names the connection: printable ASCII without spaces, at most 256 bytes.", Group: "connection",
			Args: []Arg{{Name: "connection-name", Type: "string"}}}},
	},
	"command": {
		{Name: "command|count", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the number of commands.", Group: "server"}},
		{Name: "command|docs", Arity: -2, Flags: connFlags, Doc: Doc{Summary: "Replies the documentation records (summary, since, group, arguments, subcommands) of every command, or of the named ones.", Group: "server",
			Args: []Arg{{Name: "command-name", Type: "string", Optional: true, Multiple: true}}}},
		{Name: "command|help", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the COMMAND subcommands and what they do.", Group: "server"}},
		{Name: "command|info", Arity: -2, Flags: connFlags, Doc: Doc{Summary: "Replies the details (arity, flags, key positions, subcommands) of the named commands.", Group: "server",
			Args: []Arg{{Name: "command-name", Type: "string", Optional: true, Multiple: true}}}},
		{Name: "command|list", Arity: 2, Flags: connFlags, Doc: Doc{Summary: "Replies the names of all commands.", Group: "server"}},
	},
	"config": {
		{Name: "config|get", Arity: -3, Flags: []string{"admin", "loading", "stale"}, Doc: Doc{Summary: "Replies the settings whose names match a pattern, as name and value pairs.", Group: "server",
			Args: []Arg{{Name: "parameter", Type: "string", Multiple: true}}}},
		{Name: "config|resetstat", Arity: 2, Flags: []string{"admin"}, Doc: Doc{Summary: "Refused: sluice's counters run from the start of the process.", Group: "server"}},
		{Name: "config|rewrite", Arity: 2, Flags: []string{"admin"}, Doc: Doc{Summary: "Refused: sluice has no configuration file to rewrite; it is set by flags and SLUICE_* variables.", Group: "server"}},
		{Name: "config|set", Arity: -4, Flags: []string{"admin"}, Doc: Doc{Summary: "Refused: sluice is configured by flags and SLUICE_* environment variables at startup.", Group: "server",
			Args: []Arg{{Name: "parameter", Type: "string"}, {Name: "value", Type: "string"}}}},
	},
	"debug": {
		{Name: "debug|clock-offset", Arity: -2, Flags: []string{"admin", "noscript", "loading", "stale"}, Doc: Doc{Summary: "Shifts the server clock by the milliseconds given from the system clock (0: none), or replies the shift in force.", Group: "server",
			Args: []Arg{{Name: "milliseconds", Type: "integer", Optional: true}}}},
		{Name: "debug|help", Arity: 2, Flags: []string{"loading", "stale"}, Doc: Doc{Summary: "Replies the DEBUG subcommands and what they do.", Group: "server"}},
	},
	"policy": {
		{Name: "policy|reload", Arity: 2, Flags: []string{"admin"}, Doc: Doc{Summary: "Reads the --policy file and the --rls-config directory again, as SIGHUP; a bad one is refused and what is in use is kept.", Group: "server"}},
		{Name: "policy|show", Arity: 2, Flags: []string{"admin"}, Doc: Doc{Summary: "Replies the rules in use, one flat array of names and values per rule with the limit its hits use, then each orphaned runtime limit.", Group: "server"}},
		{Name: "policy|limit", Arity: -4, Flags: []string{"admin"}, Doc: Doc{Summary: "Sets the limit of the rule with a label at runtime, kept in the store across restarts and reloads; RESET returns it to the rule file's.", Group: "server",
			Args: []Arg{{Name: "label", Type: "string"}, {Name: "limit", Type: "oneof", Args: []Arg{
				{Name: "reset", Type: "pure-token", Token: "RESET"},
				{Name: "new-limit", Type: "block", Args: []Arg{
					{Name: "creditLimit", Type: "integer"},
					{Name: "resetSeconds", Type: "integer", Optional: true},
				}},
			}}}}},
		{Name: "policy|enforce", Arity: -2, Flags: []string{"admin"}, Doc: Doc{Summary: "Sets how every rule front end enforces the limits (on; shadow: counted and reported, never refused; off: allowed, not counted), kept in the store; without a mode, replies the one in use.", Group: "server",
			Args: []Arg{{Name: "mode", Type: "oneof", Optional: true, Args: []Arg{
				{Name: "on", Type: "pure-token", Token: "ON"},
				{Name: "shadow", Type: "pure-token", Token: "SHADOW"},
				{Name: "off", Type: "pure-token", Token: "OFF"},
			}}}}},
		{Name: "policy|override", Arity: -4, Flags: []string{"admin"}, Doc: Doc{Summary: "Gives one actor of the rule with a label its own limit, kept in the store across restarts and reloads; RESET removes it; without a limit, replies the actor's override or nil.", Group: "server",
			Args: []Arg{{Name: "label", Type: "string"}, {Name: "actor", Type: "string"}, {Name: "limit", Type: "oneof", Optional: true, Args: []Arg{
				{Name: "reset", Type: "pure-token", Token: "RESET"},
				{Name: "new-limit", Type: "integer"},
			}}}}},
		{Name: "policy|overrides", Arity: -3, Flags: []string{"admin"}, Doc: Doc{Summary: "Lists the per-actor overrides of a label, as HSCAN: the cursor to continue from (0: done) and actors with their limits.", Group: "server",
			Args: []Arg{{Name: "label", Type: "string"},
				{Name: "cursor", Type: "string", Token: "CURSOR", Optional: true},
				{Name: "count", Type: "integer", Token: "COUNT", Optional: true}}}},
		{Name: "policy|stats", Arity: -3, Flags: []string{"admin"}, Doc: Doc{Summary: "Replies a label's threshold data over the retained days (--policy-stats-days): actor-windows seen and refused, distinct actors seen and refused, quantiles of peak used; WHATIF adds the shares of windows and of actors a limit would have refused.", Group: "server",
			Args: []Arg{{Name: "label", Type: "string"},
				{Name: "whatif", Type: "integer", Token: "WHATIF", Optional: true}}}},
	},
}

// clientTypeArg is the TYPE of CLIENT KILL and CLIENT LIST.
var clientTypeArg = Arg{Name: "client-type", Type: "oneof", Token: "TYPE", Optional: true, Args: []Arg{
	{Name: "normal", Type: "pure-token", Token: "NORMAL"},
	{Name: "master", Type: "pure-token", Token: "MASTER"},
	{Name: "replica", Type: "pure-token", Token: "REPLICA"},
	{Name: "pubsub", Type: "pure-token", Token: "PUBSUB"},
}}

// connFlags are the flags of the subcommands that only look at the
// connection or the command table.
var connFlags = []string{"loading", "stale"}

// Builtin returns the record of the server's own command name, nil for
// none (a family's commands carry their own).
func Builtin(name string) *Doc { return builtin[name] }

// Subs returns the subcommands of the container command name, nil for a
// command that is not one.
func Subs(name string) []Sub { return builtinSubs[name] }
