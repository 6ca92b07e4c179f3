package producer_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetcap/fleetcap/admission"
	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/fleetcap/fleetcap/tasks"
	"github.com/fleetcap/fleetcap/worker"
)

const testConfig = `
redis: {url: %q}
worker:
  queues: {default: 1, critical: 3}
tasks:
  report:fetch:
    max_retry: 3
    timeout: 2m
    semaphores: [{key: legacy-api, capacity: 5}, {key: "tenant:{tenant_id}", capacity: 2}]
  invoice:sync:
    queue: critical
    semaphore: {key: "account:{account_id}", capacity: 1}
  webhook:deliver:
    rate_limits: [{key: "hooks:{tenant_id}", rate: 10, per: 1s}]
`

// env is a private Redis, a producer on it, and what its spans recorded.
type env struct {
	srv   *redistest.Server
	p     *producer.Producer
	insp  *asynq.Inspector
	spans *tracetest.SpanRecorder
}

// demoValidators are the payload checks of the demo task types of package
// tasks, as cmd/enqueue registers them.
func demoValidators() []producer.Option {
	var opts []producer.Option
	for _, d := range tasks.All() {
		opts = append(opts, producer.WithValidator(d.Type, d.Validate))
	}
	return opts
}

func newEnv(t *testing.T, opts ...producer.Option) *env {
	t.Helper()
	srv := redistest.Start(t)
	cfg, err := config.ParseConfig(fmt.Appendf(nil, testConfig, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p, err := producer.New(cfg, append([]producer.Option{producer.WithTracerProvider(tp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = insp.Close() })
	return &env{srv: srv, p: p, insp: insp, spans: rec}
}

// newProducerOf is a producer of the config yaml, closed at the test's
// end.
func newProducerOf(t *testing.T, yaml []byte, opts ...producer.Option) *producer.Producer {
	t.Helper()
	cfg, err := config.ParseConfig(yaml)
	if err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func (e *env) task(t *testing.T, queue, id string) *asynq.TaskInfo {
	t.Helper()
	info, err := e.insp.GetTaskInfo(queue, id)
	if err != nil {
		t.Fatalf("GetTaskInfo(%s, %s): %v", queue, id, err)
	}
	return info
}

// keys is how many keys Redis holds.
func (e *env) keys(t *testing.T) int64 {
	t.Helper()
	n, err := e.srv.Client().DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const acme = `{"tenant_id":"acme"}`

// TestEnqueueAppliesConfigAndOptions: a task gets its type's configured
// queue, max_retry and timeout, and asynq options given to Enqueue win.
func TestEnqueueAppliesConfigAndOptions(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	info, err := e.p.Enqueue(ctx, tasks.TypeReportFetch, []byte(acme))
	if err != nil {
		t.Fatal(err)
	}
	got := e.task(t, "default", info.ID)
	if got.Type != tasks.TypeReportFetch || string(got.Payload) != acme || got.MaxRetry != 3 || got.Timeout != 2*time.Minute {
		t.Errorf("configured task = %+v", got)
	}

	info, err = e.p.Enqueue(ctx, tasks.TypeReportFetch, []byte(acme),
		asynq.Queue("critical"), asynq.MaxRetry(0), asynq.Timeout(30*time.Second), asynq.ProcessIn(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	got = e.task(t, "critical", info.ID)
	if got.MaxRetry != 0 || got.Timeout != 30*time.Second || got.State != asynq.TaskStateScheduled {
		t.Errorf("task with options = %+v", got)
	}

	// A declared type that sets no queue, max_retry or timeout gets the
	// defaults.
	hook := `{"tenant_id":"acme","url":"https://example.com/h","event":"invoice.paid"}`
	info, err = e.p.Enqueue(ctx, tasks.TypeWebhookDeliver, []byte(hook))
	if err != nil {
		t.Fatal(err)
	}
	if got := e.task(t, "default", info.ID); got.MaxRetry != config.DefaultMaxRetry || got.Timeout != config.DefaultTaskTimeout {
		t.Errorf("task of a type with no settings = %+v", got)
	}
}

// TestEnqueueStartsAProducerSpan: each enqueue makes a PRODUCER span, and
// the task's headers carry its traceparent.
func TestEnqueueStartsAProducerSpan(t *testing.T) {
	e := newEnv(t)
	info, err := e.p.Enqueue(context.Background(), tasks.TypeReportFetch, []byte(acme))
	if err != nil {
		t.Fatal(err)
	}
	spans := e.spans.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans ended, want 1", len(spans))
	}
	s := spans[0]
	if s.SpanKind() != trace.SpanKindProducer || s.Name() != "asynq.enqueue report:fetch" {
		t.Errorf("span %q of kind %v", s.Name(), s.SpanKind())
	}
	attrs := map[string]string{}
	for _, kv := range s.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["messaging.system"] != "asynq" || attrs["messaging.message.id"] != info.ID || attrs["messaging.destination.name"] != "default" {
		t.Errorf("span attributes = %v", attrs)
	}
	sc := s.SpanContext()
	want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
	if got := e.task(t, "default", info.ID).Headers["traceparent"]; got != want {
		t.Errorf("task header traceparent = %q, want %q", got, want)
	}
}

// TestBadInputEnqueuesNothing: every kind of bad input is an error naming
// the problem that matches ErrInvalid, from Enqueue, EnqueueAll, Check and
// CheckType alike, and Redis stays empty.
func TestBadInputEnqueuesNothing(t *testing.T) {
	e := newEnv(t, demoValidators()...)
	ctx := context.Background()
	for _, c := range []struct {
		name, typ, payload string
		opts               []asynq.Option
		want               string
	}{
		{"unknown type", "report:fetsh", acme, nil, `unknown task type "report:fetsh": the config declares invoice:sync, report:fetch, webhook:deliver`},
		{"malformed JSON", tasks.TypeReportFetch, `{"tenant_id":`, nil, "invalid report:fetch payload: malformed JSON"},
		{"rejected payload", tasks.TypeReportFetch, `{"tenant_id":""}`, nil, "invalid report:fetch payload: tenant_id: required"},
		{"empty payload", tasks.TypeReportFetch, ``, nil, "invalid report:fetch payload"},
		{"queue not served", tasks.TypeReportFetch, acme, []asynq.Option{asynq.Queue("bulk")}, `queue "bulk" is not served by the fleet (worker.queues: critical, default)`},
		{"nil option", tasks.TypeReportFetch, acme, []asynq.Option{nil}, "a nil asynq.Option"},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, producer.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: err = %v, want ErrInvalid and %q", what, err, c.want)
				}
			}
			info, err := e.p.Enqueue(ctx, c.typ, []byte(c.payload), c.opts...)
			if info != nil {
				t.Errorf("Enqueue returned a task: %+v", info)
			}
			check("Enqueue", err)
			check("Check", e.p.Check(c.typ, []byte(c.payload), c.opts...))
			n := 0
			for info, err := range e.p.EnqueueAll(ctx, c.typ, [][]byte{[]byte(acme), []byte(c.payload)}, c.opts...) {
				n++
				if info != nil {
					t.Errorf("EnqueueAll yielded a task: %+v", info)
				}
				check("EnqueueAll", err)
			}
			if n != 1 {
				t.Errorf("EnqueueAll yielded %d values, want 1", n)
			}
			if e.keys(t) != 0 {
				t.Errorf("Redis holds %d keys after bad input", e.keys(t))
			}
		})
	}
	if err := e.p.CheckType(tasks.TypeReportFetch, asynq.Queue("bulk")); !errors.Is(err, producer.ErrInvalid) {
		t.Errorf("CheckType with a queue not served: %v", err)
	}
	if err := e.p.CheckType(tasks.TypeReportFetch); err != nil {
		t.Errorf("CheckType: %v", err)
	}
}

// TestUnrenderableKeyIsRefused: a payload that a cap's key template cannot
// render (the worker could not cap it) is refused.
func TestUnrenderableKeyIsRefused(t *testing.T) {
	e := newEnv(t)
	_, err := e.p.Enqueue(context.Background(), "invoice:sync", []byte(`{"account":"a"}`))
	if !errors.Is(err, producer.ErrInvalid) || !strings.Contains(err.Error(), `semaphore key: key template "account:{account_id}": payload field "account_id" is missing`) {
		t.Errorf("err = %v", err)
	}
	if e.keys(t) != 0 {
		t.Errorf("Redis holds %d keys", e.keys(t))
	}
}

// TestUnrenderableRateKeyIsRefused: a payload that cannot render a rate
// limit's key is refused at enqueue, as the worker would archive it.
func TestUnrenderableRateKeyIsRefused(t *testing.T) {
	e := newEnv(t)
	_, err := e.p.Enqueue(context.Background(), tasks.TypeWebhookDeliver, []byte(`{"url":"https://example.com"}`))
	if !errors.Is(err, producer.ErrInvalid) || !strings.Contains(err.Error(), `rate limit key: key template "hooks:{tenant_id}": payload field "tenant_id" is missing`) {
		t.Errorf("err = %v", err)
	}
	if e.keys(t) != 0 {
		t.Errorf("Redis holds %d keys", e.keys(t))
	}
}

// TestEveryDeclaredTypeEnqueues: a task type of the user's own that the
// config declares is enqueued with its configured options, with no
// validator and though package tasks does not know it; a type the config
// does not declare is unknown, even one of package tasks.
func TestEveryDeclaredTypeEnqueues(t *testing.T) {
	srv := redistest.Start(t)
	p := newProducerOf(t, fmt.Appendf(nil, `
redis: {url: %q}
worker:
  queues: {default: 1, critical: 3}
tasks:
  invoice:sync:
    queue: critical
    max_retry: 2
    semaphore: {key: "account:{account_id}", capacity: 1}
  image:resize: {}
`, srv.URL()))
	ctx := context.Background()
	for _, c := range []struct{ typ, payload, queue string }{
		{"invoice:sync", `{"account_id":"a"}`, "critical"},
		{"image:resize", `not JSON: without a validator nothing checks it`, "default"},
	} {
		info, err := p.Enqueue(ctx, c.typ, []byte(c.payload))
		if err != nil {
			t.Errorf("Enqueue(%s): %v", c.typ, err)
			continue
		}
		if info.Type != c.typ || info.Queue != c.queue || string(info.Payload) != c.payload {
			t.Errorf("Enqueue(%s) = %+v", c.typ, info)
		}
	}
	for _, typ := range []string{tasks.TypeReportFetch, "invoice:synk"} {
		_, err := p.Enqueue(ctx, typ, []byte(acme))
		if !errors.Is(err, producer.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("unknown task type %q", typ)) {
			t.Errorf("Enqueue of the undeclared %s: err = %v, want ErrInvalid", typ, err)
		}
	}
}

// TestWithValidator: a validator adds a check to a declared type, whose
// verdict holds; a validator for a type the config does not declare, two
// for one type, and one with no type or function stop New with a message.
func TestWithValidator(t *testing.T) {
	errNoAmount := errors.New("invoice:sync: amount required")
	e := newEnv(t, producer.WithValidator("invoice:sync", func(b []byte) error {
		if !strings.Contains(string(b), "amount") {
			return errNoAmount
		}
		return nil
	}))
	ctx := context.Background()
	info, err := e.p.Enqueue(ctx, "invoice:sync", []byte(`{"account_id":"a","amount":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if info.Queue != "critical" {
		t.Errorf("queue = %q, want critical (configured)", info.Queue)
	}
	_, err = e.p.Enqueue(ctx, "invoice:sync", []byte(`{"account_id":"a"}`))
	if !errors.Is(err, producer.ErrInvalid) || !errors.Is(err, errNoAmount) {
		t.Errorf("rejected payload: err = %v", err)
	}
	accept := func([]byte) error { return nil }
	for _, c := range []struct {
		name string
		opts []producer.Option
		want string
	}{
		{"no type, no function", []producer.Option{producer.WithValidator("", nil)}, `WithValidator(""): want a task type and a validate function`},
		{"undeclared type", []producer.Option{producer.WithValidator("report:fetsh", accept)},
			`WithValidator("report:fetsh"): the config declares no task type "report:fetsh" (tasks: report:fetch)`},
		{"twice", []producer.Option{producer.WithValidator("report:fetch", accept), producer.WithValidator("report:fetch", accept)},
			`WithValidator("report:fetch") given twice`},
	} {
		if _, err := producer.New(exampleConfig(), c.opts...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.want)
		}
	}
}

// TestEnqueueAll: every payload is checked before the first is enqueued;
// then they go in order, a duplicate under asynq.Unique is yielded as an
// error the caller may pass over, and breaking out stops enqueueing.
func TestEnqueueAll(t *testing.T) {
	e := newEnv(t, demoValidators()...)
	ctx := context.Background()
	payloads := [][]byte{[]byte(`{"tenant_id":"a"}`), []byte(`{"tenant_id":""}`), []byte(`{"tenant_id":"c"}`), []byte(`{"x":1}`)}
	for _, err := range e.p.EnqueueAll(ctx, tasks.TypeReportFetch, payloads) {
		if !strings.Contains(fmt.Sprint(err), "2 of 4 payloads are invalid, nothing enqueued; the first: payload 2 of 4: invalid report:fetch payload: tenant_id: required") {
			t.Errorf("err = %v", err)
		}
	}
	if e.keys(t) != 0 {
		t.Fatalf("Redis holds %d keys after a bad batch", e.keys(t))
	}

	payloads = [][]byte{[]byte(`{"tenant_id":"a"}`), []byte(`{"tenant_id":"a"}`), []byte(`{"tenant_id":"b"}`)}
	var ids []string
	dups := 0
	for info, err := range e.p.EnqueueAll(ctx, tasks.TypeReportFetch, payloads, asynq.Unique(time.Minute)) {
		switch {
		case errors.Is(err, asynq.ErrDuplicateTask):
			dups++
		case err != nil:
			t.Fatal(err)
		default:
			ids = append(ids, info.ID)
		}
	}
	if len(ids) != 2 || dups != 1 {
		t.Fatalf("enqueued %q with %d duplicates, want 2 and 1", ids, dups)
	}
	for i, want := range []string{`{"tenant_id":"a"}`, `{"tenant_id":"b"}`} {
		if got := string(e.task(t, "default", ids[i]).Payload); got != want {
			t.Errorf("task %d payload %s, want %s", i, got, want)
		}
	}

	n := 0
	for range e.p.EnqueueAll(ctx, tasks.TypeReportFetch, [][]byte{[]byte(acme), []byte(acme), []byte(acme)}) {
		n++
		break
	}
	if size, err := e.insp.GetQueueInfo("default"); err != nil || size.Pending != 3 {
		t.Errorf("after a break at the first task: %d pending (%v), want 3", size.Pending, err)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for info, err := range e.p.EnqueueAll(cctx, tasks.TypeReportFetch, [][]byte{[]byte(acme)}) {
		if info != nil || !errors.Is(err, context.Canceled) {
			t.Errorf("with a cancelled context: %v, %v", info, err)
		}
	}
}

// TestNewRefusesBadConfig: a nil config and a config built in code with a
// bad field are errors naming the problem, not panics.
func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := producer.New(nil); err == nil {
		t.Error("New(nil): no error")
	}
	cfg := &config.Config{Tasks: map[string]config.TaskConfig{"report:fetch": {Semaphore: &config.CapConfig{Key: "legacy-api"}}}}
	if _, err := producer.New(cfg); err == nil || !strings.Contains(err.Error(), `tasks["report:fetch"].semaphore.capacity`) {
		t.Errorf("capacity 0: err = %v", err)
	}
	if _, err := producer.Open("/nonexistent/config.yaml"); err == nil || !strings.Contains(err.Error(), "/nonexistent/config.yaml") {
		t.Errorf("Open of a missing file: err = %v", err)
	}
}

// TestGateOpensOnceRedisIsBack: a capped Enqueue while Redis is down fails,
// and once Redis is back the next one works (the producer's first failure
// is not remembered).
func TestGateOpensOnceRedisIsBack(t *testing.T) {
	e := newEnv(t)
	e.srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := e.p.Enqueue(ctx, tasks.TypeReportFetch, []byte(acme)); err == nil {
		t.Fatal("Enqueue with Redis down: no error")
	}
	e.srv.StartAgain()
	info, err := e.p.Enqueue(context.Background(), tasks.TypeReportFetch, []byte(acme))
	if err != nil {
		t.Fatalf("Enqueue once Redis is back: %v", err)
	}
	if got := e.task(t, "default", info.ID); got.Type != tasks.TypeReportFetch {
		t.Errorf("enqueued %+v", got)
	}
}

// TestFailedEnqueueGivesItsPlacesBack: the places the producer kept for a
// task on its caps go back at once when asynq refuses the task (here, a
// duplicate of a unique task), instead of lapsing later; a task refused
// for the ID of another leaves that one's place alone. (Issue 19,
// defect 9.)
func TestFailedEnqueueGivesItsPlacesBack(t *testing.T) {
	srv := redistest.Start(t)
	p := newProducerOf(t, fmt.Appendf(nil, `redis: {url: %q}
tasks:
  job:
    semaphore: {key: scarce, capacity: 2}
`, srv.URL()), producer.WithValidator("job", func([]byte) error { return nil }))
	ctx := context.Background()
	if _, err := p.Enqueue(ctx, "job", []byte(`{}`), asynq.TaskID("one"), asynq.Unique(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Enqueue(ctx, "job", []byte(`{}`), asynq.Unique(time.Hour)); !errors.Is(err, asynq.ErrDuplicateTask) {
		t.Fatalf("a duplicate of a unique task: %v, want asynq.ErrDuplicateTask", err)
	}
	if _, err := p.Enqueue(ctx, "job", []byte(`{"other":1}`), asynq.TaskID("one")); !errors.Is(err, asynq.ErrTaskIDConflict) {
		t.Fatalf("a second task with the same ID: %v, want asynq.ErrTaskIDConflict", err)
	}
	places, err := srv.Client().ZCard(ctx, "fleetcap:sem:{scarce}:places").Result()
	if err != nil {
		t.Fatal(err)
	}
	if places != 1 {
		t.Fatalf("%d places kept on the cap after one task was enqueued and two refused; want 1", places)
	}
}

// TestProducerLinksOnlyWhatEnqueueingNeeds: package producer links asynq,
// go-redis, the OpenTelemetry API and the config, and nothing of the
// worker's world (SPEC §2.8): not package worker or monitoring, asynqmon,
// gorilla/mux, Prometheus, miniredis or the OTLP exporters, and not the
// demo types of package tasks; at most 330 packages in all.
func TestProducerLinksOnlyWhatEnqueueingNeeds(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/fleetcap/fleetcap/producer").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, dep := range deps {
		for _, banned := range []string{"github.com/fleetcap/fleetcap/worker", "github.com/fleetcap/fleetcap/monitoring",
			"github.com/fleetcap/fleetcap/tasks", "asynqmon", "gorilla/mux", "prometheus", "miniredis", "otlp"} {
			if strings.Contains(dep, banned) {
				t.Errorf("package producer links %s", dep)
			}
		}
	}
	if len(deps) > 330 {
		t.Errorf("package producer links %d packages, want at most 330", len(deps))
	}
	t.Logf("package producer links %d packages", len(deps))
}

// TestProducerRefusesAnotherLayout: while a process of another build's
// layout is live on the Redis, a producer's first capped enqueue (when it
// opens fleetcap's keys) fails with the message naming both layouts, and
// enqueues nothing; once that process is gone it works.
func TestProducerRefusesAnotherLayout(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	newer := layout.Version + 1
	other, err := layout.Claim(ctx, e.srv.Client(), layout.Options{Role: "worker", Version: newer})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Enqueue(ctx, tasks.TypeReportFetch, []byte(acme))
	if !errors.As(err, new(*worker.LayoutError)) || !strings.Contains(err.Error(),
		fmt.Sprintf("this build speaks Redis layout %d, but 1 process(es) of layout %d hold a live lease in fleetcap:layout (%s)", layout.Version, newer, other.Name())) {
		t.Fatalf("Enqueue: err = %v, want a *worker.LayoutError", err)
	}
	if qs, err := e.insp.Queues(); err != nil || len(qs) != 0 {
		t.Errorf("queues = %q, %v; want none", qs, err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = e.p.Enqueue(ctx, tasks.TypeReportFetch, []byte(acme))
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the data on this Redis is in layout %d", newer)) {
		t.Fatalf("Enqueue on layout %d's data: err = %v", newer, err)
	}
	e.srv.Client().Del(ctx, layout.Key)
	if _, err := e.p.Enqueue(ctx, tasks.TypeReportFetch, []byte(acme)); err != nil {
		t.Fatalf("Enqueue once layout %d is gone: %v", newer, err)
	}
}

// TestProducerReadsItsFleetsOverrides: a producer's gate reads the
// runtime overrides of its own fleet, <semaphore.prefix>control: a cap
// paused in fleet A makes A's producer enqueue a task to wait, while the
// producer of fleet B, whose prefix differs, on the same Redis, sends its
// task of the same key to its queue.
func TestProducerReadsItsFleetsOverrides(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	if err := srv.Client().HSet(ctx, "fleetA:control", "capacity:account:{account_id}", "0").Err(); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = insp.Close() })
	for prefix, want := range map[string]asynq.TaskState{"fleetA:": asynq.TaskStateScheduled, "fleetB:": asynq.TaskStatePending} {
		p := newProducerOf(t, fmt.Appendf(nil, testConfig+"semaphore: {prefix: %q}\n", srv.URL(), prefix))
		info, err := p.Enqueue(ctx, "invoice:sync", []byte(`{"account_id":"a1"}`))
		if err != nil {
			t.Fatalf("fleet %s: %v", prefix, err)
		}
		got, err := insp.GetTaskInfo(info.Queue, info.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != want {
			t.Errorf("fleet %s: the task is %s, want %s", prefix, got.State, want)
		}
	}
}

// boundedConfig declares a cap of one seat on which at most two tasks may
// wait, and a cap whose tasks take the seats their payload asks for.
const boundedConfig = `redis: {url: %q}
tasks:
  job:
    semaphore: {key: bounded, capacity: 1, max_waiting: 2}
  print:
    semaphore: {key: "printer:{site}", capacity: 4, cost_from: pages, capacity_overrides: {"printer:hq": 2}}
`

// TestMaxWaitingRefuses: with no worker taking tasks, a cap of one seat
// and max_waiting 2 lets two tasks wait (the first holds the standby place
// the default budget gives, the second is parked), then refuses the next
// with an error matching ErrFull and *admission.FullError, and enqueues
// nothing of it: no task in asynq, no place kept. Once the waiting tasks
// are gone, the next enqueue works. (SPEC §2.10.)
func TestMaxWaitingRefuses(t *testing.T) {
	srv := redistest.Start(t)
	p := newProducerOf(t, fmt.Appendf(nil, boundedConfig, srv.URL()))
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = insp.Close() })
	sem, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	ctx := context.Background()

	var ids []string
	var refused error
	for i := range 10 {
		info, err := p.Enqueue(ctx, "job", []byte(`{}`), asynq.TaskID(fmt.Sprintf("job-%d", i)))
		if err != nil {
			refused = err
			break
		}
		ids = append(ids, info.ID)
	}
	var fe *admission.FullError
	if !errors.Is(refused, producer.ErrFull) || !errors.As(refused, &fe) || errors.Is(refused, producer.ErrInvalid) {
		t.Fatalf("after %d tasks: err = %v, want ErrFull and an *admission.FullError", len(ids), refused)
	}
	if want := `producer: enqueue job: 2 tasks wait for semaphore "bounded", its max_waiting is 2`; refused.Error() != want {
		t.Errorf("err = %q\nwant %q", refused, want)
	}
	if fe.Key != "bounded" || fe.MaxWaiting != 2 || fe.Waiting != 2 {
		t.Errorf("FullError = %+v, want key bounded, 2 waiting of max_waiting 2", fe)
	}
	if len(ids) != 2 {
		t.Errorf("%d tasks enqueued before the refusal, want 2 (one standing by, one parked)", len(ids))
	}
	refusedID := fmt.Sprintf("job-%d", len(ids))
	if _, err := insp.GetTaskInfo("default", refusedID); !errors.Is(err, asynq.ErrTaskNotFound) {
		t.Errorf("the refused task %s: %v, want asynq.ErrTaskNotFound", refusedID, err)
	}
	if n := queuedTasks(t, insp); n != len(ids) {
		t.Errorf("asynq holds %d tasks, want the %d enqueued", n, len(ids))
	}
	if st, err := sem.RoomStats(ctx, "bounded"); err != nil || st.Waiting != len(ids) {
		t.Errorf("room stats %+v, %v: want %d waiting (nothing kept for the refused task)", st, err, len(ids))
	}

	// The waiting tasks go (deleted; a worker's audit dismisses their
	// tokens within a second, done here at once): the next one is taken.
	for _, id := range ids {
		if err := insp.DeleteTask("default", id); err != nil {
			t.Fatal(err)
		}
		if err := sem.Dismiss(ctx, "bounded", admission.Token{Queue: "default", ID: id}.String()); err != nil {
			t.Fatal(err)
		}
	}
	info, err := p.Enqueue(ctx, "job", []byte(`{}`), asynq.TaskID(refusedID))
	if err != nil {
		t.Fatalf("Enqueue once nothing waits: %v", err)
	}
	if got, err := insp.GetTaskInfo("default", info.ID); err != nil || got.State != asynq.TaskStatePending {
		t.Errorf("task %+v, %v: want it pending", got, err)
	}
}

// queuedTasks counts the tasks of the default queue, pending or
// scheduled.
func queuedTasks(t *testing.T, insp *asynq.Inspector) int {
	t.Helper()
	qi, err := insp.GetQueueInfo("default")
	if err != nil {
		t.Fatal(err)
	}
	return qi.Pending + qi.Scheduled
}

// TestCostOutOfRangeIsInvalid: a payload whose cost_from value is missing,
// not an integer, or outside 1..the key's configured capacity is refused
// as ErrInvalid and enqueues nothing; one in range is enqueued.
func TestCostOutOfRangeIsInvalid(t *testing.T) {
	srv := redistest.Start(t)
	p := newProducerOf(t, fmt.Appendf(nil, boundedConfig, srv.URL()))
	ctx := context.Background()
	for _, c := range []struct{ payload, want string }{
		{`{"site":"lab","pages":5}`, `semaphore "printer:lab": cost_from: payload field "pages" is 5, want an integer in 1..4 (the capacity)`},
		{`{"site":"hq","pages":3}`, `semaphore "printer:hq": cost_from: payload field "pages" is 3, want an integer in 1..2 (the capacity)`},
		{`{"site":"lab","pages":0}`, `payload field "pages" is 0, want an integer in 1..4`},
		{`{"site":"lab","pages":1.5}`, `payload field "pages" is 1.5, want an integer in 1..4`},
		{`{"site":"lab"}`, `semaphore "printer:lab": cost_from: payload field "pages" is missing`},
	} {
		_, err := p.Enqueue(ctx, "print", []byte(c.payload))
		if !errors.Is(err, producer.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrInvalid and %q", c.payload, err, c.want)
		}
		if err := p.Check("print", []byte(c.payload)); !errors.Is(err, producer.ErrInvalid) {
			t.Errorf("Check(%s) = %v, want ErrInvalid", c.payload, err)
		}
	}
	if n, err := srv.Client().DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("Redis holds %d keys (%v) after bad input, want none", n, err)
	}
	if _, err := p.Enqueue(ctx, "print", []byte(`{"site":"lab","pages":4}`)); err != nil {
		t.Errorf("a cost of the whole capacity: %v", err)
	}
}

// TestBacklogAsksAFullCapOnce: enqueueing a backlog behind a full cap asks
// the cap for a place once, not once a task: the first task refused a
// place tells the producer that the cap is full, and the next ones (within
// a second) are parked without asking, in arrival order. Each enqueue is
// then two script calls (asynq's schedule and the park), not three.
// (TestParkedWithoutAskingRunsWhenTheCapIsFree, in the root package, has
// a worker free the cap meanwhile.)
func TestBacklogAsksAFullCapOnce(t *testing.T) {
	srv := redistest.Start(t)
	p := newProducerOf(t, fmt.Appendf(nil, `redis: {url: %q}
worker: {parked_retry: 1m}
tasks:
  job:
    semaphore: {key: once, capacity: 1, standby: 0}
`, srv.URL()))
	sem, err := semaphore.New(srv.Client(), semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	ctx := context.Background()
	if _, err := p.Enqueue(ctx, "job", []byte(`{}`)); err != nil { // takes the free seat's place
		t.Fatal(err)
	}
	evalshas := func() int {
		t.Helper()
		return redistest.CommandCalls(t, srv.Client())["evalsha"]
	}
	const backlog = 10
	before := evalshas()
	for i := range backlog {
		if _, err := p.Enqueue(ctx, "job", []byte(`{}`), asynq.TaskID(fmt.Sprintf("wait-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// One Reserve, then a schedule and a park a task; two more script
	// calls of slack: the producer's layout lease renews with one every
	// 10 s, and a script the server did not know is counted once more.
	// (Asking for a place a task, it is 30.)
	if calls, most := evalshas()-before, 1+2*backlog+2; calls > most {
		t.Errorf("%d script calls to enqueue %d tasks behind a full cap, want at most %d: the cap asked once", calls, backlog, most)
	}
	st, err := sem.RoomStats(ctx, "once")
	if err != nil || st.Parked != backlog {
		t.Fatalf("room %+v, %v: want the %d tasks parked", st, err, backlog)
	}
}
