package monitoring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/syncbuf"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// fixture is a monitoring server over a real Redis and semaphore.
type fixture struct {
	redis   *redistest.Server
	sem     *semaphore.Service
	reg     *prometheus.Registry
	metrics *Metrics
	server  *Server
	http    *httptest.Server
	logs    *syncbuf.Buffer
	limiter *ratelimit.Limiter // set with fixtureOptions.rateKeys
	store   *control.Store     // set with fixtureOptions.overrides
}

type fixtureOptions struct {
	keys       []KeyInfo
	rateKeys   []RateKeyInfo // rows of kind "rate"
	overrides  bool          // runtime overrides (package control)
	adminToken string
	busiest    int
	writable   bool
	// wrap, when set, wraps the server's handler (a test adds routes).
	wrap func(http.Handler) http.Handler
}

func newFixture(t *testing.T, fo fixtureOptions) *fixture {
	t.Helper()
	f := &fixture{redis: redistest.Start(t), reg: NewRegistry(), logs: &syncbuf.Buffer{}}
	var err error
	if f.metrics, err = NewMetrics(f.reg); err != nil {
		t.Fatal(err)
	}
	for _, k := range fo.keys {
		if k.Template == "" || k.Template == k.Key {
			f.metrics.SetCapacity(k.Key, k.Capacity)
		}
	}
	logger := slog.New(slog.NewTextHandler(f.logs, nil))
	rdb := f.redis.Client()
	f.sem, err = semaphore.New(rdb, semaphore.Options{Prefix: "test:sem:", Observer: f.metrics, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.sem.Close() })

	connOpt := asynq.RedisClientOpt{Addr: f.redis.Addr()}
	insp := asynq.NewInspector(connOpt)
	t.Cleanup(func() { _ = insp.Close() })
	f.reg.MustRegister(NewQueueCollector(insp, QueueCollectorOptions{}))

	keys := fo.keys
	rooms, err := NewRoomCollector(f.sem, func(context.Context) ([]KeyInfo, error) { return keys, nil }, RoomCollectorOptions{CacheFor: -1, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	f.reg.MustRegister(rooms)
	opts := ServerOptions{
		Gatherer:         f.reg,
		Semaphore:        f.sem,
		Keys:             func(context.Context) ([]KeyInfo, error) { return keys, nil },
		BusiestKeys:      fo.busiest,
		AdminToken:       fo.adminToken,
		RedisConnOpt:     connOpt,
		AsynqmonWritable: fo.writable,
		Logger:           logger,
	}
	if fo.rateKeys != nil {
		if f.limiter, err = ratelimit.New(rdb, ratelimit.Options{Prefix: "test:", Observer: f.metrics}); err != nil {
			t.Fatal(err)
		}
		rateKeys := fo.rateKeys
		opts.RateLimiter = f.limiter
		opts.RateKeys = func(context.Context) ([]RateKeyInfo, error) { return rateKeys, nil }
		opts.LookupRateKey = func(key string) (RateKeyInfo, bool) {
			return lookupDeclared(rateKeys, key, func(k RateKeyInfo) (string, string) { return k.Key, k.Template })
		}
	}
	if fo.overrides {
		if f.store, err = control.NewStore(rdb, control.Options{Prefix: "test:"}); err != nil {
			t.Fatal(err)
		}
		reader, err := control.NewReader(context.Background(), f.store, control.ReaderOptions{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reader.Close)
		opts.Overrides = reader
		opts.LookupKey = func(key string) (KeyInfo, bool) {
			return lookupDeclared(keys, key, func(k KeyInfo) (string, string) { return k.Key, k.Template })
		}
	}
	f.server, err = NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	handler := f.server.Handler()
	if fo.wrap != nil {
		handler = fo.wrap(handler)
	}
	f.http = httptest.NewServer(handler)
	t.Cleanup(func() {
		f.http.Close()
		_ = f.server.Shutdown(context.Background())
	})
	return f
}

// hold takes n seats of key with task IDs prefix-1..prefix-n.
func (f *fixture) hold(t *testing.T, key string, capacity, n int, prefix string) []*semaphore.Permit {
	t.Helper()
	var ps []*semaphore.Permit
	for i := 1; i <= n; i++ {
		p, err := f.sem.TryAcquire(context.Background(), key, capacity,
			semaphore.WithHolder(fmt.Sprintf("%s-%d", prefix, i)), semaphore.WithTTL(10*time.Minute))
		if err != nil || p == nil {
			t.Fatalf("hold %s seat %d: permit %v, err %v", key, i, p, err)
		}
		ps = append(ps, p)
	}
	return ps
}

// lookupDeclared resolves key among the declared ones as the worker does:
// a declared key or template, or a key rendered from a template of the
// form "prefix{field}" (the only form the fixtures declare). A rendered
// key takes its template's entry with Key and Template set.
func lookupDeclared[K any](declared []K, key string, keyOf func(K) (key, template string)) (K, bool) {
	for _, d := range declared {
		if k, _ := keyOf(d); k == key {
			return d, true
		}
	}
	for _, d := range declared {
		if k, tmpl := keyOf(d); k == tmpl && tmpl != "" {
			if prefix, _, _ := strings.Cut(tmpl, "{"); strings.HasPrefix(key, prefix) && len(key) > len(prefix) {
				return d, true
			}
		}
	}
	var zero K
	return zero, false
}

func (f *fixture) do(t *testing.T, method, path, auth string) (int, string) {
	t.Helper()
	return f.send(t, method, path, auth, "")
}

// send makes a request with body (none when empty) and returns the status
// and the response body.
func (f *fixture) send(t *testing.T, method, path, auth, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, f.http.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(got)
}

func TestMetricsEndpointWithRealSemaphore(t *testing.T) {
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{{Key: "legacy-api", Capacity: 2}}})
	ctx := context.Background()
	client := asynq.NewClient(asynq.RedisClientOpt{Addr: f.redis.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	if _, err := client.Enqueue(asynq.NewTask("report:fetch", nil)); err != nil {
		t.Fatal(err)
	}

	held := f.hold(t, "legacy-api", 2, 2, "task")
	if p, err := f.sem.TryAcquire(ctx, "legacy-api", 2); p != nil || err != nil {
		t.Fatalf("TryAcquire on a full semaphore: %v, %v", p, err)
	}
	_, err := f.sem.Acquire(ctx, "legacy-api", 2, semaphore.WithWaitTimeout(50*time.Millisecond))
	var ae *semaphore.AcquisitionError
	if !errors.As(err, &ae) || ae.Reason != semaphore.ReasonTimeout {
		t.Fatalf("Acquire on a full semaphore: err = %v, want a timeout", err)
	}

	mfs := scrape(t, f.http.URL+"/metrics")
	if v := mustSample(t, mfs, "redisx_semaphore_permits_active", "key", "legacy-api"); v != 2 {
		t.Errorf("permits_active while 2 held = %v, want 2", v)
	}
	for _, p := range held {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	mfs = scrape(t, f.http.URL+"/metrics")
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"redisx_semaphore_acquisitions_total", []string{"key", "legacy-api", "status", "acquired"}, 2},
		{"redisx_semaphore_acquisitions_total", []string{"key", "legacy-api", "status", "failed"}, 2},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "legacy-api", "reason", "full"}, 1},
		{"fleetcap_semaphore_acquire_failures_total", []string{"key", "legacy-api", "reason", "timeout"}, 1},
		{"redisx_semaphore_permits_active", []string{"key", "legacy-api"}, 0},
		{"redisx_semaphore_wait_duration_seconds", []string{"key", "legacy-api"}, 2},
		{"redisx_semaphore_hold_duration_seconds", []string{"key", "legacy-api"}, 2},
		{"fleetcap_semaphore_capacity", []string{"key", "legacy-api"}, 2},
		{"asynq_queue_size", []string{"queue", "default"}, 1},
		{"fleetcap_asynq_up", nil, 1},
	} {
		if got := mustSample(t, mfs, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if _, ok := mfs[name]; !ok {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestReleaseAllEndpoint(t *testing.T) {
	const token = "s3cret-admin-token"
	keys := []KeyInfo{
		{Key: "legacy-api", Capacity: 5},
		{Key: "reports/eu", Capacity: 1},
		{Key: "tenant:{tenant_id}", Capacity: 2, Template: "tenant:{tenant_id}"},
	}

	t.Run("no admin token configured", func(t *testing.T) {
		f := newFixture(t, fixtureOptions{keys: keys})
		f.hold(t, "legacy-api", 5, 1, "task")
		if code, _ := f.do(t, "POST", "/api/semaphores/legacy-api/release-all", "Bearer anything"); code != http.StatusNotFound {
			t.Errorf("status = %d, want 404", code)
		}
		if n, _ := f.sem.UsedPermits(context.Background(), "legacy-api"); n != 1 {
			t.Errorf("used = %d after a refused release, want 1", n)
		}
	})

	f := newFixture(t, fixtureOptions{keys: keys, adminToken: token})
	held := f.hold(t, "legacy-api", 5, 5, "task")
	for _, c := range []struct {
		name, path, auth string
		want             int
	}{
		{"no token", "/api/semaphores/legacy-api/release-all", "", http.StatusUnauthorized},
		{"wrong token", "/api/semaphores/legacy-api/release-all", "Bearer nope", http.StatusUnauthorized},
		{"token prefix", "/api/semaphores/legacy-api/release-all", "Bearer " + token[:5], http.StatusUnauthorized},
		{"wrong scheme", "/api/semaphores/legacy-api/release-all", "Basic " + token, http.StatusUnauthorized},
		{"unknown key", "/api/semaphores/nope/release-all", "Bearer " + token, http.StatusNotFound},
		{"template is not a key", "/api/semaphores/tenant:%7Btenant_id%7D/release-all", "Bearer " + token, http.StatusNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := f.do(t, "POST", c.path, c.auth)
			if code != c.want {
				t.Errorf("status = %d (%s), want %d", code, body, c.want)
			}
		})
	}
	if n, _ := f.sem.UsedPermits(context.Background(), "legacy-api"); n != 5 {
		t.Fatalf("used = %d after refused requests, want 5", n)
	}
	if code, _ := f.do(t, "GET", "/api/semaphores/legacy-api/release-all", "Bearer "+token); code != http.StatusMethodNotAllowed {
		t.Errorf("GET release-all = %d, want 405", code)
	}

	code, body := f.do(t, "POST", "/api/semaphores/legacy-api/release-all", "Bearer "+token)
	if code != http.StatusOK {
		t.Fatalf("release-all = %d %s, want 200", code, body)
	}
	var got struct {
		Displaced *int `json:"displaced"`
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || got.Displaced == nil || *got.Displaced != 5 {
		t.Fatalf("release-all body = %s, want {\"displaced\":5}", body)
	}
	if hs, err := f.sem.Holders(context.Background(), "legacy-api"); err != nil || len(hs) != 0 {
		t.Errorf("holders after release-all = %v, %v; want none", hs, err)
	}
	if err := held[0].Release(context.Background()); !errors.Is(err, semaphore.ErrPermitNotHeld) {
		t.Errorf("Release of a displaced permit = %v, want ErrPermitNotHeld", err)
	}
	// A key with a slash travels path-escaped.
	f.hold(t, "reports/eu", 1, 1, "eu")
	if code, body := f.do(t, "POST", "/api/semaphores/"+url.PathEscape("reports/eu")+"/release-all", "Bearer "+token); code != 200 || !strings.Contains(body, `"displaced":1`) {
		t.Errorf("release-all of reports/eu = %d %s, want 200 displaced 1", code, body)
	}
	if strings.Contains(f.logs.String(), token) {
		t.Error("the admin token appears in the logs")
	}
	if !strings.Contains(f.logs.String(), "displaced=5") {
		t.Errorf("release-all not logged:\n%s", f.logs)
	}
}

func TestAPISemaphores(t *testing.T) {
	keys := []KeyInfo{
		{Key: "idle", Capacity: 2},
		{Key: "legacy-api", Capacity: 5},
		{Key: "tenant:{tenant_id}", Capacity: 2, Template: "tenant:{tenant_id}"},
		{Key: "tenant:acme", Capacity: 2, Template: "tenant:{tenant_id}"},
		{Key: "tenant:globex", Capacity: 2, Template: "tenant:{tenant_id}"},
		{Key: "tenant:initech", Capacity: 2, Template: "tenant:{tenant_id}"},
	}
	f := newFixture(t, fixtureOptions{keys: keys, busiest: 1})
	f.hold(t, "legacy-api", 5, 3, "task")
	f.hold(t, "tenant:acme", 2, 2, "acme")
	f.hold(t, "tenant:globex", 2, 1, "globex")

	code, body := f.do(t, "GET", "/api/semaphores", "")
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(body), &rows); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	var order []string
	for _, r := range rows {
		order = append(order, r["key"].(string))
	}
	// Busiest first: the template (acme is full), legacy-api (3/5), idle.
	if want := []string{"tenant:{tenant_id}", "legacy-api", "idle"}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("row order = %v, want %v", order, want)
	}

	legacy := rows[1]
	if legacy["capacity"] != 5.0 || legacy["used"] != 3.0 {
		t.Errorf("legacy-api = %v, want capacity 5 used 3", legacy)
	}
	holders := legacy["holders"].([]any)
	if len(holders) != 3 {
		t.Fatalf("legacy-api holders = %v, want 3", holders)
	}
	taskIDs := map[string]bool{}
	for _, h := range holders {
		h := h.(map[string]any)
		if len(h) != 4 || h["seats"] != 1.0 {
			t.Errorf("holder fields = %v, want permit_id, task_id, expires_at and seats 1", h)
		}
		taskIDs[h["task_id"].(string)] = true
		if h["permit_id"].(string) == "" {
			t.Error("empty permit_id")
		}
		exp, err := time.Parse(time.RFC3339Nano, h["expires_at"].(string))
		if err != nil || time.Until(exp) < 5*time.Minute {
			t.Errorf("expires_at = %v (%v), want about 10 minutes ahead", h["expires_at"], err)
		}
	}
	if !taskIDs["task-1"] || !taskIDs["task-2"] || !taskIDs["task-3"] {
		t.Errorf("task IDs = %v, want task-1..3", taskIDs)
	}

	idle := rows[2]
	if hs, ok := idle["holders"].([]any); !ok || len(hs) != 0 || idle["used"] != 0.0 {
		t.Errorf("idle = %v, want used 0 and holders []", idle)
	}

	tpl := rows[0]
	if tpl["template"] != true || tpl["used"] != 3.0 || tpl["keys"] != 3.0 || tpl["capacity"] != 2.0 {
		t.Errorf("template row = %v, want used 3 over 3 keys, capacity 2", tpl)
	}
	busiest := tpl["busiest"].([]any)
	if len(busiest) != 1 || busiest[0].(map[string]any)["key"] != "tenant:acme" {
		t.Errorf("busiest = %v, want only tenant:acme (BusiestKeys 1)", busiest)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{{Key: "legacy-api", Capacity: 5}}})
	if code, body := f.do(t, "GET", "/healthz", ""); code != 200 || strings.TrimSpace(body) != "ok" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, body := f.do(t, "GET", "/readyz", ""); code != 200 {
		t.Errorf("/readyz with Redis up = %d %q, want 200", code, body)
	}
	f.redis.Stop()
	if code, body := f.do(t, "GET", "/readyz", ""); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with Redis stopped = %d %q, want 503", code, body)
	}
	if code, _ := f.do(t, "GET", "/healthz", ""); code != 200 {
		t.Errorf("/healthz with Redis stopped = %d, want 200", code)
	}
	if code, body := f.do(t, "GET", "/api/semaphores", ""); code != http.StatusServiceUnavailable || !strings.Contains(body, "error") {
		t.Errorf("/api/semaphores with Redis stopped = %d %s, want 503 with an error", code, body)
	}
}

func TestReadyFunc(t *testing.T) {
	down := errors.New("queue store is down")
	s, err := NewServer(ServerOptions{Ready: func(context.Context) error { return down }})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "queue store is down") {
		t.Errorf("/readyz = %d %q", rec.Code, rec.Body)
	}
	for _, path := range []string{"/metrics", "/semaphores", "/monitoring/"} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s without its options = %d, want 404", path, rec.Code)
		}
	}
}

func TestNewServerValidates(t *testing.T) {
	if _, err := NewServer(ServerOptions{}); err == nil {
		t.Error("no Ready and no RedisConnOpt: want an error")
	}
	ready := func(context.Context) error { return nil }
	if _, err := NewServer(ServerOptions{Ready: ready, Keys: func(context.Context) ([]KeyInfo, error) { return nil, nil }}); err == nil {
		t.Error("Keys without Semaphore: want an error")
	}
}

func TestAsynqmonMountedReadOnly(t *testing.T) {
	for _, writable := range []bool{false, true} {
		t.Run(fmt.Sprintf("writable=%v", writable), func(t *testing.T) {
			f := newFixture(t, fixtureOptions{writable: writable})
			client := asynq.NewClient(asynq.RedisClientOpt{Addr: f.redis.Addr()})
			t.Cleanup(func() { _ = client.Close() })
			if _, err := client.Enqueue(asynq.NewTask("report:fetch", nil)); err != nil {
				t.Fatal(err)
			}
			if code, body := f.do(t, "GET", "/monitoring/", ""); code != 200 || !strings.Contains(body, "<html") {
				t.Errorf("GET /monitoring/ = %d", code)
			}
			if code, body := f.do(t, "GET", "/monitoring/api/queues", ""); code != 200 || !strings.Contains(body, `"default"`) {
				t.Errorf("GET /monitoring/api/queues = %d %s", code, body)
			}
			code, _ := f.do(t, "POST", "/monitoring/api/queues/default:pause", "")
			if !writable && code != http.StatusMethodNotAllowed {
				t.Errorf("read-only pause = %d, want 405", code)
			}
			if writable && code != http.StatusNoContent && code != http.StatusOK {
				t.Errorf("writable pause = %d, want success", code)
			}
		})
	}
}

func TestSemaphoresPageServesInitialData(t *testing.T) {
	f := newFixture(t, fixtureOptions{keys: []KeyInfo{{Key: "legacy-api", Capacity: 5}}})
	f.hold(t, "legacy-api", 5, 1, "<script>alert(1)</script>")
	code, body := f.do(t, "GET", "/semaphores", "")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	if !strings.Contains(body, `"key":"legacy-api"`) {
		t.Errorf("page lacks the initial data:\n%s", body)
	}
	if strings.Contains(body, "<script>alert(1)") {
		t.Error("a task ID is embedded unescaped")
	}
	if code, _ := f.do(t, "GET", "/", ""); code != 200 { // redirected to /semaphores
		t.Errorf("GET / = %d", code)
	}
}
