package monitoring

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// The waiting rooms: how many tasks wait for each key and since when, read
// from Redis (semaphore.Service.RoomStats), for the page's rows and for
// the metrics. A row is a plain key, a rendered key, or a template, which
// sums the rendered keys the worker lists (the oldest wait: the longest).

// roomTotals is the waiting room of one row.
type roomTotals struct {
	waiting, standby int
	oldest           time.Duration
	values           []semaphore.ShareWaiting // a plain fair key's values with the most waiting
}

func (r *roomTotals) add(st semaphore.RoomStats) {
	r.waiting += st.Waiting
	r.standby += st.Standby
	r.oldest = max(r.oldest, st.OldestWait)
}

// splitKeys parts infos (KeyInfo or RateKeyInfo) into the keys that hold
// seats or tokens, and rooms (plain and rendered keys, each once, in
// order), and the declared templates (in order).
func splitKeys[K listedKey](infos []K) (keys, templates []K) {
	seen := map[string]bool{}
	for _, k := range infos {
		key, template := k.names()
		switch {
		case template != "" && template == key:
			templates = append(templates, k)
		case !seen[key]:
			seen[key] = true
			keys = append(keys, k)
		}
	}
	return keys, templates
}

// listedKey is a key a worker lists: KeyInfo or RateKeyInfo.
type listedKey interface{ names() (key, template string) }

func (k KeyInfo) names() (key, template string)     { return k.Key, k.Template }
func (k RateKeyInfo) names() (key, template string) { return k.Key, k.Template }

// RoomCollectorOptions tunes NewRoomCollector.
type RoomCollectorOptions struct {
	// CacheFor is how long one reading of the rooms serves scrapes: a
	// reading costs one Redis call per listed key, and several Prometheus
	// servers may scrape every few seconds. Default 5s; a negative value
	// reads Redis on every scrape.
	CacheFor time.Duration
	// Timeout bounds one reading. Default 5s.
	Timeout time.Duration
	// Logger receives read errors (at most one per CacheFor). Default
	// slog.Default().
	Logger *slog.Logger
	// Limiter and RateKeys, when both are set, add the rooms of the rate
	// limits RateKeys lists (see ServerOptions.RateKeys):
	// fleetcap_ratelimit_tasks_waiting{key}.
	Limiter  *ratelimit.Limiter
	RateKeys func(context.Context) ([]RateKeyInfo, error)
}

// RoomCollector exports the waiting rooms of the semaphore keys a worker
// lists, read from Redis, so that an operator can alert on a backlog
// behind a cap however its tasks came (dequeued and sent back, or enqueued
// by the producer to wait without ever being dequeued):
// fleetcap_semaphore_tasks_waiting{key},
// fleetcap_semaphore_oldest_wait_seconds{key} and
// fleetcap_semaphore_standby{key}, labelled as the page's rows are (a
// rendered key by its template, which sums its rendered keys the worker
// lists), fleetcap_semaphore_fair_value_waiting{key,value} for the values
// with the most tasks waiting of a plain key with fair_by (at most 5 a
// key), and fleetcap_semaphore_rooms_up (0 when the last reading of a
// key failed). With a Limiter it also exports
// fleetcap_ratelimit_tasks_waiting{key}: the tasks waiting in each rate
// limit's room for their tokens (held back by a producer, or sent back by
// a worker), labelled in the same way. The values are fleet-wide, the
// same in every worker that lists the key: take max across instances, not
// sum. Create it with NewRoomCollector.
type RoomCollector struct {
	sem      *semaphore.Service
	keys     func(context.Context) ([]KeyInfo, error)
	limiter  *ratelimit.Limiter
	rateKeys func(context.Context) ([]RateKeyInfo, error)
	timeout  time.Duration
	cache    scrapeCache[roomReading]
}

// roomReading is one reading of the rooms: the caps' rows, then the rate
// limits'.
type roomReading struct {
	caps  []roomRow
	rates []rateRoomRow
}

// roomRow is one labelled series of a reading.
type roomRow struct {
	key string
	roomTotals
}

// rateRoomRow is the tasks waiting for the tokens of one rate-limit row.
type rateRoomRow struct {
	key     string
	waiting int
}

var _ prometheus.Collector = (*RoomCollector)(nil)

var (
	roomWaitingDesc = prometheus.NewDesc("fleetcap_semaphore_tasks_waiting",
		"Tasks waiting for a seat of the key, fleet-wide, read from its waiting room in Redis: parked there (in their queue, not dequeued) or holding a standby place (in a worker slot, or on their way to one). A template sums the rendered keys this worker lists.",
		[]string{"key"}, nil)
	roomOldestDesc = prometheus.NewDesc("fleetcap_semaphore_oldest_wait_seconds",
		"How long the task that has waited longest for a seat of the key has waited, by the Redis server's clock; 0 when none waits. A template: the longest of the rendered keys this worker lists.",
		[]string{"key"}, nil)
	roomStandbyDesc = prometheus.NewDesc("fleetcap_semaphore_standby",
		"Standby places of the key in use, fleet-wide: tasks waiting in a worker slot for the next seat, or let out of the waiting room and on their way to one.",
		[]string{"key"}, nil)
	roomFairValueDesc = prometheus.NewDesc("fleetcap_semaphore_fair_value_waiting",
		"Tasks waiting for a seat of a plain key with fair_by, for each of its fair_by values with the most waiting (at most 5 a key), fleet-wide, read from its waiting room in Redis.",
		[]string{"key", "value"}, nil)
	rateRoomWaitingDesc = prometheus.NewDesc("fleetcap_ratelimit_tasks_waiting",
		"Tasks waiting for tokens of the rate limit's key, fleet-wide, read from its room in Redis: held back by a producer (enqueued scheduled, never dequeued) or sent back by a worker. A template sums the rendered keys this worker lists.",
		[]string{"key"}, nil)
	roomsUpDesc = prometheus.NewDesc("fleetcap_semaphore_rooms_up",
		"1 when the last reading of every listed key's waiting room from Redis succeeded, else 0.",
		nil, nil)
)

// NewRoomCollector returns a collector reading the waiting rooms of the
// keys that keys lists (see ServerOptions.Keys) through sem.
func NewRoomCollector(sem *semaphore.Service, keys func(context.Context) ([]KeyInfo, error), opts RoomCollectorOptions) (*RoomCollector, error) {
	if sem == nil || keys == nil {
		return nil, errors.New("monitoring: NewRoomCollector needs a semaphore.Service and a key list")
	}
	c := &RoomCollector{sem: sem, keys: keys, timeout: opts.Timeout,
		cache: newScrapeCache[roomReading](opts.CacheFor, opts.Logger, "the semaphores' waiting rooms")}
	if opts.Limiter != nil && opts.RateKeys != nil {
		c.limiter, c.rateKeys = opts.Limiter, opts.RateKeys
	}
	if c.timeout <= 0 {
		c.timeout = 5 * time.Second
	}
	return c, nil
}

// Describe implements prometheus.Collector. It does not touch Redis.
func (c *RoomCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{roomWaitingDesc, roomOldestDesc, roomStandbyDesc, roomFairValueDesc, rateRoomWaitingDesc, roomsUpDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *RoomCollector) Collect(ch chan<- prometheus.Metric) {
	reading, err := c.cache.get(c.read)
	up := 1.0
	if err != nil {
		up = 0
	}
	ch <- prometheus.MustNewConstMetric(roomsUpDesc, prometheus.GaugeValue, up)
	for _, r := range reading.rates {
		ch <- prometheus.MustNewConstMetric(rateRoomWaitingDesc, prometheus.GaugeValue, float64(r.waiting), r.key)
	}
	for _, r := range reading.caps {
		ch <- prometheus.MustNewConstMetric(roomWaitingDesc, prometheus.GaugeValue, float64(r.waiting), r.key)
		ch <- prometheus.MustNewConstMetric(roomOldestDesc, prometheus.GaugeValue, r.oldest.Seconds(), r.key)
		ch <- prometheus.MustNewConstMetric(roomStandbyDesc, prometheus.GaugeValue, float64(r.standby), r.key)
		for _, v := range r.values {
			ch <- prometheus.MustNewConstMetric(roomFairValueDesc, prometheus.GaugeValue, float64(v.Waiting), r.key, v.Value)
		}
	}
}

// read reads the rooms, within the collector's timeout.
func (c *RoomCollector) read() (roomReading, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	caps, err := c.readRooms(ctx)
	rates, rerr := c.readRateRooms(ctx)
	return roomReading{caps: caps, rates: rates}, errors.Join(err, rerr)
}

// readRateRooms reads the room of every listed rate-limit key (plain and
// rendered), a few at a time, and sums them by row (a rendered key's
// template). A key that fails leaves its row out and is reported.
func (c *RoomCollector) readRateRooms(ctx context.Context) ([]rateRoomRow, error) {
	if c.limiter == nil {
		return nil, nil
	}
	infos, err := c.rateKeys(ctx)
	if err != nil {
		return nil, err
	}
	sums, err := roomSums(infos, "rate rooms", func(k RateKeyInfo) (int, error) { return c.sem.PacedRooms(false).Waiting(ctx, k.Key) },
		func(sum *int, _ RateKeyInfo, n int) { *sum += n })
	rows := make([]rateRoomRow, 0, len(sums))
	for _, key := range slices.Sorted(maps.Keys(sums)) {
		rows = append(rows, rateRoomRow{key: key, waiting: *sums[key]})
	}
	return rows, err
}

// readRooms reads the room of every listed key, a few at a time, and sums
// them by row. A key that fails leaves its row out (the others stay) and
// is reported in the error.
func (c *RoomCollector) readRooms(ctx context.Context) ([]roomRow, error) {
	infos, err := c.keys(ctx)
	if err != nil {
		return nil, err
	}
	sums, err := roomSums(infos, "waiting rooms", func(k KeyInfo) (semaphore.RoomStats, error) { return c.sem.RoomStats(ctx, k.Key) },
		func(sum *roomTotals, k KeyInfo, st semaphore.RoomStats) {
			sum.add(st)
			if k.Template == "" {
				sum.values = st.TopValues
			}
		})
	rows := make([]roomRow, 0, len(sums))
	for _, key := range slices.Sorted(maps.Keys(sums)) {
		rows = append(rows, roomRow{key: key, roomTotals: *sums[key]})
	}
	return rows, err
}

// roomSums reads the room of every listed key (KeyInfo or RateKeyInfo)
// with read, a few at a time, and adds each reading into its row's sum:
// a rendered key's template's (each declared template has one, zero until
// a key of it is read), or the key's own. A key that fails leaves its row
// out, and is reported in the error (what names the rooms).
func roomSums[K listedKey, T, S any](infos []K, what string, read func(K) (T, error), add func(sum *S, k K, got T)) (map[string]*S, error) {
	keys, templates := splitKeys(infos)
	sums := map[string]*S{}
	for _, t := range templates {
		key, _ := t.names()
		sums[key] = new(S)
	}
	type reading struct {
		got T
		err error
	}
	got, _ := inParallel(len(keys), func(i int) (reading, error) {
		v, err := read(keys[i])
		return reading{v, err}, nil
	})
	failed := map[string]bool{}
	var errs []error
	for i, k := range keys {
		key, template := k.names()
		row := cmp.Or(template, key)
		if got[i].err != nil {
			failed[row] = true
			errs = append(errs, got[i].err)
			continue
		}
		if sums[row] == nil {
			sums[row] = new(S)
		}
		add(sums[row], k, got[i].got)
	}
	for row := range failed {
		delete(sums, row)
	}
	if len(errs) > 0 {
		return sums, fmt.Errorf("monitoring: %d of %d %s unread, the first: %w", len(errs), len(keys), what, errs[0])
	}
	return sums, nil
}
