package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/config"
	"github.com/fleetcap/fleetcap/control"
	"github.com/fleetcap/fleetcap/internal/layout"
	"github.com/fleetcap/fleetcap/ratelimit"
	"github.com/fleetcap/fleetcap/semaphore"
)

// Gate decides where a new limited task waits before a worker takes it,
// for producers (package producer uses it). A task whose caps all have a
// place for it (a free seat or a standby place, fleet-wide) and whose rate
// limits are not busy goes to its queue as usual, its places kept for it.
// Any other waits in the room of the first limit that has no room for it:
// it is enqueued scheduled (worker.parked_retry ahead, the safety net),
// marked with WaitsForHeader, and parked; when a place frees, or its
// tokens are due, it is brought to the front of its queue like a task a
// worker parked. So a limited task is not dequeued while its cap is full,
// nor, mostly, before its tokens are due.
//
// A rate limit's key is busy until the tasks this Gate parked in its room
// are due (by the count in the room at its last park, one
// interval of the limit's cost each), so that no task overtakes them, and
// for a task beyond the limit's own pace counted over the tasks this Gate
// sent to their queue (a bucket of the limit's rate and burst in memory):
// no call to Redis either way. The Gate brings the tasks of the rooms it
// parked in back while it is open, one process per room at a time
// (semaphore.DutyLease); the workers look into the rooms of plain keys
// every SweepInterval, and into those of rendered keys (caps' and rate
// limits') that a Gate noted as it parked a task in them first
// (semaphore.Service.NoteRenderedRoom), so that tasks a producer left
// behind are brought back: a template's cap paused and restored lets them
// out at once, as do places that lapse.
type Gate struct {
	cfg   *config.Config
	table *Table
	log   *slog.Logger
	full  fullHints // the caps that refused a place lately (see Route)
	pace  *ratePace // the rate limits' pace (see Route)

	mu        sync.Mutex // guards opening: rdb, sem, adm and overrides are set together, once it works
	rdb       redis.UniversalClient
	sem       *semaphore.Service
	adm       *Admitter // parks tasks for tokens and brings them back
	stop      context.CancelFunc
	overrides *control.Reader
	layout    *layout.Lease
}

// NewGate returns a Gate for the fleet cfg describes. It does no I/O: the
// first capped task opens its Redis client (never an embedded server of
// its own), its semaphore and the runtime overrides.
func NewGate(cfg *config.Config, log *slog.Logger) (*Gate, error) {
	table, err := NewTable(cfg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	return &Gate{cfg: cfg, table: table, log: log, full: newFullHints(), pace: newRatePace()}, nil
}

// Routes reports whether Route may keep tasks of taskType out of their
// queue: they have a limit.
func (g *Gate) Routes(taskType string) bool { return g.table.Limited(taskType) }

// open opens the Gate's Redis client, semaphore and overrides, the first
// time it works: a failure (Redis down, ctx done) is returned, and the next
// call tries again.
func (g *Gate) open(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.overrides != nil {
		return nil
	}
	rdb, err := g.cfg.Redis.NewClient()
	if err != nil {
		return err
	}
	lease, err := ClaimLayout(ctx, rdb, g.cfg, g.table, "producer", g.log)
	if err != nil {
		return errors.Join(err, rdb.Close())
	}
	k := NewWaker(rdb, g.log)
	sem, err := semaphore.New(rdb, semaphore.Options{Prefix: g.cfg.Semaphore.Prefix, DefaultTTL: g.cfg.Semaphore.DefaultTTL, Logger: g.log, OnWake: k.OnWake})
	if err != nil {
		return errors.Join(err, lease.Close(), rdb.Close())
	}
	k.SetSemaphore(sem)
	overrides, err := OpenOverrides(ctx, rdb, g.cfg.Semaphore.Prefix, g.log)
	if err != nil {
		return errors.Join(err, lease.Close(), sem.Close(), rdb.Close())
	}
	lim, err := ratelimit.New(rdb, ratelimit.Options{Prefix: g.cfg.Semaphore.Prefix})
	if err != nil {
		return errors.Join(err, lease.Close(), sem.Close(), rdb.Close())
	}
	adm, err := New(Options{Redis: rdb, Table: g.table, Semaphore: sem, Limiter: lim, Sizes: overrides, Logger: g.log,
		ParkedRetry: g.cfg.Worker.ParkedRetry, EnqueueOnly: true})
	if err != nil {
		return errors.Join(err, lease.Close(), sem.Close(), rdb.Close())
	}
	runCtx, stop := context.WithCancel(context.Background())
	adm.Start(runCtx)
	g.rdb, g.sem, g.adm, g.stop, g.overrides, g.layout = rdb, sem, adm, stop, overrides, lease
	return nil
}

// Close closes what the Gate opened.
func (g *Gate) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.adm != nil {
		g.stop()
		g.adm.Wait() // its rooms' loops use the client
	}
	if g.overrides != nil {
		g.overrides.Close()
	}
	var err error
	if g.layout != nil {
		err = g.layout.Close()
	}
	if g.sem != nil {
		err = errors.Join(err, g.sem.Close())
	}
	if g.rdb != nil {
		err = errors.Join(err, g.rdb.Close())
	}
	return err
}

// Route is where a new task waits: in its queue (Waits false), with a
// place kept for it on each of its caps, or in the room of one of its
// limits.
type Route struct {
	g     *Gate
	limit Limit  // the limit it waits for, when it waits
	token string // its token in the rooms
	waits bool
	kept  []Limit // the caps that keep a place for it
	fresh bool    // its ID was made for it: its token is new to the rooms
}

// Waits reports whether the task waits in a room: enqueue it with Options,
// then Park it.
func (r Route) Waits() bool { return r.waits }

// GiveBack gives up the places kept for the task, when it could not be
// enqueued: they go to the next tasks at once.
func (r Route) GiveBack(ctx context.Context) error {
	var errs []error
	for _, l := range r.kept {
		if err := r.g.sem.Dismiss(ctx, l.Key, r.token); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Options are the asynq options that keep a waiting task out of its queue
// until it is woken; its headers must carry Header.
func (r Route) Options() []asynq.Option {
	return []asynq.Option{asynq.ProcessIn(r.g.cfg.Worker.ParkedRetry)}
}

// Header is the header (name, value) of a waiting task.
func (r Route) Header() (string, string) { return WaitsForHeader, r.limit.Key }

// Park puts the waiting task, enqueued, in its room; a cap lets it out at
// once when a place freed meanwhile.
func (r Route) Park(ctx context.Context) error {
	l := &r.limit
	if l.Kind == KindCap {
		first, err := r.g.sem.Park(ctx, l.Key, l.Capacity, r.token, capRoom(l, r.g.cfg.Worker.ParkedRetry), l.tokenOptions(r.fresh)...)
		if err == nil && first && l.Template != "" {
			r.g.adm.noteRenderedRoom(ctx, *l)
		}
		return err
	}
	n, err := r.g.adm.parkToken(ctx, *l, r.token, r.fresh)
	if err == nil {
		r.g.pace.parked(*l, n)
	}
	return err
}

// FullError is returned by Gate.Route for a task whose cap has no place
// for it and whose key already has max_waiting tasks waiting, fleet-wide
// (parked, standing by, or waiting in a process): the task must not be
// enqueued. Package producer's errors for it also match
// producer.ErrFull.
type FullError struct {
	Key        string // the rendered semaphore key
	MaxWaiting int    // the cap's max_waiting
	Waiting    int    // the tasks waiting for Key when it was read
}

func (e *FullError) Error() string {
	return fmt.Sprintf("%d tasks wait for semaphore %q, its max_waiting is %d", e.Waiting, e.Key, e.MaxWaiting)
}

// Route decides where the task of taskType with payload, to be enqueued on
// queue with ID id, waits; fresh says that id was made for this task just
// now (no task had it before), which saves looking for its token in the
// rooms. A type that Routes does not route goes to its queue. A task with
// a busy rate limit (see Gate) waits in its room, and asks
// its caps for nothing. Within fullHintFor of a
// cap refusing a place, the next tasks of its key wait in its room
// without asking (a backlog enqueued at once costs one Reserve a second,
// not one a task): their Park lets them out at once when a place freed
// meanwhile. When a
// cap with max_waiting has no place for the task and its key already has
// that many tasks waiting, Route gives back the places it kept and returns
// a *FullError. The bound is checked, not reserved: the count is read
// after the place was refused, so producers routing at the same moment
// may overshoot it by their number; and a task given a standby place goes
// to its queue without the check (the standby budget bounds those).
func (g *Gate) Route(ctx context.Context, taskType string, payload []byte, queue, id string, fresh bool) (Route, error) {
	if !g.table.Limited(taskType) {
		return Route{}, nil
	}
	if queue == "" || id == "" {
		return Route{}, errors.New("admission: Gate.Route wants the task's queue and ID")
	}
	if err := g.open(ctx); err != nil {
		return Route{}, err
	}
	limits, err := g.table.For(taskType, payload, g.overrides)
	if err != nil {
		return Route{}, err
	}
	token := Token{Queue: queue, ID: id}.String()
	for _, l := range limits {
		if l.Kind == KindRate && g.pace.busy(l) {
			return Route{g: g, limit: l, token: token, waits: true, fresh: fresh}, nil
		}
	}
	caps := slices.DeleteFunc(limits, func(l Limit) bool { return l.Kind != KindCap })
	for i, l := range caps {
		ok, err := g.reserve(ctx, l, token, fresh)
		if err == nil && ok {
			continue
		}
		// No place here: the places kept on the caps before go to others.
		if derr := (Route{g: g, token: token, kept: caps[:i]}).GiveBack(ctx); derr != nil {
			g.log.Warn("worker: give back a place kept for a task (it lapses by itself)", "err", derr)
		}
		if err != nil {
			return Route{}, err
		}
		return Route{g: g, limit: l, token: token, waits: true, fresh: fresh}, nil
	}
	return Route{g: g, token: token, kept: caps}, nil
}

// reserve asks cap l for a place for token, unless l refused one within
// fullHintFor (and has no max_waiting, whose bound is read after a
// refusal): then the task waits without asking. A refusal on a key with
// max_waiting returns a *FullError when the key has that many waiting.
func (g *Gate) reserve(ctx context.Context, l Limit, token string, fresh bool) (bool, error) {
	if l.MaxWaiting <= 0 && g.full.Recent(l.Key) {
		return false, nil
	}
	ok, err := g.sem.Reserve(ctx, l.Key, l.Capacity, token, capRoom(&l, g.cfg.Worker.ParkedRetry), l.tokenOptions(fresh)...)
	if err != nil || ok {
		return ok, err
	}
	g.full.Mark(l.Key)
	return false, g.checkWaiting(ctx, l)
}

// checkWaiting returns a *FullError when the key of cap l has a bound on
// waiting and as many tasks wait for it already; nil when the task may
// wait too.
func (g *Gate) checkWaiting(ctx context.Context, l Limit) error {
	if l.MaxWaiting <= 0 {
		return nil
	}
	st, err := g.sem.RoomStats(ctx, l.Key)
	if err != nil {
		return err
	}
	if st.Waiting >= l.MaxWaiting {
		return &FullError{Key: l.Key, MaxWaiting: l.MaxWaiting, Waiting: st.Waiting}
	}
	return nil
}

// OpenOverrides reads the operators' runtime overrides of the fleet of
// prefix (its semaphore.prefix) on rdb (package control) and keeps them
// current.
func OpenOverrides(ctx context.Context, rdb redis.UniversalClient, prefix string, log *slog.Logger) (*control.Reader, error) {
	store, err := control.NewStore(rdb, control.Options{Prefix: prefix})
	if err != nil {
		return nil, err
	}
	r, err := control.NewReader(ctx, store, control.ReaderOptions{Logger: log})
	if err != nil {
		return nil, fmt.Errorf("runtime overrides: %w", err)
	}
	return r, nil
}
