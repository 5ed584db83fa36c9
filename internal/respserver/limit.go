package respserver

import "time"

// Limit is a Config bound that can be turned off: the zero Limit is the
// field's documented default, LimitOf(n) the bound n, and NoLimit none
// (for SweepInterval, no background sweep; for MaxAuthFailures, never
// closing). A field of this type has no "negative means off" value.
type Limit[T int | int64 | time.Duration] struct {
	n   T
	off bool
}

// LimitOf is the bound n; zero (or less) is the field's default.
func LimitOf[T int | int64 | time.Duration](n T) Limit[T] { return Limit[T]{n: n} }

// NoLimit is the bound turned off.
func NoLimit[T int | int64 | time.Duration]() Limit[T] { return Limit[T]{off: true} }

// Off reports whether the bound is turned off.
func (l Limit[T]) Off() bool { return l.off }

// N is the bound; zero when it is off.
func (l Limit[T]) N() T {
	if l.off {
		return 0
	}
	return l.n
}

// OrDefault is l, or def when l is neither set nor off.
func (l Limit[T]) OrDefault(def T) Limit[T] {
	if l.off || l.n > 0 {
		return l
	}
	return Limit[T]{n: def}
}

// Within reports whether n is within the bound: always when it is off.
func (l Limit[T]) Within(n T) bool { return l.off || n <= l.n }
