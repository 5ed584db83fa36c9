package policyhttp

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
	"github.com/sluicehq/sluice/rls"
)

// Per-descriptor overrides of Envoy's limits (RLS.OVERRIDE) in the RLS
// configuration's terms: the domain in the path, the descriptor's entries
// as query parameters entry=<key>=<value>, in order.

// Entry is a descriptor entry as the API shows it.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// RLSOverride is one descriptor's override as the API shows it.
type RLSOverride struct {
	Domain          string  `json:"domain,omitempty"`
	Descriptor      []Entry `json:"descriptor"`
	RequestsPerUnit int64   `json:"requests_per_unit"`
}

func entriesOut(es []rls.Entry) []Entry {
	out := make([]Entry, len(es))
	for i, e := range es {
		out[i] = Entry(e)
	}
	return out
}

// descriptor reads the path's domain and the query's entries, or answers
// the error.
func descriptor(w http.ResponseWriter, r *http.Request) (domain string, entries []rls.Entry, ok bool) {
	domain = r.PathValue("domain")
	qs := r.URL.Query()["entry"]
	if len(qs) == 0 {
		fail(w, errs.New(errs.Request, "no entry parameter; expected the descriptor's entries as entry=<key>=<value>, in order"))
		return "", nil, false
	}
	for _, q := range qs {
		k, v, found := strings.Cut(q, "=")
		if !found || k == "" {
			fail(w, errs.New(errs.Request, "entry "+strconv.Quote(q)+" is not one; expected entry=<key>=<value>, a descriptor entry with a key"))
			return "", nil, false
		}
		entries = append(entries, rls.Entry{Key: k, Value: v})
	}
	return domain, entries, true
}

func (h *Handler) listRLSOverrides(w http.ResponseWriter, r *http.Request) {
	domain := r.PathValue("domain")
	after, n, err := pageOf(r)
	var list []policycmd.RLSOverride
	var next []byte
	if err == nil {
		list, next, err = h.Commands.RLSOverrides(domain, after, n)
	}
	if err != nil {
		fail(w, err)
		return
	}
	out := make([]RLSOverride, len(list))
	for i, o := range list {
		out[i] = RLSOverride{Descriptor: entriesOut(o.Entries), RequestsPerUnit: o.Limit}
	}
	reply(w, http.StatusOK, map[string]any{"domain": domain, "cursor": policycmd.FormatCursor(next), "overrides": out})
}

func (h *Handler) getRLSOverride(w http.ResponseWriter, r *http.Request) {
	domain, entries, ok := descriptor(w, r)
	if !ok {
		return
	}
	n, err := h.Commands.RLSOverride(domain, entries)
	switch {
	case err != nil:
		fail(w, err)
	case n < 0:
		reply(w, http.StatusNotFound, map[string]string{"error": "the descriptor has no override in domain " + strconv.Quote(domain)})
	default:
		reply(w, http.StatusOK, RLSOverride{Domain: domain, Descriptor: entriesOut(entries), RequestsPerUnit: n})
	}
}

func (h *Handler) putRLSOverride(w http.ResponseWriter, r *http.Request) {
	domain, entries, ok := descriptor(w, r)
	if !ok {
		return
	}
	var body struct {
		RequestsPerUnit *int64 `json:"requests_per_unit"`
	}
	if !decode(w, r, &body) {
		return
	}
	if !bodyCount(w, "requests_per_unit", body.RequestsPerUnit) {
		return
	}
	if err := h.Commands.SetRLSOverride(h.who(r), domain, entries, *body.RequestsPerUnit); err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, RLSOverride{Domain: domain, Descriptor: entriesOut(entries), RequestsPerUnit: *body.RequestsPerUnit})
}

func (h *Handler) deleteRLSOverride(w http.ResponseWriter, r *http.Request) {
	domain, entries, ok := descriptor(w, r)
	if !ok {
		return
	}
	had, err := h.Commands.ResetRLSOverride(h.who(r), domain, entries)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"domain": domain, "descriptor": entriesOut(entries), "reset": had})
}
