// Package redistest starts private redis-server processes for tests: one
// server on a free loopback port, or a small Redis Cluster, each owned by the
// test so that it can be stopped, killed or restarted.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by a test.
type Server struct {
	tb   testing.TB
	dir  string
	port int
	args []string

	conf     string      // sentinel: the config file (sentinel rewrites it)
	tlsCfg   *tls.Config // set: the server speaks only TLS on port
	username string      // set: readiness checks and Client log in
	password string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Option adds redis-server command-line arguments, such as
// []string{"--appendonly", "yes"}.
type Option []string

// Start launches redis-server on a free loopback port and stops it when the
// test ends. It fails the test when redis-server is missing: the tests of
// this project run against a real server.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s := &Server{tb: tb, dir: tb.TempDir(), port: FreePort(tb)}
	for _, o := range opts {
		s.args = append(s.args, o...)
	}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the server's TCP port.
func (s *Server) Port() int { return s.port }

// URL is a redis:// URL for the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Client returns a go-redis client for the server, closed at test end.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(s.options())
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// options are the client options that reach the server.
func (s *Server) options() *redis.Options {
	return &redis.Options{Addr: s.Addr(), TLSConfig: s.tlsCfg, Username: s.username, Password: s.password}
}

// Log is the server's log file so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

func (s *Server) start() {
	s.tb.Helper()
	var args []string
	switch {
	case s.conf != "":
		args = []string{s.conf, "--sentinel"}
	default:
		port := []string{"--port", strconv.Itoa(s.port)}
		if s.tlsCfg != nil {
			port = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}
		}
		args = append(port,
			"--bind", "127.0.0.1",
			"--dir", s.dir,
			"--save", "",
			"--appendonly", "no",
			"--logfile", filepath.Join(s.dir, "redis.log"),
		)
	}
	args = append(args, s.args...)
	cmd := exec.Command("redis-server", args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("redistest: start redis-server (install the Debian package redis-server): %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	if err := waitReady(s.options(), 10*time.Second); err != nil {
		s.tb.Fatalf("redistest: redis-server on %s: %v\n%s", s.Addr(), err, s.Log())
	}
}

// Stop shuts the server down and waits for it to exit. It is a no-op when
// the server is not running.
func (s *Server) Stop() { s.signal(syscall.SIGTERM) }

// Kill ends the server with SIGKILL, as a crash would.
func (s *Server) Kill() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	_ = cmd.Wait()
}

// Restart stops the server and starts it again on the same port and
// directory (with AOF on, the data survives).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

// StartAgain starts a stopped or killed server on the same port.
func (s *Server) StartAgain() {
	s.tb.Helper()
	s.start()
}

// WaitReady waits until a Redis server at addr answers PING and has loaded
// its data.
func WaitReady(addr string, within time.Duration) error {
	return waitReady(&redis.Options{Addr: addr}, within)
}

func waitReady(opt *redis.Options, within time.Duration) error {
	deadline := time.Now().Add(within)
	o := *opt
	o.MaxRetries, o.DialTimeout = -1, 200*time.Millisecond
	c := redis.NewClient(&o)
	defer c.Close()
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("not ready after %s: %w", within, err)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, and
// whose cluster bus port (port+10000) is free too.
func FreePort(tb testing.TB) int {
	tb.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("redistest: free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err != nil {
			continue
		}
		_ = bus.Close()
		return port
	}
	tb.Fatalf("redistest: no free port pair found")
	return 0
}

// Cluster is a Redis Cluster of masters without replicas, owned by a test.
type Cluster struct {
	Nodes []*Server
}

// StartCluster starts n (at least 3) cluster-enabled servers and joins them
// with redis-cli --cluster create.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c := &Cluster{}
	addrs := make([]string, 0, n)
	for range n {
		s := Start(tb, Option{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"})
		c.Nodes = append(c.Nodes, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitOK(20 * time.Second); err != nil {
		tb.Fatalf("redistest: cluster: %v", err)
	}
	return c
}

// Addrs lists the nodes' host:port.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// Client returns a go-redis cluster client, closed at test end.
func (c *Cluster) Client(tb testing.TB) *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

func (c *Cluster) waitOK(within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ok := true
		for _, n := range c.Nodes {
			out, err := exec.Command("redis-cli", "-p", strconv.Itoa(n.port), "cluster", "info").Output()
			if err != nil || !clusterStateOK(string(out)) {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("cluster_state not ok after %s", within)
}

func clusterStateOK(info string) bool {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "cluster_state:ok" {
			return true
		}
	}
	return false
}

// StartDetached starts a private redis-server outside any test, for
// TestMain (examples need a server before any test runs). Call stop when
// the tests are done.
func StartDetached() (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return "", nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, "redis.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("redistest: start redis-server (install the Debian package redis-server): %w", err)
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = os.RemoveAll(dir)
	}
	if err := WaitReady(addr, 10*time.Second); err != nil {
		stop()
		return "", nil, err
	}
	return addr, stop, nil
}

// RunMain is a TestMain for packages whose examples need a Redis: it
// starts a private redis-server (StartDetached), stores its address in
// *addr, runs the tests, stops the server and exits with the tests' code.
func RunMain(m *testing.M, addr *string) {
	a, stop, err := StartDetached()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*addr = a
	code := m.Run()
	stop()
	os.Exit(code)
}

// StartWithUser is Start with the default user off and an ACL user
// username/password allowed everything; the readiness check and Client log
// in as that user.
func StartWithUser(tb testing.TB, username, password string, opts ...Option) *Server {
	tb.Helper()
	s := &Server{tb: tb, dir: tb.TempDir(), port: FreePort(tb), username: username, password: password,
		args: []string{"--user", "default", "off", "--user", username, "on", ">" + password, "~*", "&*", "+@all"}}
	for _, o := range opts {
		s.args = append(s.args, o...)
	}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

// CommandCalls reads INFO commandstats of rdb's server: how many times it
// ran each command (lower case, "evalsha", "zadd", ...) since its stats
// were reset. Call it from the test's goroutine: it fails tb on an error.
func CommandCalls(tb testing.TB, rdb redis.UniversalClient) map[string]int {
	tb.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatalf("redistest: INFO commandstats: %v", err)
	}
	calls := map[string]int{}
	for line := range strings.Lines(info) {
		name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
		if err != nil {
			tb.Fatalf("redistest: commandstats line %q: %v", line, err)
		}
		calls[name] = n
	}
	return calls
}
