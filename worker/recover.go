package worker

import (
	"context"
	"reflect"
	"time"

	"github.com/fleetcap/fleetcap/admission"
	"github.com/fleetcap/fleetcap/internal/asynqx"
)

// Recovering the tasks of a dead worker. asynq leases each active task for
// 30 s and its heartbeater renews the lease every 5 s; when a worker dies,
// asynq's recoverer brings its tasks back only once the lease has been
// expired for 30 s more, checking once a minute: 60 to 120 s, and it counts
// a retry (a task with none left is archived). Every fleetcap worker also
// checks every recoverInterval and brings back, without spending a retry,
// tasks whose lease expired more than recoverGrace ago: about 35 to 40 s
// after the crash. asynq offers no setting for this, so it follows asynq's
// own requeue on asynq's keys (asynqx.RecoverExpired).
const (
	recoverInterval = 5 * time.Second
	overridesCheck  = 100 * time.Millisecond // in memory: costs Redis nothing
	recoverGrace    = 5 * time.Second        // clock skew between workers it tolerates: up to 25 s
	maxRecoveries   = 3
)

// recoverLoop runs until ctx is done: every recoverInterval it brings back
// the tasks of dead workers, and every admission.SweepInterval it sweeps
// the waiting rooms (Admitter.Sweep), first as it starts, so that tasks a
// producer parked are brought back at once; it sweeps at once when an
// operator's override changes a capacity, so that the whole fleet applies
// it within a second.
func (w *Worker) recoverLoop(ctx context.Context) {
	t := time.NewTicker(overridesCheck)
	defer t.Stop()
	last := w.overrides.Overrides()
	nextRecover := time.Now().Add(recoverInterval)
	nextSweep := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		resized := false // a capacity changed: every room is swept now (see Admitter.Sweep)
		if cur := w.overrides.Overrides(); !reflect.DeepEqual(cur.Capacities, last.Capacities) {
			last = cur
			nextSweep = now
			resized = true
		}
		if !now.Before(nextRecover) {
			nextRecover = now.Add(recoverInterval)
			w.recoverOnce(ctx)
		}
		if !now.Before(nextSweep) {
			nextSweep = now.Add(admission.SweepInterval)
			w.adm.Sweep(ctx, resized)
		}
	}
}

// recoverOnce brings back the lease-expired tasks of every queue.
func (w *Worker) recoverOnce(ctx context.Context) {
	cutoff := time.Now().Add(-recoverGrace)
	for queue := range w.cfg.Worker.Queues {
		ids, err := asynqx.RecoverExpired(ctx, w.rdb, queue, cutoff, maxRecoveries)
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("worker: recover tasks of dead workers", "queue", queue, "err", err)
			}
			continue
		}
		for _, id := range ids {
			w.log.Warn("worker: brought back a task whose worker stopped renewing its lease", "queue", queue, "id", id)
		}
	}
}
