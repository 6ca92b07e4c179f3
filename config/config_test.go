package config

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestLoadShippedConfig(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	t.Setenv(EnvAdminToken, "")
	cfg, err := LoadConfig("../config.yaml")
	if err != nil {
		t.Fatalf("LoadConfig(config.yaml): %v", err)
	}
	if !cfg.Redis.Embedded() || cfg.Redis.EmbeddedAddr != "127.0.0.1:6380" {
		t.Errorf("redis = %v, want embedded on 127.0.0.1:6380", cfg.Redis)
	}
	if got, want := cfg.TaskTypes(), []string{"report:fetch", "webhook:deliver"}; !reflect.DeepEqual(got, want) {
		t.Errorf("TaskTypes() = %q, want %q", got, want)
	}
	rf := cfg.Tasks["report:fetch"]
	if rf.Queue != "default" || *rf.MaxRetry != 10 || rf.Timeout != 5*time.Minute {
		t.Errorf("report:fetch = queue %q max_retry %d timeout %s", rf.Queue, *rf.MaxRetry, rf.Timeout)
	}
	want := CapConfig{
		Key: "legacy-api", Capacity: 5, Mode: ModeRequeue, TTL: 60 * time.Second,
		WaitTimeout: 10 * time.Second, AutoRenew: ptr(true), OnLeaseLost: LeaseLostCancel, Cost: 1,
	}
	if caps := rf.Caps(); len(caps) != 1 || !reflect.DeepEqual(caps[0], want) {
		t.Errorf("report:fetch caps = %+v, want [%+v]", caps, want)
	}
	caps := cfg.Tasks["webhook:deliver"].Caps()
	if len(caps) != 2 || caps[1].Key != "tenant:{tenant_id}" || caps[1].CapacityFor("tenant:acme") != 4 || caps[1].CapacityFor("tenant:zeta") != 2 {
		t.Errorf("webhook:deliver caps = %+v", caps)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte("tasks:\n  a:\n    semaphore: {capacity: 3}\n  b: {}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Redis:      RedisConfig{EmbeddedAddr: "127.0.0.1:6380"},
		Worker:     WorkerConfig{Concurrency: 10, Queues: map[string]int{"default": 1}, ShutdownTimeout: 8 * time.Second, TaskCheckInterval: DefaultTaskCheckInterval, DelayedTaskCheckInterval: DefaultDelayedTaskCheckInterval, ParkedRetry: DefaultParkedRetry},
		Semaphore:  SemaphoreConfig{Prefix: "fleetcap:sem:", DefaultTTL: 30 * time.Second},
		Monitoring: MonitoringConfig{Addr: "127.0.0.1:8080", AsynqmonReadOnly: ptr(true)},
		Tasks: map[string]TaskConfig{
			"a": {Queue: "default", MaxRetry: ptr(25), Timeout: 30 * time.Minute, Semaphore: &CapConfig{
				Key: "a", Capacity: 3, Mode: ModeRequeue, TTL: 30 * time.Second, WaitTimeout: 10 * time.Second,
				AutoRenew: ptr(true), OnLeaseLost: LeaseLostCancel, Cost: 1,
			}},
			"b": {Queue: "default", MaxRetry: ptr(25), Timeout: 30 * time.Minute},
		},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("ParseConfig:\n got %#v\nwant %#v", cfg, want)
	}
	if !cfg.Monitoring.ReadOnly() || !cfg.Tasks["a"].Caps()[0].AutoRenewEnabled() {
		t.Error("read-only and auto-renew should default to true")
	}
	if caps := cfg.Tasks["b"].Caps(); len(caps) != 0 {
		t.Errorf("b has caps %+v, want none", caps)
	}
}

func TestEmptyConfigIsAllDefaults(t *testing.T) {
	for _, in := range []string{"", "# nothing\n", "---\n"} {
		cfg, err := ParseConfig([]byte(in))
		if err != nil {
			t.Fatalf("ParseConfig(%q): %v", in, err)
		}
		if cfg.Worker.Concurrency != 10 || !cfg.Redis.Embedded() {
			t.Errorf("ParseConfig(%q) = %v", in, cfg)
		}
	}
}

func TestWithDefaultsIsIdempotentAndCopies(t *testing.T) {
	shared := &CapConfig{Capacity: 2}
	cfg := &Config{Tasks: map[string]TaskConfig{"x": {Semaphore: shared}}}
	cfg.withDefaults(nil)
	first := cfg.Tasks["x"]
	cfg.withDefaults(nil)
	if !reflect.DeepEqual(first, cfg.Tasks["x"]) {
		t.Errorf("second withDefaults changed the task: %+v -> %+v", first, cfg.Tasks["x"])
	}
	if shared.Key != "" || shared.Mode != "" {
		t.Errorf("withDefaults wrote through the caller's pointer: %+v", shared)
	}
	if err := cfg.validate(); err != nil {
		t.Errorf("validate: %v", err)
	}
}

func TestCapsAppliesLocalDefaults(t *testing.T) {
	tc := TaskConfig{Semaphores: []CapConfig{{Key: "k", Capacity: 1}, {Key: "j", Capacity: 2, Mode: ModeWait}}}
	caps := tc.Caps()
	if len(caps) != 2 || caps[0].Mode != ModeRequeue || caps[1].Mode != ModeWait || caps[0].WaitTimeout != 10*time.Second || caps[1].OnLeaseLost != LeaseLostCancel {
		t.Errorf("Caps() = %+v", caps)
	}
	caps[0].Key = "changed"
	if tc.Semaphores[0].Key != "k" {
		t.Error("Caps() shares its slice with the task")
	}
}

func TestEnvOverrides(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, path, "redis: {url: \"redis://file:6379\"}\nmonitoring: {admin_token: from-file}\n")

	t.Setenv(EnvRedisURL, "")
	t.Setenv(EnvAdminToken, "")
	cfg, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.URL != "redis://file:6379" || cfg.Monitoring.AdminToken != "from-file" {
		t.Errorf("without env: url %q token %q", cfg.Redis.URL, cfg.Monitoring.AdminToken)
	}

	t.Setenv(EnvRedisURL, "rediss://env:6380/2")
	t.Setenv(EnvAdminToken, "from-env")
	cfg, err = LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Redis.URL != "rediss://env:6380/2" || cfg.Monitoring.AdminToken != "from-env" {
		t.Errorf("with env: url %q token %q", cfg.Redis.URL, cfg.Monitoring.AdminToken)
	}

	// ParseConfig ignores the environment.
	cfg, err = ParseConfig([]byte("redis: {url: \"redis://file:6379\"}\n"))
	if err != nil || cfg.Redis.URL != "redis://file:6379" {
		t.Errorf("ParseConfig read the environment: %v %v", cfg, err)
	}

	// An overriding URL is validated like one from the file.
	t.Setenv(EnvRedisURL, "http://env:6379")
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "redis.url: unsupported scheme") {
		t.Errorf("bad FLEETCAP_REDIS_URL: err = %v", err)
	}
}

func TestLoadConfigListsProblems(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	writeFile(t, path, "worker: {concurrency: -1, shutdown_timeout: -1s}\n")
	_, err := LoadConfig(path)
	want := "config " + path + ": 2 problems:\nworker.concurrency: must be >= 1, got -1\nworker.shutdown_timeout: must be a duration > 0, got -1s"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

func TestLoadConfigMissingFile(t *testing.T) {
	_, err := LoadConfig(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("err = %v, want one naming the file", err)
	}
}

// TestBadConfigs checks that each bad config fails with a message naming
// the field by its YAML path.
func TestBadConfigs(t *testing.T) {
	const task = "tasks:\n  report:fetch:\n    semaphore:\n      key: legacy-api\n      capacity: 5\n"
	const rate = "tasks: {a: {rate_limits: ["
	const fair, sem = "tasks: {a: {semaphore: {key: hooks, capacity: 4, ", `tasks["a"].semaphore.`
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error
	}{
		{"unknown top-level field", "redis: {}\nworkers: {}\n", []string{"workers: unknown field (line 2)"}},
		{"unknown nested field", "worker: {concurency: 3}\n", []string{"worker.concurency: unknown field"}},
		{"unknown cap field", task + "      capacty: 5\n", []string{`tasks["report:fetch"].semaphore.capacty: unknown field (line 6)`}},
		{"capacity zero", "tasks:\n  report:fetch:\n    semaphore: {key: k, capacity: 0}\n", []string{`tasks["report:fetch"].semaphore.capacity: must be >= 1, got 0`}},
		{"capacity missing", "tasks:\n  a:\n    semaphore: {key: k}\n", []string{`tasks["a"].semaphore.capacity: must be >= 1, got 0`}},
		{"capacity not a number", "tasks:\n  a:\n    semaphore: {capacity: five}\n", []string{`tasks["a"].semaphore.capacity: want an integer, got "five" (line 3)`}},
		{"key with two capacities", "tasks:\n  a: {semaphore: {key: shared, capacity: 5}}\n  b: {semaphores: [{key: shared, capacity: 3}]}\n",
			[]string{`tasks["b"].semaphores[0].capacity: key "shared" has capacity 3 here but 5 in tasks["a"].semaphore`}},
		{"template with two capacities", "tasks:\n  a: {semaphore: {key: \"t:{id}\", capacity: 5}}\n  b: {semaphore: {key: \"t:{id}\", capacity: 3}}\n",
			[]string{`tasks["b"].semaphore.capacity: key "t:{id}" has capacity 3 here but 5`}},
		{"default key clashes", "tasks:\n  a: {semaphore: {capacity: 5}}\n  b: {semaphore: {key: a, capacity: 3}}\n",
			[]string{`tasks["b"].semaphore.capacity: key "a" has capacity 3 here but 5 in tasks["a"].semaphore`}},
		{"bad duration string", task + "      ttl: ten\n", []string{`tasks["report:fetch"].semaphore.ttl: want a duration such as "30s" or "5m", got "ten" (line 6)`}},
		{"duration without unit", "worker: {shutdown_timeout: 30}\n", []string{`worker.shutdown_timeout: want a duration such as "30s" or "5m", got "30"`}},
		{"negative ttl", task + "      ttl: -5s\n", []string{`tasks["report:fetch"].semaphore.ttl: must be at least 1ms, got -5s`}},
		{"negative default ttl", "semaphore: {default_ttl: -1s}\n", []string{"semaphore.default_ttl: must be at least 1ms, got -1s"}},
		{"negative wait_timeout", task + "      wait_timeout: -1s\n", []string{`tasks["report:fetch"].semaphore.wait_timeout: must be a duration > 0, got -1s`}},
		{"negative shutdown_timeout", "worker: {shutdown_timeout: -2s}\n", []string{"worker.shutdown_timeout: must be a duration > 0, got -2s"}},
		{"negative task timeout", "tasks: {a: {timeout: -1m}}\n", []string{`tasks["a"].timeout: must be a duration > 0, got -1m0s`}},
		{"unknown mode", task + "      mode: block\n", []string{`tasks["report:fetch"].semaphore.mode: must be "requeue" or "wait", got "block"`}},
		{"unknown on_lease_lost", task + "      on_lease_lost: panic\n", []string{`tasks["report:fetch"].semaphore.on_lease_lost: must be "cancel" or "continue", got "panic"`}},
		{"auto_renew not a bool", task + "      auto_renew: maybe\n", []string{`tasks["report:fetch"].semaphore.auto_renew: want true or false, got "maybe"`}},
		{"semaphore and semaphores", "tasks:\n  a:\n    semaphore: {key: k, capacity: 1}\n    semaphores: [{key: j, capacity: 1}]\n", []string{`tasks["a"]: set either semaphore or semaphores, not both`}},
		{"concurrency null", "worker: {concurrency: ~}\n", nil}, // null: left out, the default
		{"concurrency negative", "worker: {concurrency: -1}\n", []string{"worker.concurrency: must be >= 1, got -1"}},
		{"empty queue name", "worker: {queues: {\"\": 1}}\n", []string{`worker.queues[""]: queue name must not be empty`}},
		{"priority zero", "worker: {queues: {default: 0}}\n", []string{`worker.queues["default"]: priority must be >= 1, got 0`}},
		{"task queue not served", "tasks: {a: {queue: reports}}\n", []string{`tasks["a"].queue: "reports" is not one of worker.queues ["default"]`}},
		{"url and cluster", "redis: {url: \"redis://h:6379\", cluster_addrs: [\"h:7000\"]}\n", []string{"redis: set either url"}},
		{"url scheme", "redis: {url: \"http://h:6379\"}\n", []string{`redis.url: unsupported scheme "http"`}},
		{"url db", "redis: {url: \"redis://h:6379/x\"}\n", []string{"redis.url: the database number must be a non-negative integer"}},
		{"cluster addr", "redis: {cluster_addrs: [\"h:7000\", \"nope\"]}\n", []string{"redis.cluster_addrs[1]: want host:port or redis[s]://"}},
		{"cluster seed sentinel", "redis: {cluster_addrs: [\"redis-sentinel://s:26379/m\"]}\n", []string{"redis.cluster_addrs[0]: a cluster seed is host:port or a redis:// or rediss:// URL"}},
		{"cluster seed db", "redis: {cluster_addrs: [\"redis://h:7000/3\"]}\n", []string{"redis.cluster_addrs[0]: a Redis Cluster has database 0 only"}},
		{"cluster seeds disagree", "redis: {cluster_addrs: [\"rediss://u:p@h:7000\", \"h:7001\"]}\n", []string{"redis.cluster_addrs[1]: every seed must have the scheme, user and password of cluster_addrs[0]"}},
		{"embedded addr", "redis: {embedded_addr: \"localhost\"}\n", []string{`redis.embedded_addr: want host:port`}},
		{"tls files without tls", "redis: {url: \"redis://h:6379\", tls: {ca_file: /etc/hosts}}\n", []string{"redis.tls: set for a connection without TLS"}},
		{"tls files on the embedded redis", "redis: {tls: {ca_file: /etc/hosts}}\n", []string{"redis.tls: set for a connection without TLS"}},
		{"tls ca file missing", "redis: {url: \"rediss://h:6379\", tls: {ca_file: /nonexistent/ca.pem}}\n", []string{"redis.tls.ca_file: open /nonexistent/ca.pem: no such file"}},
		{"tls ca file not pem", "redis: {url: \"rediss://h:6379\", tls: {ca_file: /etc/passwd}}\n", []string{"redis.tls.ca_file: no PEM certificate in /etc/passwd"}},
		{"tls key without cert", "redis: {url: \"rediss://h:6379\", tls: {key_file: k.pem}}\n", []string{"redis.tls.cert_file: key_file is set without it"}},
		{"tls cert without key", "redis: {url: \"rediss://h:6379\", tls: {cert_file: c.pem}}\n", []string{"redis.tls.key_file: cert_file is set without it"}},
		{"tls unknown field", "redis: {url: \"rediss://h:6379\", tls: {ca: x}}\n", []string{"redis.tls.ca: unknown field"}},
		{"monitoring addr", "monitoring: {addr: \"localhost:http\"}\n", []string{`monitoring.addr: port must be a number`}},
		{"negative max_retry", "tasks: {a: {max_retry: -1}}\n", []string{`tasks["a"].max_retry: must be >= 0, got -1`}},
		{"override below one", "tasks: {a: {semaphore: {key: \"t:{id}\", capacity: 2, capacity_overrides: {\"t:x\": 0}}}}\n",
			[]string{`tasks["a"].semaphore.capacity_overrides["t:x"]: must be >= 1, got 0`}},
		{"override not rendered by template", "tasks: {a: {semaphore: {key: \"t:{id}\", capacity: 2, capacity_overrides: {\"u:x\": 3}}}}\n",
			[]string{`tasks["a"].semaphore.capacity_overrides["u:x"]: "u:x" is not a key that template "t:{id}" renders`}},
		{"override on plain key", "tasks: {a: {semaphore: {key: k, capacity: 2, capacity_overrides: {k: 3}}}}\n",
			[]string{`tasks["a"].semaphore.capacity_overrides: only a key template`}},
		{"same key twice in a task", "tasks: {a: {semaphores: [{key: \"t:{id}\", capacity: 1}, {key: \"t:{id}\", capacity: 1}]}}\n",
			[]string{`tasks["a"].semaphores[1].key: "t:{id}" is also the key of tasks["a"].semaphores[0]`}},
		{"unbalanced template", "tasks: {a: {semaphore: {key: \"t:{id\", capacity: 1}}}\n", []string{`tasks["a"].semaphore.key: key "t:{id": unbalanced "{" at offset 2`}},
		{"empty template field", "tasks: {a: {semaphore: {key: \"t:{}\", capacity: 1}}}\n", []string{`tasks["a"].semaphore.key: key "t:{}": field {} at offset 2: empty field name`}},
		{"bad template in a semaphores list", "tasks: {a: {semaphores: [{key: global, capacity: 5}, {key: \"tenant:{tenant id}\", capacity: 2}]}}\n",
			[]string{`tasks["a"].semaphores[1].key: key "tenant:{tenant id}": field {tenant id} at offset 7: bad character ' ' in field name`}},
		{"unbalanced closing brace", "tasks: {a: {semaphores: [{key: \"tenant:tenant_id}\", capacity: 2}]}}\n",
			[]string{`tasks["a"].semaphores[0].key: key "tenant:tenant_id}": unbalanced "}" at offset 16`}},
		{"nested braces", "tasks: {a: {semaphore: {key: \"t:{{id}}\", capacity: 2}}}\n", []string{`tasks["a"].semaphore.key: key "t:{{id}}": unbalanced "{" at offset 2`}},
		{"empty dotted segment", "tasks: {a: {semaphore: {key: \"t:{customer..id}\", capacity: 2}}}\n",
			[]string{`tasks["a"].semaphore.key: key "t:{customer..id}": field {customer..id} at offset 2: empty segment in dotted field name`}},
		{"templates of one shape with two capacities", "tasks:\n  a: {semaphore: {key: \"tenant:{tenant_id}\", capacity: 2}}\n  b: {semaphore: {key: \"tenant:{tenant}\", capacity: 3}}\n",
			[]string{`tasks["b"].semaphore.capacity: template "tenant:{tenant}" renders the same keys as "tenant:{tenant_id}" of tasks["a"].semaphore, with capacity 2 there but 3 here`}},
		{"templates of one shape with two overrides", "tasks:\n  a: {semaphore: {key: \"tenant:{tenant_id}\", capacity: 2, capacity_overrides: {\"tenant:acme\": 4}}}\n  b: {semaphore: {key: \"tenant:{tenant}\", capacity: 2}}\n",
			[]string{`tasks["b"].semaphore.capacity_overrides: tasks["a"].semaphore overrides key "tenant:acme" (capacity 4) but this cap gives it 2`}},
		{"plain key rendered by a template with another capacity", "tasks:\n  a: {semaphore: {key: \"tenant:acme\", capacity: 5}}\n  b: {semaphore: {key: \"tenant:{tenant_id}\", capacity: 2}}\n",
			[]string{`tasks["b"].semaphore.capacity: key "tenant:acme" has capacity 5 in tasks["a"].semaphore, but template "tenant:{tenant_id}" of tasks["b"].semaphore renders it with capacity 2`}},
		{"plain key rendered by a template with its override", "tasks:\n  a: {semaphore: {key: \"tenant:acme\", capacity: 5}}\n  b: {semaphore: {key: \"tenant:{tenant_id}\", capacity: 2, capacity_overrides: {\"tenant:acme\": 5}}}\n", nil},
		{"prefix with braces", "semaphore: {prefix: \"a{b}:\"}\n", []string{"semaphore.prefix: must not contain"}},
		{"field set twice", "worker: {concurrency: 2, concurrency: 3}\n", []string{"worker.concurrency: set twice"}},
		{"task set twice", "tasks:\n  a: {}\n  a: {}\n", []string{`tasks["a"]: set twice (first on line 2)`}},
		{"section not a mapping", "worker: [1, 2]\n", []string{"worker: want a mapping, got a list (line 1)"}},
		{"list not a list", "redis: {cluster_addrs: \"h:1\"}\n", []string{`redis.cluster_addrs: want a list, got "h:1"`}},
		{"top level not a mapping", "- a\n", []string{"top level: want a mapping"}},
		{"syntax error", "worker: {concurrency: 2\n", []string{"cannot parse YAML"}},
		{"two documents", "worker: {}\n---\nworker: {}\n", []string{"more than one YAML document"}},
		{"empty task type", "tasks: {\"\": {}}\n", []string{`tasks[""]: task type must not be empty`}},
		{"rate zero", rate + "{rate: 0, per: 1s}]}}\n", []string{`tasks["a"].rate_limits[0].rate: must be >= 1, got 0`}},
		{"rate missing", rate + "{per: 1s}]}}\n", []string{`tasks["a"].rate_limits[0].rate: must be >= 1, got 0`}},
		{"rate not a number", rate + "{rate: lots, per: 1s}]}}\n", []string{`tasks["a"].rate_limits[0].rate: want an integer, got "lots" (line 1)`}},
		{"per missing", rate + "{rate: 5}]}}\n", []string{`tasks["a"].rate_limits[0].per: required: a duration > 0 such as 1s`}},
		{"per negative", rate + "{rate: 5, per: -1s}]}}\n", []string{`tasks["a"].rate_limits[0].per: must be a duration > 0, got -1s`}},
		{"per not a duration", rate + "{rate: 5, per: second}]}}\n", []string{`tasks["a"].rate_limits[0].per: want a duration such as "30s" or "5m", got "second"`}},
		{"per without unit", rate + "{rate: 5, per: 1}]}}\n", []string{`tasks["a"].rate_limits[0].per: want a duration`}},
		{"rate finer than the server clock", rate + "{rate: 5000, per: 1ms}]}}\n", []string{`tasks["a"].rate_limits[0].rate: ratelimit: rate 5000 per 1ms is more than one token every 1µs`}},
		{"burst negative", rate + "{rate: 5, per: 1s, burst: -2}]}}\n", []string{`tasks["a"].rate_limits[0].burst: must be >= 1, got -2`}},
		{"cost negative", rate + "{rate: 5, per: 1s, cost: -1}]}}\n", []string{`tasks["a"].rate_limits[0].cost: must be >= 1, got -1`}},
		{"cost above burst", rate + "{rate: 5, per: 1s, burst: 2, cost: 3}]}}\n", []string{`tasks["a"].rate_limits[0].cost: 3 is above burst 2: such a task could never run`}},
		{"cost above the default burst", rate + "{rate: 2, per: 1s, cost: 3}]}}\n", []string{`tasks["a"].rate_limits[0].cost: 3 is above burst 2`}},
		{"rate limit mode", rate + "{rate: 5, per: 1s, mode: drop}]}}\n", []string{`tasks["a"].rate_limits[0].mode: must be "requeue" or "wait", got "drop"`}},
		{"rate limit wait_timeout", rate + "{rate: 5, per: 1s, wait_timeout: -3s}]}}\n", []string{`tasks["a"].rate_limits[0].wait_timeout: must be a duration > 0, got -3s`}},
		{"unknown rate limit field", rate + "{rate: 5, per: 1s, period: 1s}]}}\n", []string{`tasks["a"].rate_limits[0].period: unknown field (line 1)`}},
		{"rate limits not a list", "tasks: {a: {rate_limits: {rate: 5}}}\n", []string{`tasks["a"].rate_limits: want a list, got a mapping`}},
		{"rate limit key template", rate + "{key: \"s:{id\", rate: 5, per: 1s}]}}\n", []string{`tasks["a"].rate_limits[0].key: key "s:{id": unbalanced "{"`}},
		{"rate override on a plain key", rate + "{key: s, rate: 5, per: 1s, rate_overrides: {s: 9}}]}}\n", []string{`tasks["a"].rate_limits[0].rate_overrides: only a key template`}},
		{"rate override below one", rate + "{key: \"s:{id}\", rate: 5, per: 1s, rate_overrides: {\"s:x\": 0}}]}}\n", []string{`tasks["a"].rate_limits[0].rate_overrides["s:x"]: must be >= 1, got 0`}},
		{"rate override not rendered by the template", rate + "{key: \"s:{id}\", rate: 5, per: 1s, rate_overrides: {\"t:x\": 9}}]}}\n",
			[]string{`tasks["a"].rate_limits[0].rate_overrides["t:x"]: "t:x" is not a key that template "s:{id}" renders`}},
		{"one rate key twice in a task", rate + "{key: s, rate: 5, per: 1s}, {key: s, rate: 5, per: 1s}]}}\n",
			[]string{`tasks["a"].rate_limits[1].key: "s" is also the key of tasks["a"].rate_limits[0]`}},
		{"one key with two rates", "tasks:\n  a: {rate_limits: [{key: stripe, rate: 100, per: 1s}]}\n  b: {rate_limits: [{key: stripe, rate: 50, per: 1s}]}\n",
			[]string{`tasks["b"].rate_limits[0].rate: key "stripe" is limited to 50 per 1s (burst 50) here but 100 per 1s (burst 100) in tasks["a"].rate_limits[0]`}},
		{"one key with two periods", "tasks:\n  a: {rate_limits: [{key: stripe, rate: 100, per: 1s}]}\n  b: {rate_limits: [{key: stripe, rate: 100, per: 1m, burst: 100}]}\n",
			[]string{`tasks["b"].rate_limits[0].rate: key "stripe" is limited to 100 per 1m0s (burst 100) here`}},
		{"one key with two costs", "tasks:\n  a: {rate_limits: [{key: stripe, rate: 100, per: 1s}]}\n  b: {rate_limits: [{key: stripe, rate: 100, per: 1s, cost: 5, mode: wait}]}\n", nil},
		{"a rate key beside a semaphore of the same name", "tasks:\n  a: {semaphore: {key: stripe, capacity: 2}, rate_limits: [{key: stripe, rate: 100, per: 1s}]}\n", nil},
		{"templates of one shape with two rates", "tasks:\n  a: {rate_limits: [{key: \"s:{account_id}\", rate: 10, per: 1s}]}\n  b: {rate_limits: [{key: \"s:{account}\", rate: 20, per: 1s}]}\n",
			[]string{`tasks["b"].rate_limits[0].rate: key "s:{account}" is limited to 20 per 1s (burst 20) here but 10 per 1s (burst 10) in tasks["a"].rate_limits[0]`}},
		{"one template with two overrides", "tasks:\n  a: {rate_limits: [{key: \"s:{id}\", rate: 10, per: 1s, rate_overrides: {\"s:big\": 40}}]}\n  b: {rate_limits: [{key: \"s:{id}\", rate: 10, per: 1s}]}\n",
			[]string{`tasks["b"].rate_limits[0].rate_overrides["s:big"]: key "s:big" is limited to 10 per 1s (burst 10) here but 40 per 1s (burst 10) in tasks["a"].rate_limits[0]`}},
		{"plain rate key rendered by a template with another rate", "tasks:\n  a: {rate_limits: [{key: \"s:big\", rate: 40, per: 1s, burst: 10}]}\n  b: {rate_limits: [{key: \"s:{id}\", rate: 10, per: 1s}]}\n",
			[]string{`tasks["b"].rate_limits[0].rate: key "s:big" is limited to 40 per 1s (burst 10) in tasks["a"].rate_limits[0], but template "s:{id}" of tasks["b"].rate_limits[0] renders it with 10 per 1s (burst 10)`}},
		{"plain rate key rendered by a template with its override", "tasks:\n  a: {rate_limits: [{key: \"s:big\", rate: 40, per: 1s, burst: 10}]}\n  b: {rate_limits: [{key: \"s:{id}\", rate: 10, per: 1s, rate_overrides: {\"s:big\": 40}}]}\n", nil},
		{"fair_by unbalanced", fair + "fair_by: \"{tenant_id\"}}}\n", []string{sem + `fair_by: not a valid template: key "{tenant_id": unbalanced "{" at offset 0`}},
		{"fair_by bad field", fair + "fair_by: \"{tenant id}\"}}}\n", []string{sem + `fair_by: not a valid template: key "{tenant id}": field {tenant id} at offset 0: bad character ' ' in field name`}},
		{"fair_by without a field", fair + "fair_by: tenant_id}}}\n", []string{sem + `fair_by: "tenant_id" names no payload field; want a template such as "{tenant_id}"`}},
		{"weights without fair_by", fair + "weights: {acme: 3}}}}\n", []string{sem + `weights: set without fair_by: a weight is that of a fair_by value`}},
		{"weight zero", fair + "fair_by: \"{tenant_id}\", weights: {acme: 0}}}}\n", []string{sem + `weights["acme"]: must be >= 1, got 0`}},
		{"weight negative", fair + "fair_by: \"{tenant_id}\", weights: {acme: -2}}}}\n", []string{sem + `weights["acme"]: must be >= 1, got -2`}},
		{"weight not rendered by fair_by", fair + "fair_by: \"t:{tenant_id}\", weights: {acme: 2}}}}\n", []string{sem + `weights["acme"]: "acme" is not a value that fair_by "t:{tenant_id}" renders`}},
		{"weight not a number", fair + "fair_by: \"{tenant_id}\", weights: {acme: lots}}}}\n", []string{sem + `weights["acme"]: want an integer, got "lots"`}},
		{"cost negative", fair + "cost: -1}}}\n", []string{sem + `cost: must be >= 1, got -1`}},
		{"cost above capacity", fair + "cost: 5}}}\n", []string{sem + `cost: 5 is above capacity 4: such a task could never run`}},
		{"cost above a capacity override", "tasks: {a: {semaphore: {key: \"t:{id}\", capacity: 4, cost: 3, capacity_overrides: {\"t:x\": 2, \"t:y\": 3}}}}\n",
			[]string{sem + `cost: 3 is above capacity 2 of key "t:x" (capacity_overrides): such a task could never run`}},
		{"cost and cost_from", fair + "cost: 2, cost_from: pages}}}\n", []string{sem + `cost: set either cost or cost_from, not both`}},
		{"cost_from with braces", fair + "cost_from: \"{pages}\"}}}\n", []string{sem + `cost_from: "{pages}" is not a dotted payload field path such as "pages" or "job.pages": bad character '{' in field name`}},
		{"cost_from empty segment", fair + "cost_from: job..pages}}}\n", []string{sem + `cost_from: "job..pages" is not a dotted payload field path such as "pages" or "job.pages": empty segment in dotted field name`}},
		{"max_waiting negative", fair + "max_waiting: -5}}}\n", []string{sem + `max_waiting: must be >= 1 (leave it out for no bound), got -5`}},
		{"max_waiting not a number", fair + "max_waiting: many}}}\n", []string{sem + `max_waiting: want an integer, got "many"`}},
		{"one key with two fair_by", "tasks:\n  a: {semaphore: {key: k, capacity: 2, fair_by: \"{tenant_id}\"}}\n  b: {semaphore: {key: k, capacity: 2}}\n",
			[]string{`tasks["b"].semaphore.fair_by: key "k" has fair_by "" here but "{tenant_id}" in tasks["a"].semaphore`}},
		{"one key with two weights", "tasks:\n  a: {semaphore: {key: k, capacity: 2, fair_by: \"{t}\", weights: {x: 2}}}\n  b: {semaphore: {key: k, capacity: 2, fair_by: \"{t}\"}}\n",
			[]string{`tasks["b"].semaphore.weights: key "k" has other weights in tasks["a"].semaphore`}},
		{"one key with two max_waiting", "tasks:\n  a: {semaphore: {key: k, capacity: 2, max_waiting: 10}}\n  b: {semaphore: {key: k, capacity: 2}}\n",
			[]string{`tasks["b"].semaphore.max_waiting: key "k" has max_waiting 0 here but 10 in tasks["a"].semaphore (0: none)`}},
		{"one key with two costs", "tasks:\n  a: {semaphore: {key: k, capacity: 4, cost: 3}}\n  b: {semaphore: {key: k, capacity: 4, cost_from: pages}}\n", nil},
		{"fair share, costs and a bound", fair + "fair_by: \"{tenant.id}\", weights: {acme: 3, globex: 1}, cost_from: job.pages, max_waiting: 1000}}}\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.yaml))
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("ParseConfig: %v, want no error", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseConfig succeeded, want an error with %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain\n%s", err, w)
				}
			}
		})
	}
}

// TestAllErrorsReported checks that decoding and validation errors are
// reported together, each once.
func TestAllErrorsReported(t *testing.T) {
	in := `
worker:
  concurrency: -3
  shutdown_timeout: soon
tasks:
  a:
    semaphore:
      capacity: lots
      mode: sometimes
`
	_, err := ParseConfig([]byte(in))
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		`worker.shutdown_timeout: want a duration such as "30s" or "5m", got "soon" (line 4)`,
		`tasks["a"].semaphore.capacity: want an integer, got "lots" (line 8)`,
		`worker.concurrency: must be >= 1, got -3`,
		`tasks["a"].semaphore.mode: must be "requeue" or "wait", got "sometimes"`,
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("errors:\n%s\nwant:\n%s", err, strings.Join(want, "\n"))
	}
}

func TestAliasesAndMerges(t *testing.T) {
	in := `
x-cap: &cap {capacity: 3, ttl: 45s}
tasks:
  a: {semaphore: {<<: *cap, key: shared}}
  b: {semaphore: {<<: *cap, key: shared}}
`
	// x-cap is not a field: aliases only help inside known fields.
	if _, err := ParseConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), "x-cap: unknown field") {
		t.Fatalf("err = %v", err)
	}
	in = `
tasks:
  a: {semaphore: &cap {key: shared, capacity: 3, ttl: 45s}}
  b: {semaphore: *cap}
  c: {semaphore: {<<: *cap, mode: wait}}
`
	cfg, err := ParseConfig([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if c := cfg.Tasks["c"].Caps()[0]; c.Key != "shared" || c.TTL != 45*time.Second || c.Mode != ModeWait {
		t.Errorf("merged cap = %+v", c)
	}
	in = `
tasks:
  a: {semaphore: &cap {key: shared, capacity: 3}}
  b: {semaphore: {<<: *cap, bogus: 1}}
`
	if _, err := ParseConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), `tasks["b"].semaphore.bogus: unknown field`) {
		t.Fatalf("err = %v", err)
	}
	// A mapping that merges itself is an error, not an endless walk (found
	// by FuzzParseConfig); one merged twice is fine.
	in = "tasks:\n  a: {semaphore: &cap {<<: *cap, mode: t}}\n"
	if _, err := ParseConfig([]byte(in)); err == nil || !strings.Contains(err.Error(), `tasks["a"].semaphore: a merge (<<) that includes itself (line 2)`) {
		t.Fatalf("err = %v", err)
	}
	in = "tasks:\n  a: {semaphore: &cap {capacity: 1}}\n  b: {semaphore: {<<: [*cap, *cap]}}\n"
	if _, err := ParseConfig([]byte(in)); err != nil {
		t.Fatalf("a mapping merged twice: %v", err)
	}
}

func TestBillionLaughs(t *testing.T) {
	// Nine levels of nine aliases each, inside a known field: the walk that
	// names bad fields must not expand them all.
	in := "redis:\n  cluster_addrs:\n  - &a [x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for _, name := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		in += "  - &" + name + " [" + strings.Repeat("*"+prev+", ", 8) + "*" + prev + "]\n"
		prev = name
	}
	start := time.Now()
	_, err := ParseConfig([]byte(in))
	if err == nil {
		t.Fatal("no error")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("ParseConfig took %s", d)
	}
	t.Log(err)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestRateLimitDefaultsAndOverrides(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
tasks:
  invoice:sync:
    semaphores: [{key: stripe-conc, capacity: 20}]
    rate_limits:
      - key: "stripe:{account_id}"
        rate: 100
        per: 1s
        burst: 20
        cost: 2
        mode: wait
        wait_timeout: 3s
        rate_overrides: {"stripe:acct_big": 400}
      - {rate: 5, per: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Tasks["invoice:sync"].RateLimits
	want := []RateLimitConfig{
		{Key: "stripe:{account_id}", Rate: 100, Per: time.Second, Burst: 20, Cost: 2, Mode: ModeWait, WaitTimeout: 3 * time.Second,
			RateOverrides: map[string]int{"stripe:acct_big": 400}},
		{Key: "invoice:sync", Rate: 5, Per: time.Minute, Burst: 5, Cost: 1, Mode: ModeRequeue, WaitTimeout: DefaultWaitTimeout},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("rate_limits:\n got %+v\nwant %+v", got, want)
	}
	if l := got[0].LimitFor("stripe:acct_big"); l.Rate != 400 || l.Per != time.Second || l.Burst != 20 {
		t.Errorf("LimitFor(stripe:acct_big) = %s, want 400 per 1s (burst 20)", l)
	}
	if l := got[0].LimitFor("stripe:acct_small"); l.Rate != 100 || l.Burst != 20 {
		t.Errorf("LimitFor(stripe:acct_small) = %s, want 100 per 1s (burst 20)", l)
	}
	// withDefaults copies the overrides: the parsed config does not share
	// its map with a later copy.
	again := cfg.Tasks["invoice:sync"].withDefaults("invoice:sync", time.Second, nil)
	again.RateLimits[0].RateOverrides["stripe:acct_big"] = 1
	if got[0].RateOverrides["stripe:acct_big"] != 400 {
		t.Error("withDefaults shares rate_overrides with its input")
	}
}

// TestWrittenZeroIsAnError checks that a numeric field written as 0 in a
// file, where 0 is outside its range, is an error naming the field by its
// YAML path, as any other value out of range: only a field left out (or
// null) takes its default.
func TestWrittenZeroIsAnError(t *testing.T) {
	const rate = "tasks: {a: {rate_limits: [{key: \"s:{id}\", rate: 5, per: 1s"
	const rl = `tasks["a"].rate_limits[0].`
	tests := []struct {
		name string
		yaml string
		want string // a line of the error
	}{
		{"concurrency", "worker: {concurrency: 0}\n", "worker.concurrency: must be >= 1, got 0"},
		{"concurrency as a float", "worker: {concurrency: 0.0}\n", "worker.concurrency: must be >= 1, got 0"},
		{"queue priority", "worker: {queues: {default: 0}}\n", `worker.queues["default"]: priority must be >= 1, got 0`},
		{"shutdown_timeout", "worker: {shutdown_timeout: 0s}\n", "worker.shutdown_timeout: must be a duration > 0, got 0s"},
		{"shutdown_timeout without a unit", "worker: {shutdown_timeout: \"0\"}\n", "worker.shutdown_timeout: must be a duration > 0, got 0s"},
		{"task_check_interval", "worker: {task_check_interval: 0s}\n", "worker.task_check_interval: must be at least 1ms, got 0s"},
		{"delayed_task_check_interval", "worker: {delayed_task_check_interval: 0ms}\n", "worker.delayed_task_check_interval: must be at least 100ms, got 0s"},
		{"parked_retry", "worker: {parked_retry: 0s}\n", "worker.parked_retry: must be at least 1s, got 0s"},
		{"default_ttl", "semaphore: {default_ttl: 0s}\n", "semaphore.default_ttl: must be at least 1ms, got 0s"},
		{"task timeout", "tasks: {a: {timeout: 0s}}\n", `tasks["a"].timeout: must be a duration > 0, got 0s`},
		{"cap capacity", "tasks: {a: {semaphore: {capacity: 0}}}\n", `tasks["a"].semaphore.capacity: must be >= 1, got 0`},
		{"cap ttl", "tasks: {a: {semaphore: {capacity: 1, ttl: 0s}}}\n", `tasks["a"].semaphore.ttl: must be at least 1ms, got 0s`},
		{"cap ttl in a list", "tasks: {a: {semaphores: [{key: k, capacity: 1}, {key: j, capacity: 1, ttl: 0s}]}}\n", `tasks["a"].semaphores[1].ttl: must be at least 1ms, got 0s`},
		{"cap ttl through an alias", "tasks:\n  a: {semaphore: &c {key: k, capacity: 1, ttl: 0s}}\n  b: {semaphore: *c}\n", `tasks["b"].semaphore.ttl: must be at least 1ms, got 0s`},
		{"cap ttl through a merge", "tasks:\n  a: {semaphore: &c {key: k, capacity: 1, ttl: 0s}}\n  b: {semaphore: {<<: *c, mode: wait}}\n", `tasks["b"].semaphore.ttl: must be at least 1ms, got 0s`},
		{"cap wait_timeout", "tasks: {a: {semaphore: {capacity: 1, wait_timeout: 0s}}}\n", `tasks["a"].semaphore.wait_timeout: must be a duration > 0, got 0s`},
		{"capacity override", "tasks: {a: {semaphore: {key: \"t:{id}\", capacity: 2, capacity_overrides: {\"t:x\": 0}}}}\n", `tasks["a"].semaphore.capacity_overrides["t:x"]: must be >= 1, got 0`},
		{"rate", "tasks: {a: {rate_limits: [{rate: 0, per: 1s}]}}\n", rl + "rate: must be >= 1, got 0"},
		{"per", "tasks: {a: {rate_limits: [{rate: 5, per: 0s}]}}\n", rl + "per: required: a duration > 0 such as 1s"},
		{"burst", rate + ", burst: 0}]}}\n", rl + "burst: must be >= 1, got 0"},
		{"cost", rate + ", cost: 0}]}}\n", rl + "cost: must be >= 1, got 0"},
		{"rate limit wait_timeout", rate + ", mode: wait, wait_timeout: 0s}]}}\n", rl + "wait_timeout: must be a duration > 0, got 0s"},
		{"rate override", rate + ", rate_overrides: {\"s:x\": 0}}]}}\n", rl + `rate_overrides["s:x"]: must be >= 1, got 0`},
		{"cap cost", "tasks: {a: {semaphore: {capacity: 2, cost: 0}}}\n", `tasks["a"].semaphore.cost: must be >= 1, got 0`},
		{"cap cost beside cost_from", "tasks: {a: {semaphore: {capacity: 2, cost: 0, cost_from: pages}}}\n", `tasks["a"].semaphore.cost: set either cost or cost_from, not both`},
		{"cap max_waiting", "tasks: {a: {semaphore: {capacity: 2, max_waiting: 0}}}\n", `tasks["a"].semaphore.max_waiting: must be >= 1 (leave it out for no bound), got 0`},
		{"cap max_waiting in a list", "tasks: {a: {semaphores: [{key: k, capacity: 1}, {key: j, capacity: 1, max_waiting: 0}]}}\n", `tasks["a"].semaphores[1].max_waiting: must be >= 1 (leave it out for no bound), got 0`},
		{"cap weight", "tasks: {a: {semaphore: {capacity: 2, fair_by: \"{t}\", weights: {x: 0}}}}\n", `tasks["a"].semaphore.weights["x"]: must be >= 1, got 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("ParseConfig succeeded, want the error %q", tt.want)
			}
			if !slices.Contains(strings.Split(err.Error(), "\n"), tt.want) {
				t.Errorf("error\n%v\nhas no line\n%s", err, tt.want)
			}
		})
	}
}

// TestWrittenZeroKeepsItsMeaning checks the fields where a written 0 means
// something: max_retry 0 (no retry after a real failure) and standby 0 (no
// task waits in a slot for a seat) are kept, not replaced by the default.
func TestWrittenZeroKeepsItsMeaning(t *testing.T) {
	cfg, err := ParseConfig([]byte("tasks: {a: {max_retry: 0, semaphore: {capacity: 2, standby: 0}}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Tasks["a"]
	if *a.MaxRetry != 0 {
		t.Errorf("max_retry = %d, want 0", *a.MaxRetry)
	}
	if s := a.Semaphore.Standby; s == nil || *s != 0 {
		t.Errorf("standby = %v, want 0", s)
	}
}

// TestZeroInCodeIsTheDefault checks that in a Config built in code, where a
// field left out cannot be told from 0, a zero field takes its default.
func TestZeroInCodeIsTheDefault(t *testing.T) {
	cfg := &Config{Tasks: map[string]TaskConfig{"a": {
		Semaphore:  &CapConfig{Capacity: 2},
		RateLimits: []RateLimitConfig{{Rate: 5, Per: time.Second}},
	}}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	w, a := cfg.Worker, cfg.Tasks["a"]
	if w.Concurrency != DefaultConcurrency || w.ShutdownTimeout != DefaultShutdownTimeout || cfg.Semaphore.DefaultTTL != DefaultSemaphoreTTL || a.Timeout != DefaultTaskTimeout {
		t.Errorf("worker %+v, default_ttl %s, timeout %s: want the defaults", w, cfg.Semaphore.DefaultTTL, a.Timeout)
	}
	if c := a.Semaphore; c.TTL != DefaultSemaphoreTTL || c.WaitTimeout != DefaultWaitTimeout {
		t.Errorf("cap %+v: want the default ttl and wait_timeout", c)
	}
	if rl := a.RateLimits[0]; rl.Burst != 5 || rl.Cost != 1 || rl.WaitTimeout != DefaultWaitTimeout {
		t.Errorf("rate limit %+v: want burst 5, cost 1, wait_timeout %s", rl, DefaultWaitTimeout)
	}
}

// TestTooLargeToWalkIsAnError checks that a file that decodes but is too
// large for the walk that finds the fields it writes is refused, rather
// than letting a field it wrote as 0 take its default unseen.
func TestTooLargeToWalkIsAnError(t *testing.T) {
	in := "worker: {concurrency: 0}\nredis:\n  cluster_addrs: [" + strings.Repeat("h:7000, ", maxDiagnoseNodes) + "h:7000]\n"
	_, err := ParseConfig([]byte(in))
	if err == nil || !strings.Contains(err.Error(), "document too large or too deeply aliased") {
		t.Errorf("err = %v, want one saying the document is too large", err)
	}
}

// TestEmbeddedFilePath: LoadConfig puts redis.embedded_file beside the
// config file by default and makes a relative one relative to the config's
// directory; an absolute one stays; a config for a Redis server has none;
// ParseConfig (no file) keeps nothing unless told.
func TestEmbeddedFilePath(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	dir := t.TempDir()
	abs := filepath.Join(t.TempDir(), "data.json")
	for _, c := range []struct{ yaml, want string }{
		{"", filepath.Join(dir, ".fleetcap", "embedded.json")},
		{"redis: {embedded_file: state/e.json}\n", filepath.Join(dir, "state", "e.json")},
		{"redis: {embedded_file: " + abs + "}\n", abs},
		{"redis: {url: \"redis://h:6379\"}\n", ""},
	} {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Redis.EmbeddedFile != c.want {
			t.Errorf("%q: embedded_file = %q, want %q", c.yaml, cfg.Redis.EmbeddedFile, c.want)
		}
	}
	cfg, err := ParseConfig(nil)
	if err != nil || cfg.Redis.EmbeddedFile != "" {
		t.Errorf("ParseConfig: embedded_file = %q, %v; want none", cfg.Redis.EmbeddedFile, err)
	}
}

// TestFairShareCostAndBound: the fields of SPEC §2.10 parse, cost defaults
// to 1 without cost_from, and the accessors read a payload.
func TestFairShareCostAndBound(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
tasks:
  hook:
    semaphore: {key: hooks, capacity: 20, fair_by: "{tenant.id}", weights: {acme: 3}, cost_from: job.pages, max_waiting: 1000,
                capacity_overrides: {}}
  plain:
    semaphore: {key: plain, capacity: 4}
  fixed:
    semaphore: {key: "f:{region}", capacity: 4, cost: 3, capacity_overrides: {"f:eu": 8}}
`))
	if err != nil {
		t.Fatal(err)
	}
	hook, plain, fixed := *cfg.Tasks["hook"].Semaphore, *cfg.Tasks["plain"].Semaphore, *cfg.Tasks["fixed"].Semaphore
	if hook.FairBy != "{tenant.id}" || hook.Cost != 0 || hook.CostFrom != "job.pages" || hook.MaxWaiting != 1000 || !reflect.DeepEqual(hook.Weights, map[string]int{"acme": 3}) {
		t.Errorf("hook = %+v", hook)
	}
	if plain.Cost != 1 || plain.MaxWaiting != 0 || plain.FairBy != "" || plain.Weights != nil {
		t.Errorf("plain = %+v: want cost 1, no bound, no fair share", plain)
	}

	for _, c := range []struct {
		cap      CapConfig
		payload  string
		capacity int
		cost     int
		wantErr  string
	}{
		{plain, `not json`, 4, 1, ""},
		{fixed, `{}`, 4, 3, ""},
		{fixed, `{}`, 2, 0, "cost 3 is outside 1..2 (the capacity)"},
		{CapConfig{}, `{}`, 1, 1, ""}, // 0 in code: 1 seat
		{hook, `{"job":{"pages":7}}`, 20, 7, ""},
		{hook, `{"job":{"pages":20}}`, 20, 20, ""},
		{hook, `{"job":{"pages":21}}`, 20, 0, `cost_from: payload field "job.pages" is 21, want an integer in 1..20 (the capacity)`},
		{hook, `{"job":{"pages":0}}`, 20, 0, `cost_from: payload field "job.pages" is 0, want an integer in 1..20 (the capacity)`},
		{hook, `{"job":{"pages":-3}}`, 20, 0, `cost_from: payload field "job.pages" is -3, want an integer in 1..20 (the capacity)`},
		{hook, `{"job":{"pages":2.5}}`, 20, 0, `cost_from: payload field "job.pages" is 2.5, want an integer in 1..20 (the capacity)`},
		{hook, `{"job":{"pages":1e99}}`, 20, 0, `cost_from: payload field "job.pages" is 1e99, want an integer in 1..20`},
		{hook, `{"job":{"pages":"3"}}`, 20, 0, `cost_from: payload field "job.pages" is a string "3", want an integer in 1..20`},
		{hook, `{"job":{"pages":null}}`, 20, 0, `cost_from: payload field "job.pages" is null, want an integer in 1..20`},
		{hook, `{"job":{"pages":true}}`, 20, 0, `cost_from: payload field "job.pages" is a boolean true, want an integer`},
		{hook, `{"job":{}}`, 20, 0, `cost_from: payload field "job.pages" is missing`},
		{hook, `{"job":5}`, 20, 0, `cost_from: payload field "job.pages": "job" is a number, not an object`},
		{hook, `[1]`, 20, 0, `cost_from "job.pages": payload is an array, want a JSON object`},
	} {
		got, err := c.cap.CostOf([]byte(c.payload), c.capacity)
		switch {
		case c.wantErr == "" && (err != nil || got != c.cost):
			t.Errorf("CostOf(%s, %d) of %q = %d, %v; want %d", c.payload, c.capacity, c.cap.Key, got, err, c.cost)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("CostOf(%s, %d) of %q = %d, %v; want the error %q", c.payload, c.capacity, c.cap.Key, got, err, c.wantErr)
		}
	}

	if v, err := hook.FairValue([]byte(`{"tenant":{"id":"acme"}}`)); err != nil || v != "acme" || hook.WeightOf(v) != 3 {
		t.Errorf("FairValue = %q, %v, weight %d; want acme of weight 3", v, err, hook.WeightOf(v))
	}
	if hook.WeightOf("globex") != 1 || plain.WeightOf("") != 1 {
		t.Error("a value without a weight should weigh 1")
	}
	if _, err := hook.FairValue([]byte(`{"tenant":{}}`)); err == nil || err.Error() != `fair_by template "{tenant.id}": payload field "tenant.id" is missing` {
		t.Errorf("FairValue without the field: %v", err)
	}
	if v, err := plain.FairValue([]byte(`not json`)); err != nil || v != "" {
		t.Errorf("FairValue without fair_by = %q, %v; want \"\"", v, err)
	}

	// withDefaults copies the weights.
	again := cfg.Tasks["hook"].withDefaults("hook", time.Second, nil)
	again.Semaphore.Weights["acme"] = 1
	if hook.Weights["acme"] != 3 {
		t.Error("withDefaults shares weights with its input")
	}
}
