// Package taskspan is the tracing that travels with an asynq task: the
// producer span of its enqueue, whose W3C trace context is written into the
// task's headers, and the attributes its consumer span (monitoring's
// TracingMiddleware) shares with it. It needs only the OpenTelemetry API,
// so that a service that only enqueues (package producer) links nothing
// of the SDK or its exporters.
package taskspan

import (
	"context"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the task spans.
const TracerName = "github.com/fleetcap/fleetcap/monitoring"

// Propagator writes and reads W3C traceparent/tracestate and baggage in
// task headers, whatever global propagator the process has.
var Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Attributes of the asynq spans, beside the messaging.* conventions.
const (
	AttrTaskType   = attribute.Key("asynq.task.type")
	AttrRetryCount = attribute.Key("asynq.task.retry_count")
	AttrMaxRetry   = attribute.Key("asynq.task.max_retry")
)

// MessagingSystem is the messaging.system of the task spans.
var MessagingSystem = semconv.MessagingSystemKey.String("asynq")

// Tracer is the tracer of the task spans of tp; nil means the global
// provider.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(TracerName)
}

// StartEnqueue starts the producer span "asynq.enqueue <taskType>" and
// writes its W3C trace context (traceparent, tracestate, baggage) into
// headers, when not nil. Create the task with asynq.NewTaskWithHeaders,
// enqueue it with the returned context, and finish the span with
// EndEnqueue.
func StartEnqueue(ctx context.Context, tp trace.TracerProvider, taskType string, payload []byte, headers map[string]string) (context.Context, trace.Span) {
	ctx, span := Tracer(tp).Start(ctx, "asynq.enqueue "+taskType,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(
			MessagingSystem,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("enqueue"),
			semconv.MessagingMessageBodySize(len(payload)),
			AttrTaskType.String(taskType),
		))
	if headers != nil {
		Propagator.Inject(ctx, propagation.MapCarrier(headers))
	}
	return ctx, span
}

// EndEnqueue records the outcome of an enqueue on the span from
// StartEnqueue (task ID and queue, or the error) and ends it.
func EndEnqueue(span trace.Span, info *asynq.TaskInfo, err error) {
	if info != nil {
		span.SetAttributes(semconv.MessagingMessageID(info.ID), semconv.MessagingDestinationName(info.Queue))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
