package admission

import (
	"context"
	"sync"
	"time"

	"github.com/fleetcap/fleetcap/internal/asynqx"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Places in a cap's waiting room. A task holding a standby place waits for
// a seat up to its cap's wait_timeout; the place outlives that by
// standbyMargin, so that only a dead worker's place lapses. A task let out
// of the room has transitTime to reach a slot (it is pushed to the front of
// its queue: usually milliseconds) before its place goes back to the room,
// which lets it out again first, if it still waits: so a task deleted on
// its way gives its place back within about a second.
const (
	standbyMargin = 5 * time.Second
	transitTime   = time.Second
)

// The sweep: every SweepInterval each worker asks the rooms of the keys it
// knows to let tasks out, for places and seats that freed without a call
// that would have done it (a lease that ran out, a worker that died, a
// task that never came for its place); the first to ask in three quarters
// of auditInterval does it for the fleet (see Sweep). Once an audit
// interval, that worker also checks that the parked tasks still exist: a
// task deleted while it waited is dismissed within a second or two. A
// worker that finds a room swept by another leaves it to that one for
// leaveSwept (its next two sweeps): the sweeper keeps sweeping once an
// interval, and when it stops (it died), another takes over within about
// four seconds.
const (
	SweepInterval = time.Second
	auditInterval = time.Second
	leaveSwept    = 5 * SweepInterval / 2
)

// room is how the waiting room of cap l is kept (see semaphore.Room).
func (a *Admitter) room(l *Limit) semaphore.Room { return capRoom(l, a.ParkedRetry) }

func capRoom(l *Limit, parkedRetry time.Duration) semaphore.Room {
	standby := l.standby(l.Capacity)
	if l.Capacity == 0 {
		standby = 0 // paused: nobody waits in a slot for a seat that will not come
	}
	return semaphore.Room{
		Standby: standby,
		Hold:    l.Cap.WaitTimeout + standbyMargin,
		Transit: transitTime,
		TTL:     3 * parkedRetry,
		Audit:   auditInterval,
		// Every task of the cap takes one seat in one line: a task let
		// out in the place of one that starts stands by as it comes (its
		// seat is labelled with its task ID, as permitOptions labels it).
		Enrol: l.Cap.FairBy == "" && l.Cap.CostFrom == "" && l.Cap.Cost <= 1,
	}
}

// Sweep lets tasks out of the rooms of the caps this process knows (its
// plain keys, and the rendered keys it parked tasks for lately), and
// audits the rooms it is handed. It also looks into the room of each plain
// rate-limit key, where a producer may have parked tasks (see Gate): one
// call a key while nobody waits there; a room with tasks gets this
// process's loop that brings them back (rateWakes), as when it parks a
// task there itself. So does the room of each rendered rate-limit key
// that was noted since the last sweep (a producer parked a task in it
// while it was empty; one call for the notes, when the config has rate
// templates). The worker calls it every SweepInterval (first as it
// starts), and at once, resized (true), when an operator's override
// changes a capacity. A cap's room is swept by one process of the fleet
// every three quarters of auditInterval (see semaphore.Room.Audit): the
// other processes' calls find it done, for three commands, and leave the
// room alone for leaveSwept, unless a capacity changed (resized): then
// this process sweeps every room, so that the seats a raise opens go at
// once.
func (a *Admitter) Sweep(ctx context.Context, resized bool) {
	for key, spec := range a.Table.Plain(KindRate) {
		a.rateWakes.watch(a, Limit{Spec: spec, Key: key}, false)
	}
	a.watchNotedRooms(ctx)
	for _, l := range a.knownCaps() {
		room := a.room(&l)
		if resized {
			room.Audit = 0
		} else if a.sweptElsewhere.Recent(l.Key) {
			continue
		}
		audit, elsewhere, err := a.Semaphore.Admit(ctx, l.Key, l.Capacity, room)
		if err != nil {
			if ctx.Err() == nil {
				a.Logger.Warn("worker: let tasks out of a waiting room", "key", l.Key, "err", err)
			}
			continue
		}
		if elsewhere {
			a.sweptElsewhere.Mark(l.Key)
		}
		a.audit(ctx, l.Key, audit)
	}
}

// audit dismisses the tokens of key's room whose tasks no longer exist or
// are done.
func (a *Admitter) audit(ctx context.Context, key string, tokens []string) {
	byQueue := map[string][]string{}
	for _, s := range tokens {
		if t, err := ParseToken(s); err == nil {
			byQueue[t.Queue] = append(byQueue[t.Queue], t.ID)
		}
	}
	for queue, ids := range byQueue {
		gone, err := asynqx.Missing(ctx, a.Redis, queue, ids)
		if err != nil {
			if ctx.Err() == nil {
				a.Logger.Warn("worker: check the tasks of a waiting room", "key", key, "err", err)
			}
			continue
		}
		for _, id := range gone {
			a.Logger.Info("worker: a task that waited for a seat is gone (deleted or archived): its place goes to the next", "key", key, "queue", queue, "id", id)
			if err := a.Semaphore.Dismiss(ctx, key, Token{Queue: queue, ID: id}.String()); err != nil && ctx.Err() == nil {
				a.Logger.Warn("worker: dismiss a token whose task is gone", "key", key, "err", err)
			}
		}
	}
}

// knownCaps are the declared plain cap keys, and the rendered keys in whose
// rooms this process parked tasks lately, with their capacities in force.
func (a *Admitter) knownCaps() []Limit {
	var out []Limit
	for key, spec := range a.Table.Plain(KindCap) {
		out = append(out, Limit{Spec: spec, Key: key}.Resized(a.Sizes))
	}
	for _, l := range a.rooms.list(3 * a.ParkedRetry) {
		out = append(out, l.Resized(a.Sizes))
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
	Limit
	at time.Time
}

const roomKeysMax = 1000

// note remembers that a task was parked in the room of l.
func (r *roomKeys) note(l *Limit) {
	if l.Template == "" {
		return // plain keys are always swept
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]roomKey{}
	}
	if _, ok := r.last[l.Key]; !ok && len(r.last) >= roomKeysMax {
		oldest := ""
		for k, v := range r.last {
			if oldest == "" || v.at.Before(r.last[oldest].at) {
				oldest = k
			}
		}
		delete(r.last, oldest)
	}
	r.last[l.Key] = roomKey{Limit: *l, at: time.Now()}
}

// list returns the rooms noted within the last within, forgetting older
// ones.
func (r *roomKeys) list(within time.Duration) []Limit {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Limit
	for k, v := range r.last {
		if time.Since(v.at) > within {
			delete(r.last, k)
			continue
		}
		out = append(out, v.Limit)
	}
	return out
}

// watchNotedRooms watches the rooms of rendered rate-limit keys noted
// since the last sweep (semaphore.Service.NoteRenderedRoom), sweeps those
// of rendered cap keys from now on (knownCaps), and lists their keys for
// monitoring; the first sweep looks back as far as a room lives.
func (a *Admitter) watchNotedRooms(ctx context.Context) {
	templates, caps := a.Table.Templates(KindRate), a.Table.Templates(KindCap)
	if len(templates)+len(caps) == 0 {
		return
	}
	lives := 3 * a.ParkedRetry
	forget := time.Now().Add(-lives).UnixMilli()
	since := max(a.notedSince.Load(), forget)
	rooms, err := a.Semaphore.RenderedRooms(ctx, since, forget)
	if err != nil {
		if ctx.Err() == nil {
			a.Logger.Warn("worker: read the rooms of rendered rate-limit keys (their tasks come back after their delay)", "err", err)
		}
		return
	}
	for _, r := range rooms {
		if spec, ok := templates[r.Template]; ok && spec.Matches(r.Key) {
			a.recentRates.touch(r.Key, r.Template, 0) // listed for monitoring, as if a task of it had come
			a.rateWakes.watch(a, Limit{Spec: spec, Key: r.Key, Template: r.Template}, false)
		}
		if spec, ok := caps[r.Template]; ok && spec.Matches(r.Key) {
			// Swept from now on (knownCaps), as if this process had parked
			// a task in it, and listed for monitoring.
			l := Limit{Spec: spec, Key: r.Key, Template: r.Template}.Resized(a.Sizes)
			a.rooms.note(&l)
			a.recentCaps.touch(l.Key, l.Template, l.Capacity)
		}
		a.notedSince.Store(max(a.notedSince.Load(), r.At))
	}
}
