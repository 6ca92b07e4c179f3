package monitoring

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/fleetcap/fleetcap/internal/taskspan"
)

// propagator writes and reads W3C traceparent/tracestate and baggage in
// task headers, whatever global propagator the process has.
var propagator = taskspan.Propagator

// SetupTracing builds the process's TracerProvider from the standard
// OpenTelemetry environment variables and installs it, with the W3C
// propagators, as the OTel globals (the semaphore's tracer defaults to
// them). The exporter comes from go.opentelemetry.io/contrib/exporters/autoexport,
// which reads the variables the standard way:
//
//   - OTEL_TRACES_EXPORTER: "otlp", "console" (JSON on stdout) or "none".
//     Unset, spans go to OTLP when OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, and nowhere otherwise
//     (autoexport alone would send them to localhost:4318).
//   - OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL: "http/protobuf" (default) or
//     "grpc"; the OTLP exporters read the other OTEL_EXPORTER_OTLP_*
//     variables (endpoint, headers, timeout, certificates) themselves.
//   - OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override serviceName;
//     OTEL_TRACES_SAMPLER[_ARG] pick the sampler; OTEL_BSP_* tune the
//     batching; OTEL_SDK_DISABLED=true turns tracing off.
//
// With no exporter it returns a no-op provider. Call shutdown at exit to
// flush buffered spans.
func SetupTracing(ctx context.Context, serviceName string) (tp trace.TracerProvider, shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagator)
	noShutdown := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") || !tracingConfigured() {
		return noop.NewTracerProvider(), noShutdown, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("monitoring: tracing: OTEL_TRACES_EXPORTER=%q, OTEL_EXPORTER_OTLP_PROTOCOL=%q, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=%q: %w",
			os.Getenv("OTEL_TRACES_EXPORTER"), os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return noop.NewTracerProvider(), noShutdown, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(serviceName)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, nil, fmt.Errorf("monitoring: tracing resource: %w", err)
	}
	sdk := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithBatcher(exp))
	otel.SetTracerProvider(sdk)
	return sdk, sdk.Shutdown, nil
}

// tracingConfigured reports whether the environment asks for spans: an
// exporter named, or an OTLP endpoint set.
func tracingConfigured() bool {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		if strings.TrimSpace(os.Getenv(k)) != "" {
			return true
		}
	}
	return false
}

// The attributes and tracer the producer and consumer spans share.
const (
	attrTaskType   = taskspan.AttrTaskType
	attrRetryCount = taskspan.AttrRetryCount
	attrMaxRetry   = taskspan.AttrMaxRetry
)

var messagingSystem = taskspan.MessagingSystem

func tracer(tp trace.TracerProvider) trace.Tracer { return taskspan.Tracer(tp) }

// InjectTask starts the producer span "asynq.enqueue <taskType>" and
// writes its W3C trace context (traceparent, tracestate, baggage) into
// headers, which must not be nil. Create the task with
// asynq.NewTaskWithHeaders(taskType, payload, headers, ...), enqueue it
// with the returned context, and finish the span with EndEnqueue. A nil tp
// means the global provider. (Package producer does this for you.)
//
//	headers := map[string]string{}
//	ctx, span := monitoring.InjectTask(ctx, tp, "report:fetch", payload, headers)
//	info, err := client.EnqueueContext(ctx, asynq.NewTaskWithHeaders("report:fetch", payload, headers))
//	monitoring.EndEnqueue(span, info, err)
func InjectTask(ctx context.Context, tp trace.TracerProvider, taskType string, payload []byte, headers map[string]string) (context.Context, trace.Span) {
	return taskspan.StartEnqueue(ctx, tp, taskType, payload, headers)
}

// EndEnqueue records the outcome of an enqueue on the span from InjectTask
// (task ID and queue, or the error) and ends it.
func EndEnqueue(span trace.Span, info *asynq.TaskInfo, err error) {
	taskspan.EndEnqueue(span, info, err)
}

// TracingOption tunes TracingMiddleware.
type TracingOption func(*tracingConfig)

type tracingConfig struct {
	isFailure func(error) bool
}

// WithIsFailure tells the middleware which handler errors are failures,
// like asynq's Config.IsFailure: an error for which fn returns false (such
// as "semaphore full, requeue") leaves the span's status unset and is
// recorded as an "asynq.requeue" event instead. Default: every error is a
// failure.
func WithIsFailure(fn func(error) bool) TracingOption {
	return func(c *tracingConfig) { c.isFailure = fn }
}

// TracingMiddleware returns asynq middleware that runs each task inside a
// CONSUMER span "asynq.process <type>". The span starts a new trace and
// links to the producer's span when the task's headers carry a
// traceparent (see InjectTask): a task that is retried or requeued many
// times gives one short trace per run, each linked to its enqueue. Baggage
// from the headers reaches the handler's context. The span carries the
// task ID, queue, retry count and max retry, and has status Error when the
// handler fails or panics (the panic goes on to asynq). Install it before
// the cap middleware so that the semaphore.acquire span is its child. A nil
// tp means the global provider.
func TracingMiddleware(tp trace.TracerProvider, opts ...TracingOption) asynq.MiddlewareFunc {
	cfg := tracingConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) (err error) {
			carrier := propagation.MapCarrier(t.Headers())
			producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
			ctx = propagation.Baggage{}.Extract(ctx, carrier)

			attrs := []attribute.KeyValue{
				messagingSystem,
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingOperationName("process"),
				semconv.MessagingMessageBodySize(len(t.Payload())),
				attrTaskType.String(t.Type()),
			}
			if id, ok := asynq.GetTaskID(ctx); ok {
				attrs = append(attrs, semconv.MessagingMessageID(id))
			}
			if q, ok := asynq.GetQueueName(ctx); ok {
				attrs = append(attrs, semconv.MessagingDestinationName(q))
			}
			if n, ok := asynq.GetRetryCount(ctx); ok {
				attrs = append(attrs, attrRetryCount.Int(n))
			}
			if n, ok := asynq.GetMaxRetry(ctx); ok {
				attrs = append(attrs, attrMaxRetry.Int(n))
			}
			startOpts := []trace.SpanStartOption{
				trace.WithSpanKind(trace.SpanKindConsumer),
				trace.WithNewRoot(),
				trace.WithAttributes(attrs...),
			}
			if producer.IsValid() {
				startOpts = append(startOpts, trace.WithLinks(trace.Link{SpanContext: producer}))
			}
			ctx, span := tracer(tp).Start(ctx, "asynq.process "+t.Type(), startOpts...)
			defer func() {
				if r := recover(); r != nil {
					span.SetStatus(codes.Error, fmt.Sprintf("panic: %v", r))
					span.End()
					panic(r)
				}
				switch {
				case err == nil:
				case cfg.isFailure != nil && !cfg.isFailure(err):
					span.AddEvent("asynq.requeue", trace.WithAttributes(attribute.String("reason", err.Error())))
				default:
					span.RecordError(err)
					span.SetStatus(codes.Error, err.Error())
				}
				span.End()
			}()
			return next.ProcessTask(ctx, t)
		})
	}
}
