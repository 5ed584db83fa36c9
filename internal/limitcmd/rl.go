// Package limitcmd holds the RESP commands of limits: the requests of the
// bucket-backed limiter commands (RL.*, CL.*, FW.*, ROLL.*), the parsing of
// their arguments, in the order that decides which error a client sees,
// and the storage.Mutator each applies to its stored state with package
// bucket's arithmetic, which do no I/O and read no clock (time is a field
// the caller sets); and HIT, a request's hit of the --policy rules. A
// mutator is reused by one connection, so a command allocates nothing.
// Errors a client is told are typed (package errs). The commands
// (commands.go, hit.go) are registered into a dispatch.Table: each checks
// its request, runs it in the connection's engine.Round, which owns the
// clock, the store and --on-store-error, and appends its reply or returns
// its error, which the dispatcher answers.
package limitcmd

import (
	"math"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The RL.* commands: argument parsing with the upstream validation order,
// and the storage.Mutator that applies bucket arithmetic to a stored state.

// RLKind is what an RL.* command does to its bucket.
type RLKind uint8

const (
	RLReduce RLKind = iota
	RLGet
	RLSessionize
)

// RLSpec describes one RL.* command.
type RLSpec struct {
	Kind RLKind
	MS   bool // the P forms take milliseconds
}

// RLRequest is a parsed RL.* command.
type RLRequest struct {
	Key    []byte // aliases the command's arguments
	Params bucket.Params
	Take   int64
	At     int64 // request time (ms); valid when hasAt
	HasAt  bool
	Strict bool
}

// ParseRL parses the arguments after the command name, in the order that
// decides which error a client sees: argument count, max, refill time, the
// option loop (a value is parsed before its keyword is checked), then the
// range checks. name is the lower-case command name, for the arity error.
func ParseRL(spec RLSpec, name string, args [][]byte, r *RLRequest) error {
	maxArgs := 10
	if spec.Kind == RLGet {
		maxArgs = 8
	}
	if len(args) < 3 || len(args) > maxArgs {
		return errs.WrongArgs(name)
	}
	*r = RLRequest{Key: args[0], Take: 1}
	if spec.Kind == RLGet {
		r.Take = 0
	}
	max, ok := resp.ParseInt(args[1])
	if !ok {
		return errs.NotInteger
	}
	refillTime, ok := resp.ParseInt(args[2])
	if !ok || refillTime < math.MinInt32 || refillTime > math.MaxInt32 {
		return errs.NotInteger
	}
	refill := max
	for i := 3; i < len(args); i++ {
		if resp.EqualFold(args[i], "strict") {
			r.Strict = true
			continue
		}
		if i == len(args)-1 {
			return errs.Syntax
		}
		v, ok := resp.ParseInt(args[i+1])
		if !ok {
			return errs.NotInteger
		}
		switch {
		case resp.EqualFold(args[i], "refill"):
			refill = v
		case resp.EqualFold(args[i], "take") && spec.Kind != RLGet:
			r.Take = v
		case resp.EqualFold(args[i], "at"):
			r.At, r.HasAt = v, true
		default:
			return errs.Syntax
		}
		i++
	}
	if max < 1 || refillTime < 1 || refill < 1 || r.Take < 0 || (r.HasAt && r.At < 0) {
		return errs.NotInteger
	}
	if !spec.MS {
		refillTime *= 1000 // at most MaxInt32*1000: no overflow
		if r.HasAt {
			if r.At > math.MaxInt64/1000 {
				return errs.NotInteger
			}
			r.At *= 1000
		}
	}
	r.Params = bucket.Params{Max: max, RefillAmount: refill, RefillMs: refillTime}
	return nil
}

// RLMutator applies one parsed RL.* request to a stored bucket state. One
// lives in each client and is reused, so a command allocates nothing.
type RLMutator struct {
	Spec   RLSpec
	Req    RLRequest
	Now    int64 // request time (ms)
	Server int64 // server clock (ms)

	// results
	Before  int64
	Session int64

	val [bucket.MaxStateLen]byte
}

// Mutate implements storage.Mutator.
func (m *RLMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var s bucket.State
	if found {
		var err error
		if s, err = bucket.DecodeState(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	p := m.Req.Params
	r := bucket.Request{Now: m.Now, Server: m.Server, Take: m.Req.Take, Strict: m.Req.Strict}
	var (
		next  bucket.State
		write bool
	)
	switch m.Spec.Kind {
	case RLGet:
		m.Before, _ = p.Available(s, found, m.Now)
		return nil, storage.Keep, nil
	case RLReduce:
		m.Before, next, write = p.Reduce(s, found, r)
	case RLSessionize:
		m.Before, m.Session, next, write = p.Sessionize(s, found, r)
	}
	if !write {
		return nil, storage.Keep, nil
	}
	return bucket.AppendState(m.val[:0], next), storage.Put, nil
}

// AppendBucketKey appends the store key of a parsed request.
func AppendBucketKey(dst []byte, r RLRequest) []byte {
	return keyspace.AppendBucketKey(dst, r.Params, r.Key)
}
