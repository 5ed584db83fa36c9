package bucket

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// stateVersion1 is the only value format so far. The version byte lets a
// later format coexist with stored v1 values.
const stateVersion1 = 1

const flagSession = 1 << 0

// MaxStateLen is the most bytes AppendState appends.
const MaxStateLen = 2 + 4*binary.MaxVarintLen64

// AppendState appends the encoding of s: a version byte, a flags byte, then
// signed varints for the amount, the anchor, LastReduce as a delta from the
// anchor and, when present, the session start as a delta from the anchor.
// Deltas keep a typical state to about a dozen bytes.
func AppendState(dst []byte, s State) []byte {
	var flags byte
	if s.HasSession {
		flags |= flagSession
	}
	dst = append(dst, stateVersion1, flags)
	dst = binary.AppendVarint(dst, s.Amount)
	dst = binary.AppendVarint(dst, s.Anchor)
	dst = binary.AppendVarint(dst, s.LastReduce-s.Anchor)
	if s.HasSession {
		dst = binary.AppendVarint(dst, s.SessionStart-s.Anchor)
	}
	return dst
}

// ErrCorrupt is returned for a stored value that cannot be decoded.
var ErrCorrupt = errors.New("bucket: stored state is corrupt")

// DecodeState decodes a value made by AppendState.
func DecodeState(b []byte) (State, error) {
	if len(b) < 2 {
		return State{}, fmt.Errorf("%w: %d bytes, want at least 2", ErrCorrupt, len(b))
	}
	if b[0] != stateVersion1 {
		return State{}, fmt.Errorf("%w: format version %d, this build reads version %d", ErrCorrupt, b[0], stateVersion1)
	}
	flags := b[1]
	if flags&^flagSession != 0 {
		return State{}, fmt.Errorf("%w: unknown flags %#x", ErrCorrupt, flags)
	}
	var s State
	var d [3]int64
	n := 3
	if flags&flagSession != 0 {
		n = 4
		s.HasSession = true
	}
	rest := b[2:]
	for i := range n {
		v, k := binary.Varint(rest)
		if k <= 0 {
			return State{}, fmt.Errorf("%w: truncated field %d", ErrCorrupt, i)
		}
		rest = rest[k:]
		if i == 0 {
			s.Amount = v
		} else {
			d[i-1] = v
		}
	}
	if len(rest) != 0 {
		return State{}, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(rest))
	}
	s.Anchor = d[0]
	s.LastReduce = d[0] + d[1]
	if s.HasSession {
		s.SessionStart = d[0] + d[2]
	}
	return s, nil
}
