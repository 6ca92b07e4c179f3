package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/ratelimit"
)

// Rate limits. A task with rate limits runs only when, holding its seats,
// it can take the tokens of each: tokens are taken last, so that no token
// is spent by a task that then does not run. A task with no token gives
// its seats back and, in mode wait, sleeps until its tokens are due (up to
// wait_timeout); in mode requeue, or once its wait ran out, it goes back
// to its queue without a failure, parked in the rate limit's room, and
// one worker of the fleet brings it back when its tokens are due
// (ratelimit.Limiter.NextDue: one task a token, in arrival order).

// rateSpec is one declared rate limit, parsed.
type rateSpec struct {
	RateLimitConfig
	tmpl *config.KeyTemplate
}

// rateTable holds the rate limits of every task type.
type rateTable map[string][]rateSpec

func newRateTable(cfg *Config) (rateTable, error) {
	t := rateTable{}
	for typ, tc := range cfg.Tasks {
		for _, rl := range tc.RateLimits {
			kt, err := rl.KeyTemplate()
			if err != nil {
				return nil, fmt.Errorf("worker: task %q: %w", typ, err)
			}
			t[typ] = append(t[typ], rateSpec{RateLimitConfig: rl, tmpl: kt})
		}
	}
	return t, nil
}

// rateTake is one rate limit of one task: its key rendered, its limit the
// one in force.
type rateTake struct {
	spec     rateSpec
	key      string
	template string
	limit    ratelimit.Limit
}

// ratesFor renders the rate limits of a task, in key order.
func (w *Worker) ratesFor(specs []rateSpec, payload []byte) ([]rateTake, error) {
	out := make([]rateTake, 0, len(specs))
	for _, s := range specs {
		key, err := s.tmpl.Render(payload)
		if err != nil {
			return nil, err
		}
		template := ""
		if s.tmpl.IsTemplate() {
			template = s.Key
			w.recentRates.touch(key, template, 0)
		}
		out = append(out, rateTake{spec: s, key: key, template: template, limit: w.limitFor(key, template, s.LimitFor(key))})
	}
	slices.SortFunc(out, func(a, b rateTake) int { return cmp.Compare(a.key, b.key) })
	return out, nil
}

// RenderedRateKeys lists the rate-limit keys this process rendered from
// templates lately (the 200 it used last), for the monitoring page.
func (w *Worker) RenderedRateKeys() []string {
	var out []string
	for _, k := range w.recentRates.list() {
		out = append(out, k.Key)
	}
	return out
}

// limitFor is the limit in force of a rendered key: an operator's override
// of the key, else of its template, else configured.
func (w *Worker) limitFor(key, template string, configured ratelimit.Limit) ratelimit.Limit {
	if w.overrides == nil {
		return configured
	}
	limit, _ := w.overrides.RateFor(key, template, configured)
	return limit
}

// takeTokens takes the tokens of every rate limit of a task, or none: it
// peeks at all first, so that a limit with no token spends nobody's, and
// gives back what it took when a take fails after its peek. It
// returns the first limit with no token and how long until its tokens are
// due, or nil when the task may run.
func (w *Worker) takeTokens(ctx context.Context, rates []rateTake) (*rateTake, time.Duration, error) {
	for i, r := range rates {
		res, err := w.limiter.Peek(ctx, r.key, r.limit, r.spec.Cost)
		if err != nil {
			return nil, 0, err
		}
		if !res.Allowed {
			// A refusal found by the peek is a limited take for the
			// metrics (the page's own peeks are not).
			if w.rateObs != nil {
				w.rateObs.Take(ratelimit.TakeEvent{Key: r.key, Cost: r.spec.Cost, Remaining: res.Remaining, RetryAfter: res.RetryAfter})
			}
			return &rates[i], res.RetryAfter, nil
		}
	}
	for i, r := range rates {
		res, err := w.limiter.Take(ctx, r.key, r.limit, r.spec.Cost)
		if err == nil && res.Allowed {
			continue
		}
		// Another task took them since the peek (or Redis failed): the
		// task does not run, so the tokens it took of the limits before
		// this one go back.
		w.refund(ctx, rates[:i])
		if err != nil {
			return nil, 0, err
		}
		return &rates[i], res.RetryAfter, nil
	}
	return nil, 0, nil
}

// refund gives back the tokens taken of rates by a task that does not run.
func (w *Worker) refund(ctx context.Context, rates []rateTake) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	for _, r := range rates {
		if err := w.limiter.Refund(rctx, r.key, r.limit, r.spec.Cost); err != nil {
			w.log.Warn("worker: give back the tokens of a task that does not run (they are spent)", "key", r.key, "err", err)
		}
	}
}

// waitForTokens sleeps until a rate limit's tokens are due (mode wait): it
// reports false when they are not due within the wait left before
// deadline, or ctx ended.
func waitForTokens(ctx context.Context, due time.Duration, deadline time.Time) bool {
	if time.Now().Add(due).After(deadline) {
		return false
	}
	t := time.NewTimer(due)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// parkForTokens parks the task of token in the room of r, and makes sure
// this process brings tasks back from it when their tokens are due.
func (w *Worker) parkForTokens(ctx context.Context, r *rateTake, token string) *requeueRequest {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeCallTimeout)
	defer cancel()
	if err := w.limiter.Park(pctx, r.key, token, 3*w.cfg.Worker.ParkedRetry); err != nil {
		taskID, _ := asynq.GetTaskID(ctx)
		w.log.Warn("worker: park a task for tokens (it comes back after its delay)", "key", r.key, "id", taskID, "err", err)
	}
	w.rateWakes.watch(w, *r)
	return &requeueRequest{key: r.key, why: RequeueRateLimited, token: token}
}

// rateWakes runs, for each rate limit whose room this process parked tasks
// in, one loop that brings them back as their tokens come due.
type rateWakes struct {
	mu sync.Mutex
	// running maps the key of each loop that runs to whether a task
	// parked since the loop last found the room empty: a loop ends only
	// when it is false, so that no parked task is left unwatched.
	running map[string]bool
}

// watch starts the loop of r's key, or tells the running one that a task
// parked.
func (rw *rateWakes) watch(w *Worker, r rateTake) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.running == nil {
		rw.running = map[string]bool{}
	}
	if _, runs := rw.running[r.key]; runs || w.runCtx == nil {
		if runs {
			rw.running[r.key] = true
		}
		return
	}
	rw.running[r.key] = false
	go rw.loop(w, r)
}

// done ends the loop of key unless a task parked since it found the room
// empty; then it reports false, and the loop goes on.
func (rw *rateWakes) done(key string) bool {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if rw.running[key] {
		rw.running[key] = false
		return false
	}
	delete(rw.running, key)
	return true
}

// loop brings back the tasks of r's room, one a token, until it is empty
// or the worker stops.
func (rw *rateWakes) loop(w *Worker, r rateTake) {
	ctx := w.runCtx
	defer func() {
		if ctx.Err() != nil { // the worker stops: nothing is watched any more
			rw.mu.Lock()
			delete(rw.running, r.key)
			rw.mu.Unlock()
		}
	}()
	mark := rateMark(r.key)
	for ctx.Err() == nil {
		limit := w.limitFor(r.key, r.template, r.spec.LimitFor(r.key))
		token, wait, err := w.limiter.NextDue(ctx, r.key, limit, r.spec.Cost)
		switch {
		case errors.Is(err, ratelimit.ErrRoomEmpty):
			if rw.done(r.key) {
				return
			}
			continue
		case err != nil:
			if ctx.Err() == nil {
				w.log.Warn("worker: bring back tasks that waited for tokens (they come back by themselves)", "key", r.key, "err", err)
			}
			wait = time.Second
		case token != "":
			go w.waker.bringBack(context.WithoutCancel(ctx), mark, token)
			continue
		}
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}
