package policyhttp

import (
	"net/http"

	"github.com/sluicehq/sluice/internal/policycmd"
)

// getStats is GET /v1/policy/stats/{label}[?whatif=<limit>]: POLICY
// STATS as JSON (policycmd.Stats).
func (h *Handler) getStats(w http.ResponseWriter, r *http.Request) {
	name, ok := labelOf(w, r)
	if !ok {
		return
	}
	var whatif *int64
	if q := r.URL.Query(); q.Has("whatif") {
		l, err := policycmd.ParseLimit([]byte(q.Get("whatif")))
		if err != nil {
			fail(w, err)
			return
		}
		whatif = &l
	}
	st, err := h.Commands.Stats(name, whatif)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, st)
}
