package dispatch

// Table collects the commands the families register, and numbers their
// per-connection state.
type Table struct {
	cmds   []Command
	states int
}

// Add registers cmds.
func (t *Table) Add(cmds ...Command) { t.cmds = append(t.cmds, cmds...) }

// Commands returns the registered commands, in the order of registration.
func (t *Table) Commands() []Command { return t.cmds }

// State is a family's per-connection value of type T: a command's
// scratch (a request, a mutator handed to the store) lives there, not in
// a new value per command, which would escape to the heap.
type State[T any] struct {
	i int
	h Hooks[T]
}

// Hooks are what the connection does with a family's per-connection value
// besides handing it to the family's commands. A nil hook is skipped.
type Hooks[T any] struct {
	// Trim lets go of the value's buffers above keep bytes, between
	// pipelines.
	Trim func(v *T, keep int)
	// Footprint is the bytes the value's buffers hold, counted against
	// --maxmemory-clients.
	Footprint func(v *T) int
	// Committed follows the commit of the writes the pipeline's commands
	// made so far: ok is false when they were not stored (and their
	// replies became the error), for a family whose metrics count only
	// what clients were told.
	Committed func(v *T, ok bool)
}

// slot is a connection's value of one State.
type slot struct {
	v         any
	trim      func(keep int)
	footprint func() int
	committed func(ok bool)
}

// NewState reserves a per-connection T in every Ctx, with hooks h.
func NewState[T any](t *Table, h Hooks[T]) State[T] {
	t.states++
	return State[T]{i: t.states - 1, h: h}
}

// Of returns x's value, made zero on the connection's first use.
func (s State[T]) Of(x *Ctx) *T {
	if s.i < len(x.states) {
		if v, ok := x.states[s.i].v.(*T); ok {
			return v
		}
	}
	return s.make(x)
}

func (s State[T]) make(x *Ctx) *T {
	if s.i >= len(x.states) {
		x.states = append(x.states, make([]slot, s.i+1-len(x.states))...)
	}
	v := new(T)
	sl := slot{v: v}
	if h := s.h.Trim; h != nil {
		sl.trim = func(keep int) { h(v, keep) }
	}
	if h := s.h.Footprint; h != nil {
		sl.footprint = func() int { return h(v) }
	}
	if h := s.h.Committed; h != nil {
		sl.committed = func(ok bool) { h(v, ok) }
	}
	x.states[s.i] = sl
	return v
}
