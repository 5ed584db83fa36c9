// Package dispatch is the seam between the RESP front end and its command
// families: the command table's entry (Command), which a family registers
// into a Table, and the context a command runs in (Ctx), which the server
// fills for every connection. A family reads its arguments, runs its
// operations in the connection's engine.Round (which owns the clock, the
// key size limit, the store and --on-store-error), and appends its reply,
// or returns a typed error that the dispatcher answers; the server's
// dispatcher does the rest once for every command: lookup, arity,
// authentication, slot routing, transactions, the commit and the
// accounting.
//
// A Ctx belongs to one connection and is not safe for concurrent use; a
// Table is built once, before the server serves, and only read after.
package dispatch

import (
	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/engine"
)

// Command is an entry of the command table.
type Command struct {
	Name  string
	Arity int // Redis' convention: > 0 exact, < 0 at least -Arity; counts the name
	Flags []string
	// First, Last and Step locate the key arguments, as COMMAND reports
	// them; First > 0 makes the dispatcher route the command by its keys'
	// hash slot in a cluster.
	First, Last, Step int
	// Run executes the command with args (args[0] is its name, arity
	// already checked) and appends exactly one reply to x.Out, or
	// returns the error the dispatcher answers instead, having appended
	// nothing. It is nil for the server's own commands, which the server
	// runs itself.
	Run func(x *Ctx, args [][]byte) error
	// Doc is the COMMAND DOCS record.
	Doc *cmddoc.Doc
}

// Result is how a limit command decided, for the metrics.
type Result uint8

const (
	// None is a command that decided nothing (a read, an error).
	None Result = iota
	// Allowed is a request the limit let through.
	Allowed
	// Denied is a request the limit refused.
	Denied
)

// Ctx is the context of the command a connection is executing: its reply
// buffer, its round of operations and what the command decided.
type Ctx struct {
	// Round runs the command's operations; the server commits it before
	// the replies of the pipeline's writes are sent.
	Round *engine.Round
	// Out is the connection's reply buffer; a command appends its reply.
	Out []byte
	// Key is scratch room for a store key, kept across commands.
	Key []byte
	// Result is set by a limit command that decided; the dispatcher clears
	// it before each command.
	Result Result

	states []slot // the families' per-connection state, by State index
}

// Trim lets go of the families' buffers larger than keep bytes, between
// pipelines.
func (x *Ctx) Trim(keep int) {
	for _, s := range x.states {
		if s.trim != nil {
			s.trim(keep)
		}
	}
}

// Committed tells the families that the pipeline's writes so far were
// committed (ok) or not stored.
func (x *Ctx) Committed(ok bool) {
	for _, s := range x.states {
		if s.committed != nil {
			s.committed(ok)
		}
	}
}

// Footprint is the bytes of the families' per-connection buffers, as
// counted against --maxmemory-clients.
func (x *Ctx) Footprint() int {
	n := 0
	for _, s := range x.states {
		if s.footprint != nil {
			n += s.footprint()
		}
	}
	return n
}
