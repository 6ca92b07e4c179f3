package tasks

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeReportFetch checks that decoding never panics, that every error
// is a payload error, and that an accepted payload survives a round trip.
func FuzzDecodeReportFetch(f *testing.F) {
	f.Add([]byte(`{"tenant_id":"acme","report":"monthly","duration_ms":25}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeReportFetch(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("error is not a payload error: %v", err)
			}
			return
		}
		if p.TenantID == "" || len(p.TenantID) > MaxTenantIDLen || p.Duration() <= 0 || p.Duration() > MaxReportFetchDuration {
			t.Fatalf("accepted a bad payload: %+v", p)
		}
		task, err := NewReportFetchTask(p)
		if err != nil {
			t.Fatalf("NewReportFetchTask(%+v): %v", p, err)
		}
		again, err := DecodeReportFetch(task.Payload())
		if err != nil || again != p {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, p)
		}
	})
}

// FuzzDecodeWebhookDeliver is FuzzDecodeReportFetch for webhook:deliver.
func FuzzDecodeWebhookDeliver(f *testing.F) {
	f.Add([]byte(`{"tenant_id":"acme","url":"https://h.example/x","event":"invoice.paid","body":{"a":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := DecodeWebhookDeliver(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("error is not a payload error: %v", err)
			}
			return
		}
		if p.TenantID == "" || p.URL == "" || p.Event == "" {
			t.Fatalf("accepted a bad payload: %+v", p)
		}
		task, err := NewWebhookDeliverTask(p)
		if err != nil {
			// Re-encoding may grow the payload (HTML escaping) past the limit.
			if errors.Is(err, ErrInvalidPayload) && len(b) > MaxPayloadBytes/2 {
				return
			}
			t.Fatalf("NewWebhookDeliverTask(%+v): %v", p, err)
		}
		again, err := DecodeWebhookDeliver(task.Payload())
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		var b1, b2 any
		_ = json.Unmarshal(p.Body, &b1)
		_ = json.Unmarshal(again.Body, &b2)
		if again.TenantID != p.TenantID || again.URL != p.URL || again.Event != p.Event || !reflect.DeepEqual(b1, b2) {
			t.Fatalf("round trip: %+v; want %+v", again, p)
		}
	})
}
