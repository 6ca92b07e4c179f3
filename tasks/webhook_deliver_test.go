package tasks

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/hibiken/asynq"
)

func TestDecodeWebhookDeliver(t *testing.T) {
	tests := []struct {
		name, in string
		wantErr  string
	}{
		{name: "https", in: `{"tenant_id":"acme","url":"https://hooks.example.com/a?b=c","event":"invoice.paid","body":{"id":1}}`},
		{name: "no body", in: `{"tenant_id":"acme","url":"https://h.example","event":"x"}`},
		{name: "http loopback", in: `{"tenant_id":"acme","url":"http://127.0.0.1:8080/h","event":"x"}`},
		{name: "http localhost", in: `{"tenant_id":"acme","url":"http://localhost/h","event":"x"}`},
		{name: "http ipv6 loopback", in: `{"tenant_id":"acme","url":"http://[::1]:9/h","event":"x"}`},

		{name: "missing tenant", in: `{"url":"https://h.example","event":"x"}`, wantErr: "tenant_id: required"},
		{name: "missing url", in: `{"tenant_id":"a","event":"x"}`, wantErr: "url: required"},
		{name: "relative url", in: `{"tenant_id":"a","url":"/hooks","event":"x"}`, wantErr: "url: want an absolute URL"},
		{name: "http remote", in: `{"tenant_id":"a","url":"http://example.com/h","event":"x"}`, wantErr: "url: http is only allowed to a loopback host"},
		{name: "ftp", in: `{"tenant_id":"a","url":"ftp://example.com/h","event":"x"}`, wantErr: `url: scheme must be https, got "ftp"`},
		{name: "credentials", in: `{"tenant_id":"a","url":"https://u:p@example.com/h","event":"x"}`, wantErr: "url: must not carry credentials"},
		{name: "url too long", in: `{"tenant_id":"a","url":"https://example.com/` + strings.Repeat("p", 2048) + `","event":"x"}`, wantErr: "url: 2068 bytes"},
		{name: "missing event", in: `{"tenant_id":"a","url":"https://h.example"}`, wantErr: "event: required"},
		{name: "bad event", in: `{"tenant_id":"a","url":"https://h.example","event":"Invoice Paid"}`, wantErr: "event: bad character 'I'"},
		{name: "body array", in: `{"tenant_id":"a","url":"https://h.example","event":"x","body":[1]}`, wantErr: "body: must be a JSON object"},
		{name: "body null", in: `{"tenant_id":"a","url":"https://h.example","event":"x","body":null}`, wantErr: "body: must be a JSON object"},
		{name: "unknown field", in: `{"tenant_id":"a","url":"https://h.example","event":"x","secret":"s"}`, wantErr: `unknown field "secret"`},
		{name: "trailing", in: `{"tenant_id":"a","url":"https://h.example","event":"x"} []`, wantErr: "data after the JSON object"},
		{name: "oversized", in: `{"tenant_id":"a","url":"https://h.example","event":"x","body":{"k":"` + strings.Repeat("v", MaxPayloadBytes) + `"}}`, wantErr: "more than the 65536 allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := DecodeWebhookDeliver([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil || p.TenantID == "" {
					t.Fatalf("DecodeWebhookDeliver = %+v, %v", p, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalidPayload) {
				t.Fatalf("DecodeWebhookDeliver error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// hook is a test endpoint that answers with a given status.
type hook struct {
	status int
	mu     sync.Mutex
	got    []*http.Request
	bodies []string
}

func (h *hook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	h.got = append(h.got, r)
	h.bodies = append(h.bodies, string(b))
	h.mu.Unlock()
	if h.status == http.StatusFound {
		w.Header().Set("Location", "/elsewhere")
	}
	w.WriteHeader(h.status)
	_, _ = io.WriteString(w, "answer from hook")
}

func webhookTask(t *testing.T, url string) *asynq.Task {
	t.Helper()
	task, err := NewWebhookDeliverTask(WebhookDeliverPayload{TenantID: "acme", URL: url, Event: "invoice.paid", Body: []byte(`{"invoice_id":"inv_1"}`)})
	if err != nil {
		t.Fatal(err)
	}
	return task
}

func TestWebhookDeliverer(t *testing.T) {
	tests := []struct {
		status    int
		wantErr   bool
		skipRetry bool
	}{
		{http.StatusOK, false, false},
		{http.StatusNoContent, false, false},
		{http.StatusFound, true, true},
		{http.StatusBadRequest, true, true},
		{http.StatusGone, true, true},
		{http.StatusRequestTimeout, true, false},
		{http.StatusTooManyRequests, true, false},
		{http.StatusInternalServerError, true, false},
		{http.StatusServiceUnavailable, true, false},
	}
	for _, tt := range tests {
		t.Run(http.StatusText(tt.status), func(t *testing.T) {
			h := &hook{status: tt.status}
			srv := httptest.NewServer(h)
			defer srv.Close()
			err := NewWebhookDeliverer().ProcessTask(context.Background(), webhookTask(t, srv.URL+"/hook"))
			if (err != nil) != tt.wantErr || errors.Is(err, asynq.SkipRetry) != tt.skipRetry {
				t.Fatalf("ProcessTask = %v; want error %t, SkipRetry %t", err, tt.wantErr, tt.skipRetry)
			}
			if err != nil && !strings.Contains(err.Error(), "answer from hook") {
				t.Errorf("error %q does not quote the answer", err)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if len(h.got) != 1 {
				t.Fatalf("%d requests, want 1 (redirects are not followed)", len(h.got))
			}
			r := h.got[0]
			if r.Method != http.MethodPost || r.URL.Path != "/hook" || r.Header.Get("Content-Type") != "application/json" ||
				r.Header.Get("Webhook-Event") != "invoice.paid" || h.bodies[0] != `{"invoice_id":"inv_1"}` {
				t.Errorf("request %s %s %v body %q", r.Method, r.URL, r.Header, h.bodies[0])
			}
		})
	}
}

func TestWebhookDelivererErrors(t *testing.T) {
	// Connection refused: retried, and only the host is named.
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL + "/secret-token-in-path"
	srv.Close()
	err := (&WebhookDeliverer{}).ProcessTask(context.Background(), webhookTask(t, url))
	if err == nil || errors.Is(err, asynq.SkipRetry) || strings.Contains(err.Error(), "secret-token") {
		t.Errorf("refused: err = %v, want a retryable error without the path", err)
	}

	// Cancelled: the context's error.
	block := make(chan struct{})
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	defer srv.Close()
	defer close(block)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := NewWebhookDeliverer().ProcessTask(ctx, webhookTask(t, srv.URL)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: err = %v", err)
	}

	// Bad payload: not retried.
	err = NewWebhookDeliverer().ProcessTask(context.Background(), asynq.NewTask(TypeWebhookDeliver, []byte(`{"tenant_id":"a"}`)))
	if !errors.Is(err, asynq.SkipRetry) || !errors.Is(err, ErrInvalidPayload) {
		t.Errorf("bad payload: err = %v", err)
	}
}
