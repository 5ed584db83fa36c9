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
	i         int
	trim      func(v *T, keep int)
	footprint func(v *T) int
}

// slot is a connection's value of one State.
type slot struct {
	v         any
	trim      func(keep int)
	footprint func() int
}

// NewState reserves a per-connection T in every Ctx. trim, if not nil,
// lets go of the value's buffers above keep bytes between pipelines;
// footprint, if not nil, is the bytes they hold, counted against
// --maxmemory-clients.
func NewState[T any](t *Table, trim func(v *T, keep int), footprint func(v *T) int) State[T] {
	t.states++
	return State[T]{i: t.states - 1, trim: trim, footprint: footprint}
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
	if s.trim != nil {
		sl.trim = func(keep int) { s.trim(v, keep) }
	}
	if s.footprint != nil {
		sl.footprint = func() int { return s.footprint(v) }
	}
	x.states[s.i] = sl
	return v
}
