package reload

import (
	"errors"
	"log/slog"
	"testing"
	"time"
)

var errClosed = errors.New("closed")

// runner returns a Runner whose timeouts the test fires: each Run's
// timeout channel is sent on timeouts, with the duration it was asked for.
func runner(t *testing.T) (*Runner, chan chan time.Time, *[]time.Duration) {
	t.Helper()
	timeouts := make(chan chan time.Time, 8)
	var asked []time.Duration
	r := New(Options{
		Timeout: 3 * time.Second,
		Log:     slog.New(slog.DiscardHandler),
		Closed:  errClosed,
		After: func(d time.Duration) <-chan time.Time {
			asked = append(asked, d)
			ch := make(chan time.Time, 1)
			timeouts <- ch
			return ch
		},
	})
	return r, timeouts, &asked
}

// TestRunReturnsItsError: a reload that ends in time returns its own
// error, unwrapped, and asks for one timeout of Options.Timeout.
func TestRunReturnsItsError(t *testing.T) {
	r, _, asked := runner(t)
	bad := errors.New("bad file")
	if err := r.Run(func() error { return bad }); err != bad {
		t.Fatalf("Run: %v, want the reload's own error %v", err, bad)
	}
	if err := r.Run(func() error { return nil }); err != nil {
		t.Fatalf("Run: %v, want nil", err)
	}
	if len(*asked) != 2 || (*asked)[0] != 3*time.Second || (*asked)[1] != 3*time.Second {
		t.Fatalf("timeouts asked for: %v; want one of 3s per Run", *asked)
	}
}

// TestOneTimeoutAllTold: the wait for the reload before and the reload
// itself share one timeout, so a reload that waited is not given a
// fresh one; and the second reload runs only once the first has ended.
func TestOneTimeoutAllTold(t *testing.T) {
	r, timeouts, asked := runner(t)
	release, first := make(chan struct{}), make(chan error, 1)
	running := make(chan struct{})
	go func() { first <- r.Run(func() error { close(running); <-release; return nil }) }()
	<-running
	<-timeouts // the first Run's, never fired

	firstDone := false
	second := make(chan error, 1)
	go func() {
		second <- r.Run(func() error {
			if !firstDone {
				return errors.New("ran while the first reload was running")
			}
			return nil
		})
	}()
	timeout := <-timeouts // the second Run waits for the slot
	firstDone = true
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if len(*asked) != 2 {
		t.Fatalf("%d timeouts asked for, want 2: the second reload's wait and run share one", len(*asked))
	}
	timeout <- time.Time{} // fired after the fact: nothing is listening
}

// TestWaitingPastTheTimeout: a reload that cannot start within the
// timeout, as another is still running, returns ErrTimeout and never
// runs; the one running, past its own timeout, goes on and ends.
func TestWaitingPastTheTimeout(t *testing.T) {
	r, timeouts, _ := runner(t)
	release, first := make(chan struct{}), make(chan error, 1)
	running, ended := make(chan struct{}), make(chan struct{})
	go func() {
		first <- r.Run(func() error { close(running); <-release; close(ended); return nil })
	}()
	<-running
	firstTimeout := <-timeouts

	ran := false
	second := make(chan error, 1)
	go func() { second <- r.Run(func() error { ran = true; return nil }) }()
	(<-timeouts) <- time.Time{}
	if err := <-second; !errors.Is(err, ErrTimeout) {
		t.Fatalf("a reload waiting past its timeout: %v, want %v", err, ErrTimeout)
	}
	firstTimeout <- time.Time{}
	if err := <-first; !errors.Is(err, ErrTimeout) {
		t.Fatalf("a reload running past its timeout: %v, want %v", err, ErrTimeout)
	}
	close(release)
	<-ended
	// The slot is free again once the hung reload has ended.
	if err := r.Run(func() error { return nil }); err != nil {
		t.Fatalf("a reload after the hung one ended: %v", err)
	}
	if ran {
		t.Fatal("the reload that timed out waiting ran")
	}
}

// TestRunAfterStop: once stopped, Run returns Options.Closed without
// starting the reload, even with no other reload running: a reload
// started then would read its files during the shutdown. Tried many
// times, as a free slot and the stop are both ready to be chosen.
func TestRunAfterStop(t *testing.T) {
	r, _, _ := runner(t)
	r.Stop()
	never := make(chan struct{})
	defer close(never)
	for i := range 100 {
		if err := r.Run(func() error { <-never; return nil }); err != errClosed {
			t.Fatalf("Run %d after Stop: %v, want %v", i, err, errClosed)
		}
		if len(r.running) != 0 {
			t.Fatalf("Run %d after Stop started its reload", i)
		}
	}
}
