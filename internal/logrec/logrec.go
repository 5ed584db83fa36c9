// Package logrec is a slog.Handler for tests that check what is logged:
// a Recorder keeps every record at its level or above, and Records
// returns them as maps of their attributes. It is safe for concurrent
// use.
package logrec

import (
	"context"
	"log/slog"
	"sync"
)

// Recorder keeps the records logged at Level or above.
type Recorder struct {
	Level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

// Enabled implements slog.Handler.
func (h *Recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= h.Level }

// Handle implements slog.Handler.
func (h *Recorder) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}

// WithAttrs implements slog.Handler; the attributes are dropped.
func (h *Recorder) WithAttrs([]slog.Attr) slog.Handler { return h }

// WithGroup implements slog.Handler; the group is dropped.
func (h *Recorder) WithGroup(string) slog.Handler { return h }

// Records returns the messages logged, with their attributes: "msg" is
// the message, "level" its level.
func (h *Recorder) Records() []map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []map[string]string
	for _, r := range h.recs {
		m := map[string]string{"msg": r.Message, "level": r.Level.String()}
		r.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		out = append(out, m)
	}
	return out
}
