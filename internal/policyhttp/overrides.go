package policyhttp

import (
	"cmp"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/internal/engine"
	"github.com/sluicehq/sluice/internal/errs"
	"github.com/sluicehq/sluice/internal/policycmd"
)

// Override is one actor's override as the API shows it. An actor is
// bytes; JSON shows it as a string (bytes that are not UTF-8 become
// U+FFFD: use RESP for such actors).
type Override struct {
	Label string `json:"label,omitempty"`
	Actor string `json:"actor"`
	Limit int64  `json:"limit"`
}

// actor reads the path's label and actor, or answers the error.
func (h *Handler) actor(w http.ResponseWriter, r *http.Request) (label string, actor []byte, ok bool) {
	if label, ok = labelOf(w, r); !ok {
		return "", nil, false
	}
	actor = []byte(r.PathValue("actor"))
	if err := h.Commands.Engine.CheckKeySize("actor", len(actor)); err != nil {
		fail(w, err)
		return "", nil, false
	}
	return label, actor, true
}

func (h *Handler) listOverrides(w http.ResponseWriter, r *http.Request) {
	name, ok := labelOf(w, r)
	if !ok {
		return
	}
	after, n, err := pageOf(r)
	var list []engine.Override
	var next []byte
	if err == nil {
		c := h.Commands
		list, next, err = c.Engine.Overrides(c.Rules.Current(), name, after, n)
	}
	if err != nil {
		fail(w, err)
		return
	}
	out := make([]Override, len(list))
	for i, o := range list {
		out[i] = Override{Actor: string(o.Actor), Limit: o.Limit}
	}
	reply(w, http.StatusOK, map[string]any{"label": name, "cursor": policycmd.FormatCursor(next), "overrides": out})
}

// pageOf reads a listing's query parameters cursor and count.
func pageOf(r *http.Request) (after []byte, n int, err error) {
	q := r.URL.Query()
	if after, err = policycmd.ParseCursor(cmp.Or(q.Get("cursor"), "0")); err != nil {
		return nil, 0, err
	}
	n = policycmd.DefaultOverridesCount
	if s := q.Get("count"); s != "" {
		v, cerr := strconv.Atoi(s)
		if cerr != nil || v < 1 || v > engine.MaxOverridesPage {
			return nil, 0, errs.New(errs.Request, "count "+strconv.Quote(s)+" is not one; expected an integer from 1 to "+strconv.Itoa(engine.MaxOverridesPage))
		}
		n = v
	}
	return after, n, nil
}

func (h *Handler) getOverride(w http.ResponseWriter, r *http.Request) {
	name, actor, ok := h.actor(w, r)
	if !ok {
		return
	}
	c := h.Commands
	err := c.Engine.CheckOverrideLabel(c.Rules.Current(), name)
	n := int64(-1)
	if err == nil {
		n, err = c.Engine.Override(name, actor)
	}
	switch {
	case err != nil:
		fail(w, err)
	case n < 0:
		reply(w, http.StatusNotFound, map[string]string{"error": "actor " + strconv.Quote(string(actor)) + " has no override in label " + name})
	default:
		reply(w, http.StatusOK, Override{Label: name, Actor: string(actor), Limit: n})
	}
}

func (h *Handler) putOverride(w http.ResponseWriter, r *http.Request) {
	name, actor, ok := h.actor(w, r)
	if !ok {
		return
	}
	var body struct {
		Limit *int64 `json:"limit"`
	}
	if !decode(w, r, &body) {
		return
	}
	if !bodyCount(w, "limit", body.Limit) {
		return
	}
	if err := h.Commands.SetOverride(h.who(r), name, actor, *body.Limit); err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, Override{Label: name, Actor: string(actor), Limit: *body.Limit})
}

// bodyCount checks a body's member name, v: present and not negative;
// else it answers the error.
func bodyCount(w http.ResponseWriter, name string, v *int64) bool {
	switch {
	case v == nil:
		fail(w, errs.New(errs.Request, `the body has no "`+name+`"; expected {"`+name+`": N}, a non-negative integer`))
		return false
	case *v < 0:
		fail(w, errs.New(errs.Request, name+" is "+strconv.FormatInt(*v, 10)+"; expected a non-negative integer"))
		return false
	}
	return true
}

func (h *Handler) deleteOverride(w http.ResponseWriter, r *http.Request) {
	name, actor, ok := h.actor(w, r)
	if !ok {
		return
	}
	had, err := h.Commands.ResetOverride(h.who(r), name, actor)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"label": name, "actor": string(actor), "reset": had})
}
