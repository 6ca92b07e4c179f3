// Package semaphore is a leased, fleet-wide counting semaphore on Redis.
//
// A Service hands out permits: leased seats of a named semaphore of a given
// capacity. Every process of a fleet that uses the same Redis and prefix
// shares the seats, so at most capacity permits of one key are held at once.
// A seat lapses at its lease expiry unless it is extended or auto-renewed,
// so a crashed holder frees its seat within its TTL. Lease time comes from
// the Redis server's clock, never from the caller's.
//
// Waiting is cheap and fair. Whoever waits for a seat is a token in the
// key's waiting room in Redis, first come first served by its arrival
// (lua/room.lua). A waiting Acquire, or a job-queue task standing by in a
// worker slot, waits in its process: the script call that frees a seat
// gives it to the first of them in the same call and sends it the seat on
// its process's channel (or hands it over in memory, when the process that
// freed it is its own), so nobody races for a seat, and nobody polls; a
// recheck with backoff is only the safety net, timed by the soonest lease
// expiry. Work that waits outside any process (a job queue's tasks) waits
// parked in the room instead (room.go): a fleet-wide budget of standby
// places lets a few tasks wait in a slot for the next seat, and the others
// are let out, first come first served, as places free. A token let out in
// the place of a task of the same process that starts on its seat joins
// the line at once on that process's behalf, so that its task stands by
// as it reaches a slot there, with no call of its own (Room.Enrol,
// enrol.go).
//
// The same line serves three more guarantees (SPEC §1.3, §2.10). A permit
// of weight n (WithWeight) takes n seats, and a heavy waiter at the head
// of the line stops it rather than be overtaken. On a fair key
// (WithShare), a token's arrival is virtual: the values that wait take
// turns, weighted, first come first served within a value; every other
// rule of the line stays as it is. And every seat carries a fencing token
// (Permit.Fence), above every fence granted on its key before.
//
// A call on a key nobody waits for skips the room: quick.lua takes a seat
// with one look at it, and two plain commands give it back, the seat
// first and then the look (quick.go). Of a process's Acquire
// calls that wait for a key, a few join the room and the others wait
// behind them in the process, keeping their arrivals (behind.go); a seat
// given back while the process's own waiter is first in line goes to it
// in memory, and moves on the store one call later (handover.go).
//
// A cap that is far from full costs its tasks no round trip of their own:
// a Service with Options.SpareSeats takes a few spare seats of such a key
// with a seat Enter took, and lends them to its next tasks in memory; the
// first call anywhere that finds the key full calls them back (spare.go).
//
// A rate limit's tasks wait in a room of the same kind, a paced room: the
// same line (lua/line.lua), whose tokens go out one at a time at the
// limit's pace, not as seats free (PacedRooms, pace.go).
package semaphore

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetcap/fleetcap/internal/lately"
	"github.com/fleetcap/fleetcap/internal/rediskey"
)

//go:embed lua/*.lua
var luaFiles embed.FS

func script(name string) *redis.Script {
	return redis.NewScript(luaFile(name))
}

// roomScript is a script that uses the functions of line.lua and room.lua,
// which come first (after nextfence.lua). Its KEYS are those of keys.all;
// its ARGV are name/value pairs.
func roomScript(name string) *redis.Script {
	return redis.NewScript(roomDefaults + luaFile("nextfence.lua") + luaFile("line.lua") + luaFile("room.lua") + luaFile(name))
}

// roomDefaults are the room scripts' defaults, from this package's.
var roomDefaults = fmt.Sprintf("local defaultKeyTTL = '%d'\n", defaultRoomTTL.Milliseconds())

func luaFile(name string) string {
	src, err := luaFiles.ReadFile("lua/" + name)
	if err != nil {
		panic("semaphore: missing embedded script " + name) // a build defect, not user input
	}
	return string(src)
}

var (
	acquireScript      = roomScript("acquire.lua")
	releaseScript      = roomScript("release.lua")
	leaveScript        = roomScript("leave.lua")
	forceReleaseScript = roomScript("forcerelease.lua")
	parkScript         = roomScript("park.lua")
	dismissScript      = roomScript("dismiss.lua")
	admitScript        = roomScript("admit.lua")
	asideScript        = roomScript("aside.lua")
	settleScript       = roomScript("settle.lua")
	fenceScript        = roomScript("fence.lua")
	extendScript       = script("extend.lua")
	holdersScript      = script("holders.lua")
	heldScript         = script("held.lua")
)

// Defaults of Options.
const (
	DefaultPrefix = rediskey.DefaultPrefix // "fleetcap:sem:"
	DefaultTTL    = 30 * time.Second
)

// Options configure a Service.
type Options struct {
	Prefix         string               // key prefix; default "fleetcap:sem:"
	DefaultTTL     time.Duration        // lease when a call gives none; default 30s
	Logger         *slog.Logger         // default slog.Default()
	TracerProvider trace.TracerProvider // default otel.GetTracerProvider()
	Observer       Observer             // metrics hook; nil = none
	// OnWake receives the tokens this Service lets out of a key's waiting
	// room (see Enter and Park): each should be brought to a slot, where
	// its task calls Enter again. It is called on a goroutine of its own.
	// A Service without it leaves the room alone.
	OnWake func(key string, tokens []string)
	// SpareSeats is how many spare seats of a key this Service may hold
	// for Enter's auto-renewed seats (see spare.go): a worker gives its
	// concurrency. 0 takes none.
	SpareSeats int
}

// Service hands out permits of semaphores kept in one Redis. It is safe for
// concurrent use; one Service per process is the intended shape.
type Service struct {
	rdb    redis.UniversalClient
	batch  *batchers // the hot calls go through them
	prefix string
	ttl    time.Duration
	log    *slog.Logger
	tracer trace.Tracer
	obs    Observer
	onWake func(key string, tokens []string)
	id     string // this Service's channel, where seats for its waiters come

	closeOnce sync.Once
	closed    chan struct{}

	localHandOvers atomic.Int64 // seats given to a waiter of this Service in memory

	mu       sync.Mutex           // guards renewing
	renewing map[*Permit]struct{} // permits with auto-renew on

	waits waitRegistry  // the waiters of this Service, and their keys
	spare spareSeats    // the spare seats it holds
	busy  *lately.Marks // keys found with somebody waiting lately (quick.go)
	full  *lately.Marks // keys whose last seat a quick take took lately (quick.go)
	told  *lately.Marks // rooms told their settings lately (see roomTold)
	names roomNames     // the key names of the rooms it called (keysFor)
	roomy *lately.Marks // keys whose room held tokens lately: a task stood by or parked (see release)
	// letOut keeps the arrivals of the tokens this Service let out of its
	// keys' rooms lately (by key and token, see letOutKey), for the enter
	// of a token whose task comes to this process (see Enter)
	letOut *lately.Notes[string]
	// early keeps, for a while, the seats sent to tokens that no waiter
	// here waits for: an enrolled token's seat may come before the reply
	// of the call that enrolled it (keepEarly)
	early *lately.Notes[seatMsg]
	// seatedAlone keeps, for a while, the seats that tasks standing by
	// here took as a recheck found them: a release's reply that gave such
	// a seat, handed on after, is not early (keepEarly)
	seatedAlone *lately.Notes[string]
	// handedSeats keeps, for a while, the moves of the seats handed in memory
	// to tasks standing by here (handover.go): a call that gave such a
	// task a seat on the store meanwhile, and let tokens out in its place,
	// hands them to the move, for the task's Settle (see handedMeanwhile)
	handedSeats *lately.Notes[*pendingFence]
	nextHeadFor time.Duration // see nextHeadFor; tests lengthen it
	taskMoves   atomic.Int64  // seats handed to tasks standing by in memory (for tests)
	clock       clockOffset
	// beforeEnrol, set by tests only, runs as a reply's enrolled tokens
	// are about to be registered (enrolled), to delay that reply
	beforeEnrol func(tokens []string)
}

// New returns a Service on rdb. It does not take ownership of rdb: Close
// leaves it open.
func New(rdb redis.UniversalClient, opts Options) (*Service, error) {
	if rdb == nil {
		return nil, errors.New("semaphore: New: nil redis client")
	}
	prefix, err := rediskey.PrefixOrDefault(opts.Prefix)
	if err != nil {
		return nil, fmt.Errorf("semaphore: New: Prefix %w", err)
	}
	opts.Prefix = prefix
	if opts.SpareSeats < 0 {
		return nil, fmt.Errorf("semaphore: New: SpareSeats must be >= 0, got %d", opts.SpareSeats)
	}
	if opts.DefaultTTL == 0 {
		opts.DefaultTTL = DefaultTTL
	}
	if err := checkTTL("New: DefaultTTL", opts.DefaultTTL); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	return &Service{
		rdb:         rdb,
		batch:       newBatchers(rdb),
		prefix:      opts.Prefix,
		ttl:         opts.DefaultTTL,
		log:         opts.Logger,
		tracer:      opts.TracerProvider.Tracer("github.com/fleetcap/fleetcap/semaphore"),
		obs:         opts.Observer,
		onWake:      opts.OnWake,
		id:          randomID(),
		closed:      make(chan struct{}),
		renewing:    make(map[*Permit]struct{}),
		waits:       newWaitRegistry(),
		spare:       spareSeats{max: opts.SpareSeats, open: map[string]*spareBlock{}},
		busy:        newBusyKeys(),
		full:        newBusyKeys(),
		told:        &lately.Marks{For: time.Minute, Max: busyMax},
		names:       roomNames{of: map[string]keys{}},
		roomy:       newBusyKeys(),
		letOut:      &lately.Notes[string]{For: time.Minute, Max: busyMax},
		early:       &lately.Notes[seatMsg]{For: earlyFor, Max: earlyMax},
		seatedAlone: &lately.Notes[string]{For: earlyFor, Max: earlyMax},
		handedSeats: &lately.Notes[*pendingFence]{For: earlyFor, Max: earlyMax},
		nextHeadFor: nextHeadFor,
	}, nil
}

// keys are the Redis keys of one semaphore; they share the hash tag {key}
// (see rediskey.HashTag). A holder's label travels inside its member of
// holders (see member). The others are the waiting room (lua/room.lua).
type keys struct {
	holders, waiting, slots, procs, parked, places, room, aside, fence, shares, reals, spares string
	// the KEYS of a roomScript and (keysFor) of quick.lua, built once
	allKeys, quickKeys []string
}

// keysFor returns the keys of key's room. Their names are kept
// (roomNames): building them cost S3's cycle a seventh of its
// allocations.
func (s *Service) keysFor(key string) keys {
	s.names.mu.Lock()
	defer s.names.mu.Unlock()
	k, ok := s.names.of[key]
	if !ok {
		k = keysAt(s.prefix + "{" + rediskey.HashTag(key) + "}:")
		k.quickKeys = []string{k.holders, k.waiting, k.parked, k.places, k.aside, k.fence, k.spares}
		if len(s.names.of) >= roomNamesMax {
			clear(s.names.of) // once in roomNamesMax new keys
		}
		s.names.of[key] = k
	}
	return k
}

// roomNames are the keys of the rooms a Service called, by key, at most
// roomNamesMax of them.
type roomNames struct {
	mu sync.Mutex
	of map[string]keys
}

const roomNamesMax = 4096

// keysAt are the keys of a room whose names start with base.
func keysAt(base string) keys {
	k := keys{holders: base + "holders", waiting: base + "waiting", slots: base + "slots", procs: base + "procs",
		parked: base + "parked", places: base + "places", room: base + "room", aside: base + "aside", fence: base + "fence",
		shares: base + "shares", reals: base + "reals", spares: base + "spares"}
	k.allKeys = []string{k.holders, k.waiting, k.slots, k.procs, k.parked, k.places, k.room, k.aside, k.fence, k.shares, k.reals, k.spares}
	return k
}

// all is the KEYS of a roomScript, in room.lua's order. Callers may append
// to it, not change it.
func (k keys) all() []string { return k.allKeys[:len(k.allKeys):len(k.allKeys)] }

// quick is the KEYS of quick.lua (of keys from keysFor: a paced room has
// no quick path); callers do not change it.
func (k keys) quick() []string { return k.quickKeys }

// member is a permit's member of the holders ZSET: its id, and its label
// after a newline when it has one (ids are hex, so the first newline ends
// the id), so that a seat and its label come and go in one command.
func member(id, label string) string {
	if label == "" {
		return id
	}
	return id + "\n" + label
}

// extraSeatMark separates a permit's id from the number of its other seats
// (2..weight) in their members of the holders ZSET (extraSeat in
// room.lua); ids are hex, so it is never in one.
const extraSeatMark = "\x01"

// splitMember is the inverse of member.
func splitMember(m string) (id, label string) {
	id, label, _ = strings.Cut(m, "\n")
	return id, label
}

func checkKey(key string) error {
	if key == "" {
		return errors.New("semaphore: key must not be empty")
	}
	return nil
}

func checkPermits(permits int) error {
	if permits < 1 {
		return fmt.Errorf("semaphore: permits must be >= 1, got %d", permits)
	}
	return nil
}

// UsedPermits counts the live (unexpired) seats of key: a permit of
// weight n holds n.
func (s *Service) UsedPermits(ctx context.Context, key string) (int, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	k := s.keysFor(key)
	n, err := holdersScript.Run(ctx, s.rdb, []string{k.holders}, "count").Int()
	if err != nil {
		return 0, fmt.Errorf("semaphore: used permits of %q: %w", key, err)
	}
	return n, nil
}

// AvailablePermits is permits minus the live holders of key, never below 0.
func (s *Service) AvailablePermits(ctx context.Context, key string, permits int) (int, error) {
	if err := checkPermits(permits); err != nil {
		return 0, err
	}
	used, err := s.UsedPermits(ctx, key)
	if err != nil {
		return 0, err
	}
	return max(permits-used, 0), nil
}

// Holder is a live holder of a seat.
type Holder struct {
	PermitID  string
	Label     string // WithHolder's label; the worker records the task ID
	ExpiresAt time.Time
	Seats     int // the seats it holds: its weight (WithWeight)
}

// Holders lists the live holders of key, soonest expiry first: one per
// permit, whatever its weight.
func (s *Service) Holders(ctx context.Context, key string) ([]Holder, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	k := s.keysFor(key)
	vals, err := holdersScript.Run(ctx, s.rdb, []string{k.holders}, "list").Slice()
	if err != nil {
		return nil, fmt.Errorf("semaphore: holders of %q: %w", key, err)
	}
	out := make([]Holder, 0, (len(vals)-1)/2)
	extra := map[string]int{}
	for i := 1; i+1 < len(vals); i += 2 {
		m, _ := vals[i].(string)
		id, label := splitMember(m)
		if of, _, ok := strings.Cut(id, extraSeatMark); ok {
			extra[of]++ // another seat of a permit of weight > 1
			continue
		}
		ms, err := strconv.ParseFloat(fmt.Sprint(vals[i+1]), 64)
		if err != nil {
			return nil, fmt.Errorf("semaphore: holders of %q: bad expiry %v", key, vals[i+1])
		}
		out = append(out, Holder{PermitID: id, Label: label, ExpiresAt: time.UnixMilli(int64(ms)), Seats: 1})
	}
	for i := range out {
		out[i].Seats += extra[out[i].PermitID]
	}
	return out, nil
}

// ForceReleaseAll frees every seat of key and returns how many live holders
// it displaced. Their Release returns ErrPermitNotHeld, their Extend
// ErrExtension. The seats go to the waiters, and with Options.OnWake
// tokens are let out of the waiting room for them.
func (s *Service) ForceReleaseAll(ctx context.Context, key string) (int, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	k := s.keysFor(key)
	r, err := s.runNamed(ctx, forceReleaseScript, k, s.settleArgs(key, "capacity", -1)...)
	if err != nil {
		return 0, fmt.Errorf("semaphore: force release of %q: %w", key, err)
	}
	n, err := r.int("displaced")
	if err != nil {
		return 0, fmt.Errorf("semaphore: force release of %q: %w", key, err)
	}
	s.log.Warn("semaphore: force-released every seat", "key", key, "displaced", n)
	s.passOn(key, r, time.Time{})
	return int(n), nil
}

// Close shuts the Service down. It does not release held permits (their work
// may still be running): it stops every auto-renewal, so this process's
// seats lapse within their remaining TTL; it aborts every waiting Acquire
// with ReasonShutdown; a seat won meanwhile is given back. Work that
// finishes still releases through its own Release. Close does not close
// the Redis client.
func (s *Service) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.unenrolAll()
		s.drainAllSpares(true)
		s.mu.Lock()
		renewing := s.renewing
		s.renewing = map[*Permit]struct{}{}
		s.mu.Unlock()
		for p := range renewing {
			p.stopRenew() // not under s.mu: a renewal ending may take it
		}
		s.stopListening()
	})
	return nil
}

func (s *Service) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}

// clockOffset tracks the Redis server's clock relative to the local
// monotonic clock, to stamp local waiters with a server-time ticket.
type clockOffset struct {
	mu     sync.Mutex
	offset time.Duration // server minus local
	known  bool
}

// observe takes the server time a call read, sent at local time sent and
// answered at received: the server read it about halfway between.
func (c *clockOffset) observe(serverMicros int64, sent, received time.Time) {
	local := sent.Add(received.Sub(sent) / 2)
	c.mu.Lock()
	c.offset = time.UnixMicro(serverMicros).Sub(local)
	c.known = true
	c.mu.Unlock()
}

// observeMillis is observe for a server time in milliseconds.
func (c *clockOffset) observeMillis(serverMillis int64, sent, received time.Time) {
	c.observe(serverMillis*1000, sent, received)
}

// local is the local time of server time t, when the offset is known.
func (c *clockOffset) local(t time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return t.Add(-c.offset), c.known
}

func (c *clockOffset) now() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset).UnixMicro(), c.known
}
