package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/storage"
)

// roundVersion is the first byte of an encoded round. A node refuses a
// round of a version it does not know rather than guess at its bytes.
const roundVersion = 1

// The kind byte of each operation of a round.
const (
	opPut    = 'p'
	opDelete = 'd'
)

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
//	version (1)  uvarint proposer  uvarint seq  uvarint count
//	count × ( 'p' uvarint len key uvarint len value | 'd' uvarint len key )
func (r *Round) Append(dst []byte) []byte {
	dst = append(dst, roundVersion)
	dst = binary.AppendUvarint(dst, r.Proposer)
	dst = binary.AppendUvarint(dst, r.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(r.Ops)))
	for _, op := range r.Ops {
		if op.Delete {
			dst = append(dst, opDelete)
			dst = appendBytes(dst, op.Key)
			continue
		}
		dst = append(dst, opPut)
		dst = appendBytes(dst, op.Key)
		dst = appendBytes(dst, op.Value)
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
		}
	}
	return nil
}

// DecodeRound decodes an encoded round. Keys and values alias b. Any
// malformed input is an error wrapping ErrBadRound: an unknown version, a
// length past the end, trailing bytes, an empty or reserved key.
func DecodeRound(b []byte) (Round, error) { return decodeRound(b, false) }

// decodeRound is DecodeRound, of the placement group's rounds if own.
func decodeRound(b []byte, own bool) (Round, error) {
	var r Round
	if len(b) == 0 {
		return r, fmt.Errorf("%w: empty", ErrBadRound)
	}
	if b[0] != roundVersion {
		return r, fmt.Errorf("%w: version %d, want %d", ErrBadRound, b[0], roundVersion)
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
		r.Ops = make([]Op, 0, n)
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		var op Op
		switch kind := d.byte(); kind {
		case opPut:
			op.Key = d.bytes()
			op.Value = d.bytes()
			if op.Value == nil && d.err == nil {
				op.Value = []byte{}
			}
		case opDelete:
			op.Key = d.bytes()
			op.Delete = true
		default:
			if d.err == nil {
				d.err = fmt.Errorf("op %d: kind %q, want 'p' or 'd'", i, kind)
			}
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
