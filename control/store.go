// Package control keeps the fleet's runtime overrides in Redis: an
// operator's capacity for a semaphore key and rate for a rate-limit key,
// set while the fleet runs (SPEC §2.7). A Store writes and reads them; a
// Reader keeps a copy in memory, refreshed in the background, for lookups
// on the hot path that cost no Redis call.
//
// An override is set for a plain key, a rendered key of a template
// ("tenant:acme") or a template itself ("tenant:{tenant_id}", every key it
// renders); the rendered key's own override wins over its template's, and
// both over the config. The overrides live in one Redis hash without
// expiry, so they survive worker restarts until cleared: the hash
// <prefix>control of the fleet's prefix (config semaphore.prefix).
package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
	"github.com/fleetcap/fleetcap/ratelimit"
)

// MaxKeyLen bounds an overridden key, as a rendered key is bounded.
const MaxKeyLen = 1024

// Field prefixes of the hash: "capacity:" + key and "rate:" + key.
const (
	capacityField = "capacity:"
	rateField     = "rate:"
)

// Options configures NewStore.
type Options struct {
	// Prefix is the fleet's key prefix (config semaphore.prefix): the
	// overrides live in the hash Prefix+"control", announced on
	// Prefix+"control:changed"; default rediskey.DefaultPrefix,
	// "fleetcap:sem:" (the hash fleetcap:sem:control). It must not
	// contain "{" or "}", as a fleet's prefix.
	Prefix string
}

// Store writes and reads the overrides in Redis. It is safe for
// concurrent use.
type Store struct {
	rdb redis.UniversalClient
	key string
}

// NewStore returns a store on rdb.
func NewStore(rdb redis.UniversalClient, opts Options) (*Store, error) {
	if rdb == nil {
		return nil, errors.New("control: NewStore: nil Redis client")
	}
	prefix, err := rediskey.PrefixOrDefault(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("control: NewStore: Prefix %w", err)
	}
	return &Store{rdb: rdb, key: rediskey.Control(prefix)}, nil
}

// Key is the Redis hash holding the overrides.
func (s *Store) Key() string { return s.key }

// Overrides is one reading of every override.
type Overrides struct {
	// Capacities maps a semaphore key or template to its capacity (0:
	// paused).
	Capacities map[string]int
	// Rates maps a rate-limit key or template to its limit.
	Rates map[string]ratelimit.Limit
}

// SetCapacity overrides the capacity of a semaphore key or template;
// capacity 0 pauses it: seats already held finish, no new one is taken.
func (s *Store) SetCapacity(ctx context.Context, key string, capacity int) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if capacity < 0 {
		return fmt.Errorf("control: capacity must be >= 0 (0 pauses the key), got %d", capacity)
	}
	if err := s.rdb.HSet(ctx, s.key, capacityField+key, strconv.Itoa(capacity)).Err(); err != nil {
		return fmt.Errorf("control: set capacity of %q: %w", key, err)
	}
	return s.announce(ctx)
}

// Channel is the pub/sub channel a Store announces every change on.
func (s *Store) Channel() string { return s.key + ":changed" }

// announce tells the Readers that the overrides changed.
func (s *Store) announce(ctx context.Context) error {
	if err := s.rdb.Publish(ctx, s.Channel(), "1").Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotAnnounced, err)
	}
	return nil
}

// ClearCapacity removes the capacity override of key (the config's capacity
// applies again) and reports whether there was one.
func (s *Store) ClearCapacity(ctx context.Context, key string) (bool, error) {
	return s.clear(ctx, capacityField, key)
}

// SetRate overrides the limit of a rate-limit key or template.
func (s *Store) SetRate(ctx context.Context, key string, limit ratelimit.Limit) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := limit.Validate(); err != nil {
		return fmt.Errorf("control: rate of %q: %w", key, err)
	}
	v, err := json.Marshal(storedRate{Rate: limit.Rate, Per: limit.Per.String(), Burst: limit.Burst})
	if err != nil {
		return fmt.Errorf("control: encode rate of %q: %w", key, err)
	}
	if err := s.rdb.HSet(ctx, s.key, rateField+key, v).Err(); err != nil {
		return fmt.Errorf("control: set rate of %q: %w", key, err)
	}
	return s.announce(ctx)
}

// ClearRate removes the rate override of key (the config's limit applies
// again) and reports whether there was one.
func (s *Store) ClearRate(ctx context.Context, key string) (bool, error) {
	return s.clear(ctx, rateField, key)
}

func (s *Store) clear(ctx context.Context, prefix, key string) (bool, error) {
	if err := checkKey(key); err != nil {
		return false, err
	}
	n, err := s.rdb.HDel(ctx, s.key, prefix+key).Result()
	if err != nil {
		return false, fmt.Errorf("control: clear %s override of %q: %w", strings.TrimSuffix(prefix, ":"), key, err)
	}
	return n > 0, s.announce(ctx)
}

// Load reads every override. An entry it cannot read (written by something
// else than a Store) is an error naming it: no override is silently
// dropped.
func (s *Store) Load(ctx context.Context) (*Overrides, error) {
	fields, err := s.rdb.HGetAll(ctx, s.key).Result()
	if err != nil {
		return nil, fmt.Errorf("control: read overrides: %w", err)
	}
	o := &Overrides{Capacities: map[string]int{}, Rates: map[string]ratelimit.Limit{}}
	var errs []error
	for field, value := range fields {
		if err := o.add(field, value); err != nil {
			errs = append(errs, fmt.Errorf("control: field %q of hash %s: %w", field, s.key, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return o, nil
}

// add decodes one field of the hash into o.
func (o *Overrides) add(field, value string) error {
	if key, ok := strings.CutPrefix(field, capacityField); ok && key != "" {
		n, err := strconv.Atoi(value)
		if err != nil || n < 0 {
			return fmt.Errorf("capacity %q is not an integer >= 0", value)
		}
		o.Capacities[key] = n
		return nil
	}
	if key, ok := strings.CutPrefix(field, rateField); ok && key != "" {
		var r storedRate
		if err := json.Unmarshal([]byte(value), &r); err != nil {
			return fmt.Errorf("rate %q: %w", value, err)
		}
		per, err := time.ParseDuration(r.Per)
		if err != nil {
			return fmt.Errorf("rate %q: per: %w", value, err)
		}
		limit := ratelimit.Limit{Rate: r.Rate, Per: per, Burst: r.Burst}
		if err := limit.Validate(); err != nil {
			return fmt.Errorf("rate %q: %w", value, err)
		}
		o.Rates[key] = limit
		return nil
	}
	return errors.New(`not an override: want "capacity:<key>" or "rate:<key>"`)
}

// storedRate is a rate override as the hash holds it, readable in
// redis-cli.
type storedRate struct {
	Rate  int    `json:"rate"`
	Per   string `json:"per"`
	Burst int    `json:"burst"`
}

func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrBadKey)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, longer than the %d allowed", ErrBadKey, len(key), MaxKeyLen)
	}
	return nil
}

// ErrBadKey is the error of a key no override can have (empty, or too
// long): the caller's mistake, not the store's.
var ErrBadKey = errors.New("control: bad key")

// ErrNotAnnounced is the error of a change that was written but not
// announced: it is in force, and Readers see it at their next read.
var ErrNotAnnounced = errors.New("control: the change is written but not announced (readers see it within their interval)")
