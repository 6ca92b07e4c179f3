package config

import (
	"os"
	"reflect"
	"testing"
)

// FuzzParseConfig checks that no input panics, and that an accepted config
// is valid and stable under a second round of defaults.
func FuzzParseConfig(f *testing.F) {
	if shipped, err := os.ReadFile("../config.yaml"); err == nil {
		f.Add(shipped)
	}
	f.Add([]byte("tasks: {a: {semaphore: {key: \"t:{id}\", capacity: 2, capacity_overrides: {\"t:x\": 3}}}}\n"))
	f.Add([]byte("worker: {concurrency: 2, shutdown_timeout: ten}\n"))
	f.Add([]byte("tasks: {a: {rate_limits: [{key: \"s:{id}\", rate: 100, per: 1s, burst: 20, cost: 2, rate_overrides: {\"s:x\": 400}}]}}\n"))
	f.Add([]byte("worker: {concurrency: 0}\ntasks: {a: {max_retry: 0, semaphore: {capacity: 1, ttl: 0s, standby: 0}, rate_limits: [{rate: 5, per: 1s, cost: 0}]}}\n"))
	f.Add([]byte("tasks: {a: {semaphore: {key: \"t:{id}\", capacity: 4, fair_by: \"{tenant_id}\", weights: {acme: 3}, cost: 2, max_waiting: 10, capacity_overrides: {\"t:x\": 2}}}}\n"))
	f.Add([]byte("tasks: {a: {semaphores: [{key: k, capacity: 3, cost_from: job.pages, max_waiting: 0}, {key: j, capacity: 1, cost: 0, weights: {x: 0}}]}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := ParseConfig(data)
		if err != nil {
			if cfg != nil {
				t.Fatalf("ParseConfig returned a config and an error: %v", err)
			}
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("accepted config does not validate: %v", err)
		}
		// New applies the defaults again, as for a Config built in code:
		// they must not change what the file said (a 0 it wrote).
		again := *cfg
		again.withDefaults(nil)
		if !reflect.DeepEqual(&again, cfg) {
			t.Fatalf("a second round of defaults changed the config:\n%#v\n%#v", cfg, &again)
		}
		if cfg.Worker.Concurrency < 1 || len(cfg.Worker.Queues) == 0 || cfg.Semaphore.DefaultTTL <= 0 {
			t.Fatalf("defaults missing: %v", cfg)
		}
		for _, typ := range cfg.TaskTypes() {
			for _, c := range cfg.Tasks[typ].Caps() {
				if c.Capacity < 1 || c.TTL <= 0 || c.Key == "" {
					t.Fatalf("task %q: invalid cap accepted: %+v", typ, c)
				}
				if _, err := c.KeyTemplate(); err != nil {
					t.Fatalf("task %q: bad key accepted: %v", typ, err)
				}
				if c.CostFrom == "" && (c.Cost < 1 || c.Cost > c.Capacity) || c.CostFrom != "" && c.Cost != 0 || c.MaxWaiting < 0 {
					t.Fatalf("task %q: invalid cost or max_waiting accepted: %+v", typ, c)
				}
			}
			for _, rl := range cfg.Tasks[typ].RateLimits {
				if err := rl.Limit().Validate(); err != nil || rl.Cost < 1 || rl.Cost > rl.Burst {
					t.Fatalf("task %q: invalid rate limit accepted: %+v (%v)", typ, rl, err)
				}
				if _, err := rl.KeyTemplate(); err != nil {
					t.Fatalf("task %q: bad rate-limit key accepted: %v", typ, err)
				}
			}
		}
		if _, err := cfg.Redis.AsynqConnOpt(); err != nil {
			t.Fatalf("accepted redis config has no connection: %v", err)
		}
	})
}

// FuzzKeyTemplateRender checks that parsing and rendering never panic, that
// a plain key renders as itself, and that a rendered key is one the template
// matches.
func FuzzKeyTemplateRender(f *testing.F) {
	f.Add("tenant:{tenant_id}", []byte(`{"tenant_id":"acme"}`))
	f.Add("r:{customer.region}", []byte(`{"customer":{"region":"eu"}}`))
	f.Add("n:{n}:{b}", []byte(`{"n":1.50,"b":true}`))
	f.Add("legacy-api", []byte(`not json`))
	f.Add("t:{a", []byte(`{}`))
	f.Add("{a}", []byte(`{"a":null}`))
	f.Fuzz(func(t *testing.T, key string, payload []byte) {
		kt, err := ParseKeyTemplate(key)
		if err != nil {
			return
		}
		if kt.String() != key {
			t.Fatalf("String() = %q, want %q", kt.String(), key)
		}
		got, err := kt.Render(payload)
		if err != nil {
			if !kt.IsTemplate() {
				t.Fatalf("plain key %q failed to render: %v", key, err)
			}
			return
		}
		if !kt.IsTemplate() {
			if got != key {
				t.Fatalf("plain key %q rendered as %q", key, got)
			}
			return
		}
		if len(got) > MaxRenderedKeyLen {
			t.Fatalf("rendered key is %d bytes", len(got))
		}
		if !kt.Matches(got) {
			t.Fatalf("template %q does not match its own rendering %q", key, got)
		}
	})
}
