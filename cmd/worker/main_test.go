package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/syncbuf"
)

func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBadInput: bad flags, arguments and configs exit 2 with a message that
// says what is wrong, before anything starts.
func TestBadInput(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--nope"}, "flag provided but not defined"},
		{"extra argument", []string{"--config", "x.yaml", "extra"}, "unexpected arguments"},
		{"missing config", []string{"--config", filepath.Join(t.TempDir(), "none.yaml")}, "no such file"},
		{"unknown field", []string{"--config", writeConfig(t, "worker:\n  concurency: 3\n")}, "concurency"},
		{"capacity 0", []string{"--config", writeConfig(t, "tasks:\n  report:fetch:\n    semaphore: {key: a, capacity: 0}\n")}, "capacity"},
		{"bad duration", []string{"--config", writeConfig(t, "worker:\n  shutdown_timeout: soon\n")}, "shutdown_timeout"},
		{"concurrency 0", []string{"--config", writeConfig(t, "worker:\n  concurrency: 0\n")}, "worker.concurrency: must be >= 1, got 0"},
		{"shutdown_timeout 0s", []string{"--config", writeConfig(t, "worker:\n  shutdown_timeout: 0s\n")}, "worker.shutdown_timeout: must be a duration > 0, got 0s"},
		{"ttl 0s", []string{"--config", writeConfig(t, "tasks:\n  report:fetch:\n    semaphore: {capacity: 1, ttl: 0s}\n")}, `tasks["report:fetch"].semaphore.ttl: must be at least 1ms, got 0s`},
		{"burst 0", []string{"--config", writeConfig(t, "tasks:\n  report:fetch:\n    rate_limits: [{rate: 5, per: 1s, burst: 0}]\n")}, `tasks["report:fetch"].rate_limits[0].burst: must be >= 1, got 0`},
		{"cost 0", []string{"--config", writeConfig(t, "tasks:\n  report:fetch:\n    rate_limits: [{rate: 5, per: 1s, cost: 0}]\n")}, `tasks["report:fetch"].rate_limits[0].cost: must be >= 1, got 0`},
		{"unknown mode", []string{"--config", writeConfig(t, "tasks:\n  report:fetch:\n    semaphore: {capacity: 1, mode: hurry}\n")}, "mode"},
		{"two capacities for one key", []string{"--config", writeConfig(t, "tasks:\n  report:fetch:\n    semaphore: {key: a, capacity: 1}\n  webhook:deliver:\n    semaphore: {key: a, capacity: 2}\n")}, "capacit"},
		{"task type without a handler", []string{"--config", writeConfig(t, "tasks:\n  image:resize:\n    semaphore: {capacity: 1}\n")}, "image:resize"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := exitCode(run(context.Background(), c.args, &stdout, &stderr), &stderr)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), c.want) {
				t.Fatalf("stderr %q does not say %q", stderr.String(), c.want)
			}
			if stdout.Len() != 0 {
				t.Fatalf("printed %q though it did not start", stdout.String())
			}
		})
	}
}

// TestRunsAndStops: with a good config the worker prints where its pages
// are and exits 0 when its context ends (as on SIGTERM).
func TestRunsAndStops(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeConfig(t, "redis:\n  url: "+srv.URL()+"\nmonitoring:\n  addr: 127.0.0.1:0\n")
	_, stop := startWorker(t, cfg)
	stop()
}

// startWorker runs the worker with the config file at path until stop,
// which fails the test unless the worker exits 0. It returns the base URL
// of the monitoring server, once the worker has printed it.
func startWorker(t *testing.T, path string) (base string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncbuf.Buffer
	done := make(chan int, 1)
	out := &syncbuf.Buffer{}
	go func() { done <- exitCode(run(ctx, []string{"--config", path}, out, &stderr), &stderr) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "/semaphores\n") {
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no page addresses printed: %q; stderr:\n%s", out.String(), stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, rest, _ := strings.Cut(out.String(), "semaphores: ")
	base, _, _ = strings.Cut(rest, "/semaphores")
	return base, func() {
		t.Helper()
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit code %d; stderr:\n%s", code, stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatal("worker did not stop")
		}
	}
}

// TestAnotherLayoutExits2: on a Redis where a process of another build's
// layout is live, the worker does not start: exit 2, and a message naming
// both layouts and what to do.
func TestAnotherLayoutExits2(t *testing.T) {
	srv := redistest.Start(t)
	newer := layout.Version + 1
	other, err := layout.Claim(context.Background(), srv.Client(), layout.Options{Role: "worker", Version: newer})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	cfg := writeConfig(t, "redis:\n  url: "+srv.URL()+"\nmonitoring:\n  addr: 127.0.0.1:0\n")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := exitCode(run(ctx, []string{"--config", cfg}, &stdout, &stderr), &stderr)
	if code != 2 || stdout.Len() != 0 {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s\nwant exit 2 and nothing printed", code, stdout.String(), stderr.String())
	}
	for _, want := range []string{
		fmt.Sprintf("worker: fleetcap: this build speaks Redis layout %d, but 1 process(es) of layout %d", layout.Version, newer),
		other.Name(), fmt.Sprintf("stop every process of the layout-%d build", newer),
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr %q does not say %q", stderr.String(), want)
		}
	}
}
