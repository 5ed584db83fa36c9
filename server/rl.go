package server

import (
	"math"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/resp"
	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/storage"
)

// The RL.* commands: argument parsing with the upstream validation order,
// and the storage.Mutator that applies bucket arithmetic to a stored state.

type rlKind uint8

const (
	rlReduce rlKind = iota
	rlGet
	rlSessionize
)

// rlSpec describes one RL.* command.
type rlSpec struct {
	kind rlKind
	ms   bool // the P forms take milliseconds
}

// rlRequest is a parsed RL.* command.
type rlRequest struct {
	key    []byte // aliases the command's arguments
	params bucket.Params
	take   int64
	at     int64 // request time (ms); valid when hasAt
	hasAt  bool
	strict bool
}

// parseRL parses the arguments after the command name, in the order that
// decides which error a client sees: argument count, max, refill time, the
// option loop (a value is parsed before its keyword is checked), then the
// range checks. name is the lower-case command name, for the arity error.
func parseRL(spec rlSpec, name string, args [][]byte, r *rlRequest) error {
	maxArgs := 10
	if spec.kind == rlGet {
		maxArgs = 8
	}
	if len(args) < 3 || len(args) > maxArgs {
		return resp.WrongArgs(name)
	}
	*r = rlRequest{key: args[0], take: 1}
	if spec.kind == rlGet {
		r.take = 0
	}
	max, ok := resp.ParseInt(args[1])
	if !ok {
		return resp.ErrNotInteger
	}
	refillTime, ok := resp.ParseInt(args[2])
	if !ok || refillTime < math.MinInt32 || refillTime > math.MaxInt32 {
		return resp.ErrNotInteger
	}
	refill := max
	for i := 3; i < len(args); i++ {
		if resp.EqualFold(args[i], "strict") {
			r.strict = true
			continue
		}
		if i == len(args)-1 {
			return resp.ErrSyntax
		}
		v, ok := resp.ParseInt(args[i+1])
		if !ok {
			return resp.ErrNotInteger
		}
		switch {
		case resp.EqualFold(args[i], "refill"):
			refill = v
		case resp.EqualFold(args[i], "take") && spec.kind != rlGet:
			r.take = v
		case resp.EqualFold(args[i], "at"):
			r.at, r.hasAt = v, true
		default:
			return resp.ErrSyntax
		}
		i++
	}
	if max < 1 || refillTime < 1 || refill < 1 || r.take < 0 || (r.hasAt && r.at < 0) {
		return resp.ErrNotInteger
	}
	if !spec.ms {
		refillTime *= 1000 // at most MaxInt32*1000: no overflow
		if r.hasAt {
			if r.at > math.MaxInt64/1000 {
				return resp.ErrNotInteger
			}
			r.at *= 1000
		}
	}
	r.params = bucket.Params{Max: max, RefillAmount: refill, RefillMs: refillTime}
	return nil
}

// rlMutator applies one parsed RL.* request to a stored bucket state. One
// lives in each client and is reused, so a command allocates nothing.
type rlMutator struct {
	spec   rlSpec
	req    rlRequest
	now    int64 // request time (ms)
	server int64 // server clock (ms)

	// results
	before  int64
	session int64

	val [bucket.MaxStateLen]byte
}

// Mutate implements storage.Mutator.
func (m *rlMutator) Mutate(old []byte, found bool) ([]byte, storage.Op, error) {
	var s bucket.State
	if found {
		var err error
		if s, err = bucket.DecodeState(old); err != nil {
			return nil, storage.Keep, err
		}
	}
	p := m.req.params
	r := bucket.Request{Now: m.now, Server: m.server, Take: m.req.take, Strict: m.req.strict}
	var (
		next  bucket.State
		write bool
	)
	switch m.spec.kind {
	case rlGet:
		m.before, _ = p.Available(s, found, m.now)
		return nil, storage.Keep, nil
	case rlReduce:
		m.before, next, write = p.Reduce(s, found, r)
	case rlSessionize:
		m.before, m.session, next, write = p.Sessionize(s, found, r)
	}
	if !write {
		return nil, storage.Keep, nil
	}
	return bucket.AppendState(m.val[:0], next), storage.Put, nil
}

// appendBucketKey appends the store key of a parsed request.
func appendBucketKey(dst []byte, r rlRequest) []byte {
	return keyspace.AppendBucketKey(dst, r.params, r.key)
}
