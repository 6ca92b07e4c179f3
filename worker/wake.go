package worker

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Waking parked tasks. A task parked in a cap's waiting room waits in
// asynq's retry set (sent back by its handler) or scheduled set (enqueued
// to wait), not in a worker slot. When the semaphore lets its token out
// (a place freed: a task took a seat, gave up, or a seat freed with places
// to spare), onWake moves it to the dequeuing end of its queue
// (asynqx.Wake), so that it runs before the tasks that came after it, and
// its place waits for it (a second, renewed each time the room lets it out
// again while it is still on its way). Only a task that still waits for
// that seat is moved: never one that completed, failed, was archived or
// deleted, or waits for another key meanwhile; such a token is dismissed
// and its place goes to the next. A task run by hand waits pending with
// its place. A task of a paused queue steps aside: it holds no place while
// its queue is paused, and keeps its arrival for when it resumes. Its
// delay in asynq is only the safety net.
type waker struct {
	sem *semaphore.Service
	rdb redis.UniversalClient
	log *slog.Logger
}

// onWake brings the tasks of tokens let out of key's room to their queue.
func (k *waker) onWake(key string, tokens []string) {
	ctx, cancel := context.WithTimeout(context.Background(), storeCallTimeout)
	defer cancel()
	for _, token := range tokens {
		var err error
		switch k.bringBack(ctx, requeueMark(key), token) {
		case asynqx.Gone:
			// Not waiting any more: its place goes to the next token,
			// handed to onWake again.
			err = k.sem.Dismiss(ctx, key, token)
		case asynqx.Paused:
			err = k.sem.StepAside(ctx, key, token)
		}
		if err != nil {
			k.log.Warn("worker: give up the place of a task that does not come for it now (the place lapses by itself)", "key", key, "err", err)
		}
	}
}

// bringBack moves the task of token to the dequeuing end of its queue and
// says what it found (see asynqx.Wake; mark is the start of the requeue
// error it waits with). A task that is still in its handler (parking
// itself) is asked for again, 1 ms later, then 2, 4 and 8 ms apart, for
// 200 ms; if it is still there, or Redis fails, Busy: its place lapses
// back to the room, keeping its arrival.
func (k *waker) bringBack(ctx context.Context, mark, token string) asynqx.WakeResult {
	queue, id, ok := strings.Cut(token, "\x00")
	if !ok {
		return asynqx.Gone
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for pause := time.Millisecond; ; pause = min(2*pause, 8*time.Millisecond) {
		res, err := asynqx.Wake(ctx, k.rdb, queue, id, mark, WaitsForHeader)
		if err != nil {
			k.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", queue, "id", id, "err", err)
			return asynqx.Busy
		}
		if res != asynqx.Busy || time.Now().After(deadline) {
			return res
		}
		select {
		case <-ctx.Done():
			return asynqx.Busy
		case <-time.After(pause):
		}
	}
}

// The sweep: every sweepInterval each worker lets tasks out of the rooms
// of the keys it knows, for places and seats that freed without a call
// that would have done it (a lease that ran out, a worker that died, a
// task that never came for its place), and, one worker per room and
// audit interval, checks that the parked tasks still exist: a task
// deleted while it waited is dismissed within a second or two.
const (
	sweepInterval = time.Second
	auditInterval = time.Second
)

// sweep lets tasks out of the rooms of the keys this process knows, and
// audits the rooms it is handed.
func (w *Worker) sweep(ctx context.Context) {
	for _, s := range w.knownSeats() {
		audit, err := w.sem.Admit(ctx, s.key, s.capacity, s.room(w.cfg.Worker.ParkedRetry))
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("worker: let tasks out of a waiting room", "key", s.key, "err", err)
			}
			continue
		}
		w.audit(ctx, s.key, audit)
	}
}

// audit dismisses the tokens of key's room whose tasks no longer exist or
// are done.
func (w *Worker) audit(ctx context.Context, key string, tokens []string) {
	byQueue := map[string][]string{}
	for _, token := range tokens {
		if queue, id, ok := strings.Cut(token, "\x00"); ok {
			byQueue[queue] = append(byQueue[queue], id)
		}
	}
	for queue, ids := range byQueue {
		gone, err := asynqx.Missing(ctx, w.rdb, queue, ids)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("worker: check the tasks of a waiting room", "key", key, "err", err)
			}
			continue
		}
		for _, id := range gone {
			w.log.Info("worker: a task that waited for a seat is gone (deleted or archived): its place goes to the next", "key", key, "queue", queue, "id", id)
			if err := w.sem.Dismiss(ctx, key, queue+"\x00"+id); err != nil && ctx.Err() == nil {
				w.log.Warn("worker: dismiss a token whose task is gone", "key", key, "err", err)
			}
		}
	}
}

// knownSeats are the declared plain keys, and the rendered keys in whose
// rooms this process parked tasks lately, with their capacities in force.
func (w *Worker) knownSeats() []seat {
	var out []seat
	for key, spec := range w.caps.plainKeys() {
		out = append(out, seat{spec: spec, key: key, capacity: w.capacityFor(key, "", spec.CapacityFor(key))})
	}
	for _, s := range w.rooms.list(3 * w.cfg.Worker.ParkedRetry) {
		s.capacity = w.capacityFor(s.key, s.template, s.spec.CapacityFor(s.key))
		out = append(out, s)
	}
	return out
}

// roomKeys remembers the rendered keys in whose waiting rooms this process
// parked tasks, and when it last did, so that it sweeps them (at most
// roomKeysMax, the oldest forgotten first).
type roomKeys struct {
	mu   sync.Mutex
	last map[string]roomKey
}

type roomKey struct {
	seat
	at time.Time
}

const roomKeysMax = 1000

// note remembers that a task was parked in the room of s.
func (r *roomKeys) note(s seat) {
	if s.template == "" {
		return // plain keys are always swept
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]roomKey{}
	}
	if _, ok := r.last[s.key]; !ok && len(r.last) >= roomKeysMax {
		oldest := ""
		for k, v := range r.last {
			if oldest == "" || v.at.Before(r.last[oldest].at) {
				oldest = k
			}
		}
		delete(r.last, oldest)
	}
	r.last[s.key] = roomKey{seat: s, at: time.Now()}
}

// list returns the rooms noted within the last for, forgetting older ones.
func (r *roomKeys) list(within time.Duration) []seat {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []seat
	for k, v := range r.last {
		if time.Since(v.at) > within {
			delete(r.last, k)
			continue
		}
		out = append(out, v.seat)
	}
	return out
}
