package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hibiken/asynq"
)

// TypeWebhookDeliver POSTs an event to a tenant's webhook endpoint.
// config.yaml caps it fleet-wide (webhooks-out) and per tenant
// (tenant:{tenant_id}), so that one slow endpoint cannot hold every seat.
const TypeWebhookDeliver = "webhook:deliver"

// Webhook limits.
const (
	maxWebhookURLLen   = 2048
	maxWebhookEventLen = 64
	webhookTimeout     = 30 * time.Second
	webhookUserAgent   = "fleetcap-webhook/1"
)

// WebhookDeliverPayload is the payload of a webhook:deliver task.
type WebhookDeliverPayload struct {
	// TenantID owns the endpoint; required, as for report:fetch.
	TenantID string `json:"tenant_id"`
	// URL is the endpoint: https, or http to a loopback host (for local
	// testing); no credentials in it; at most 2048 bytes. Required.
	URL string `json:"url"`
	// Event names the event, such as "invoice.paid": lower-case letters,
	// digits, ".", "_" and "-", at most 64 bytes. Required.
	Event string `json:"event"`
	// Body is the JSON object sent; default {}.
	Body json.RawMessage `json:"body,omitempty"`
}

func (p WebhookDeliverPayload) validate() error {
	const typ = TypeWebhookDeliver
	if err := checkTenantID(typ, p.TenantID); err != nil {
		return err
	}
	if err := checkWebhookURL(p.URL); err != nil {
		return err
	}
	if p.Event == "" {
		return payloadErr(typ, "event", "required")
	}
	if len(p.Event) > maxWebhookEventLen {
		return payloadErr(typ, "event", "%d bytes, longer than %d", len(p.Event), maxWebhookEventLen)
	}
	for i, r := range p.Event {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return payloadErr(typ, "event", "bad character %q at byte %d (want a-z, 0-9, '.', '_', '-')", r, i)
		}
	}
	if len(p.Body) > 0 {
		var obj map[string]json.RawMessage
		if bytes.Equal(bytes.TrimSpace(p.Body), []byte("null")) || json.Unmarshal(p.Body, &obj) != nil {
			return payloadErr(typ, "body", "must be a JSON object")
		}
	}
	return nil
}

// checkWebhookURL allows https, and http to loopback hosts only.
func checkWebhookURL(raw string) error {
	const typ, field = TypeWebhookDeliver, "url"
	if raw == "" {
		return payloadErr(typ, field, "required")
	}
	if len(raw) > maxWebhookURLLen {
		return payloadErr(typ, field, "%d bytes, longer than %d", len(raw), maxWebhookURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || u.Hostname() == "" || u.Opaque != "" {
		return payloadErr(typ, field, "want an absolute URL such as https://example.com/hooks")
	}
	if u.User != nil {
		return payloadErr(typ, field, "must not carry credentials")
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !isLoopback(u.Hostname()) {
			return payloadErr(typ, field, "http is only allowed to a loopback host; use https")
		}
	default:
		return payloadErr(typ, field, "scheme must be https, got %q", u.Scheme)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// DecodeWebhookDeliver strictly decodes and checks a webhook:deliver
// payload. Its errors are *PayloadError and match ErrInvalidPayload.
func DecodeWebhookDeliver(b []byte) (WebhookDeliverPayload, error) {
	var p WebhookDeliverPayload
	if err := decodeStrict(TypeWebhookDeliver, b, &p); err != nil {
		return WebhookDeliverPayload{}, err
	}
	if err := p.validate(); err != nil {
		return WebhookDeliverPayload{}, err
	}
	return p, nil
}

// NewWebhookDeliverTask returns a webhook:deliver task, or an error if the
// payload is invalid.
func NewWebhookDeliverTask(p WebhookDeliverPayload, opts ...asynq.Option) (*asynq.Task, error) {
	if err := p.validate(); err != nil {
		return nil, err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("%s: encode payload: %w", TypeWebhookDeliver, err)
	}
	if len(b) > MaxPayloadBytes {
		return nil, payloadErr(TypeWebhookDeliver, "", "%d bytes, more than the %d allowed", len(b), MaxPayloadBytes)
	}
	return asynq.NewTask(TypeWebhookDeliver, b, opts...), nil
}

// WebhookDeliverer handles webhook:deliver tasks. It POSTs the body with
// the headers Webhook-Event and Webhook-Id (the task ID, the same on every
// retry, so that receivers can drop duplicates). A 2xx answer is success;
// 408, 425, 429, 5xx and network errors are retried; redirects and other
// 4xx answers are not, since sending again will not help.
type WebhookDeliverer struct {
	// Client sends the requests; nil means a client with a 30s timeout that
	// does not follow redirects.
	Client *http.Client
}

// NewWebhookDeliverer returns a WebhookDeliverer with the default client.
func NewWebhookDeliverer() *WebhookDeliverer {
	return &WebhookDeliverer{Client: &http.Client{
		Timeout: webhookTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}
}

// ProcessTask implements asynq.Handler.
func (d *WebhookDeliverer) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := DecodeWebhookDeliver(t.Payload())
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	body := []byte(p.Body)
	if len(body) == 0 {
		body = []byte("{}")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: %w: %w", TypeWebhookDeliver, err, asynq.SkipRetry)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", webhookUserAgent)
	req.Header.Set("Webhook-Event", p.Event)
	if id, ok := asynq.GetTaskID(ctx); ok {
		req.Header.Set("Webhook-Id", id)
	}

	client := d.Client
	if client == nil {
		client = NewWebhookDeliverer().Client
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s to %s: %w", TypeWebhookDeliver, req.URL.Host, ctxErr(ctx))
		}
		// Only the host is named: a webhook URL's path often holds a secret.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			err = ue.Err
		}
		return fmt.Errorf("%s to %s: %w", TypeWebhookDeliver, req.URL.Host, err)
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused

	code := resp.StatusCode
	if code >= 200 && code < 300 {
		return nil
	}
	err = fmt.Errorf("%s to %s: endpoint answered %s: %q", TypeWebhookDeliver, req.URL.Host, resp.Status, strings.TrimSpace(string(snippet)))
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests, code >= 500:
		return err
	default:
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
}
