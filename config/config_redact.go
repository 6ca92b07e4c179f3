package config

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// redacted replaces a secret in String and GoString output.
const redacted = "xxxxx"

// String formats the section with the URL's passwords masked, so that a
// logged or printed config never shows them.
func (r RedisConfig) String() string {
	return fmt.Sprintf("{url:%s cluster_addrs:%v embedded_addr:%s tls:%+v}", redactURL(r.URL), redactSeeds(r.ClusterAddrs), r.EmbeddedAddr, r.TLS)
}

// GoString is String for %#v.
func (r RedisConfig) GoString() string {
	return fmt.Sprintf("config.RedisConfig{URL:%q, ClusterAddrs:%#v, EmbeddedAddr:%q, TLS:%#v}", redactURL(r.URL), redactSeeds(r.ClusterAddrs), r.EmbeddedAddr, r.TLS)
}

// redactSeeds masks the passwords of cluster_addrs entries that are URLs,
// and hides whole any other entry with a user part (a mistyped URL).
func redactSeeds(seeds []string) []string {
	if seeds == nil {
		return nil
	}
	out := make([]string, len(seeds))
	for i, s := range seeds {
		switch {
		case strings.Contains(s, "://"):
			out[i] = redactURL(s)
		case strings.Contains(s, "@"):
			out[i] = redacted
		default:
			out[i] = s
		}
	}
	return out
}

// String formats the section with the admin token masked.
func (m MonitoringConfig) String() string {
	return fmt.Sprintf("{addr:%s admin_token:%s asynqmon_read_only:%t}", m.Addr, redactSecret(m.AdminToken), m.ReadOnly())
}

// GoString is String for %#v.
func (m MonitoringConfig) GoString() string {
	return fmt.Sprintf("config.MonitoringConfig{Addr:%q, AdminToken:%q, AsynqmonReadOnly:%t}", m.Addr, redactSecret(m.AdminToken), m.ReadOnly())
}

// redactURL masks the password of a Redis URL (or a user name without a
// password), its sentinel_password parameter and any unknown parameter. A URL that does not parse is hidden whole: its password could
// be anywhere in it.
func redactURL(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return "(malformed URL hidden)"
	}
	if u.User != nil {
		if _, hasPassword := u.User.Password(); !hasPassword {
			// "redis://secret@host" is a common slip for ":secret@".
			u.User = url.User(redacted)
		}
	}
	if u.RawQuery != "" {
		q, err := url.ParseQuery(u.RawQuery)
		for k := range q {
			switch k {
			case "master", "db", "sentinel_username":
			case "sentinel_password":
				q.Set(k, redacted)
			default:
				err = errors.New("unknown parameter") // may be anything
			}
		}
		u.RawQuery = q.Encode()
		if err != nil {
			u.RawQuery = redacted
		}
	}
	u.Fragment, u.RawFragment = "", ""
	return u.Redacted()
}

func redactSecret(s string) string {
	if s == "" {
		return ""
	}
	return redacted
}
