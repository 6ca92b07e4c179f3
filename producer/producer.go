// Package producer enqueues fleetcap's task types from Go services. Every
// task type the fleet's config declares (its tasks section) can be
// enqueued, and no other. The producer checks each payload as the workers
// will (every key template of its caps and rate limits, and the validator
// given for its type with WithValidator, if any), applies the task type's
// configured queue, max_retry and timeout, and wraps each enqueue in a
// producer span whose W3C trace context travels in the task's headers, so
// that the worker's span of the task links to it.
//
// The package knows no task type of its own: the demo types of package
// tasks are not built in (cmd/enqueue registers their validators itself).
package producer

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetcap/fleetcap/admission"
	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/taskspan"
)

// ErrInvalid matches (errors.Is) every error about a task the fleet would
// not run: a task type the config does not declare, a payload its
// validator rejects, a semaphore key, fair_by value or cost (cost,
// cost_from: 1..capacity) the payload cannot give, a queue no worker
// serves. Nothing was enqueued when it is returned.
var ErrInvalid = errors.New("producer: invalid task")

// ErrFull matches (errors.Is) the error of an Enqueue refused because a cap
// of the task has no place for it and its key already has the cap's
// max_waiting tasks waiting, fleet-wide (SPEC §2.10); errors.As finds the
// *admission.FullError that names the key. Nothing was enqueued and no
// place is kept for the task; it may be enqueued again once fewer wait.
// The bound is checked, not reserved: producers enqueueing at the same
// moment may overshoot it by their number.
var ErrFull = errors.New("producer: the cap's max_waiting is reached")

// invalid marks err as bad input: it matches ErrInvalid and still err.
func invalid(err error) error { return markedError{ErrInvalid, err} }

// markedError is err that also matches the sentinel mark.
type markedError struct{ mark, err error }

func (e markedError) Error() string   { return e.err.Error() }
func (e markedError) Unwrap() []error { return []error{e.mark, e.err} }

// Option tunes New and Open.
type Option func(*options)

type options struct {
	tp         trace.TracerProvider
	validators []validator // in the order given
}

// validator is one WithValidator.
type validator struct {
	taskType string
	validate func(payload []byte) error
}

// WithTracerProvider sets where the producer spans go; default the global
// provider (otel.GetTracerProvider()).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tp = tp }
}

// WithValidator adds a payload check to a task type the config declares:
// validate returns an error for a payload the type's handler would reject,
// and Enqueue then refuses it (ErrInvalid). It does not make a type known:
// every declared type can be enqueued, with or without a validator. New
// refuses a validator for a type the config does not declare (it could
// never run: a misspelt type, or a config that lacks it), and two
// validators for one type.
func WithValidator(taskType string, validate func(payload []byte) error) Option {
	return func(o *options) { o.validators = append(o.validators, validator{taskType, validate}) }
}

// Producer enqueues tasks for a fleetcap fleet. It is safe for concurrent
// use. Create it with New or Open; Close it when done.
type Producer struct {
	cfg        *config.Config
	client     *asynq.Client
	gate       *admission.Gate
	tp         trace.TracerProvider
	validators map[string]func(payload []byte) error
}

// Open loads the fleet's config file (as config.LoadConfig does, with its
// environment overrides) and returns a Producer for it.
func Open(configPath string, opts ...Option) (*Producer, error) {
	cfg, err := config.LoadConfig(configPath)
	if err != nil {
		return nil, err
	}
	return New(cfg, opts...)
}

// New returns a Producer for the fleet that cfg describes: its Redis, its
// queues and its task types. A Config built in code gets its defaults and
// is checked here (see config.Config.Validate). New does no I/O; Ping
// checks that Redis answers.
func New(cfg *config.Config, opts ...Option) (*Producer, error) {
	if cfg == nil {
		return nil, errors.New("producer: New: nil config")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("producer: config: %w", err)
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	validators, err := validatorsOf(cfg, o.validators)
	if err != nil {
		return nil, err
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	connOpt, err := cfg.Redis.AsynqConnOpt()
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	gate, err := admission.NewGate(cfg, nil)
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	return &Producer{cfg: cfg, client: asynq.NewClient(connOpt), gate: gate, tp: o.tp, validators: validators}, nil
}

// validatorsOf checks the WithValidator options against the config and
// maps each task type to its validator.
func validatorsOf(cfg *config.Config, given []validator) (map[string]func([]byte) error, error) {
	out := make(map[string]func([]byte) error, len(given))
	for _, v := range given {
		switch _, declared := cfg.Tasks[v.taskType]; {
		case v.taskType == "" || v.validate == nil:
			return nil, fmt.Errorf("producer: WithValidator(%q): want a task type and a validate function", v.taskType)
		case !declared:
			return nil, fmt.Errorf("producer: WithValidator(%q): the config declares no task type %q (tasks: %s); declare it there, or drop the validator",
				v.taskType, v.taskType, declaredTypes(cfg))
		case out[v.taskType] != nil:
			return nil, fmt.Errorf("producer: WithValidator(%q) given twice; combine the checks in one function", v.taskType)
		}
		out[v.taskType] = v.validate
	}
	return out, nil
}

// declaredTypes lists the config's task types for a message.
func declaredTypes(cfg *config.Config) string {
	if len(cfg.Tasks) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(cfg.Tasks)), ", ")
}

// Close closes the connections to Redis.
func (p *Producer) Close() error { return errors.Join(p.client.Close(), p.gate.Close()) }

// Ping checks that Redis answers.
func (p *Producer) Ping() error { return p.client.Ping() }

// CheckType reports whether tasks of this type can be enqueued with these
// options (a type the config declares, a queue the fleet serves), without enqueueing
// any; its errors match ErrInvalid.
func (p *Producer) CheckType(taskType string, opts ...asynq.Option) error {
	_, err := p.plan(taskType, opts)
	return err
}

// Check reports whether a task of this type and payload would be enqueued
// with these options, without enqueueing it; its errors match ErrInvalid.
func (p *Producer) Check(taskType string, payload []byte, opts ...asynq.Option) error {
	pl, err := p.plan(taskType, opts)
	if err != nil {
		return err
	}
	return pl.check(payload)
}

// Enqueue checks the payload, then enqueues a task of taskType with the
// type's configured queue, max_retry and timeout, overridden by opts (such
// as asynq.Queue, asynq.MaxRetry, asynq.Timeout, asynq.ProcessIn or
// asynq.Unique). It starts a producer span and carries its traceparent in
// the task's headers. Bad input returns an error matching ErrInvalid and
// enqueues nothing; asynq's errors (asynq.ErrDuplicateTask, ...) are
// wrapped. A task refused for its cap's max_waiting returns an error
// matching ErrFull and enqueues nothing. The first capped task opens fleetcap's keys in Redis: on a
// Redis of another build's layout it fails with a *admission.LayoutError (worker.LayoutError)
// that says what to do, and so does every later one until that is done.
func (p *Producer) Enqueue(ctx context.Context, taskType string, payload []byte, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	pl, err := p.plan(taskType, opts)
	if err != nil {
		return nil, err
	}
	if err := pl.check(payload); err != nil {
		return nil, err
	}
	return p.send(ctx, pl, payload)
}

// EnqueueAll checks every payload first and enqueues nothing unless all
// pass: then the one value it yields is (nil, err) with err matching
// ErrInvalid. Otherwise it enqueues the payloads in order as Enqueue does,
// yielding each task's info or its error (a duplicate under asynq.Unique
// yields an error matching asynq.ErrDuplicateTask); the caller may go on
// after an error, and stops enqueueing by breaking out of the loop. Once
// ctx is done it yields ctx's error and stops.
func (p *Producer) EnqueueAll(ctx context.Context, taskType string, payloads [][]byte, opts ...asynq.Option) iter.Seq2[*asynq.TaskInfo, error] {
	return func(yield func(*asynq.TaskInfo, error) bool) {
		pl, err := p.plan(taskType, opts)
		if err == nil {
			err = pl.checkAll(payloads)
		}
		if err != nil {
			yield(nil, err)
			return
		}
		for _, payload := range payloads {
			if err := ctx.Err(); err != nil {
				yield(nil, fmt.Errorf("producer: %w", err))
				return
			}
			if !yield(p.send(ctx, pl, payload)) {
				return
			}
		}
	}
}

// send enqueues one checked payload inside a producer span.
func (p *Producer) send(ctx context.Context, pl *plan, payload []byte) (*asynq.TaskInfo, error) {
	headers := map[string]string{}
	ctx, span := taskspan.StartEnqueue(ctx, p.tp, pl.taskType, payload, headers)
	info, err := p.enqueue(ctx, pl, payload, headers)
	taskspan.EndEnqueue(span, info, err)
	if err != nil {
		return nil, fmt.Errorf("producer: enqueue %s: %w", pl.taskType, err)
	}
	return info, nil
}

// enqueue puts one checked task into Redis: in its queue, or, when a cap of
// its type has no place for it or a rate limit of its type is busy, in that
// limit's waiting room, so that no worker takes it while the cap is full or
// before its tokens are due (see admission.Gate). A task given a
// time to run (asynq.ProcessIn, ProcessAt) or a group goes as asked.
func (p *Producer) enqueue(ctx context.Context, pl *plan, payload []byte, headers map[string]string) (*asynq.TaskInfo, error) {
	opts := pl.opts
	if !p.gate.Routes(pl.taskType) || !routable(opts) {
		return p.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(pl.taskType, payload, headers), opts...)
	}
	id := taskIDOf(opts)
	fresh := id == ""
	if fresh {
		id = uuid.NewString()
		opts = append(slices.Clip(opts), asynq.TaskID(id))
	}
	route, err := p.gate.Route(ctx, pl.taskType, payload, pl.queue, id, fresh)
	if fe := (*admission.FullError)(nil); errors.As(err, &fe) {
		return nil, markedError{ErrFull, err}
	}
	if err != nil {
		return nil, err
	}
	if route.Waits() {
		opts = append(slices.Clip(opts), route.Options()...)
		name, value := route.Header()
		headers[name] = value
	}
	info, err := p.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(pl.taskType, payload, headers), opts...)
	if err != nil {
		if errors.Is(err, asynq.ErrTaskIDConflict) {
			return nil, err // the places are those of the task that has this ID
		}
		if gerr := route.GiveBack(context.WithoutCancel(ctx)); gerr != nil {
			slog.Warn("producer: give back the places kept for a task that was not enqueued (they lapse by themselves)", "id", id, "err", gerr)
		}
		return nil, err
	}
	if route.Waits() {
		if err := route.Park(ctx); err != nil {
			// It is enqueued all the same: it comes back by itself after
			// worker.parked_retry.
			slog.Warn("producer: park a task that waits in a limit's room (it comes back by itself, after worker.parked_retry)", "id", id, "err", err)
		}
	}
	return info, nil
}

// routable reports whether a task with these options may wait in a room:
// not one scheduled or grouped by its caller.
func routable(opts []asynq.Option) bool {
	for _, o := range opts {
		switch o.Type() {
		case asynq.ProcessAtOpt, asynq.ProcessInOpt, asynq.GroupOpt:
			return false
		}
	}
	return true
}

// taskIDOf is the task ID the options ask for, "" for none.
func taskIDOf(opts []asynq.Option) string {
	id := ""
	for _, o := range opts {
		if o.Type() == asynq.TaskIDOpt {
			id, _ = o.Value().(string)
		}
	}
	return id
}

// plan is what enqueueing a task type takes: its checks and its options.
type plan struct {
	taskType string
	queue    string
	validate func(payload []byte) error // nil: none
	caps     []config.CapConfig
	rates    []config.RateLimitConfig
	opts     []asynq.Option
}

// plan resolves a task type and the caller's options against the config.
func (p *Producer) plan(taskType string, opts []asynq.Option) (*plan, error) {
	tc, declared := p.cfg.Tasks[taskType]
	if !declared {
		return nil, invalid(fmt.Errorf("unknown task type %q: the config declares %s", taskType, declaredTypes(p.cfg)))
	}
	queue, maxRetry, timeout := tc.Queue, *tc.MaxRetry, tc.Timeout
	for _, o := range opts {
		if o == nil {
			return nil, invalid(errors.New("a nil asynq.Option"))
		}
		if o.Type() == asynq.QueueOpt {
			queue, _ = o.Value().(string)
		}
	}
	if _, ok := p.cfg.Worker.Queues[queue]; !ok {
		return nil, invalid(fmt.Errorf("queue %q is not served by the fleet (worker.queues: %s)",
			queue, strings.Join(slices.Sorted(maps.Keys(p.cfg.Worker.Queues)), ", ")))
	}
	return &plan{
		taskType: taskType,
		queue:    queue,
		validate: p.validators[taskType],
		caps:     tc.Caps(),
		rates:    tc.RateLimits,
		opts:     append([]asynq.Option{asynq.Queue(queue), asynq.MaxRetry(maxRetry), asynq.Timeout(timeout)}, opts...),
	}, nil
}

// check validates one payload: the task type's validator, if it has one,
// then every key of its caps and rate limits, and the fair share value and
// cost of its caps, so that no task the worker could not cap or limit is
// enqueued.
func (pl *plan) check(payload []byte) error {
	if pl.validate != nil {
		if err := pl.validate(payload); err != nil {
			return invalid(err)
		}
	}
	for _, c := range pl.caps {
		key, err := c.RenderKey(payload)
		if err != nil {
			return invalid(fmt.Errorf("semaphore key: %w", err))
		}
		if _, err := c.CostOf(payload, c.CapacityFor(key)); err != nil {
			return invalid(fmt.Errorf("semaphore %q: %w", key, err))
		}
		if _, err := c.FairValue(payload); err != nil {
			return invalid(fmt.Errorf("semaphore %q: %w", key, err))
		}
	}
	for _, r := range pl.rates {
		if _, err := r.RenderKey(payload); err != nil {
			return invalid(fmt.Errorf("rate limit key: %w", err))
		}
	}
	return nil
}

// checkAll validates every payload and names the first bad one.
func (pl *plan) checkAll(payloads [][]byte) error {
	var first error
	bad := 0
	for i, payload := range payloads {
		if err := pl.check(payload); err != nil {
			if bad++; first == nil {
				first = fmt.Errorf("payload %d of %d: %w", i+1, len(payloads), err)
			}
		}
	}
	switch {
	case bad > 1:
		return invalid(fmt.Errorf("%d of %d payloads are invalid, nothing enqueued; the first: %w", bad, len(payloads), first))
	case bad == 1:
		return invalid(fmt.Errorf("nothing enqueued: %w", first))
	}
	return nil
}
