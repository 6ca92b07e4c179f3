package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/ratelimit"
)

// DefaultInterval is how often a Reader reads the overrides by itself: a
// Store announces every change on a pub/sub channel, which makes every
// Reader read at once; the interval is the safety net for a lost notice.
const DefaultInterval = 2 * time.Second

// ReaderOptions configures NewReader.
type ReaderOptions struct {
	// Interval is how often the overrides are read; default
	// DefaultInterval. One HGETALL a read.
	Interval time.Duration
	// Logger receives refresh failures and recoveries; default
	// slog.Default().
	Logger *slog.Logger
}

// Reader keeps the overrides in memory and reads them again every
// Interval, so that lookups cost no Redis call. Create it with NewReader,
// stop it with Close. It is safe for concurrent use.
type Reader struct {
	store *Store
	log   *slog.Logger

	cur     atomic.Pointer[Overrides]
	lastErr atomic.Pointer[error]

	refreshMu sync.Mutex // one Redis read at a time
	stop      context.CancelFunc
	done      chan struct{}
}

// NewReader reads the overrides once (an error here is returned: a worker
// must not start without knowing them) and then every Interval until
// Close.
func NewReader(ctx context.Context, store *Store, opts ReaderOptions) (*Reader, error) {
	if store == nil {
		return nil, errors.New("control: NewReader: nil Store")
	}
	if opts.Interval < 0 {
		return nil, errors.New("control: NewReader: negative Interval")
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Reader{store: store, log: opts.Logger, done: make(chan struct{})}
	// Subscribed (and confirmed) before the first read, so that no change
	// made after that read goes unannounced until the next interval.
	loopCtx, stop := context.WithCancel(context.Background())
	ps := store.rdb.Subscribe(loopCtx, store.Channel())
	if _, err := ps.Receive(ctx); err != nil {
		stop()
		_ = ps.Close() // the subscription failed already; its error is the one returned
		return nil, fmt.Errorf("control: subscribe to %s: %w", store.Channel(), err)
	}
	if err := r.Refresh(ctx); err != nil {
		stop()
		_ = ps.Close()
		return nil, err
	}
	r.stop = stop
	go r.loop(loopCtx, ps, opts.Interval)
	return r, nil
}

func (r *Reader) loop(ctx context.Context, ps *redis.PubSub, interval time.Duration) {
	defer close(r.done)
	defer ps.Close()
	changed := ps.Channel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
		readCtx, cancel := context.WithTimeout(ctx, max(interval, time.Second))
		_ = r.Refresh(readCtx) // it logs and records a failure (see Err)
		cancel()
	}
}

// Refresh reads the overrides now (the HTTP API calls it after a write, so
// that its own answer shows the change). On failure the last reading stays
// in force and Err reports the failure until a read works again.
func (r *Reader) Refresh(ctx context.Context) error {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	o, err := r.store.Load(ctx)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return err // cancelled by the caller (or Close): says nothing of Redis
	}
	prev := r.lastErr.Load()
	if err != nil {
		if prev == nil || *prev == nil {
			r.log.Error("control: cannot read the overrides; keeping the last ones read", "key", r.store.key, "err", err)
		}
		r.lastErr.Store(&err)
		return err
	}
	if prev != nil && *prev != nil {
		r.log.Info("control: overrides readable again", "key", r.store.key)
	}
	r.cur.Store(o)
	r.lastErr.Store(&err)
	return nil
}

// Err is the error of the last read, nil when it worked.
func (r *Reader) Err() error {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Store is the store the reader reads.
func (r *Reader) Store() *Store { return r.store }

// Overrides is the last reading. It is shared: do not modify it.
func (r *Reader) Overrides() *Overrides { return r.cur.Load() }

// CapacityFor returns the capacity in force for the semaphore key, which is
// rendered from template ("" for a plain key): key's override, else
// template's, else configured; overridden says whether an override
// applied.
func (r *Reader) CapacityFor(key, template string, configured int) (capacity int, overridden bool) {
	return lookup(r.cur.Load().Capacities, key, template, configured)
}

// RateFor returns the limit in force for the rate-limit key, as
// CapacityFor does for capacities.
func (r *Reader) RateFor(key, template string, configured ratelimit.Limit) (limit ratelimit.Limit, overridden bool) {
	return lookup(r.cur.Load().Rates, key, template, configured)
}

func lookup[V any](m map[string]V, key, template string, configured V) (V, bool) {
	if v, ok := m[key]; ok {
		return v, true
	}
	if template != "" {
		if v, ok := m[template]; ok {
			return v, true
		}
	}
	return configured, false
}

// Close stops the background reads and waits for the loop to end. Lookups
// keep answering with the last reading.
func (r *Reader) Close() {
	r.stop()
	<-r.done
}
