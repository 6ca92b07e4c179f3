// Package fleettest runs fleets of probe workers
// (internal/testutil/probeworker) as separate processes against one Redis,
// for the end-to-end tests and the benchmarks.
package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/syncbuf"
)

// Build compiles the probe worker into dir and returns its path; race
// builds it with the race detector.
func Build(dir string, race bool) (string, error) {
	return BuildCommand(dir, "github.com/fleetcap/fleetcap/internal/testutil/probeworker", race)
}

// BuildCommand compiles the main package pkg into dir (the binary is named
// after the package's last path element) and returns its path.
func BuildCommand(dir, pkg string, race bool) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	cmd := exec.Command("go", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("fleettest: go build %s: %v\n%s", pkg, err, out.String())
	}
	return bin, nil
}

// Proc is one probe worker process.
type Proc struct {
	Name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   *syncbuf.Buffer // stdout and stderr
	done  chan struct{}
	err   error
}

// Start launches a probe worker with the config file and extra flags. Its
// output goes to a buffer (Log). It returns once the worker is serving.
func Start(bin, name, config string, flags ...string) (*Proc, error) {
	return StartEnv(nil, bin, name, config, flags...)
}

// StartEnv is Start with extra environment variables (KEY=value) added to
// the test's own.
func StartEnv(env []string, bin, name, config string, flags ...string) (*Proc, error) {
	cmd := exec.Command(bin, append([]string{"--config", config}, flags...)...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	p := &Proc{Name: name, cmd: cmd, log: &syncbuf.Buffer{}, done: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	p.stdin = stdin
	cmd.Stderr = p.log
	ready := make(chan struct{})
	cmd.Stdout = &readyWriter{w: p.log, ready: ready}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("fleettest: %s exited at start: %v\n%s", name, p.err, p.Log())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("fleettest: %s not ready in 30s\n%s", name, p.Log())
	}
}

// Release lets a worker started with --hold serve.
func (p *Proc) Release() error {
	if _, err := io.WriteString(p.stdin, "serve\n"); err != nil {
		return fmt.Errorf("fleettest: release %s: %w", p.Name, err)
	}
	return nil
}

// Log is what the process printed so far.
func (p *Proc) Log() string { return p.log.String() }

// PID is the process ID.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Wait waits up to within for the process to exit and returns its exit
// error (nil for exit code 0).
func (p *Proc) Wait(within time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(within):
		return fmt.Errorf("fleettest: %s still running after %s", p.Name, within)
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Kill ends the process with SIGKILL and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Stop ends the process gracefully (SIGTERM), killing it after within.
func (p *Proc) Stop(within time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	if err := p.Wait(within); err != nil {
		p.Kill()
		return err
	}
	return nil
}

// readyWriter closes ready when the worker prints that it serves.
type readyWriter struct {
	w     *syncbuf.Buffer
	ready chan struct{}
	once  sync.Once
}

func (r *readyWriter) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("probeworker: ready")) {
		r.once.Do(func() { close(r.ready) })
	}
	return r.w.Write(b)
}

// Counters reads the probe counters of prefix.
type Counters struct {
	rdb redis.UniversalClient
	p   string
}

// NewCounters reads counters under prefix on rdb.
func NewCounters(rdb redis.UniversalClient, prefix string) *Counters {
	return &Counters{rdb: rdb, p: "{" + prefix + "}:"}
}

// Done is how many distinct tasks finished.
func (c *Counters) Done(ctx context.Context) (int, error) {
	n, err := c.rdb.SCard(ctx, c.p+"done").Result()
	return int(n), err
}

// IsDone reports whether the task with this ID finished.
func (c *Counters) IsDone(ctx context.Context, id string) (bool, error) {
	return c.rdb.SIsMember(ctx, c.p+"done", id).Result()
}

// Runs is how many runs finished (a task run twice counts twice).
func (c *Counters) Runs(ctx context.Context) (int, error) { return c.int(ctx, "runs") }

// ProbeOverhead is how long, on average, a finished probe held its seat
// beyond its payload's ms: a count-in slower than its work, its count-out
// and its timer's overshoot. Zero when none finished.
func (c *Counters) ProbeOverhead(ctx context.Context) (time.Duration, error) {
	m, err := c.rdb.HGetAll(ctx, c.p+"overhead").Result()
	if err != nil {
		return 0, err
	}
	if len(m) == 0 {
		return 0, nil
	}
	us, err := strconv.ParseInt(m["us"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("probe overhead: %w", err)
	}
	n, err := strconv.ParseInt(m["n"], 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("probe overhead: count %q", m["n"])
	}
	return time.Duration(us/n) * time.Microsecond, nil
}

// MaxInflight is the most probes that ran at once.
func (c *Counters) MaxInflight(ctx context.Context) (int, error) { return c.int(ctx, "max") }

// MaxInflightPerTenant is the most probes of each tenant that ran at once.
func (c *Counters) MaxInflightPerTenant(ctx context.Context) (map[string]int, error) {
	return c.maxima(ctx, "tmax")
}

// MaxInflightPerType is the most probes of each task type that ran at
// once.
func (c *Counters) MaxInflightPerType(ctx context.Context) (map[string]int, error) {
	return c.maxima(ctx, "typemax")
}

func (c *Counters) maxima(ctx context.Context, hash string) (map[string]int, error) {
	m, err := c.rdb.HGetAll(ctx, c.p+hash).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(m))
	for k, v := range m {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, err
		}
		out[k] = n
	}
	return out, nil
}

// forgetScript counts out the probes a killed process left counted in.
var forgetScript = redis.NewScript(`
local n = tonumber(redis.call('GET', KEYS[1] .. 'inflight:pid:' .. ARGV[1]) or '0')
redis.call('DECRBY', KEYS[1] .. 'inflight', n)
redis.call('DEL', KEYS[1] .. 'inflight:pid:' .. ARGV[1])
return n`)

// Forget counts out the probes that the killed process pid was running
// (it never will) and returns how many. Call it before their seats lapse,
// so that no probe starts in between.
func (c *Counters) Forget(ctx context.Context, pid int) (int, error) {
	return forgetScript.Run(ctx, c.rdb, []string{c.p}, pid).Int()
}

// Makespan is the time from the first probe's start to the last one's end.
func (c *Counters) Makespan(ctx context.Context) (time.Duration, error) {
	return c.makespan(ctx, "first", "last")
}

// MakespanOf is Makespan for the probes of one task type.
func (c *Counters) MakespanOf(ctx context.Context, taskType string) (time.Duration, error) {
	return c.makespan(ctx, "first:"+taskType, "last:"+taskType)
}

func (c *Counters) makespan(ctx context.Context, firstKey, lastKey string) (time.Duration, error) {
	first, err := c.int(ctx, firstKey)
	if err != nil {
		return 0, err
	}
	last, err := c.int(ctx, lastKey)
	if err != nil {
		return 0, err
	}
	return time.Duration(last-first) * time.Millisecond, nil
}

// MaxSlotsWaiting is the most slots that held a capped task which was not
// running at once, fleet-wide (counted by workers run with
// --slots-waiting).
func (c *Counters) MaxSlotsWaiting(ctx context.Context) (int, error) {
	return c.int(ctx, "waiting:max")
}

// TenantStart is a start of a probe of a tenant.
type TenantStart struct {
	Tenant string
	At     time.Time
}

// TenantStarts are the starts of the probes that named a tenant, in the
// order they were counted.
func (c *Counters) TenantStarts(ctx context.Context) ([]TenantStart, error) {
	vals, err := c.rdb.LRange(ctx, c.p+"tstarts", 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]TenantStart, len(vals))
	for i, v := range vals {
		tenant, at, _ := strings.Cut(v, "\t")
		us, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("tenant start %q: %w", v, err)
		}
		out[i] = TenantStart{Tenant: tenant, At: time.UnixMicro(us)}
	}
	return out, nil
}

// TenantLastEnds is when each tenant's last probe ended.
func (c *Counters) TenantLastEnds(ctx context.Context) (map[string]time.Time, error) {
	vals, err := c.rdb.HGetAll(ctx, c.p+"tlast").Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(vals))
	for tenant, v := range vals {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("tenant last end %q: %w", v, err)
		}
		out[tenant] = time.UnixMilli(ms)
	}
	return out, nil
}

// Pickups are the times from enqueue to handler start of the probes whose
// payload carried their enqueue time, in the order they started.
// Starts are the start times of every probe, in the order they were
// counted (the list {P}:starts).
func (c *Counters) Starts(ctx context.Context) ([]time.Time, error) {
	vals, err := c.rdb.LRange(ctx, c.p+"starts", 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]time.Time, len(vals))
	for i, v := range vals {
		us, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("start %q: %w", v, err)
		}
		out[i] = time.UnixMicro(us)
	}
	return out, nil
}

func (c *Counters) Pickups(ctx context.Context) ([]time.Duration, error) {
	vals, err := c.rdb.LRange(ctx, c.p+"pickup", 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]time.Duration, len(vals))
	for i, v := range vals {
		us, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pickup %q: %w", v, err)
		}
		out[i] = time.Duration(us) * time.Microsecond
	}
	return out, nil
}

func (c *Counters) int(ctx context.Context, name string) (int, error) {
	v, err := c.rdb.Get(ctx, c.p+name).Int()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return v, err
}

// WaitDone waits until n distinct tasks finished, or fails after within
// (or as soon as check returns an error).
func (c *Counters) WaitDone(ctx context.Context, n int, within time.Duration, check func() error) error {
	deadline := time.Now().Add(within)
	for {
		done, err := c.Done(ctx)
		if err == nil && done >= n {
			return nil
		}
		if check != nil {
			if err := check(); err != nil {
				return err
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("fleettest: %d of %d tasks done after %s (last error %v)", done, n, within, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Config is a probe fleet's config.yaml: the probe task type on queue
// (empty: "default") with the caps in capYAML (indented for
// tasks.probe).
func Config(redisURL string, concurrency int, capYAML string) string {
	return ConfigOn(redisURL, "default", concurrency, capYAML)
}

// ConfigOn is Config with the probes on a queue of their own.
func ConfigOn(redisURL, queue string, concurrency int, capYAML string) string {
	return ConfigTypes(redisURL, queue, concurrency, map[string]string{"probe": capYAML})
}

// ConfigTypes is a config with several probe task types (the probe worker
// serves every type its config declares), each on queue with the caps in
// its entry of capYAML (indented for tasks.<type>).
func ConfigTypes(redisURL, queue string, concurrency int, capYAML map[string]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "redis:\n  url: %q\nworker:\n  concurrency: %d\n  queues: {%q: 1}\n  shutdown_timeout: 5s\nmonitoring:\n  addr: 127.0.0.1:0\n", redisURL, concurrency, queue)
	b.WriteString("tasks:\n")
	for _, typ := range slices.Sorted(maps.Keys(capYAML)) {
		fmt.Fprintf(&b, "  %s:\n    queue: %q\n    max_retry: 3\n", typ, queue)
		b.WriteString(capYAML[typ])
	}
	return b.String()
}

// WriteConfig writes a config file into dir.
func WriteConfig(dir, content string) (string, error) {
	path := filepath.Join(dir, "fleet.yaml")
	return path, os.WriteFile(path, []byte(content), 0o600)
}
