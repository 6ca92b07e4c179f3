package worker_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/worker"
)

// startWorkers runs n workers of one fleet on srv with tasksYAML, each of
// concurrency 4, serving typ with h, until the test ends.
func startWorkers(t *testing.T, srv *redistest.Server, n int, tasksYAML, typ string, h asynq.Handler) {
	t.Helper()
	cfg, err := worker.ParseConfig([]byte(fmt.Sprintf("redis:\n  url: %q\nworker:\n  concurrency: 4\n  shutdown_timeout: 3s\ntasks:\n%s", srv.URL(), tasksYAML)))
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		w, err := worker.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		w.Handle(typ, h)
		serve(t, w)
	}
}

// TestCostFromTakesSeats: on two workers, tasks take their payload's pages
// in seats of a cap of 4: the seats of the running tasks never exceed 4, a
// task of 4 pages enqueued early is overtaken by no more tasks than the
// fleet's slots, and every task runs once.
func TestCostFromTakesSeats(t *testing.T) {
	srv := redistest.Start(t)
	log := newSeatLog()
	startWorkers(t, srv, 2, `  print:
    semaphore: {key: printer, capacity: 4, cost_from: pages, standby: 2}
`, "print", log.handler(15*time.Millisecond))
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	const tasks, heavyAt = 40, 4
	for i := range tasks {
		pages := 1 + i%2
		if i == heavyAt {
			pages = 4
		}
		payload := fmt.Sprintf(`{"name":"t%d","pages":%d}`, i, pages)
		if _, err := client.Enqueue(asynq.NewTask("print", []byte(payload)), asynq.MaxRetry(20)); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Condition(t, 60*time.Second, "every task done", func() bool { return log.count() >= tasks })
	log.check(t, 4, tasks)
	log.mu.Lock()
	defer log.mu.Unlock()
	overtaken := 0
	for _, name := range log.started {
		if name == fmt.Sprintf("t%d", heavyAt) {
			break
		}
		var i int
		if _, err := fmt.Sscanf(name, "t%d", &i); err == nil && i > heavyAt {
			overtaken++
		}
	}
	t.Logf("peak %d of 4 seats; the 4-page task was overtaken by %d later tasks", log.peak, overtaken)
	if overtaken > 8 {
		t.Errorf("the 4-page task was overtaken by %d later tasks, want at most the fleet's 8 slots", overtaken)
	}
}

// TestBadCostIsArchived: a task whose payload gives no cost in 1..capacity
// (out of range, missing, not an integer) or whose fair_by it cannot
// render is archived with a message naming the field, and never runs.
func TestBadCostIsArchived(t *testing.T) {
	srv := redistest.Start(t)
	log := newSeatLog()
	startWorkers(t, srv, 1, `  print:
    semaphore: {key: printer, capacity: 4, cost_from: pages, fair_by: "{team}"}
`, "print", log.handler(time.Millisecond))
	conn := asynq.RedisClientOpt{Addr: srv.Addr()}
	client, insp := asynq.NewClient(conn), asynq.NewInspector(conn)
	t.Cleanup(func() { _ = client.Close(); _ = insp.Close() })
	want := map[string]string{
		`{"name":"big","pages":9,"team":"a"}`:    `payload field "pages" is 9, want an integer in 1..4`,
		`{"name":"none","team":"a"}`:             `payload field "pages" is missing`,
		`{"name":"text","pages":"2","team":"a"}`: `payload field "pages" is a string`,
		`{"name":"noteam","pages":2}`:            `payload field "team" is missing`,
	}
	for payload := range want {
		if _, err := client.Enqueue(asynq.NewTask("print", []byte(payload)), asynq.MaxRetry(5)); err != nil {
			t.Fatal(err)
		}
	}
	var archived []*asynq.TaskInfo
	waitfor.Condition(t, 30*time.Second, "every bad task archived", func() bool {
		var err error
		archived, err = insp.ListArchivedTasks("default")
		return err == nil && len(archived) == len(want)
	})
	for _, info := range archived {
		if msg := want[string(info.Payload)]; !strings.Contains(info.LastErr, msg) {
			t.Errorf("%s archived with %q, want it to say %q", info.Payload, info.LastErr, msg)
		}
	}
	if n := log.count(); n != 0 {
		t.Errorf("%d bad tasks ran", n)
	}
}
