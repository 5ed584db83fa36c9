package dispatch

import (
	"strconv"
	"testing"
)

type buf struct{ b []byte }

// A family's state is made once per connection, kept across commands,
// trimmed and counted with the connection's buffers, and told of commits.
func TestState(t *testing.T) {
	var tab Table
	plain := NewState[int](&tab, Hooks[int]{})
	commits := ""
	st := NewState(&tab, Hooks[buf]{
		Trim: func(v *buf, keep int) {
			if cap(v.b) > keep {
				v.b = nil
			}
		},
		Footprint: func(v *buf) int { return cap(v.b) },
		Committed: func(v *buf, ok bool) { commits += strconv.FormatBool(ok) + " " },
	})
	var x, y Ctx
	if v := st.Of(&x); v != st.Of(&x) {
		t.Fatal("Of made a second value for the same connection")
	}
	if st.Of(&x) == st.Of(&y) {
		t.Fatal("two connections share a value")
	}
	*plain.Of(&x) = 7
	st.Of(&x).b = make([]byte, 100)
	if *plain.Of(&x) != 7 || x.Footprint() != 100 {
		t.Fatalf("plain %d, footprint %d; want 7, 100", *plain.Of(&x), x.Footprint())
	}
	x.Trim(200)
	if x.Footprint() != 100 {
		t.Fatalf("footprint %d after trimming to 200, want 100", x.Footprint())
	}
	x.Trim(50)
	if x.Footprint() != 0 {
		t.Fatalf("footprint %d after trimming to 50, want 0", x.Footprint())
	}
	x.Committed(true)
	x.Committed(false)
	y.Committed(true)
	if commits != "true false true " {
		t.Fatalf("Committed hooks ran %q, want \"true false true \"", commits)
	}
	if allocs := testing.AllocsPerRun(100, func() { st.Of(&x).b = st.Of(&x).b[:0] }); allocs != 0 {
		t.Fatalf("Of allocates %v times once made", allocs)
	}
}
