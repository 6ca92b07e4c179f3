package worker_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/internal/snapshot"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
	"github.com/fleetcap/fleetcap/worker"
)

// layoutConfig declares a plain cap key (whose parked list layout 1 kept)
// and a template.
const layoutConfig = `
redis: {%s}
tasks:
  report:fetch:
    semaphore: {key: legacy-api, capacity: 5}
  webhook:deliver:
    semaphore: {key: "tenant:{tenant_id}", capacity: 2}
`

func layoutCfg(t *testing.T, redisYAML string) *worker.Config {
	t.Helper()
	cfg, err := worker.ParseConfig(fmt.Appendf(nil, layoutConfig, redisYAML))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// refusedStart wants New to refuse with a *worker.LayoutError that says
// every one of want, and to write nothing on rdb (nil: not checked).
func refusedStart(t *testing.T, cfg *worker.Config, rdb *redis.Client, want ...string) {
	t.Helper()
	var before string
	if rdb != nil {
		before = dump(t, rdb)
	}
	w, err := worker.New(cfg)
	if err == nil {
		w.Close()
		t.Fatal("worker.New started on another build's layout")
	}
	if !errors.As(err, new(*worker.LayoutError)) {
		t.Fatalf("worker.New: %v, want a *worker.LayoutError", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q does not say %q", err, s)
		}
	}
	if rdb != nil {
		if after := dump(t, rdb); after != before {
			t.Errorf("a refused start wrote:\n%s\nthen\n%s", before, after)
		}
	}
}

// dump is every key of rdb with its type, for "nothing was written".
func dump(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s %s; ", k, rdb.Type(ctx, k).Val())
	}
	h, _ := rdb.HGetAll(ctx, layout.Key).Result()
	fmt.Fprintf(&b, "record %v", h)
	return b.String()
}

// TestWorkerRefusesAnotherLayout: while a process of another build's
// layout is live on the Redis, a worker refuses to start with a message
// naming both layouts and what to do, and writes nothing.
func TestWorkerRefusesAnotherLayout(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	newer := layout.Version + 1
	other, err := layout.Claim(context.Background(), rdb, layout.Options{Role: "worker", Version: newer})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	refusedStart(t, layoutCfg(t, "url: "+strconv.Quote(srv.URL())), rdb,
		fmt.Sprintf("this build speaks Redis layout %d, but 1 process(es) of layout %d hold a live lease in fleetcap:layout (%s)", layout.Version, newer, other.Name()),
		fmt.Sprintf("stop every process of the layout-%d build, then start this one", newer))
}

// TestWorkerRefusesLayout1Lists: a worker refuses to start on the data of
// a build from before 46ae4d4 (a declared cap's parked key is a LIST),
// names the key and what to do, and leaves the list as it was.
func TestWorkerRefusesLayout1Lists(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	parked := "fleetcap:sem:{legacy-api}:parked"
	rdb.RPush(ctx, parked, "default\x00task-1")
	rdb.PExpire(ctx, parked, time.Minute)
	refusedStart(t, layoutCfg(t, "url: "+strconv.Quote(srv.URL())), rdb,
		fmt.Sprintf("this build speaks Redis layout %d, but %s is a LIST: data of layout 1", layout.Version, parked), "before 46ae4d4",
		"Stop every process of that build", "DEL "+parked)
}

// TestWorkerStartsOnceTheOtherLeaseLapsed: the lease of a killed process
// of an older layout holds a worker back until it lapses; then the worker
// starts, records its layout, and gives its own lease back at Close.
func TestWorkerStartsOnceTheOtherLeaseLapsed(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	lapses := now.Add(500 * time.Millisecond).UnixMilli()
	rdb.HSet(ctx, layout.Key, "version", "1", "process worker@old-host:7:killed", fmt.Sprintf("1 %d", lapses))
	cfg := layoutCfg(t, "url: "+strconv.Quote(srv.URL()))
	refusedStart(t, cfg, rdb, "worker@old-host:7:killed")
	var w *worker.Worker
	waitfor.Condition(t, 10*time.Second, "the worker starts once the old lease lapsed", func() bool {
		w, err = worker.New(cfg)
		if err != nil && !errors.As(err, new(*worker.LayoutError)) {
			t.Fatal(err)
		}
		return err == nil
	})
	if at, _ := rdb.Time(ctx).Result(); at.UnixMilli() < lapses {
		t.Errorf("started at %d, before the lease lapsed at %d", at.UnixMilli(), lapses)
	}
	rec := rdb.HGetAll(ctx, layout.Key).Val()
	if rec["version"] != strconv.Itoa(layout.Version) || len(rec) != 2 {
		t.Errorf("record = %v, want version %d and the new worker alone", rec, layout.Version)
	}
	w.Close()
	if rec := rdb.HGetAll(ctx, layout.Key).Val(); len(rec) != 1 {
		t.Errorf("after Close the record = %v, want the version alone", rec)
	}
}

// TestEmbeddedFileOfLayout1Refuses: the embedded Redis's file of an old
// build (a parked LIST) stops the worker with the message, and the file
// keeps its data.
func TestEmbeddedFileOfLayout1Refuses(t *testing.T) {
	t.Setenv(worker.EnvRedisURL, "")
	file := filepath.Join(t.TempDir(), "embedded.json")
	old := miniredis.NewMiniRedis()
	parked := "fleetcap:sem:{legacy-api}:parked"
	if _, err := old.RPush(parked, "default\x00task-1"); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.Save(old, file); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(redistest.FreePort(t))
	refusedStart(t, layoutCfg(t, fmt.Sprintf("embedded_addr: %q, embedded_file: %q", addr, file)), nil, parked+" is a LIST", "it has no TTL")
	again := miniredis.NewMiniRedis()
	if _, err := snapshot.Load(again, file); err != nil {
		t.Fatal(err)
	}
	if got, _ := again.List(parked); len(got) != 1 || again.Exists(layout.Key) {
		t.Errorf("the file after a refused start: list %q, record written %v", got, again.Exists(layout.Key))
	}
}
