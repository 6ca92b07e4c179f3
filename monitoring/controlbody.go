package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/fleetcap/fleetcap/ratelimit"
)

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

// capacity checks the request and returns its capacity.
func (req CapacityRequest) capacity() (int, error) {
	switch {
	case req.Capacity == nil:
		return 0, errors.New(`"capacity" is required: {"capacity": N} with N >= 0 (0 pauses the key)`)
	case *req.Capacity < 0:
		return 0, fmt.Errorf(`"capacity" must be >= 0 (0 pauses the key), got %d`, *req.Capacity)
	}
	return *req.Capacity, nil
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
