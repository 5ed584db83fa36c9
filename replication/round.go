package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice/storage"
)

// The first byte of an encoded round: its version. A node refuses a round
// of a version it does not know rather than guess at its bytes. Version 2
// adds the kinds of op that say whether the record existed before (its
// Prior); a round of changes whose Prior is unknown is written in version
// 1, which older nodes read too.
const (
	roundV1 = 1
	roundV2 = 2
)

// The kind byte of each operation of a round: put and delete of a record
// of unknown Prior (versions 1 and 2), and of a known one (version 2):
// a put that creates the record or updates it, a delete that removes it
// or finds none.
const (
	opPut        = 'p'
	opDelete     = 'd'
	opCreate     = 'c'
	opUpdate     = 'u'
	opRemove     = 'r'
	opDeleteNone = 'n'
)

// kindOf is the kind byte of op.
func kindOf(op *Op) byte {
	switch {
	case op.Delete && op.Prior == storage.PriorPresent:
		return opRemove
	case op.Delete && op.Prior == storage.PriorAbsent:
		return opDeleteNone
	case op.Delete:
		return opDelete
	case op.Prior == storage.PriorPresent:
		return opUpdate
	case op.Prior == storage.PriorAbsent:
		return opCreate
	}
	return opPut
}

// ErrBadRound is the error for bytes that are not an encoded round.
var ErrBadRound = errors.New("replication: not an encoded round")

// Op is one change of a round: a record key and its new value (nil for
// a delete), or its deletion, as the store's committer hands it over.
// Followers write exactly these bytes: a round carries the state the
// leader decided, never the command or the clock that decided it.
type Op = storage.ReplicaOp

// Round is what one log entry replicates: the changes of one round of the
// leader's committer, and who proposed it (Proposer, the node, and Seq,
// unique among its proposals) so that the proposer can tell its own round
// when it is applied. Followers ignore Proposer and Seq.
type Round struct {
	Proposer uint64
	Seq      uint64
	Ops      []Op
}

// Append appends the encoding of r to dst:
//
//	version (1 or 2)  uvarint proposer  uvarint seq  uvarint count
//	count × ( put uvarint len key uvarint len value | delete uvarint len key )
//
// where put is 'p' (version 1 or 2), 'c' or 'u' (version 2), and delete is
// 'd' (version 1 or 2), 'r' or 'n' (version 2): see the op kinds.
func (r *Round) Append(dst []byte) []byte {
	version := byte(roundV1)
	for i := range r.Ops {
		if r.Ops[i].Prior != storage.PriorUnknown {
			version = roundV2
			break
		}
	}
	dst = append(dst, version)
	dst = binary.AppendUvarint(dst, r.Proposer)
	dst = binary.AppendUvarint(dst, r.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(r.Ops)))
	for i := range r.Ops {
		op := &r.Ops[i]
		dst = append(dst, kindOf(op))
		dst = appendBytes(dst, op.Key)
		if !op.Delete {
			dst = appendBytes(dst, op.Value)
		}
	}
	return dst
}

func appendBytes(dst, b []byte) []byte {
	return append(binary.AppendUvarint(dst, uint64(len(b))), b...)
}

// check returns an error for a round a leader must not propose: an empty
// key, or one among the store's own keys (from 0xff) unless own (the
// placement group's, whose keys are the replication package's own), or a
// value on a delete. Decode refuses the same, so what one node proposes
// every node applies.
func (r *Round) check(own bool) error {
	for i, op := range r.Ops {
		switch {
		case len(op.Key) == 0:
			return fmt.Errorf("%w: op %d has an empty key", ErrBadRound, i)
		case op.Key[0] == 0xff && !own:
			return fmt.Errorf("%w: op %d: key %q is among the store's own keys (0xff)", ErrBadRound, i, op.Key)
		case op.Delete && op.Value != nil:
			return fmt.Errorf("%w: op %d: a delete with a value", ErrBadRound, i)
		case op.Prior > storage.PriorPresent:
			return fmt.Errorf("%w: op %d: Prior %d, want PriorUnknown, PriorAbsent or PriorPresent", ErrBadRound, i, op.Prior)
		}
	}
	return nil
}

// DecodeRound decodes an encoded round. Keys and values alias b. Any
// malformed input is an error wrapping ErrBadRound: an unknown version, a
// length past the end, trailing bytes, an empty or reserved key.
func DecodeRound(b []byte) (Round, error) { return decodeRound(b, false, nil) }

// decodeRound is DecodeRound, of the placement group's rounds if own,
// with its Ops appended to ops[:0].
func decodeRound(b []byte, own bool, ops []Op) (Round, error) {
	r := Round{Ops: ops[:0]}
	if len(b) == 0 {
		return r, fmt.Errorf("%w: empty", ErrBadRound)
	}
	version := b[0]
	if version != roundV1 && version != roundV2 {
		return r, fmt.Errorf("%w: version %d, want %d or %d", ErrBadRound, version, roundV1, roundV2)
	}
	d := decoder{b: b[1:]}
	r.Proposer = d.uvarint()
	r.Seq = d.uvarint()
	n := d.uvarint()
	// Each op takes at least 3 bytes: a bound on the count before
	// allocating for it.
	if d.err == nil && n > uint64(len(d.b))/3 {
		return Round{}, fmt.Errorf("%w: %d ops in %d bytes", ErrBadRound, n, len(d.b))
	}
	if n > 0 {
		r.Ops = slices.Grow(r.Ops, int(n))
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		var op Op
		kind := d.byte()
		switch kind {
		case opPut, opDelete:
		case opCreate, opDeleteNone:
			op.Prior = storage.PriorAbsent
		case opUpdate, opRemove:
			op.Prior = storage.PriorPresent
		}
		switch {
		case d.err != nil:
		case version == roundV1 && kind != opPut && kind != opDelete:
			d.err = fmt.Errorf("op %d: kind %q, want 'p' or 'd' in version 1", i, kind)
		case kind == opPut || kind == opCreate || kind == opUpdate:
			op.Key = d.bytes()
			op.Value = d.bytes()
			if op.Value == nil && d.err == nil {
				op.Value = []byte{}
			}
		case kind == opDelete || kind == opRemove || kind == opDeleteNone:
			op.Key = d.bytes()
			op.Delete = true
		default:
			d.err = fmt.Errorf("op %d: kind %q, want one of \"pdcurn\"", i, kind)
		}
		r.Ops = append(r.Ops, op)
	}
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the last op", len(d.b))
	}
	if d.err != nil {
		return Round{}, fmt.Errorf("%w: %w", ErrBadRound, d.err)
	}
	if err := r.check(own); err != nil {
		return Round{}, err
	}
	return r, nil
}

// decoder reads from b, remembering the first error.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated or overlong varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errors.New("truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("length %d past the end (%d bytes left)", n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}
