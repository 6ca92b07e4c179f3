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
// its place waits for it. Only a task that still waits for that seat is
// moved: never one that completed, failed, was archived or waits for
// another key meanwhile; such a token is dismissed and its place goes to
// the next. Its delay in asynq is only the safety net.
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
		if !k.bringBack(ctx, requeueMark(key), token) {
			// Not waiting any more: its place goes to the next token,
			// handed to onWake again.
			if err := k.sem.Dismiss(ctx, key, token); err != nil {
				k.log.Warn("worker: dismiss a token whose task no longer waits (its place lapses by itself)", "key", key, "err", err)
			}
		}
	}
}

// bringBack moves the task of token to its queue; false when it no longer
// waits (its message lacks mark, the start of the requeue error it waits
// with). A task that is still in its handler (parking itself) or not
// enqueued yet (its producer parks it) is asked for again, 1 ms later, then
// 2, 4 and 8 ms apart, for 200 ms; if it does not show up, its place
// lapses back to the room.
func (k *waker) bringBack(ctx context.Context, mark, token string) bool {
	queue, id, ok := strings.Cut(token, "\x00")
	if !ok {
		return false
	}
	deadline := time.Now().Add(200 * time.Millisecond)
	for pause := time.Millisecond; ; pause = min(2*pause, 8*time.Millisecond) {
		res, err := asynqx.Wake(ctx, k.rdb, queue, id, mark, WaitsForHeader)
		switch {
		case err != nil:
			k.log.Warn("worker: wake a parked task (it comes back by itself)", "queue", queue, "id", id, "err", err)
			return true // its place lapses back to the room
		case res == asynqx.Woken:
			return true
		case res == asynqx.Busy && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return true
			case <-time.After(pause):
			}
		case res == asynqx.Busy:
			return true // its place lapses back to the room
		default:
			return false
		}
	}
}

// sweep lets tasks out of the rooms of the keys this process knows, for
// places and seats that freed without a call that would have done it (a
// lease that ran out, a worker that died) or that a new capacity opened.
func (w *Worker) sweep(ctx context.Context) {
	for _, s := range w.knownSeats() {
		if err := w.sem.Admit(ctx, s.key, s.capacity, s.room(w.cfg.Worker.ParkedRetry)); err != nil && ctx.Err() == nil {
			w.log.Warn("worker: let tasks out of a waiting room", "key", s.key, "err", err)
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
