package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Embedded reports whether the config asks for the embedded Redis: neither
// url nor cluster_addrs is set.
func (r RedisConfig) Embedded() bool {
	return r.URL == "" && len(r.ClusterAddrs) == 0
}

// DefaultEmbeddedFile is redis.embedded_file's default, relative to the
// config file's directory.
const DefaultEmbeddedFile = ".fleetcap/embedded.json"

// resolveEmbeddedFile defaults embedded_file (for the embedded Redis) and
// makes a relative one relative to configDir.
func (r *RedisConfig) resolveEmbeddedFile(configDir string) {
	if !r.Embedded() {
		return
	}
	if r.EmbeddedFile == "" {
		r.EmbeddedFile = DefaultEmbeddedFile
	}
	if !filepath.IsAbs(r.EmbeddedFile) {
		r.EmbeddedFile = filepath.Join(configDir, r.EmbeddedFile)
	}
}

// AsynqConnOpt returns asynq's connection option for the configured Redis.
// The clients asynq (and asynqmon) make with it are NewClient's, so they
// keep the URL's username (Redis ACLs), speak RESP2 and end calls at their
// context's deadline, like the semaphore's.
func (r RedisConfig) AsynqConnOpt() (asynq.RedisConnOpt, error) {
	t, err := r.target()
	if err != nil {
		return nil, err
	}
	return connOpt{t}, nil
}

// connOpt is an asynq.RedisConnOpt that makes clients with newClient.
type connOpt struct{ target redisTarget }

// MakeRedisClient returns a new client; whoever asked for it closes it.
func (o connOpt) MakeRedisClient() any { return o.target.newClient() }

// NewClient returns a go-redis client for the configured Redis. The caller
// closes it.
//
// Its calls end at their context's deadline (ContextTimeoutEnabled): the
// semaphore renews a lease with a call bounded by the lease's local
// deadline, and must learn that the seat is lost by then. Without it
// go-redis bounds a call by its own dial and read timeouts only, and a
// partitioned worker learned of its lost seat 3-5 s after the server had
// given the seat to another worker (TestPartition).
//
// It speaks RESP2: with RESP3 go-redis checks every reply for push
// notifications, which cost about a sixth of a worker's CPU in S2.
func (r RedisConfig) NewClient() (redis.UniversalClient, error) {
	t, err := r.target()
	if err != nil {
		return nil, err
	}
	return t.newClient(), nil
}

func (t redisTarget) newClient() redis.UniversalClient {
	switch t.kind {
	case kindSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			ContextTimeoutEnabled: true,
			Protocol:              2,
			MasterName:            t.master,
			SentinelAddrs:         t.addrs,
			SentinelUsername:      t.sentinelUsername,
			SentinelPassword:      t.sentinelPassword,
			Username:              t.username,
			Password:              t.password,
			DB:                    t.db,
			TLSConfig:             t.tlsConfig(),
		})
	case kindCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{
			ContextTimeoutEnabled: true,
			Protocol:              2,
			Addrs:                 t.addrs,
			Username:              t.username,
			Password:              t.password,
			TLSConfig:             t.tlsConfig(),
		})
	default:
		return redis.NewClient(&redis.Options{
			ContextTimeoutEnabled: true,
			Protocol:              2,
			Addr:                  t.addrs[0],
			Username:              t.username,
			Password:              t.password,
			DB:                    t.db,
			TLSConfig:             t.tlsConfig(),
		})
	}
}

type targetKind int

const (
	kindSingle targetKind = iota // one server; also the embedded Redis
	kindSentinel
	kindCluster
)

// redisTarget is a parsed connection setting.
type redisTarget struct {
	kind               targetKind
	addrs              []string // the server, the sentinels or the cluster seeds
	username, password string
	db                 int
	tls                bool
	serverName         string // TLS server name
	master             string // sentinel master name
	sentinelUsername   string
	sentinelPassword   string
	rootCAs            *x509.CertPool    // nil: the system's
	clientCerts        []tls.Certificate // presented when the server asks
}

func (t redisTarget) tlsConfig() *tls.Config {
	if !t.tls {
		return nil
	}
	return &tls.Config{ServerName: t.serverName, MinVersion: tls.VersionTLS12, RootCAs: t.rootCAs, Certificates: t.clientCerts}
}

// tlsFileError is a bad redis.tls setting; field names it.
type tlsFileError struct {
	field string
	err   error
}

func (e *tlsFileError) Error() string {
	if e.field == "" {
		return fmt.Sprintf("tls: %v", e.err)
	}
	return fmt.Sprintf("tls.%s: %v", e.field, e.err)
}

// loadTLSFiles reads the CA and client certificate files of c, which only
// a rediss:// target may use.
func (t *redisTarget) loadTLSFiles(c RedisTLSConfig) error {
	if c == (RedisTLSConfig{}) {
		return nil
	}
	if !t.tls {
		return &tlsFileError{"", errors.New("set for a connection without TLS; use a rediss:// url or rediss:// cluster seeds")}
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return &tlsFileError{"ca_file", err}
		}
		t.rootCAs = x509.NewCertPool()
		if !t.rootCAs.AppendCertsFromPEM(pem) {
			return &tlsFileError{"ca_file", fmt.Errorf("no PEM certificate in %s", c.CAFile)}
		}
	}
	switch {
	case c.CertFile == "" && c.KeyFile == "":
	case c.CertFile == "":
		return &tlsFileError{"cert_file", errors.New("key_file is set without it")}
	case c.KeyFile == "":
		return &tlsFileError{"key_file", errors.New("cert_file is set without it")}
	default:
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return &tlsFileError{"cert_file", err}
		}
		t.clientCerts = []tls.Certificate{cert}
	}
	return nil
}

// target parses the config into one connection setting.
func (r RedisConfig) target() (redisTarget, error) {
	t, err := r.endpoint()
	if err != nil {
		return redisTarget{}, err
	}
	if err := t.loadTLSFiles(r.TLS); err != nil {
		return redisTarget{}, fmt.Errorf("redis.%w", err)
	}
	return t, nil
}

// endpoint parses where to connect, without the TLS files.
func (r RedisConfig) endpoint() (redisTarget, error) {
	switch {
	case r.URL != "" && len(r.ClusterAddrs) > 0:
		return redisTarget{}, errors.New("redis: set either url or cluster_addrs, not both")
	case len(r.ClusterAddrs) > 0:
		return parseClusterSeeds(r.ClusterAddrs)
	case r.URL != "":
		t, err := parseRedisURL(r.URL)
		if err != nil {
			return redisTarget{}, fmt.Errorf("redis.url: %w", err)
		}
		return t, nil
	}
	addr := r.EmbeddedAddr
	if addr == "" {
		addr = DefaultEmbeddedAddr
	}
	return redisTarget{kind: kindSingle, addrs: []string{addr}}, nil
}

// seedError is a bad cluster_addrs entry; its index names the field.
type seedError struct {
	index int
	err   error
}

func (e *seedError) Error() string { return fmt.Sprintf("cluster_addrs[%d]: %v", e.index, e.err) }

// parseClusterSeeds parses cluster_addrs. An entry is host:port, or a
// redis:// or rediss:// URL ([user:password@]host[:port]) for a cluster
// that needs a login or TLS; URL entries must agree on scheme, user and
// password (one login for the whole cluster). With TLS each node's
// certificate is checked against that node's own host name.
func parseClusterSeeds(seeds []string) (redisTarget, error) {
	t := redisTarget{kind: kindCluster}
	for i, seed := range seeds {
		s, err := parseClusterSeed(seed)
		if err != nil {
			return redisTarget{}, &seedError{i, err}
		}
		if i > 0 && (s.tls != t.tls || s.username != t.username || s.password != t.password) {
			return redisTarget{}, &seedError{i, errors.New("every seed must have the scheme, user and password of cluster_addrs[0]")}
		}
		t.addrs = append(t.addrs, s.addrs[0])
		t.tls, t.username, t.password = s.tls, s.username, s.password
	}
	return t, nil
}

func parseClusterSeed(seed string) (redisTarget, error) {
	if !strings.Contains(seed, "://") {
		// Not quoted: a mistyped URL may hold a password.
		if checkHostPort(seed, 1) != nil {
			return redisTarget{}, fmt.Errorf("want host:port or %s", urlShape)
		}
		return redisTarget{addrs: []string{seed}}, nil
	}
	s, err := parseRedisURL(seed)
	switch {
	case err != nil:
		return redisTarget{}, err
	case s.kind != kindSingle:
		return redisTarget{}, errors.New("a cluster seed is host:port or a redis:// or rediss:// URL")
	case s.db != 0:
		return redisTarget{}, errors.New("a Redis Cluster has database 0 only")
	}
	s.serverName = "" // each node is checked by its own name
	return s, nil
}

// urlShape is the accepted URL syntax, quoted in errors instead of the URL
// (which may hold a password).
const urlShape = "redis[s]://[user:password@]host[:port][/db] or redis-sentinel://[user:password@]host:port[,host:port...]/master[?db=N]"

// parseRedisURL parses a redis://, rediss:// or redis-sentinel:// URL. Its
// errors never quote the URL or any part of it but the scheme, since
// a mistyped URL may put the password anywhere.
func parseRedisURL(raw string) (redisTarget, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return redisTarget{}, fmt.Errorf("not a valid URL; want %s", urlShape)
	}
	switch u.Scheme {
	case "redis", "rediss":
		return parseServerURL(u, raw)
	case "redis-sentinel":
		t, err := parseSentinelURL(u)
		if err != nil {
			return redisTarget{}, err
		}
		if u.User != nil {
			t.username = u.User.Username()
			t.password, _ = u.User.Password()
		}
		return t, nil
	case "":
		return redisTarget{}, fmt.Errorf("missing scheme; want %s", urlShape)
	default:
		return redisTarget{}, fmt.Errorf("unsupported scheme %q; want redis, rediss or redis-sentinel", u.Scheme)
	}
}

// parseServerURL parses redis://[user:password@]host[:port][/db] (u is raw
// parsed) with go-redis's own parser. Beside it, it refuses what go-redis
// would accept but fleetcap could not honour or the user cannot have meant:
// a missing host (go-redis would take localhost), query parameters (the
// clients are built from the fields below, not from go-redis's options), a
// port out of range and a negative database.
func parseServerURL(u *url.URL, raw string) (redisTarget, error) {
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return redisTarget{}, fmt.Errorf("missing host; want %s", urlShape)
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return redisTarget{}, errors.New("query parameters and fragments are not supported in redis:// and rediss:// URLs")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return redisTarget{}, errors.New("port must be a number in 1..65535")
		}
	}
	opt, err := redis.ParseURL(raw)
	if err != nil || opt.DB < 0 {
		// With the scheme, host and query checked above, go-redis refuses
		// only the path; its message quotes it, so it is not passed on.
		return redisTarget{}, errors.New("the database number must be a non-negative integer")
	}
	t := redisTarget{kind: kindSingle, addrs: []string{opt.Addr}, username: opt.Username, password: opt.Password, db: opt.DB}
	if opt.TLSConfig != nil {
		t.tls = true
		t.serverName = opt.TLSConfig.ServerName
	}
	return t, nil
}

// parseSentinelURL parses
// redis-sentinel://[user:password@]host:port[,host:port...]/master[?db=N].
// The user and password authenticate to the master and replicas; the query
// parameters sentinel_username and sentinel_password to the sentinels.
// master may also be given as ?master=NAME, as asynq.ParseRedisURI reads it.
func parseSentinelURL(u *url.URL) (redisTarget, error) {
	if u.Opaque != "" || u.Host == "" {
		return redisTarget{}, fmt.Errorf("missing sentinel addresses; want %s", urlShape)
	}
	t := redisTarget{kind: kindSentinel}
	for h := range strings.SplitSeq(u.Host, ",") {
		addr, err := hostPortDefault(h, "26379")
		if err != nil {
			return redisTarget{}, fmt.Errorf("sentinel address: %w", err)
		}
		t.addrs = append(t.addrs, addr)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil || u.Fragment != "" {
		return redisTarget{}, errors.New("malformed query; allowed parameters: master, db, sentinel_username, sentinel_password")
	}
	for name := range q {
		switch name {
		case "master", "db", "sentinel_username", "sentinel_password":
		default:
			return redisTarget{}, errors.New("unsupported query parameter; allowed: master, db, sentinel_username, sentinel_password")
		}
	}
	t.master = strings.Trim(u.Path, "/")
	if m := q.Get("master"); m != "" {
		if t.master != "" && t.master != m {
			return redisTarget{}, errors.New("the master name is given twice, in the path and in ?master=")
		}
		t.master = m
	}
	if t.master == "" || strings.Contains(t.master, "/") {
		return redisTarget{}, fmt.Errorf("want one master name as the path; want %s", urlShape)
	}
	if d := q.Get("db"); d != "" {
		if t.db, err = parseDB(d); err != nil {
			return redisTarget{}, err
		}
	}
	t.sentinelUsername = q.Get("sentinel_username")
	t.sentinelPassword = q.Get("sentinel_password")
	return t, nil
}

// hostPortDefault checks host[:port] and adds the default port.
func hostPortDefault(hostport, defaultPort string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		// No port: a host name, an IPv4 address or an IPv6 address in brackets.
		host, port = hostport, defaultPort
		if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
			host = host[1 : len(host)-1]
		} else if strings.Contains(host, ":") {
			return "", errors.New("malformed host:port")
		}
	}
	if host == "" || strings.ContainsAny(host, "[]/@ ") {
		return "", errors.New("malformed host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", errors.New("port must be a number in 1..65535")
	}
	return net.JoinHostPort(host, port), nil
}

// parseDB parses a database number.
func parseDB(s string) (int, error) {
	db, err := strconv.Atoi(s)
	if err != nil || db < 0 || db > 1<<20 {
		return 0, errors.New("the database number must be a non-negative integer")
	}
	return db, nil
}
