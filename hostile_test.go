// Hostile input: oversized payloads, secrets in logs and errors, and the
// monitoring server's guards, against the real commands.
package fleetcap_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/syncbuf"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// runCmd runs a command to its end (at most 60 s) and returns its exit
// code and everything it printed.
func runCmd(t *testing.T, stdin io.Reader, env []string, bin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s %q: %v", bin, args, err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestEnqueueRejectsOversizedInput: a 10 MiB payload on stdin, a 100 KiB
// payload argument and a payload whose semaphore key would render past its
// bound exit 2 with a short message, and nothing is enqueued.
func TestEnqueueRejectsOversizedInput(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeFile(t, "fleet.yaml", reportConfig(fmt.Sprintf("  url: %q", srv.URL()), 2, 2)+
		"  webhook:deliver:\n    semaphore:\n      key: \"hooks:{tenant_id}\"\n      capacity: 2\n")
	huge := `{"tenant_id":"acme","report":"` + strings.Repeat("x", 10<<20) + `"}` + "\n"
	big := `{"tenant_id":"acme","report":"` + strings.Repeat("x", 100<<10) + `"}`
	cases := []struct {
		name  string
		stdin io.Reader
		args  []string
	}{
		{"10 MiB on stdin", strings.NewReader(huge), []string{"report:fetch"}},
		{"10 MiB on stdin among good lines", strings.NewReader(`{"tenant_id":"a"}` + "\n" + huge + `{"tenant_id":"b"}` + "\n"), []string{"report:fetch"}},
		{"100 KiB argument", nil, []string{"report:fetch", big}},
		{"100 KiB argument, many times", nil, []string{"--count", "1000", "report:fetch", big}},
		{"100 KiB tenant in a key template", nil, []string{"webhook:deliver", `{"tenant_id":"` + strings.Repeat("t", 100<<10) + `","url":"https://h.example/x","event":"e"}`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := runCmd(t, tc.stdin, nil, enqueueBin, append([]string{"--config", cfg}, tc.args...)...)
			if code != 2 || stdout != "" {
				t.Fatalf("exit %d, stdout %q; want exit 2 and no task ID", code, stdout)
			}
			if len(stderr) > 2000 {
				t.Fatalf("a %d-byte message: it echoes the input", len(stderr))
			}
			t.Logf("exit 2 in %s: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr))
		})
	}
	if n, err := srv.Client().DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys in Redis (%v): something was enqueued", n, err)
	}
}

// process is a command running in the background, its output captured.
type process struct {
	cmd *exec.Cmd
	out syncbuf.Buffer
	end chan struct{}
	err error
}

// Output is what the process printed so far.
func (p *process) Output() string { return p.out.String() }

func startProcess(t *testing.T, env []string, bin string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(bin, args...), end: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.end) }()
	t.Cleanup(func() {
		select {
		case <-p.end:
		default:
			_ = p.cmd.Process.Kill()
			<-p.end
		}
	})
	return p
}

// TestSecretsNeverLogged runs the worker and the enqueue command with a
// Redis password and an admin token, through a normal run, a Redis outage,
// a wrong password, an unreachable server and a malformed URL, and finds
// neither secret in anything they print. Meanwhile it checks over HTTP
// that asynqmon is read-only and the admin API refuses a wrong token.
func TestSecretsNeverLogged(t *testing.T) {
	const password, token = "pw-S3cr3t-9f2a", "tok-Adm1n-71be"
	srv := redistest.StartWithUser(t, "fleet", password)
	url := fmt.Sprintf("redis://fleet:%s@%s", password, srv.Addr())
	cfg := writeFile(t, "fleet.yaml", reportConfig(fmt.Sprintf("  url: %q", url), 4, 2))
	env := []string{"FLEETCAP_ADMIN_TOKEN=" + token}
	var outputs []string
	leaks := func(what, out string) {
		t.Helper()
		for _, secret := range []string{password, token, "S3cr3t", "Adm1n"} {
			if strings.Contains(out, secret) {
				t.Errorf("%s printed a secret (%q):\n%s", what, secret, out)
			}
		}
		outputs = append(outputs, out)
	}

	w, base := startWorker(t, env, cfg)
	do := func(method, path, auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := do("GET", "/monitoring/api/queues", ""); code != http.StatusOK {
		t.Errorf("asynqmon queues: %d", code)
	}
	for _, path := range []string{"/monitoring/api/queues/default:pause", "/monitoring/api/queues/default/pending_tasks:batch_delete"} {
		if code, _ := do("POST", path, ""); code != http.StatusMethodNotAllowed {
			t.Errorf("read-only asynqmon: POST %s = %d, want 405", path, code)
		}
	}
	if code, _ := do("DELETE", "/monitoring/api/queues/default", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("read-only asynqmon: DELETE queue = %d, want 405", code)
	}
	for _, auth := range []string{"", "tok-wrong", token + "x"} {
		code, body := do("POST", "/api/semaphores/legacy-api/release-all", auth)
		if code != http.StatusUnauthorized {
			t.Errorf("release-all with token %q: %d, want 401", auth, code)
		}
		leaks("release-all answer", body)
	}
	if code, body := do("POST", "/api/semaphores/legacy-api/release-all", token); code != http.StatusOK {
		t.Errorf("release-all with the token: %d %s", code, body)
	}
	_, metrics := do("GET", "/metrics", "")
	leaks("/metrics", metrics)

	// Work, then an outage: the worker logs connection errors.
	code, stdout, stderr := runCmd(t, nil, nil, enqueueBin, "--config", cfg, "--count", "6", "report:fetch", `{"tenant_id":"acme","duration_ms":1500}`)
	if code != 0 {
		t.Fatalf("enqueue: exit %d: %s", code, stderr)
	}
	leaks("enqueue", stdout+stderr)
	waitfor.Condition(t, 20*time.Second, "seats taken", func() bool {
		_, body := do("GET", "/api/semaphores", "")
		return strings.Contains(body, `"used":2`)
	})
	srv.Stop()
	code, stdout, stderr = runCmd(t, nil, nil, enqueueBin, "--config", cfg, "report:fetch", `{"tenant_id":"acme"}`)
	if code == 0 {
		t.Error("enqueue with Redis down succeeded")
	}
	leaks("enqueue with Redis down", stdout+stderr)
	if code, body := do("GET", "/readyz", ""); code == http.StatusOK {
		t.Errorf("readyz with Redis down: %d", code)
	} else {
		leaks("/readyz", body)
	}
	waitfor.Condition(t, 20*time.Second, "the worker logs the outage", func() bool { return strings.Contains(w.Output(), "connection refused") })
	srv.StartAgain()
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.end:
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not stop on SIGTERM")
	}
	if w.err != nil {
		t.Errorf("worker exit: %v", w.err)
	}
	leaks("the worker", w.Output())
	t.Logf("worker output: %d lines, none with a secret", strings.Count(w.Output(), "\n"))

	// Failing starts.
	bad := map[string]string{
		"wrong password":     fmt.Sprintf("redis://fleet:%s-no@%s", password, srv.Addr()),
		"unreachable server": fmt.Sprintf("redis://fleet:%s@127.0.0.1:%d", password, redistest.FreePort(t)),
		"malformed URL":      fmt.Sprintf("redis://fleet:%s@127.0.0.1:port:x", password),
		"password as user":   fmt.Sprintf("redis://%s@%s", password, srv.Addr()),
		"unknown parameter":  fmt.Sprintf("redis-sentinel://127.0.0.1:1/m?sentinel_password=%s&x=%s", password, password),
	}
	for name, u := range bad {
		c := writeFile(t, "bad.yaml", reportConfig(fmt.Sprintf("  url: %q", u), 2, 2))
		code, stdout, stderr := runCmd(t, nil, env, workerBin, "--config", c)
		if code == 0 {
			t.Errorf("worker with %s: exit 0", name)
		}
		leaks("worker with "+name, stdout+stderr)
		code, stdout, stderr = runCmd(t, nil, env, enqueueBin, "--config", c, "report:fetch", `{"tenant_id":"acme"}`)
		if code == 0 {
			t.Errorf("enqueue with %s: exit 0", name)
		}
		leaks("enqueue with "+name, stdout+stderr)
		t.Logf("%s: worker and enqueue fail without the secret: %s", name, firstLine(stderr))
	}
	total := 0
	for _, o := range outputs {
		total += len(o)
	}
	t.Logf("%d outputs (%d bytes) searched for the secrets", len(outputs), total)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
