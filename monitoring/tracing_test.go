package monitoring

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

func newRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

func spanNamed(rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

func attr(s sdktrace.ReadOnlySpan, key string) (string, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String(), true
		}
	}
	return "", false
}

// TestTracingLinksEnqueueToProcess sends a task through a real asynq
// server and checks that the consumer span links to the producer span.
func TestTracingLinksEnqueueToProcess(t *testing.T) {
	tp, rec := newRecorder(t)
	srv := redistest.Start(t)
	opt := asynq.RedisClientOpt{Addr: srv.Addr()}

	type seen struct {
		span trace.SpanContext
		bag  string
	}
	got := make(chan seen, 1)
	mux := asynq.NewServeMux()
	mux.Use(TracingMiddleware(tp))
	mux.HandleFunc("report:fetch", func(ctx context.Context, _ *asynq.Task) error {
		got <- seen{span: trace.SpanContextFromContext(ctx), bag: baggage.FromContext(ctx).Member("tenant").Value()}
		return nil
	})
	server := asynq.NewServer(opt, asynq.Config{Concurrency: 1, TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.ErrorLevel})
	if err := server.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.Shutdown)

	client := asynq.NewClient(opt)
	t.Cleanup(func() { _ = client.Close() })
	member, _ := baggage.NewMember("tenant", "acme")
	bag, _ := baggage.New(member)
	ctx := baggage.ContextWithBaggage(context.Background(), bag)

	payload := []byte(`{"tenant_id":"acme"}`)
	headers := map[string]string{}
	ctx, span := InjectTask(ctx, tp, "report:fetch", payload, headers)
	if !strings.HasPrefix(headers["traceparent"], "00-"+span.SpanContext().TraceID().String()) {
		t.Fatalf("traceparent = %q, want the producer's trace", headers["traceparent"])
	}
	info, err := client.EnqueueContext(ctx, asynq.NewTaskWithHeaders("report:fetch", payload, headers))
	EndEnqueue(span, info, err)
	if err != nil {
		t.Fatal(err)
	}

	var s seen
	select {
	case s = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("task not processed within 10s")
	}
	var consumer sdktrace.ReadOnlySpan
	waitfor.Condition(t, 5*time.Second, "the consumer span to end", func() bool {
		consumer = spanNamed(rec, "asynq.process report:fetch")
		return consumer != nil
	})
	producer := spanNamed(rec, "asynq.enqueue report:fetch")
	if producer == nil {
		t.Fatal("no producer span")
	}

	if producer.SpanKind() != trace.SpanKindProducer || consumer.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("kinds = %v, %v; want producer, consumer", producer.SpanKind(), consumer.SpanKind())
	}
	if links := consumer.Links(); len(links) != 1 || !links[0].SpanContext.Equal(producer.SpanContext().WithRemote(true)) {
		t.Fatalf("consumer links = %+v, want one link to the producer span %v", consumer.Links(), producer.SpanContext())
	}
	if consumer.Parent().IsValid() || consumer.SpanContext().TraceID() == producer.SpanContext().TraceID() {
		t.Errorf("consumer span should start a new trace (linked, not parented)")
	}
	if s.span.SpanID() != consumer.SpanContext().SpanID() {
		t.Errorf("handler context carries span %v, want the consumer span %v", s.span.SpanID(), consumer.SpanContext().SpanID())
	}
	if s.bag != "acme" {
		t.Errorf("baggage tenant in handler = %q, want acme", s.bag)
	}
	for _, c := range []struct {
		span      sdktrace.ReadOnlySpan
		key, want string
	}{
		{producer, "messaging.message.id", info.ID},
		{producer, "messaging.destination.name", "default"},
		{consumer, "messaging.message.id", info.ID},
		{consumer, "messaging.destination.name", "default"},
		{consumer, "messaging.system", "asynq"},
		{consumer, "asynq.task.type", "report:fetch"},
		{consumer, "asynq.task.retry_count", "0"},
	} {
		if v, ok := attr(c.span, c.key); !ok || v != c.want {
			t.Errorf("%s: %s = %q, want %q", c.span.Name(), c.key, v, c.want)
		}
	}
	if consumer.Status().Code != codes.Unset {
		t.Errorf("consumer status = %v, want unset", consumer.Status())
	}
}

func TestTracingMiddlewareStatus(t *testing.T) {
	errFull := errors.New("semaphore full")
	errBoom := errors.New("boom")
	for _, c := range []struct {
		name    string
		handler func() error
		want    codes.Code
		event   string
	}{
		{"ok", func() error { return nil }, codes.Unset, ""},
		{"error", func() error { return errBoom }, codes.Error, "exception"},
		{"not a failure", func() error { return errFull }, codes.Unset, "asynq.requeue"},
		{"panic", func() error { panic("kaput") }, codes.Error, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp, rec := newRecorder(t)
			mw := TracingMiddleware(tp, WithIsFailure(func(err error) bool { return !errors.Is(err, errFull) }))
			h := mw(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return c.handler() }))
			func() {
				defer func() { _ = recover() }()
				_ = h.ProcessTask(context.Background(), asynq.NewTask("t", nil))
			}()
			spans := rec.Ended()
			if len(spans) != 1 {
				t.Fatalf("spans = %d, want 1", len(spans))
			}
			s := spans[0]
			if s.Status().Code != c.want {
				t.Errorf("status = %v, want %v", s.Status(), c.want)
			}
			if len(s.Links()) != 0 {
				t.Errorf("links = %v, want none without a traceparent", s.Links())
			}
			if c.event != "" && (len(s.Events()) == 0 || s.Events()[0].Name != c.event) {
				t.Errorf("events = %v, want %s", s.Events(), c.event)
			}
		})
	}
}

// restoreOTelGlobals puts back the globals SetupTracing replaces.
func restoreOTelGlobals(t *testing.T) {
	tp, prop := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	t.Cleanup(func() { otel.SetTracerProvider(tp); otel.SetTextMapPropagator(prop) })
}

func clearOTelEnv(t *testing.T) {
	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		"OTEL_SERVICE_NAME", "OTEL_TRACES_SAMPLER"} {
		t.Setenv(k, "")
	}
}

func emitOne(t *testing.T, tp trace.TracerProvider, shutdown func(context.Context) error) {
	t.Helper()
	_, span := tp.Tracer("test").Start(context.Background(), "hello-span")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func TestSetupTracingNoExporter(t *testing.T) {
	for _, env := range [][2]string{{"OTEL_TRACES_EXPORTER", ""}, {"OTEL_TRACES_EXPORTER", "none"}, {"OTEL_SDK_DISABLED", "true"}} {
		t.Run(env[0]+"="+env[1], func(t *testing.T) {
			restoreOTelGlobals(t)
			clearOTelEnv(t)
			t.Setenv(env[0], env[1])
			if env[0] == "OTEL_SDK_DISABLED" {
				t.Setenv("OTEL_TRACES_EXPORTER", "console")
			}
			tp, shutdown, err := SetupTracing(context.Background(), "fleetcap-test")
			if err != nil {
				t.Fatal(err)
			}
			if _, span := tp.Tracer("x").Start(context.Background(), "s"); span.IsRecording() {
				t.Error("span is recording with no exporter configured")
			}
			if err := shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestSetupTracingRejectsUnknownExporter(t *testing.T) {
	restoreOTelGlobals(t)
	clearOTelEnv(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	if _, _, err := SetupTracing(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "zipkin") {
		t.Errorf("err = %v, want one naming zipkin", err)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if _, _, err := SetupTracing(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "http/json") {
		t.Errorf("err = %v, want one naming http/json", err)
	}
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp,console") // autoexport takes one exporter
	if _, _, err := SetupTracing(context.Background(), "x"); err == nil || !strings.Contains(err.Error(), "otlp,console") {
		t.Errorf("err = %v, want one naming otlp,console", err)
	}
}

// TestSetupTracingConsole runs itself again as a child process, whose
// stdout the console exporter (autoexport's, bound to the process's stdout
// at start) writes to.
func TestSetupTracingConsole(t *testing.T) {
	if os.Getenv("FLEETCAP_CONSOLE_CHILD") == "1" {
		tp, shutdown, err := SetupTracing(context.Background(), "fleetcap-test")
		if err != nil {
			t.Fatal(err)
		}
		if otel.GetTracerProvider() != tp {
			t.Error("SetupTracing did not install the provider globally")
		}
		emitOne(t, tp, shutdown)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSetupTracingConsole$", "-test.count=1")
	cmd.Env = append(os.Environ(), "FLEETCAP_CONSOLE_CHILD=1", "OTEL_TRACES_EXPORTER=console", "OTEL_SERVICE_NAME=from-env",
		"OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_SDK_DISABLED=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"Name":"hello-span"`) || !strings.Contains(string(out), "from-env") {
		t.Errorf("console output lacks the span or the env service name:\n%s", out)
	}
}

func TestSetupTracingOTLPHTTP(t *testing.T) {
	restoreOTelGlobals(t)
	clearOTelEnv(t)
	var posts atomic.Int32
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/traces" {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL) // OTEL_TRACES_EXPORTER unset: endpoint alone selects OTLP

	tp, shutdown, err := SetupTracing(context.Background(), "fleetcap-test")
	if err != nil {
		t.Fatal(err)
	}
	emitOne(t, tp, shutdown)
	if posts.Load() == 0 {
		t.Error("no OTLP/HTTP export reached the collector")
	}
}

type fakeTraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans int
}

func (f *fakeTraceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			f.spans += len(ss.GetSpans())
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func TestSetupTracingOTLPGRPC(t *testing.T) {
	restoreOTelGlobals(t)
	clearOTelEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	svc := &fakeTraceService{}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, svc)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://"+l.Addr().String())

	tp, shutdown, err := SetupTracing(context.Background(), "fleetcap-test")
	if err != nil {
		t.Fatal(err)
	}
	emitOne(t, tp, shutdown)
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if svc.spans != 1 {
		t.Errorf("gRPC collector got %d spans, want 1", svc.spans)
	}
}
