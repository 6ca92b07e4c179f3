package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// TypeReportFetch fetches a tenant's report from the legacy reporting API, a
// slow service that takes only a few calls at once (config.yaml caps it
// with the semaphore key legacy-api).
const TypeReportFetch = "report:fetch"

// Report fetch timing.
const (
	DefaultReportFetchDuration = 2 * time.Second
	MaxReportFetchDuration     = 10 * time.Minute
	maxReportNameLen           = 128
)

// ReportFetchPayload is the payload of a report:fetch task.
type ReportFetchPayload struct {
	// TenantID is whose report to fetch; required, at most 128 bytes, no
	// control characters.
	TenantID string `json:"tenant_id"`
	// Report names the report; default "" (the tenant's default report).
	Report string `json:"report,omitempty"`
	// DurationMS is how long the stand-in legacy call takes, in
	// milliseconds; default 2000, at most 600000.
	DurationMS int `json:"duration_ms,omitempty"`
}

// Duration is how long the legacy call takes.
func (p ReportFetchPayload) Duration() time.Duration {
	if p.DurationMS == 0 {
		return DefaultReportFetchDuration
	}
	return time.Duration(p.DurationMS) * time.Millisecond
}

// validate checks the fields of a decoded payload.
func (p ReportFetchPayload) validate() error {
	if err := checkTenantID(TypeReportFetch, p.TenantID); err != nil {
		return err
	}
	if err := checkLabel(TypeReportFetch, "report", p.Report, maxReportNameLen, false); err != nil {
		return err
	}
	if limit := int(MaxReportFetchDuration / time.Millisecond); p.DurationMS < 0 || p.DurationMS > limit {
		return payloadErr(TypeReportFetch, "duration_ms", "must be in 0..%d, got %d", limit, p.DurationMS)
	}
	return nil
}

// DecodeReportFetch strictly decodes and checks a report:fetch payload. Its
// errors are *PayloadError and match ErrInvalidPayload.
func DecodeReportFetch(b []byte) (ReportFetchPayload, error) {
	var p ReportFetchPayload
	if err := decodeStrict(TypeReportFetch, b, &p); err != nil {
		return ReportFetchPayload{}, err
	}
	if err := p.validate(); err != nil {
		return ReportFetchPayload{}, err
	}
	return p, nil
}

// NewReportFetchTask returns a report:fetch task, or an error if the
// payload is invalid.
func NewReportFetchTask(p ReportFetchPayload, opts ...asynq.Option) (*asynq.Task, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("%s: encode payload: %w", TypeReportFetch, err)
	}
	return asynq.NewTask(TypeReportFetch, b, opts...), nil
}

// ReportFetchResult is what a report:fetch task leaves as its asynq result.
type ReportFetchResult struct {
	TenantID  string    `json:"tenant_id"`
	Report    string    `json:"report,omitempty"`
	FetchedAt time.Time `json:"fetched_at"`
}

// HandleReportFetch handles a report:fetch task: it stands in for the slow
// legacy call by waiting the payload's duration, and returns early with the
// context's error when the task is cancelled (shutdown, timeout, lost
// semaphore lease). A bad payload is not retried.
func HandleReportFetch(ctx context.Context, t *asynq.Task) error {
	p, err := DecodeReportFetch(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	timer := time.NewTimer(p.Duration())
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%s for tenant %q: %w", TypeReportFetch, p.TenantID, ctxErr(ctx))
	case <-timer.C:
	}
	if w := t.ResultWriter(); w != nil {
		res, err := json.Marshal(ReportFetchResult{TenantID: p.TenantID, Report: p.Report, FetchedAt: time.Now().UTC()})
		if err != nil {
			return fmt.Errorf("%s: encode result: %w", TypeReportFetch, err)
		}
		if _, err := w.Write(res); err != nil {
			return fmt.Errorf("%s: write result: %w", TypeReportFetch, err)
		}
	}
	return nil
}
