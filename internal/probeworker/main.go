// Command probeworker is a fleetcap worker for the fleet tests and the
// benchmarks: it serves one task type, "probe", under the caps of its
// config, and counts in Redis, independently of the semaphore, how many
// probes run at once (overall and per tenant), when the first started and
// the last ended, and which finished.
//
//	probeworker --config fleet.yaml [--counters redis://127.0.0.1:6379] [--prefix probe]
//
// Counters (all under the prefix's hash tag):
//
//	{P}:inflight, {P}:max            probes running now, and the most at once
//	{P}:inflight:<tenant>, {P}:tmax  the same per tenant (tmax is a hash)
//	{P}:first, {P}:last              Unix ms of the first start and last end
//	{P}:done                         a set of finished task IDs
//	{P}:runs                         how many runs finished (duplicates count)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/worker"
)

// TypeProbe is the probe task type.
const TypeProbe = "probe"

// Payload is a probe's payload.
type Payload struct {
	MS     int    `json:"ms"`               // how long the probe holds its seat
	Tenant string `json:"tenant,omitempty"` // counted per tenant when set
	Fail   bool   `json:"fail,omitempty"`   // fail (once per task) to exercise retries
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "probeworker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	configPath := flag.String("config", "config.yaml", "config file")
	counters := flag.String("counters", "", "redis:// URL of the counters' Redis; default the worker's")
	prefix := flag.String("prefix", "probe", "counter key prefix")
	flag.Parse()
	cfg, err := worker.LoadConfig(*configPath)
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	w, err := worker.New(cfg, worker.WithLogger(logger))
	if err != nil {
		return err
	}
	var crdb redis.UniversalClient
	if *counters != "" {
		opt, err := redis.ParseURL(*counters)
		if err != nil {
			return err
		}
		crdb = redis.NewClient(opt)
	} else if crdb, err = cfg.Redis.NewClient(); err != nil {
		return err
	}
	defer crdb.Close()
	c := &counter{rdb: crdb, p: "{" + *prefix + "}:"}
	w.HandleFunc(TypeProbe, c.handle)
	fmt.Println("probeworker: ready")
	return w.Run(ctx)
}

type counter struct {
	rdb redis.UniversalClient
	p   string
}

// raise sets KEYS[1] to ARGV[1] when larger; with KEYS[2] a hash field.
var raise = redis.NewScript(`
local cur
if ARGV[2] ~= '' then cur = redis.call('HGET', KEYS[1], ARGV[2]) else cur = redis.call('GET', KEYS[1]) end
if (not cur) or tonumber(cur) < tonumber(ARGV[1]) then
  if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[2], ARGV[1]) else redis.call('SET', KEYS[1], ARGV[1]) end
end
return 1`)

func (c *counter) handle(ctx context.Context, t *asynq.Task) error {
	var p Payload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("probe payload: %v: %w", err, asynq.SkipRetry)
	}
	id, _ := asynq.GetTaskID(ctx)
	bg := context.WithoutCancel(ctx)
	now := time.Now().UnixMilli()
	c.rdb.SetNX(bg, c.p+"first", now, 0)
	n, err := c.rdb.Incr(bg, c.p+"inflight").Result()
	if err != nil {
		return err
	}
	raise.Run(bg, c.rdb, []string{c.p + "max"}, n, "")
	if p.Tenant != "" {
		tn, err := c.rdb.Incr(bg, c.p+"inflight:"+p.Tenant).Result()
		if err != nil {
			return err
		}
		raise.Run(bg, c.rdb, []string{c.p + "tmax"}, tn, p.Tenant)
	}
	var runErr error
	select {
	case <-time.After(time.Duration(p.MS) * time.Millisecond):
	case <-ctx.Done():
		runErr = ctx.Err()
	}
	if p.Tenant != "" {
		c.rdb.Decr(bg, c.p+"inflight:"+p.Tenant)
	}
	c.rdb.Decr(bg, c.p+"inflight")
	if runErr != nil {
		return runErr
	}
	if p.Fail {
		retried, _ := asynq.GetRetryCount(ctx)
		if retried == 0 {
			return fmt.Errorf("probe: asked to fail once")
		}
	}
	c.rdb.Set(bg, c.p+"last", time.Now().UnixMilli(), 0)
	c.rdb.SAdd(bg, c.p+"done", id)
	c.rdb.Incr(bg, c.p+"runs")
	return nil
}
