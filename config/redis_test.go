package config

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/tcpproxy"
	"github.com/fleetcap/fleetcap/semaphore"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

func TestRedisTarget(t *testing.T) {
	tests := []struct {
		name string
		cfg  RedisConfig
		want redisTarget
	}{
		{"embedded", RedisConfig{EmbeddedAddr: "127.0.0.1:6390"}, redisTarget{addrs: []string{"127.0.0.1:6390"}}},
		{"plain", RedisConfig{URL: "redis://h:6379"}, redisTarget{addrs: []string{"h:6379"}}},
		{"default port", RedisConfig{URL: "redis://h"}, redisTarget{addrs: []string{"h:6379"}}},
		{"user password db", RedisConfig{URL: "redis://alice:pw@h:7000/3"},
			redisTarget{addrs: []string{"h:7000"}, username: "alice", password: "pw", db: 3}},
		{"password only", RedisConfig{URL: "redis://:pw@h:7000/"}, redisTarget{addrs: []string{"h:7000"}, password: "pw"}},
		{"escaped password", RedisConfig{URL: "redis://u:p%40ss%2Fw@h"}, redisTarget{addrs: []string{"h:6379"}, username: "u", password: "p@ss/w"}},
		{"ipv6", RedisConfig{URL: "redis://[::1]:6380"}, redisTarget{addrs: []string{"[::1]:6380"}}},
		{"ipv6 default port", RedisConfig{URL: "redis://[::1]"}, redisTarget{addrs: []string{"[::1]:6379"}}},
		{"tls", RedisConfig{URL: "rediss://alice:pw@cache.example.com:6380/1"},
			redisTarget{addrs: []string{"cache.example.com:6380"}, username: "alice", password: "pw", db: 1, tls: true, serverName: "cache.example.com"}},
		{"sentinel", RedisConfig{URL: "redis-sentinel://u:pw@s1:26379,s2:26380/mymaster?db=2"},
			redisTarget{kind: kindSentinel, master: "mymaster", addrs: []string{"s1:26379", "s2:26380"}, username: "u", password: "pw", db: 2}},
		{"sentinel asynq style", RedisConfig{URL: "redis-sentinel://s1?master=m&sentinel_username=su&sentinel_password=sp"},
			redisTarget{kind: kindSentinel, master: "m", addrs: []string{"s1:26379"}, sentinelUsername: "su", sentinelPassword: "sp"}},
		{"cluster", RedisConfig{ClusterAddrs: []string{"c1:7000", "c2:7001"}}, redisTarget{kind: kindCluster, addrs: []string{"c1:7000", "c2:7001"}}},
		{"cluster with a login and TLS", RedisConfig{ClusterAddrs: []string{"rediss://u:pw@c1:7000", "rediss://u:pw@c2"}},
			redisTarget{kind: kindCluster, addrs: []string{"c1:7000", "c2:6379"}, username: "u", password: "pw", tls: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.target()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("target() = %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

// TestAsynqConnOptMakesOurClients: asynq's clients have the settings of
// NewClient (RESP2, calls bounded by their context, the URL's user and
// TLS).
func TestAsynqConnOptMakesOurClients(t *testing.T) {
	opt, err := RedisConfig{URL: "rediss://alice:pw@cache.example.com:6380/1"}.AsynqConnOpt()
	if err != nil {
		t.Fatal(err)
	}
	made := opt.MakeRedisClient()
	c, ok := made.(*redis.Client)
	if !ok {
		t.Fatalf("MakeRedisClient() is a %T, want *redis.Client", made)
	}
	defer c.Close()
	o := c.Options()
	if o.Protocol != 2 || !o.ContextTimeoutEnabled || o.Addr != "cache.example.com:6380" || o.Username != "alice" || o.DB != 1 ||
		o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example.com" {
		t.Errorf("asynq's client options: %#v", o)
	}
	opt, err = RedisConfig{ClusterAddrs: []string{"c1:7000"}}.AsynqConnOpt()
	if err != nil {
		t.Fatal(err)
	}
	cc, ok := opt.MakeRedisClient().(*redis.ClusterClient)
	if !ok {
		t.Fatalf("MakeRedisClient() on a cluster is not a *redis.ClusterClient")
	}
	defer cc.Close()
	if o := cc.Options(); o.Protocol != 2 || !o.ContextTimeoutEnabled || o.Username != "" || o.TLSConfig != nil {
		t.Errorf("asynq's cluster client options: %#v", o)
	}
	opt, err = RedisConfig{ClusterAddrs: []string{"rediss://u:pw@c1:7000", "rediss://u:pw@c2:7000"}}.AsynqConnOpt()
	if err != nil {
		t.Fatal(err)
	}
	cc, ok = opt.MakeRedisClient().(*redis.ClusterClient)
	if !ok {
		t.Fatalf("MakeRedisClient() on a cluster is not a *redis.ClusterClient")
	}
	defer cc.Close()
	if o := cc.Options(); o.Username != "u" || o.Password != "pw" || o.TLSConfig == nil || o.TLSConfig.ServerName != "" {
		t.Errorf("cluster client with a login and TLS: %#v", o)
	}
}

func TestNewClientKinds(t *testing.T) {
	for _, tt := range []struct {
		cfg  RedisConfig
		want any
	}{
		{RedisConfig{EmbeddedAddr: "127.0.0.1:1"}, &redis.Client{}},
		{RedisConfig{URL: "redis://h"}, &redis.Client{}},
		{RedisConfig{URL: "redis-sentinel://s1/m"}, &redis.Client{}}, // a failover client is a *redis.Client
		{RedisConfig{ClusterAddrs: []string{"c:1"}}, &redis.ClusterClient{}},
	} {
		c, err := tt.cfg.NewClient()
		if err != nil {
			t.Fatalf("%v: %v", tt.cfg, err)
		}
		if reflect.TypeOf(c) != reflect.TypeOf(tt.want) {
			t.Errorf("%v: NewClient() is a %T, want %T", tt.cfg, c, tt.want)
		}
		_ = c.Close()
	}
}

func TestEmbedded(t *testing.T) {
	for cfg, want := range map[*RedisConfig]bool{
		{}:                              true,
		{EmbeddedAddr: "x:1"}:           true,
		{URL: "redis://h"}:              false,
		{ClusterAddrs: []string{"h:1"}}: false,
	} {
		if got := cfg.Embedded(); got != want {
			t.Errorf("%v.Embedded() = %t, want %t", *cfg, got, want)
		}
	}
}

// TestSecretsNeverShown checks that a password never appears in an error
// or in a printed config.
func TestSecretsNeverShown(t *testing.T) {
	const secret = "s3cret"
	bad := []string{
		"http://alice:s3cret@h:6379",
		"redis://alice:s3cret@h:notaport",
		"redis://alice:s3cret@h:6379/notadb",
		"redis://alice:s3cret@h:6379/0?timeout=s3cret",
		"redis://alice:s3cret@",
		"redis://alice:s3/cret@h:6379", // unescaped '/' splits the password
		"redis://alice:s3?cret@h:6379", // so does '?'
		"redis://alice:s3#cret@h:6379",
		"redis://alice:s3cret@h:6379/0#frag",
		"redis:alice:s3cret@h",
		"alice:s3cret@h:6379",
		"redis-sentinel://alice:s3cret@s1:26379",
		"redis-sentinel://alice:s3cret@s1:26379/m?s3cret=1",
		"redis-sentinel://alice:pw@s1:x/m?sentinel_password=s3cret",
		"redis-sentinel://alice:s3cret@s1:26379/m?db=x",
		"redis://alice:s3cret@h:6379\x7f",
		"redis://alice:s3cret@[::1:6379",
	}
	for _, u := range bad {
		cfg := RedisConfig{URL: u}
		if _, err := cfg.AsynqConnOpt(); err == nil {
			t.Errorf("AsynqConnOpt(%q): no error", u)
		} else if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "cret") {
			t.Errorf("AsynqConnOpt(%q) error shows the password: %v", u, err)
		}
		if _, err := cfg.NewClient(); err == nil || strings.Contains(err.Error(), "cret") {
			t.Errorf("NewClient(%q) error = %v", u, err)
		}
		seeds := RedisConfig{ClusterAddrs: []string{"h:1", u}}
		if _, err := seeds.NewClient(); err == nil || strings.Contains(err.Error(), "cret") {
			t.Errorf("NewClient(cluster seed %q) error = %v", u, err)
		}
		if s := fmt.Sprintf("%v %#v", seeds, seeds); strings.Contains(s, "cret") {
			t.Errorf("printed cluster seeds show the password: %s", s)
		}
		_, err := ParseConfig(fmt.Appendf(nil, "redis: {url: %q, cluster_addrs: [\"h:1\"]}\n", u))
		if err == nil || strings.Contains(err.Error(), "cret") {
			t.Errorf("ParseConfig(url %q) error = %v", u, err)
		}
		if s := fmt.Sprintf("%v %+v %#v %s", cfg, cfg, cfg, cfg); strings.Contains(s, "cret") {
			t.Errorf("printing RedisConfig{URL: %q} shows the password: %s", u, s)
		}
	}
	// A type error on the url field must not echo it either.
	if _, err := ParseConfig([]byte("redis: {url: !!int \"redis://alice:s3cret@h\"}\n")); err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("ParseConfig(url !!int) error = %v", err)
	}

	in := `
redis: {url: "redis-sentinel://alice:s3cret@s1:26379/m?sentinel_password=s3cret"}
monitoring: {admin_token: s3cret}
`
	cfg, err := ParseConfig([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{
		fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg), fmt.Sprintf("%#v", cfg), fmt.Sprintf("%v", *cfg),
		fmt.Sprint(cfg.Redis), fmt.Sprint(cfg.Monitoring),
	} {
		if strings.Contains(s, secret) {
			t.Errorf("printed config shows a secret: %s", s)
		}
		if !strings.Contains(s, "alice") && !strings.Contains(s, "xxxxx") {
			t.Errorf("printed config lost the user name or the mask: %s", s)
		}
	}
	if s := fmt.Sprint(RedisConfig{URL: "redis://s3cret@h"}); strings.Contains(s, secret) {
		t.Errorf("a user name that may be a password is shown: %s", s)
	}
}

func TestRealRedisWithACLUser(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	admin := srv.Client()
	if err := admin.Do(ctx, "ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	// From now on only alice can log in: a client that drops the user name
	// (as asynq.ParseRedisURI does) fails.
	if err := admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
		t.Fatal(err)
	}

	cfg := RedisConfig{URL: "redis://alice:s3cret@" + srv.Addr() + "/3"}
	rdb, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Set(ctx, "fleetcap:test", "db3", 0).Err(); err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	check := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "alice", Password: "s3cret", DB: 3})
	defer check.Close()
	if v, err := check.Get(ctx, "fleetcap:test").Result(); err != nil || v != "db3" {
		t.Errorf("GET in db 3 = %q, %v", v, err)
	}

	info, opt := enqueueThrough(t, cfg, "test:acl", "as alice")
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	if got, err := insp.GetTaskInfo("default", info.ID); err != nil || got.Type != "test:acl" {
		t.Errorf("inspector as alice: %v, %v", got, err)
	}
	if n, err := check.Exists(ctx, "asynq:{default}:t:"+info.ID).Result(); err != nil || n != 1 {
		t.Errorf("the task is not in db 3: %d, %v", n, err)
	}

	// A wrong password fails without showing either password.
	wrong, err := RedisConfig{URL: "redis://alice:n0tit@" + srv.Addr()}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	err = wrong.Ping(ctx).Err()
	if err == nil || strings.Contains(err.Error(), "n0tit") || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("ping with a wrong password: %v", err)
	}
}

func TestRealRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three redis-server processes")
	}
	cluster := redistest.StartCluster(t, 3)
	cfg := RedisConfig{ClusterAddrs: cluster.Addrs()}
	ctx := context.Background()
	rdb, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	for i := range 10 {
		if err := rdb.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET on the cluster: %v", err)
		}
	}
	enqueueThrough(t, cfg, "test:cluster", "on the cluster")
}

// TestRealRedisClusterWithACLUser: cluster_addrs given as URLs log in to
// every node as their user, for the semaphore and for asynq alike.
func TestRealRedisClusterWithACLUser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three redis-server processes")
	}
	cluster := redistest.StartCluster(t, 3)
	ctx := context.Background()
	var seeds []string
	for _, n := range cluster.Nodes {
		admin := n.Client()
		if err := admin.Do(ctx, "ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
		// Only alice can log in from now on (the cluster bus needs no login).
		if err := admin.Do(ctx, "ACL", "SETUSER", "default", "off").Err(); err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, "redis://alice:s3cret@"+n.Addr())
	}
	cfg := RedisConfig{ClusterAddrs: seeds}
	rdb, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	for i := range 10 { // keys on every node
		if err := rdb.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET as alice on the cluster: %v", err)
		}
	}
	sem, err := semaphore.New(rdb, semaphore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	p, err := sem.TryAcquire(ctx, "acl-cluster", 1)
	if err != nil || p == nil {
		t.Fatalf("TryAcquire as alice on the cluster: %v, %v", p, err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	enqueueThrough(t, cfg, "test:cluster-acl", "as alice on the cluster")

	wrong, err := RedisConfig{ClusterAddrs: []string{"redis://alice:n0tit@" + cluster.Nodes[0].Addr()}}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := wrong.Set(ctx, "k0", 0, 0).Err(); err == nil || strings.Contains(err.Error(), "n0tit") {
		t.Errorf("SET with a wrong password: %v", err)
	}
}

// TestRealRedisMutualTLS: redis.tls gives the CA to trust and the client
// certificate a server with tls-auth-clients asks for, to the semaphore's
// client and asynq's alike.
func TestRealRedisMutualTLS(t *testing.T) {
	srv := redistest.StartTLS(t, "alice", "tls-pw-91b2", true)
	ctx := context.Background()
	cfg := RedisConfig{URL: srv.URL(), TLS: RedisTLSConfig{CAFile: srv.CAFile, CertFile: srv.ClientCertFile, KeyFile: srv.ClientKeyFile}}
	rdb, err := cfg.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("ping with a client certificate: %v", err)
	}
	enqueueThrough(t, cfg, "test:mtls", "with a client certificate")

	// Without the certificate the server refuses the connection.
	noCert, err := RedisConfig{URL: srv.URL(), TLS: RedisTLSConfig{CAFile: srv.CAFile}}.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer noCert.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := noCert.Ping(pctx).Err(); err == nil {
		t.Error("ping without a client certificate succeeded")
	}
}

// TestNewClientCallsEndAtTheirDeadline: a call to a Redis that does not
// answer (a blackholed connection) ends at its context's deadline, not at
// go-redis's dial or read timeout. The semaphore's lease renewal relies on
// it to learn of a lost seat before the server gives it away.
func TestNewClientCallsEndAtTheirDeadline(t *testing.T) {
	srv := redistest.Start(t)
	proxy, err := tcpproxy.New(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	for _, cfg := range []RedisConfig{{URL: "redis://" + proxy.Addr()}, {ClusterAddrs: []string{proxy.Addr()}}} {
		rdb, err := cfg.NewClient()
		if err != nil {
			t.Fatal(err)
		}
		proxy.Cut()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		err = rdb.Ping(ctx).Err()
		took := time.Since(start)
		cancel()
		_ = rdb.Close()
		proxy.Restore()
		if err == nil || took > time.Second {
			t.Errorf("%v: Ping through a blackhole with a 300ms deadline: %v after %s", cfg, err, took)
		}
	}
}

// enqueueThrough enqueues a task of type typ with an asynq client made
// from cfg's AsynqConnOpt, failing the test (the message says where: how)
// when it cannot; it returns the task and the connection option.
func enqueueThrough(t *testing.T, cfg RedisConfig, typ, how string) (*asynq.TaskInfo, asynq.RedisConnOpt) {
	t.Helper()
	opt, err := cfg.AsynqConnOpt()
	if err != nil {
		t.Fatal(err)
	}
	client := asynq.NewClient(opt)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := client.EnqueueContext(ctx, asynq.NewTask(typ, []byte(`{}`)))
	if err != nil {
		t.Fatalf("asynq enqueue %s: %v", how, err)
	}
	return info, opt
}
