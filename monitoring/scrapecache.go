package monitoring

import (
	"log/slog"
	"sync"
	"time"
)

// scrapeCache keeps one reading of Redis for the scrapes of cacheFor: a
// reading costs Redis calls, and several Prometheus servers may scrape
// every few seconds. A failed reading is cached too, so that an outage
// costs one round of calls per interval, not one per scrape, and its error
// is logged once per interval.
type scrapeCache[T any] struct {
	cacheFor time.Duration // a negative value reads on every scrape
	now      func() time.Time
	log      *slog.Logger
	what     string // what is read, for the log

	mu  sync.Mutex // held across a reading, so concurrent scrapes share one
	at  time.Time
	val T
	err error
}

func newScrapeCache[T any](cacheFor time.Duration, log *slog.Logger, what string) scrapeCache[T] {
	if cacheFor == 0 {
		cacheFor = 5 * time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return scrapeCache[T]{cacheFor: cacheFor, now: time.Now, log: log, what: what}
}

// get returns the cached reading, or calls read when it is older than
// cacheFor.
func (c *scrapeCache[T]) get(read func() (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if !c.at.IsZero() && c.cacheFor > 0 && now.Sub(c.at) < c.cacheFor {
		return c.val, c.err
	}
	c.val, c.err = read()
	c.at = now
	if c.err != nil {
		c.log.Warn("monitoring: read "+c.what, "err", c.err)
	}
	return c.val, c.err
}
