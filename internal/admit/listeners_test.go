package admit

import (
	"errors"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestListenersOnePerFrontEnd: a front end gets one listener, its address
// is known by its name, and once the server is closing no listener is
// taken; Drain closes those it took.
func TestListenersOnePerFrontEnd(t *testing.T) {
	var closing atomic.Bool
	ls := Listeners{Gate: &Gate{Max: 1, Shared: Shared{Closing: &closing, Log: slog.New(slog.DiscardHandler), After: time.After}}}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}
	first := listen()
	if _, err := ls.Listen(first, Door{Name: "resp"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ls.Listen(listen(), Door{Name: "resp"}); !errors.Is(err, ErrServing) {
		t.Fatalf("a second RESP listener: %v, want ErrServing", err)
	}
	if a := ls.Addr("resp"); a == nil || a.String() != first.Addr().String() {
		t.Fatalf("Addr(resp) = %v, want %v", a, first.Addr())
	}
	if a := ls.Addr("divvy"); a != nil {
		t.Fatalf("Addr(divvy) = %v before it listens, want nil", a)
	}
	closing.Store(true)
	if _, err := ls.Listen(listen(), Door{Name: "divvy"}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a listener once closing: %v, want net.ErrClosed", err)
	}
	ls.Drain(time.Now(), 0, 0)
	if _, err := first.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Drain: %v, want net.ErrClosed", err)
	}
}
