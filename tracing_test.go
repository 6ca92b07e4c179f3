package fleetcap_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
)

// collectedSpan is one span an OTLP exporter sent, with its service.
type collectedSpan struct {
	service string
	span    *tracepb.Span
}

// collector is an OTLP/HTTP trace collector: it decodes what exporters
// POST to /v1/traces.
type collector struct {
	url   string
	mu    sync.Mutex
	spans []collectedSpan
	errs  []error
}

func startCollector(t *testing.T) *collector {
	t.Helper()
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
		http.NotFound(w, r)
		return
	}
	body := io.Reader(r.Body)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			c.fail(w, err)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		c.fail(w, err)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &req); err != nil {
		c.fail(w, err)
		return
	}
	c.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, collectedSpan{service, s})
			}
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (c *collector) fail(w http.ResponseWriter, err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
	http.Error(w, err.Error(), http.StatusBadRequest)
}

// find returns the spans that match.
func (c *collector) find(match func(collectedSpan) bool) []collectedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []collectedSpan
	for _, s := range c.spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// taskTrace is what the collector holds for one task: its producer span,
// its consumer span, and the semaphore.acquire spans inside the latter.
type taskTrace struct {
	producer, consumer collectedSpan
	acquires           []collectedSpan
}

func (c *collector) taskTrace(taskID string) (taskTrace, bool) {
	of := func(kind tracepb.Span_SpanKind) []collectedSpan {
		return c.find(func(s collectedSpan) bool {
			return s.span.GetKind() == kind && spanAttr(s.span, "messaging.message.id") == taskID
		})
	}
	producers, consumers := of(tracepb.Span_SPAN_KIND_PRODUCER), of(tracepb.Span_SPAN_KIND_CONSUMER)
	if len(producers) == 0 || len(consumers) == 0 {
		return taskTrace{}, false
	}
	tt := taskTrace{producer: producers[0], consumer: consumers[0]}
	tt.acquires = c.find(func(s collectedSpan) bool {
		return s.span.GetName() == "semaphore.acquire" && bytes.Equal(s.span.GetParentSpanId(), tt.consumer.span.GetSpanId()) &&
			bytes.Equal(s.span.GetTraceId(), tt.consumer.span.GetTraceId())
	})
	return tt, len(tt.acquires) > 0
}

// TestTraceFromEnqueueToWorker runs the worker and enqueue binaries with
// OTEL_EXPORTER_OTLP_ENDPOINT pointing at a collector the test serves, and
// enqueues one capped task with the command and one with the Go producer
// API. For each the collector gets a PRODUCER span; the worker's CONSUMER
// span of the task is its child or links to it; and the semaphore.acquire
// span of the task's seat sits inside the consumer span.
func TestTraceFromEnqueueToWorker(t *testing.T) {
	col := startCollector(t)
	srv := redistest.Start(t)
	cfg := writeFile(t, "fleet.yaml", reportConfig(fmt.Sprintf("  url: %q", srv.URL()), 4, 2))
	env := []string{"FLEETCAP_REDIS_URL=", "OTEL_EXPORTER_OTLP_ENDPOINT=" + col.url, "OTEL_BSP_SCHEDULE_DELAY=100",
		"OTEL_TRACES_EXPORTER=", "OTEL_SDK_DISABLED=", "OTEL_SERVICE_NAME="}
	w, _ := startWorker(t, env, cfg)

	code, stdout, stderr := runCmd(t, nil, env, enqueueBin, "--config", cfg, "report:fetch", `{"tenant_id":"cli","duration_ms":50}`)
	if code != 0 || len(strings.Fields(stdout)) != 1 {
		t.Fatalf("enqueue: exit %d, %q, %s", code, stdout, stderr)
	}
	cliTask := strings.TrimSpace(stdout)

	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(col.url+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	fleetCfg, err := worker.LoadConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(fleetCfg, producer.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	info, err := p.Enqueue(ctx, tasks.TypeReportFetch, []byte(`{"tenant_id":"go-api","duration_ms":50}`))
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct{ how, taskID, service string }{
		{"the enqueue command", cliTask, "fleetcap-enqueue"},
		{"the Go producer API", info.ID, ""},
	} {
		var tt taskTrace
		waitfor.Condition(t, 30*time.Second, "the spans of the task enqueued by "+c.how, func() bool {
			var ok bool
			tt, ok = col.taskTrace(c.taskID)
			return ok
		})
		prod, cons := tt.producer.span, tt.consumer.span
		if c.service != "" && tt.producer.service != c.service {
			t.Errorf("%s: producer span from service %q, want %q", c.how, tt.producer.service, c.service)
		}
		if tt.consumer.service != "fleetcap-worker" {
			t.Errorf("%s: consumer span from service %q, want fleetcap-worker", c.how, tt.consumer.service)
		}
		child := bytes.Equal(cons.GetTraceId(), prod.GetTraceId()) && bytes.Equal(cons.GetParentSpanId(), prod.GetSpanId())
		linked := false
		for _, l := range cons.GetLinks() {
			linked = linked || (bytes.Equal(l.GetTraceId(), prod.GetTraceId()) && bytes.Equal(l.GetSpanId(), prod.GetSpanId()))
		}
		if !child && !linked {
			t.Errorf("%s: consumer span %s (trace %s) neither a child of nor linked to producer span %s (trace %s)", c.how,
				hex.EncodeToString(cons.GetSpanId()), hex.EncodeToString(cons.GetTraceId()),
				hex.EncodeToString(prod.GetSpanId()), hex.EncodeToString(prod.GetTraceId()))
		}
		if got := spanAttr(tt.acquires[0].span, "semaphore.key"); got != "legacy-api" {
			t.Errorf("%s: semaphore.acquire key = %q, want legacy-api", c.how, got)
		}
		t.Logf("%s: producer %s %q -> consumer %s %q (child %t, linked %t) -> %d semaphore.acquire", c.how,
			hex.EncodeToString(prod.GetSpanId()), prod.GetName(), hex.EncodeToString(cons.GetSpanId()), cons.GetName(), child, linked, len(tt.acquires))
	}
	if err := w.terminate(20 * time.Second); err != nil {
		t.Errorf("worker stop: %v\n%s", err, w.Output())
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if len(col.errs) > 0 {
		t.Errorf("the collector could not decode %d exports: %v", len(col.errs), col.errs[0])
	}
}
