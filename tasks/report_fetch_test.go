package tasks

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestDecodeReportFetch(t *testing.T) {
	long := strings.Repeat("t", MaxTenantIDLen)
	tests := []struct {
		name    string
		in      string
		want    ReportFetchPayload
		wantErr string // substring; "" means valid
	}{
		{name: "minimal", in: `{"tenant_id":"acme"}`, want: ReportFetchPayload{TenantID: "acme"}},
		{name: "all fields", in: `{"tenant_id":"acme","report":"monthly-usage","duration_ms":25}`,
			want: ReportFetchPayload{TenantID: "acme", Report: "monthly-usage", DurationMS: 25}},
		{name: "white space around", in: " \n{\"tenant_id\" : \"acme\"}\n", want: ReportFetchPayload{TenantID: "acme"}},
		{name: "longest tenant", in: `{"tenant_id":"` + long + `"}`, want: ReportFetchPayload{TenantID: long}},
		{name: "unicode tenant", in: `{"tenant_id":"café-東京"}`, want: ReportFetchPayload{TenantID: "café-東京"}},
		{name: "max duration", in: `{"tenant_id":"a","duration_ms":600000}`, want: ReportFetchPayload{TenantID: "a", DurationMS: 600000}},

		{name: "empty", in: ``, wantErr: "malformed JSON"},
		{name: "malformed", in: `{"tenant_id":"acme"`, wantErr: "malformed JSON"},
		{name: "not json", in: `tenant_id=acme`, wantErr: "malformed JSON"},
		{name: "array", in: `[{"tenant_id":"acme"}]`, wantErr: "want a JSON object, got an array"},
		{name: "null", in: `null`, wantErr: "want a JSON object, got null"},
		{name: "string", in: `"acme"`, wantErr: "want a JSON object, got a string"},
		{name: "unknown field", in: `{"tenant_id":"acme","tenant":"x"}`, wantErr: `unknown field "tenant"`},
		{name: "field in another case", in: `{"Tenant_ID":"acme"}`, wantErr: `unknown field "Tenant_ID"`},
		{name: "field twice", in: `{"tenant_id":"a","tenant_id":"b"}`, wantErr: "tenant_id: given twice"},
		{name: "trailing object", in: `{"tenant_id":"acme"}{}`, wantErr: "data after the JSON object"},
		{name: "trailing garbage", in: `{"tenant_id":"acme"} x`, wantErr: "data after the JSON object"},
		{name: "missing tenant", in: `{}`, wantErr: "tenant_id: required"},
		{name: "empty tenant", in: `{"tenant_id":""}`, wantErr: "tenant_id: required"},
		{name: "null tenant", in: `{"tenant_id":null}`, wantErr: "tenant_id: required"},
		{name: "numeric tenant", in: `{"tenant_id":42}`, wantErr: "tenant_id: want a string, got a JSON number"},
		{name: "tenant too long", in: `{"tenant_id":"` + long + `x"}`, wantErr: "tenant_id: 129 bytes, longer than 128"},
		{name: "tenant with newline", in: `{"tenant_id":"ac\nme"}`, wantErr: "tenant_id: control character at byte 2"},
		{name: "tenant with NUL", in: `{"tenant_id":"acme\u0000"}`, wantErr: "tenant_id: control character at byte 4"},
		{name: "tenant with spaces", in: `{"tenant_id":" acme"}`, wantErr: "tenant_id: must not start or end with white space"},
		{name: "report too long", in: `{"tenant_id":"a","report":"` + strings.Repeat("r", 129) + `"}`, wantErr: "report: 129 bytes"},
		{name: "negative duration", in: `{"tenant_id":"a","duration_ms":-1}`, wantErr: "duration_ms: must be in 0..600000, got -1"},
		{name: "duration too long", in: `{"tenant_id":"a","duration_ms":600001}`, wantErr: "duration_ms: must be in 0..600000"},
		{name: "fractional duration", in: `{"tenant_id":"a","duration_ms":1.5}`, wantErr: "duration_ms: want an integer"},
		{name: "invalid UTF-8", in: "{\"tenant_id\":\"a\xff\"}", wantErr: "not valid UTF-8"},
		{name: "oversized", in: `{"tenant_id":"a","report":"` + strings.Repeat(" ", MaxPayloadBytes) + `"}`, wantErr: "more than the 65536 allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeReportFetch([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("DecodeReportFetch = %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("DecodeReportFetch error = %v, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, ErrInvalidPayload) || !strings.HasPrefix(err.Error(), "invalid report:fetch payload: ") {
				t.Errorf("error %q does not match ErrInvalidPayload or lacks the type", err)
			}
			if got != (ReportFetchPayload{}) {
				t.Errorf("DecodeReportFetch returned %+v with its error", got)
			}
		})
	}
}

func TestNewReportFetchTask(t *testing.T) {
	task, err := NewReportFetchTask(ReportFetchPayload{TenantID: "acme", DurationMS: 5}, asynq.Queue("default"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := DecodeReportFetch(task.Payload())
	if err != nil || p.TenantID != "acme" || p.DurationMS != 5 || task.Type() != TypeReportFetch {
		t.Errorf("round trip: %+v, %v", p, err)
	}
	if _, err := NewReportFetchTask(ReportFetchPayload{}); !errors.Is(err, ErrInvalidPayload) {
		t.Errorf("empty payload: err = %v", err)
	}
}

func TestHandleReportFetch(t *testing.T) {
	ctx := context.Background()
	if err := HandleReportFetch(ctx, asynq.NewTask(TypeReportFetch, []byte(`{"tenant_id":"acme","duration_ms":1}`))); err != nil {
		t.Fatalf("HandleReportFetch: %v", err)
	}

	err := HandleReportFetch(ctx, asynq.NewTask(TypeReportFetch, []byte(`{"tenant":"acme"}`)))
	if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, ErrInvalidPayload) {
		t.Errorf("bad payload: err = %v, want SkipRetry and ErrInvalidPayload", err)
	}
}

func TestHandleReportFetchHonoursCancel(t *testing.T) {
	leaseLost := errors.New("lease lost")
	ctx, cancel := context.WithCancelCause(context.Background())
	task := asynq.NewTask(TypeReportFetch, []byte(`{"tenant_id":"acme","duration_ms":600000}`))
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- HandleReportFetch(ctx, task) }()
	cancel(leaseLost)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !errors.Is(err, leaseLost) {
			t.Errorf("err = %v, want context.Canceled and its cause", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("returned after %s", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("HandleReportFetch did not return after cancel")
	}
}

func TestReportFetchDuration(t *testing.T) {
	if d := (ReportFetchPayload{}).Duration(); d != 2*time.Second {
		t.Errorf("default duration = %s", d)
	}
	if d := (ReportFetchPayload{DurationMS: 25}).Duration(); d != 25*time.Millisecond {
		t.Errorf("duration = %s", d)
	}
}
