package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

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

// maxBodyBytes bounds an override request body.
const maxBodyBytes = 4 << 10

// CapacityRequest is the body of PUT /api/semaphores/{key}/capacity.
type CapacityRequest struct {
	Capacity *int `json:"capacity"` // >= 0; 0 pauses the key
}

// RateRequest is the body of PUT /api/ratelimits/{key}.
type RateRequest struct {
	Rate  *int   `json:"rate"`  // >= 1
	Per   string `json:"per"`   // a duration > 0 such as "1s"
	Burst *int   `json:"burst"` // >= 1 and not below any task's cost; default rate
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

func (c *controlAPI) putCapacity(w http.ResponseWriter, r *http.Request) {
	if !c.server.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	var req CapacityRequest
	if err := decodeBody(w, r, &req); err != nil {
		badRequest(w, err.Error())
		return
	}
	switch {
	case req.Capacity == nil:
		badRequest(w, `"capacity" is required: {"capacity": N} with N >= 0 (0 pauses the key)`)
		return
	case *req.Capacity < 0:
		badRequest(w, fmt.Sprintf(`"capacity" must be >= 0 (0 pauses the key), got %d`, *req.Capacity))
		return
	}
	info, ok := c.lookupKey(key)
	if !ok {
		badRequest(w, fmt.Sprintf("unknown semaphore key %q: neither a declared key or template nor a key a declared template renders", key))
		return
	}
	if err := c.overrides.Store().SetCapacity(r.Context(), key, *req.Capacity); !c.stored(w, "set capacity", key, err) {
		return
	}
	c.server.log.Warn("monitoring: admin set a capacity override", "key", key, "capacity", *req.Capacity,
		"configured", info.Capacity, "remote", r.RemoteAddr)
	c.answerCapacity(w, r, key, info, nil)
}

func (c *controlAPI) deleteCapacity(w http.ResponseWriter, r *http.Request) {
	if !c.server.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	// A key no longer declared may still carry an override: it can always
	// be cleared.
	cleared, err := c.overrides.Store().ClearCapacity(r.Context(), key)
	if !c.stored(w, "clear capacity", key, err) {
		return
	}
	c.server.log.Warn("monitoring: admin cleared a capacity override", "key", key, "cleared", cleared, "remote", r.RemoteAddr)
	info, _ := c.lookupKey(key)
	c.answerCapacity(w, r, key, info, &cleared)
}

func (c *controlAPI) answerCapacity(w http.ResponseWriter, r *http.Request, key string, info KeyInfo, cleared *bool) {
	if !c.refresh(w, r) {
		return
	}
	capacity, over := c.overrides.CapacityFor(key, info.Template, info.Capacity)
	writeJSON(w, http.StatusOK, OverrideResponse{Key: key, Capacity: &capacity, ConfiguredCapacity: &info.Capacity, Override: over, Cleared: cleared})
}

func (c *controlAPI) putRate(w http.ResponseWriter, r *http.Request) {
	if !c.server.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	var req RateRequest
	if err := decodeBody(w, r, &req); err != nil {
		badRequest(w, err.Error())
		return
	}
	limit, err := req.limit()
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	info, ok := c.lookupRateKey(key)
	if !ok {
		badRequest(w, fmt.Sprintf("unknown rate-limit key %q: neither a declared key or template nor a key a declared template renders", key))
		return
	}
	if limit.Burst < info.MaxCost {
		badRequest(w, fmt.Sprintf(`"burst" %d is below the %d tokens a task of key %q takes: such a task could never run`, limit.Burst, info.MaxCost, key))
		return
	}
	if err := c.overrides.Store().SetRate(r.Context(), key, limit); !c.stored(w, "set rate", key, err) {
		return
	}
	c.server.log.Warn("monitoring: admin set a rate override", "key", key, "limit", limit.String(),
		"configured", info.Limit.String(), "remote", r.RemoteAddr)
	c.answerRate(w, r, key, info, nil)
}

func (c *controlAPI) deleteRate(w http.ResponseWriter, r *http.Request) {
	if !c.server.admit(w, r) {
		return
	}
	key := r.PathValue("key")
	cleared, err := c.overrides.Store().ClearRate(r.Context(), key)
	if !c.stored(w, "clear rate", key, err) {
		return
	}
	c.server.log.Warn("monitoring: admin cleared a rate override", "key", key, "cleared", cleared, "remote", r.RemoteAddr)
	info, _ := c.lookupRateKey(key)
	c.answerRate(w, r, key, info, &cleared)
}

func (c *controlAPI) answerRate(w http.ResponseWriter, r *http.Request, key string, info RateKeyInfo, cleared *bool) {
	if !c.refresh(w, r) {
		return
	}
	limit, over := c.overrides.RateFor(key, info.Template, info.Limit)
	inForce, configured := specOf(limit), specOf(info.Limit)
	writeJSON(w, http.StatusOK, OverrideResponse{Key: key, Rate: &inForce, Configured: &configured, Override: over, Cleared: cleared})
}

// limit checks the request and returns its limit; burst defaults to rate.
func (req RateRequest) limit() (ratelimit.Limit, error) {
	if req.Rate == nil {
		return ratelimit.Limit{}, errors.New(`"rate" is required: {"rate": N, "per": "1s", "burst": B} with N >= 1`)
	}
	if *req.Rate < 1 {
		return ratelimit.Limit{}, fmt.Errorf(`"rate" must be >= 1, got %d`, *req.Rate)
	}
	if req.Per == "" {
		return ratelimit.Limit{}, errors.New(`"per" is required: a duration > 0 such as "1s" or "1m"`)
	}
	per, err := time.ParseDuration(req.Per)
	if err != nil || per <= 0 {
		return ratelimit.Limit{}, fmt.Errorf(`"per" must be a duration > 0 such as "1s" or "1m", got %q`, req.Per)
	}
	burst := *req.Rate
	if req.Burst != nil {
		if *req.Burst < 1 {
			return ratelimit.Limit{}, fmt.Errorf(`"burst" must be >= 1, got %d`, *req.Burst)
		}
		burst = *req.Burst
	}
	limit := ratelimit.Limit{Rate: *req.Rate, Per: per, Burst: burst}
	if err := limit.Validate(); err != nil {
		return ratelimit.Limit{}, err
	}
	return limit, nil
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

// decodeBody decodes one JSON object into v, refusing unknown fields,
// anything after the object and bodies over maxBodyBytes.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		return fmt.Errorf("cannot read the body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the body is empty; want a JSON object")
		}
		return fmt.Errorf("the body is not the JSON object expected: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("the body holds more than one JSON value; want one object")
	}
	return nil
}

func badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
}
