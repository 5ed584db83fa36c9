package admit

import (
	"log/slog"
	"syscall"
	"testing"
	"time"
)

// TestBackoffDoubles: a listener's pause after a failed Accept doubles
// from 5ms up to 1s, and a success resets it.
func TestBackoffDoubles(t *testing.T) {
	var slept []time.Duration
	b := backoff{sleep: func(d time.Duration) { slept = append(slept, d) }}
	for range 10 {
		b.wait(slog.New(slog.DiscardHandler), "test", syscall.EMFILE)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000}
	for i := range want {
		if slept[i] != want[i]*time.Millisecond {
			t.Fatalf("pauses %v, want %v ms", slept, want)
		}
	}
}
