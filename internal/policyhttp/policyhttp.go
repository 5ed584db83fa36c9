// Package policyhttp is the rules' dials over HTTP, for tooling: the
// enforcement mode, the runtime limits and the per-actor overrides of
// POLICY ENFORCE, POLICY LIMIT, POLICY OVERRIDE and RLS.OVERRIDE under /v1/policy/, with
// JSON bodies, and the threshold data of POLICY STATS. Every change goes through
// policycmd.Commands, so it is stored, applied and audited as over RESP.
// The server mounts the Handler on its HTTP port behind the password and
// TLS checks of /backup; the handler itself checks nothing of the client.
//
//	GET    /v1/policy/                 {"enforce": "on", "limits": [...]}
//	GET    /v1/policy/enforce          {"enforce": "on"}
//	PUT    /v1/policy/enforce          {"enforce": "shadow"}
//	GET    /v1/policy/limits/{label}   {"label": ..., "creditLimit": ..., ...}
//	PUT    /v1/policy/limits/{label}   {"creditLimit": 5, "resetSeconds": 60}
//	DELETE /v1/policy/limits/{label}   {"label": ..., "reset": true}
//	GET    /v1/policy/overrides/{label}?cursor=0&count=10
//	                                   {"label": ..., "cursor": "0", "overrides": [...]}
//	GET    /v1/policy/overrides/{label}/{actor...}  {"label": ..., "actor": ..., "limit": 5}
//	PUT    /v1/policy/overrides/{label}/{actor...}  {"limit": 5}
//	DELETE /v1/policy/overrides/{label}/{actor...}  {"label": ..., "actor": ..., "reset": true}
//	GET    /v1/policy/stats/{label}?whatif=50  {"label": ..., "windows": ..., "whatif": {...}}
//	GET    /v1/policy/rls/{domain}/overrides?cursor=0&count=10
//	                                   {"domain": ..., "cursor": "0", "overrides": [...]}
//	GET    /v1/policy/rls/{domain}/override?entry=k=v  {"domain": ..., "descriptor": [...], "requests_per_unit": 5}
//	PUT    /v1/policy/rls/{domain}/override?entry=k=v  {"requests_per_unit": 5}
//	DELETE /v1/policy/rls/{domain}/override?entry=k=v  {"domain": ..., "descriptor": [...], "reset": true}
//
// Errors are {"error": "..."} with 400 for a bad request, 404 for a label
// with no runtime limit or an actor with no override, 503 when the store
// takes no change.
//
// A Handler is safe for concurrent use.
package policyhttp

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
)

// MaxBody is the largest request body: a dial's JSON is a few dozen bytes.
const MaxBody = 4 << 10

// Handler serves /v1/policy/.
type Handler struct {
	Commands *policycmd.Commands
	// User is the user a request authenticated as, for the audit log;
	// "" when the server has no password.
	User string
	mux  *http.ServeMux
}

// New returns a Handler over c; user is the audit log's user of every
// request ("" for none).
func New(c *policycmd.Commands, user string) *Handler {
	h := &Handler{Commands: c, User: user, mux: http.NewServeMux()}
	h.mux.HandleFunc("GET /v1/policy/{$}", h.getAll)
	h.mux.HandleFunc("GET /v1/policy/enforce", h.getEnforce)
	h.mux.HandleFunc("PUT /v1/policy/enforce", h.putEnforce)
	h.mux.HandleFunc("GET /v1/policy/limits/{label}", h.getLimit)
	h.mux.HandleFunc("PUT /v1/policy/limits/{label}", h.putLimit)
	h.mux.HandleFunc("DELETE /v1/policy/limits/{label}", h.deleteLimit)
	h.mux.HandleFunc("GET /v1/policy/overrides/{label}", h.listOverrides)
	h.mux.HandleFunc("GET /v1/policy/overrides/{label}/{actor...}", h.getOverride)
	h.mux.HandleFunc("PUT /v1/policy/overrides/{label}/{actor...}", h.putOverride)
	h.mux.HandleFunc("DELETE /v1/policy/overrides/{label}/{actor...}", h.deleteOverride)
	h.mux.HandleFunc("GET /v1/policy/stats/{label}", h.getStats)
	h.mux.HandleFunc("GET /v1/policy/rls/{domain}/overrides", h.listRLSOverrides)
	h.mux.HandleFunc("GET /v1/policy/rls/{domain}/override", h.getRLSOverride)
	h.mux.HandleFunc("PUT /v1/policy/rls/{domain}/override", h.putRLSOverride)
	h.mux.HandleFunc("DELETE /v1/policy/rls/{domain}/override", h.deleteRLSOverride)
	return h
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// Limit is a runtime limit as the API shows it.
type Limit struct {
	Label       string `json:"label"`
	CreditLimit int64  `json:"creditLimit"`
	// ResetSeconds is nil when the rule file's window applies.
	ResetSeconds *int64 `json:"resetSeconds"`
	// State is applied, refused (Problem says why) or orphaned.
	State   string `json:"state"`
	Problem string `json:"problem,omitempty"`
}

func limitOf(l engine.LabelLimit) Limit {
	out := Limit{Label: l.Label, CreditLimit: l.CreditLimit, State: "applied", Problem: l.Problem}
	if l.ResetSeconds != engine.FileReset {
		rs := l.ResetSeconds
		out.ResetSeconds = &rs
	}
	switch {
	case l.Rule == nil:
		out.State = "orphaned"
	case l.Problem != "":
		out.State = "refused"
	}
	return out
}

func (h *Handler) who(r *http.Request) policycmd.Who {
	return policycmd.Who{Via: "http", Addr: r.RemoteAddr, User: h.User}
}

func (h *Handler) limits() []Limit {
	c := h.Commands
	ls := c.Engine.Limits(c.Rules.Current())
	out := make([]Limit, len(ls))
	for i, l := range ls {
		out[i] = limitOf(l)
	}
	return out
}

func (h *Handler) getAll(w http.ResponseWriter, _ *http.Request) {
	ovs, _ := h.Commands.Engine.OverrideCounts()
	if ovs == nil {
		ovs = map[string]int64{}
	}
	reply(w, http.StatusOK, map[string]any{"enforce": h.Commands.Engine.Enforcement().String(), "limits": h.limits(), "overrides": ovs})
}

func (h *Handler) getEnforce(w http.ResponseWriter, _ *http.Request) {
	reply(w, http.StatusOK, map[string]string{"enforce": h.Commands.Engine.Enforcement().String()})
}

func (h *Handler) putEnforce(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Enforce *string `json:"enforce"`
	}
	if !decode(w, r, &body) {
		return
	}
	if body.Enforce == nil {
		fail(w, errs.New(errs.Request, `the body has no "enforce"; expected {"enforce": "on"}, "shadow" or "off"`))
		return
	}
	m, err := policycmd.ParseMode([]byte(*body.Enforce))
	if err == nil {
		err = h.Commands.SetEnforcement(h.who(r), m)
	}
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"enforce": m.String()})
}

// labelOf reads the path's label, or answers the error.
func labelOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	l := r.PathValue("label")
	if err := policycmd.CheckLabel([]byte(l)); err != nil {
		fail(w, err)
		return "", false
	}
	return l, true
}

func (h *Handler) getLimit(w http.ResponseWriter, r *http.Request) {
	name, ok := labelOf(w, r)
	if !ok {
		return
	}
	for _, l := range h.limits() {
		if l.Label == name {
			reply(w, http.StatusOK, l)
			return
		}
	}
	reply(w, http.StatusNotFound, map[string]string{"error": "label " + name + " has no runtime limit"})
}

func (h *Handler) putLimit(w http.ResponseWriter, r *http.Request) {
	name, ok := labelOf(w, r)
	if !ok {
		return
	}
	var body struct {
		CreditLimit  *int64 `json:"creditLimit"`
		ResetSeconds *int64 `json:"resetSeconds"`
	}
	if !decode(w, r, &body) {
		return
	}
	if body.CreditLimit == nil {
		fail(w, errs.New(errs.Request, `the body has no "creditLimit"; expected {"creditLimit": N} or {"creditLimit": N, "resetSeconds": S}, non-negative integers`))
		return
	}
	l := engine.Limit{CreditLimit: *body.CreditLimit, ResetSeconds: engine.FileReset}
	if body.ResetSeconds != nil {
		if l.ResetSeconds = *body.ResetSeconds; l.ResetSeconds < 0 {
			// FileReset is -1: it must not be asked for by number.
			fail(w, errs.New(errs.Request, "resetSeconds is negative; expected a non-negative integer, or none for the rule file's"))
			return
		}
	}
	if err := h.Commands.SetLimit(h.who(r), name, l); err != nil {
		fail(w, err)
		return
	}
	h.getLimit(w, r)
}

func (h *Handler) deleteLimit(w http.ResponseWriter, r *http.Request) {
	name, ok := labelOf(w, r)
	if !ok {
		return
	}
	had, err := h.Commands.ResetLimit(h.who(r), name)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"label": name, "reset": had})
}

// decode reads a JSON object of known members into v, or answers 400.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	d := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxBody))
	d.DisallowUnknownFields()
	err := d.Decode(v)
	if err == nil && d.More() {
		err = errors.New("more than one JSON value")
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		reply(w, http.StatusRequestEntityTooLarge, map[string]string{"error": "the body is over 4096 bytes; expected a small JSON object"})
		return false
	case errors.Is(err, io.EOF):
		reply(w, http.StatusBadRequest, map[string]string{"error": "the body is empty; expected a JSON object"})
		return false
	case err != nil:
		reply(w, http.StatusBadRequest, map[string]string{"error": "the body is not the JSON object expected: " + err.Error()})
		return false
	}
	return true
}

// fail answers a typed error: 400 for the request's fault, 503 for the
// store's or a shutdown, 500 for anything else (logged by no one here:
// the engine returns only typed errors).
func fail(w http.ResponseWriter, err error) {
	e := engine.Typed(err)
	code := http.StatusInternalServerError
	switch {
	case e.Kind == errs.Request:
		code = http.StatusBadRequest
	case e.Kind.StoreDown() || e.Kind == errs.Shutdown:
		code = http.StatusServiceUnavailable
	}
	reply(w, code, map[string]string{"error": e.Message()})
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
