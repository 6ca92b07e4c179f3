package rediskey_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// awkward are keys that a hash tag could choke on: braces, percent signs,
// escapes written out, and text that is no escape at all.
var awkward = []string{"plain", "}", "{", "{}", "}{", "}acme", "a}b{c", "tenant:{acme}", "a{b}c{d}",
	"%", "%25", "%7D", "%7B", "100%", "%%7D", "päth/ü"}

func TestHashTag(t *testing.T) {
	for key, want := range map[string]string{
		"legacy-api":    "legacy-api",
		"tenant:{acme}": "tenant:{acme%7D",
		"}":             "%7D",
		"{":             "{",
		"%7D":           "%257D",
		"100%":          "100%25",
	} {
		if got := rediskey.HashTag(key); got != want {
			t.Errorf("HashTag(%q) = %q, want %q", key, got, want)
		}
	}
}

// unescape undoes HashTag, or fails: that it always can, and gives the key
// back, is what makes two keys' tags differ.
func unescape(tag string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(tag); i++ {
		if tag[i] != '%' {
			b.WriteByte(tag[i])
			continue
		}
		switch {
		case strings.HasPrefix(tag[i:], "%25"):
			b.WriteByte('%')
		case strings.HasPrefix(tag[i:], "%7D"):
			b.WriteByte('}')
		default:
			return "", false
		}
		i += 2
	}
	return b.String(), true
}

// FuzzHashTag: a tag never holds "}" (it would end the tag early), and
// gives its key back: two different keys never share an escaped form.
func FuzzHashTag(f *testing.F) {
	for _, k := range awkward {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		tag := rediskey.HashTag(key)
		if strings.Contains(tag, "}") {
			t.Fatalf("HashTag(%q) = %q holds a }", key, tag)
		}
		if back, ok := unescape(tag); !ok || back != key {
			t.Fatalf("HashTag(%q) = %q reads back as %q (%v): another key could share it", key, tag, back, ok)
		}
	})
}

// TestOneSlotPerKeyOnACluster: on a 3-node Redis Cluster, every Redis key
// of one semaphore (seats, line and waiting room) and of one rate limit
// (its tokens and its room) carries the hash tag HashTag(key) and lies in
// that tag's slot, for keys with braces and percent signs too; the
// semaphore and the limit of one key escape it alike; and no two keys
// share a tag.
func TestOneSlotPerKeyOnACluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3).Client(t)
	ctx := context.Background()
	sem, err := semaphore.New(cl, semaphore.Options{Prefix: "t:sem:", OnWake: func(string, []string) {}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sem.Close() })
	lim, err := ratelimit.New(cl, ratelimit.Options{Prefix: "t:rl:"})
	if err != nil {
		t.Fatal(err)
	}
	room := semaphore.Room{Hold: time.Minute, Transit: time.Minute, TTL: time.Minute}
	limit := ratelimit.Limit{Rate: 1, Per: time.Hour, Burst: 1}
	tags := map[string]string{}
	for _, key := range awkward {
		tag := rediskey.HashTag(key)
		if other, ok := tags[tag]; ok {
			t.Fatalf("keys %q and %q share the tag %q", key, other, tag)
		}
		tags[tag] = key

		if _, err := sem.Acquire(ctx, key, 1, semaphore.WithHolder("h")); err != nil {
			t.Fatalf("key %q: Acquire: %v", key, err)
		}
		if _, err := sem.Park(ctx, key, 1, "q\x00task", room); err != nil {
			t.Fatalf("key %q: Park: %v", key, err)
		}
		if _, err := lim.Take(ctx, key, limit, 1); err != nil {
			t.Fatalf("key %q: Take: %v", key, err)
		}
		if _, err := sem.PacedRooms(false).Park(ctx, key, "q\x00task", time.Minute, false); err != nil {
			t.Fatalf("key %q: rate Park: %v", key, err)
		}

		names := allKeys(t, cl)
		slot := cl.ClusterKeySlot(ctx, tag).Val()
		var ofSem, ofLimit int
		for _, name := range names {
			switch {
			case strings.HasPrefix(name, "rate:t:rl:"), strings.HasPrefix(name, "t:sem:paced:"): // its tokens, its waiting room
				ofLimit++
			case strings.HasPrefix(name, "t:sem:"):
				ofSem++
			default:
				t.Fatalf("key %q: a Redis key %q of neither", key, name)
			}
			if got := clusterTag(name); got != tag {
				t.Errorf("key %q: Redis key %q hashes %q, want its tag %q", key, name, got, tag)
			}
			if got := cl.ClusterKeySlot(ctx, name).Val(); got != slot {
				t.Errorf("key %q: Redis key %q is in slot %d, want %d", key, name, got, slot)
			}
			if err := cl.Del(ctx, name).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if ofSem < 2 || ofLimit < 2 {
			t.Fatalf("key %q: %d Redis keys of the semaphore and %d of the limit, want at least 2 each: %q", key, ofSem, ofLimit, names)
		}
	}
}

// clusterTag is what Redis Cluster hashes of a key's name: what stands
// between its first "{" and the next "}" when that is not empty, else the
// whole name.
func clusterTag(name string) string {
	if i := strings.IndexByte(name, '{'); i >= 0 {
		if j := strings.IndexByte(name[i+1:], '}'); j > 0 {
			return name[i+1 : i+1+j]
		}
	}
	return name
}

// allKeys is every key of every master of the cluster.
func allKeys(t *testing.T, cl *redis.ClusterClient) []string {
	t.Helper()
	var mu sync.Mutex
	var all []string
	err := cl.ForEachMaster(context.Background(), func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "*").Result()
		mu.Lock()
		all = append(all, keys...)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

func TestPrefixOrDefault(t *testing.T) {
	for _, c := range []struct {
		in, want string
		bad      bool
	}{{"", rediskey.DefaultPrefix, false}, {"team-a:", "team-a:", false}, {"team{a}:", "", true}} {
		got, err := rediskey.PrefixOrDefault(c.in)
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("PrefixOrDefault(%q) = %q, %v; want %q (error: %v)", c.in, got, err, c.want, c.bad)
		}
	}
}
