package monitoring

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/ratelimit"
)

// controlAPI serves the override endpoints (SPEC §2.7): PUT and DELETE of
// /api/semaphores/{key}/capacity and /api/ratelimits/{key}. Each write goes
// to Redis, where every worker's control.Reader picks it up; this server's
// reader is refreshed at once, so that its own answers show the change.
type controlAPI struct {
	server        *Server
	overrides     *control.Reader
	lookupKey     func(string) (KeyInfo, bool)
	lookupRateKey func(string) (RateKeyInfo, bool)
}

// OverrideResponse answers the override endpoints.
type OverrideResponse struct {
	Key string `json:"key"`
	// PUT and DELETE of a capacity: the capacity in force and the
	// configured one (for DELETE of a key no longer declared, both 0).
	Capacity           *int `json:"capacity,omitempty"`
	ConfiguredCapacity *int `json:"configured_capacity,omitempty"`
	// PUT and DELETE of a rate: the limit in force and the configured one.
	Rate       *RateSpec `json:"rate,omitempty"`
	Configured *RateSpec `json:"configured,omitempty"`
	Override   bool      `json:"override"`          // an override is in force for the key
	Cleared    *bool     `json:"cleared,omitempty"` // DELETE: there was an override to clear
}

// overrideEndpoint serves PUT and DELETE of one kind of override, a
// capacity or a rate, and holds what sets the two kinds apart: Req is the
// PUT body, V the value it sets (a capacity, a limit) and Info what the
// worker declares of a key (KeyInfo, RateKeyInfo).
type overrideEndpoint[Req, V, Info any] struct {
	api     *controlAPI
	name    string // "capacity" or "rate", in log lines and store actions
	keyKind string // "semaphore" or "rate-limit", in the unknown-key error
	// value checks a PUT body and returns the value it sets.
	value func(Req) (V, error)
	// lookup resolves the {key} as the worker declares it.
	lookup func(key string) (Info, bool)
	// fits refuses a value the key cannot take; nil when every valid
	// value fits.
	fits func(key string, v V, info Info) error
	// set and clear write the override to the store.
	set   func(ctx context.Context, key string, v V) error
	clear func(ctx context.Context, key string) (cleared bool, err error)
	// setAttrs are the attributes of a PUT's log line between the key and
	// the remote address: the value set and the configured one.
	setAttrs func(v V, info Info) []any
	// answer is the answer to a PUT or DELETE, read from the overrides:
	// the value in force and the configured one.
	answer func(key string, info Info) OverrideResponse
}

// capacityOverride serves PUT and DELETE /api/semaphores/{key}/capacity.
func (c *controlAPI) capacityOverride() *overrideEndpoint[CapacityRequest, int, KeyInfo] {
	store := c.overrides.Store()
	return &overrideEndpoint[CapacityRequest, int, KeyInfo]{
		api: c, name: "capacity", keyKind: "semaphore",
		value: CapacityRequest.capacity, lookup: c.lookupKey,
		set: store.SetCapacity, clear: store.ClearCapacity,
		setAttrs: func(capacity int, info KeyInfo) []any {
			return []any{"capacity", capacity, "configured", info.Capacity}
		},
		answer: c.answerCapacity,
	}
}

// rateOverride serves PUT and DELETE /api/ratelimits/{key}.
func (c *controlAPI) rateOverride() *overrideEndpoint[RateRequest, ratelimit.Limit, RateKeyInfo] {
	store := c.overrides.Store()
	return &overrideEndpoint[RateRequest, ratelimit.Limit, RateKeyInfo]{
		api: c, name: "rate", keyKind: "rate-limit",
		value: RateRequest.limit, lookup: c.lookupRateKey, fits: burstFitsCost,
		set: store.SetRate, clear: store.ClearRate,
		setAttrs: func(limit ratelimit.Limit, info RateKeyInfo) []any {
			return []any{"limit", limit.String(), "configured", info.Limit.String()}
		},
		answer: c.answerRate,
	}
}

// put sets the override of the {key}: 400 for a bad body or an unknown
// key, 503 when the store fails, else 200 with the value in force.
func (e *overrideEndpoint[Req, V, Info]) put(w http.ResponseWriter, r *http.Request) {
	if !e.api.server.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	v, info, err := e.request(w, r, key)
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	if err := e.set(r.Context(), key, v); !e.api.stored(w, "set "+e.name, key, err) {
		return
	}
	attrs := slices.Concat([]any{"key", key}, e.setAttrs(v, info), []any{"remote", r.RemoteAddr})
	e.api.server.log.Warn("monitoring: admin set a "+e.name+" override", attrs...)
	e.respond(w, r, key, info, nil)
}

// request decodes and checks the body of a PUT of key, and looks the key
// up: the value to set and what the worker declares of the key.
func (e *overrideEndpoint[Req, V, Info]) request(w http.ResponseWriter, r *http.Request, key string) (v V, info Info, err error) {
	var req Req
	if err := decodeBody(w, r, &req); err != nil {
		return v, info, err
	}
	if v, err = e.value(req); err != nil {
		return v, info, err
	}
	info, ok := e.lookup(key)
	if !ok {
		return v, info, fmt.Errorf("unknown %s key %q: neither a declared key or template nor a key a declared template renders", e.keyKind, key)
	}
	if e.fits != nil {
		err = e.fits(key, v, info)
	}
	return v, info, err
}

// delete clears the override of the {key}. A key no longer declared may
// still carry an override: it can always be cleared.
func (e *overrideEndpoint[Req, V, Info]) delete(w http.ResponseWriter, r *http.Request) {
	if !e.api.server.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	cleared, err := e.clear(r.Context(), key)
	if !e.api.stored(w, "clear "+e.name, key, err) {
		return
	}
	e.api.server.log.Warn("monitoring: admin cleared a "+e.name+" override", "key", key, "cleared", cleared, "remote", r.RemoteAddr)
	info, _ := e.lookup(key)
	e.respond(w, r, key, info, &cleared)
}

// respond reads the overrides back and answers a PUT or DELETE (cleared
// is nil for a PUT).
func (e *overrideEndpoint[Req, V, Info]) respond(w http.ResponseWriter, r *http.Request, key string, info Info, cleared *bool) {
	if !e.api.refresh(w, r) {
		return
	}
	resp := e.answer(key, info)
	resp.Cleared = cleared
	writeJSON(w, http.StatusOK, resp)
}

// answerCapacity is the capacity in force of key and its configured one.
func (c *controlAPI) answerCapacity(key string, info KeyInfo) OverrideResponse {
	capacity, over := c.overrides.CapacityFor(key, info.Template, info.Capacity)
	return OverrideResponse{Key: key, Capacity: &capacity, ConfiguredCapacity: &info.Capacity, Override: over}
}

// answerRate is the limit in force of key and its configured one.
func (c *controlAPI) answerRate(key string, info RateKeyInfo) OverrideResponse {
	limit, over := c.overrides.RateFor(key, info.Template, info.Limit)
	inForce, configured := specOf(limit), specOf(info.Limit)
	return OverrideResponse{Key: key, Rate: &inForce, Configured: &configured, Override: over}
}

// burstFitsCost refuses a limit whose burst is below the tokens a task of
// the key takes: such a task could never run.
func burstFitsCost(key string, limit ratelimit.Limit, info RateKeyInfo) error {
	if limit.Burst < info.MaxCost {
		return fmt.Errorf(`"burst" %d is below the %d tokens a task of key %q takes: such a task could never run`, limit.Burst, info.MaxCost, key)
	}
	return nil
}

// refresh re-reads the overrides so that this server's answer (and this
// worker) has the change at once, and drops the cached rows.
func (c *controlAPI) refresh(w http.ResponseWriter, r *http.Request) bool {
	if err := c.overrides.Refresh(r.Context()); err != nil {
		c.server.log.Error("monitoring: override written but not read back", "err", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "override written, but reading the overrides back failed: " + err.Error()})
		return false
	}
	c.server.snap.invalidate()
	return true
}

// stored reports whether a change to the store went through, and answers
// the request when it did not: 400 for a bad key, 503 when the store
// failed. A change written but not announced went through: it is logged.
func (c *controlAPI) stored(w http.ResponseWriter, what, key string, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, control.ErrNotAnnounced):
		c.server.log.Warn("monitoring: admin override written, not announced", "action", what, "key", key, "err", err)
		return true
	case errors.Is(err, control.ErrBadKey):
		badRequest(w, err.Error())
		return false
	}
	c.server.log.Error("monitoring: admin override failed", "action", what, "key", key, "err", err)
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
	return false
}

func badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
}
