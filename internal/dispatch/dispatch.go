// Package dispatch is the seam between the server and its command
// families: the command table's entry (Command), which a family registers
// into a Table, and the context a command runs in (Ctx), which the server
// fills for every connection. A family reads its arguments, asks the Ctx
// for the time, the store and the limits, and appends its reply; the
// server's dispatcher does the rest once for every command: lookup, arity,
// authentication, slot routing, transactions and the accounting.
//
// A Ctx belongs to one connection and is not safe for concurrent use; a
// Table is built once, before the server serves, and only read after.
package dispatch

import (
	"time"

	"github.com/sluicehq/sluice/internal/cmddoc"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/storage"
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
	// already checked) and appends exactly one reply to x.Out. It is nil
	// for the server's own commands, which the server runs itself.
	Run func(x *Ctx, args [][]byte)
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

// Env is what a command sees of the server it runs in. The server fills it
// once; every connection's Ctx points to it.
type Env struct {
	// Clock is the server's clock.
	Clock func() time.Time
	// MaxKeySize is the longest client key, in bytes.
	MaxKeySize int
	// ErrorText words err as the text of a RESP error reply: the server's
	// one classifier, which logs and counts what needs it.
	ErrorText func(err error) string
	// Modify runs m on key's record through b, honouring
	// --on-store-error: a store error is returned ready for ErrorText,
	// unless the reply m computed may stand despite it.
	Modify func(b *storage.Batch, key []byte, m storage.Mutator) error
	// StoreErr makes an error of b.Modify ready for ErrorText, for a
	// command --on-store-error does not apply to.
	StoreErr func(err error) error
}

// CheckKeySize refuses a key of n bytes when it is longer than
// MaxKeySize; what names the key in the error. It is checked before the
// store is touched, on the client's own key: the store key adds a few
// bytes of prefix the client did not send.
func (e *Env) CheckKeySize(what string, n int) error {
	if n <= e.MaxKeySize {
		return nil
	}
	return errs.KeyTooLong(what, n, e.MaxKeySize)
}

// Ctx is the context of the command a connection is executing: its reply
// buffer, its pipeline's batch and what the command decided.
type Ctx struct {
	Env *Env
	// Out is the connection's reply buffer; a command appends its reply.
	Out []byte
	// Batch holds the writes of the connection's pipeline until the server
	// commits them, before their replies are sent.
	Batch *storage.Batch
	// Key is scratch room for a store key, kept across commands.
	Key []byte
	// Result is set by a limit command that decided; the dispatcher clears
	// it before each command.
	Result Result

	states []slot // the families' per-connection state, by State index
}

// Now is the server's time.
func (x *Ctx) Now() time.Time { return x.Env.Clock() }

// CheckKeySize is Env.CheckKeySize.
func (x *Ctx) CheckKeySize(what string, n int) error { return x.Env.CheckKeySize(what, n) }

// Modify runs m on key's record through the pipeline's batch, as
// Env.Modify.
func (x *Ctx) Modify(key []byte, m storage.Mutator) error {
	return x.Env.Modify(x.Batch, key, m)
}

// Apply runs m on key's record through the pipeline's batch, without
// --on-store-error's leniency: for a command that decides no limit.
func (x *Ctx) Apply(key []byte, m storage.Mutator) error {
	if err := x.Batch.Modify(key, m); err != nil {
		return x.Env.StoreErr(err)
	}
	return nil
}

// ReplyErr answers err as the command's reply.
func (x *Ctx) ReplyErr(err error) {
	x.Out = resp.AppendError(x.Out, x.Env.ErrorText(err))
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
