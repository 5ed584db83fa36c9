package admit

import (
	"errors"
	"net"
	"slices"
	"sync"
	"time"
)

// ErrServing is returned by Listeners.Listen for a front end that has a
// listener already. Its text names the server, as it did when the server
// owned it.
var ErrServing = errors.New("server: already serving")

// Listeners are a server's listeners, one for each front end (by its
// Door's Name), which Drain drains all at once. Set Gate before the first
// Listen. Safe for concurrent use.
type Listeners struct {
	Gate *Gate

	mu struct {
		sync.Mutex
		byName map[string]net.Listener // as given to Listen
		all    []*Listener
	}
}

// Listen makes ln, wrapped in a Listener of door d, the listener of the
// front end d.Name, which Drain drains; it fails once the gate's server is
// closing (net.ErrClosed) or when that front end has one already
// (ErrServing). The check and the listener's registration are one step
// under the lock, so a listener either is drained or is refused.
func (ls *Listeners) Listen(ln net.Listener, d Door) (*Listener, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	switch {
	case ls.mu.byName[d.Name] != nil:
		return nil, ErrServing
	case ls.Gate.Closing.Load():
		return nil, net.ErrClosed
	}
	if ls.mu.byName == nil {
		ls.mu.byName = make(map[string]net.Listener)
	}
	ls.mu.byName[d.Name] = ln
	l := ls.Gate.Listen(ln, d)
	ls.mu.all = append(ls.mu.all, l)
	return l, nil
}

// Addr returns the address of the front end name's listener, or nil when
// it has none.
func (ls *Listeners) Addr(name string) net.Addr {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ln := ls.mu.byName[name]; ln != nil {
		return ln.Addr()
	}
	return nil
}

// Drain drains every listener at once, each as Listener.Drain does. Call
// it once the gate's server is closing: a Listen after that is refused.
func (ls *Listeners) Drain(forceAt time.Time, rest, timeout time.Duration) {
	ls.mu.Lock()
	all := slices.Clone(ls.mu.all)
	ls.mu.Unlock()
	var wg sync.WaitGroup
	for _, l := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Drain(forceAt, rest, timeout)
		}()
	}
	wg.Wait()
}
