package fleetcap_test

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/producer"
	"github.com/fleetcap/fleetcap/worker"
)

// startWorkers runs n Workers of the config yaml in this process until the
// test ends, each with the handlers and middleware, and returns them.
func startWorkers(t *testing.T, n int, yaml string, handlers map[string]asynq.HandlerFunc, mws ...asynq.MiddlewareFunc) []*worker.Worker {
	t.Helper()
	return startWorkersWith(t, n, yaml, handlers, nil, mws...)
}

// startWorkersWith is startWorkers with options for worker.New.
func startWorkersWith(t *testing.T, n int, yaml string, handlers map[string]asynq.HandlerFunc, opts []worker.Option, mws ...asynq.MiddlewareFunc) []*worker.Worker {
	t.Helper()
	var ws []*worker.Worker
	for i := range n {
		cfg, err := worker.ParseConfig([]byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		w, err := worker.New(cfg, opts...)
		if err != nil {
			t.Fatal(err)
		}
		w.Use(mws...)
		for typ, h := range handlers {
			w.HandleFunc(typ, h)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("worker %d: %v", i, err)
			}
		})
		ws = append(ws, w)
	}
	return ws
}

// newProducer is a producer of the config yaml that takes any payload of
// the given task types.
func newProducer(t *testing.T, yaml string, types ...string) *producer.Producer {
	t.Helper()
	cfg, err := worker.ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	var opts []producer.Option
	for _, typ := range types {
		opts = append(opts, producer.WithValidator(typ, func([]byte) error { return nil }))
	}
	p, err := producer.New(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// startLog records when tasks start, how many run at once (the most ever
// seen), and which ran how often.
type startLog struct {
	mu      sync.Mutex
	starts  map[string][]time.Time // by group (a tenant, or "")
	runs    map[string]int
	running atomic.Int64
	most    atomic.Int64
}

func newStartLog() *startLog {
	return &startLog{starts: map[string][]time.Time{}, runs: map[string]int{}}
}

// handler runs for d, recording its start under group(payload).
func (l *startLog) handler(d time.Duration, group func(payload []byte) string) asynq.HandlerFunc {
	return func(ctx context.Context, task *asynq.Task) error {
		now := time.Now()
		n := l.running.Add(1)
		for m := l.most.Load(); n > m && !l.most.CompareAndSwap(m, n); m = l.most.Load() {
		}
		id, _ := asynq.GetTaskID(ctx)
		l.mu.Lock()
		g := ""
		if group != nil {
			g = group(task.Payload())
		}
		l.starts[g] = append(l.starts[g], now)
		l.runs[id]++
		l.mu.Unlock()
		time.Sleep(d)
		l.running.Add(-1)
		return nil
	}
}

// done counts the tasks that ran.
func (l *startLog) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}

// ranTwice lists the tasks that ran more than once.
func (l *startLog) ranTwice() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ids []string
	for id, n := range l.runs {
		if n > 1 {
			ids = append(ids, id)
		}
	}
	return ids
}

// startsOf returns the start times of group, sorted.
func (l *startLog) startsOf(group string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := append([]time.Time(nil), l.starts[group]...)
	sort.Slice(s, func(i, j int) bool { return s[i].Before(s[j]) })
	return s
}

// mostInWindow is the most starts in any window of length per.
func mostInWindow(starts []time.Time, per time.Duration) int {
	most, j := 0, 0
	for i := range starts {
		for starts[i].Sub(starts[j]) >= per {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// rateOver is the starts per second after the first burst of them, from
// the first start after it to the last.
func rateOver(starts []time.Time, burst int) float64 {
	if len(starts) <= burst+1 {
		return 0
	}
	s := starts[burst:]
	return float64(len(s)-1) / s[len(s)-1].Sub(s[0]).Seconds()
}
