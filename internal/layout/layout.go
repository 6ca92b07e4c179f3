// Package layout versions fleetcap's Redis layout: the names, types and
// contents of every key fleetcap owns (the semaphores and their waiting
// rooms, the rate limits, the runtime overrides, the watches of idle
// queues; internal/rediskey names them). One Redis serves one layout at a
// time, so that no process fails with WRONGTYPE on another build's key or
// misreads its data (SPEC §2.12).
//
// This build speaks layout 7 (Version). The layouts, and what each
// changed:
//   - 1, the builds from before 46ae4d4, which recorded no version: the
//     waiting room of a key, <semaphore.prefix>{<key>}:parked, was a LIST.
//   - 2: that room is a ZSET under the same name.
//   - 3: every key a fleet owns starts with its semaphore.prefix (P), so
//     that fleets of different prefixes share a Redis apart. The runtime
//     overrides move from fleetcap:control (and its channel
//     fleetcap:control:changed) to P+"control" (and P+"control:changed");
//     a rate limit's tokens and room from rate:fleetcap:{<tag>} (and
//     :room, :next) to rate:P{<tag>}; an idle queue's watch from
//     fleetcap:idle:{<queue>}:duty and :bell to P+"idle:{<queue tag>}:duty"
//     and :bell. With the default prefix, fleetcap:sem:control,
//     rate:fleetcap:sem:{<tag>} and fleetcap:sem:idle:{<queue>}:duty. And
//     the hash tag of a rate limit's keys escapes the key as a
//     semaphore's does (rediskey.HashTag): a "{" in the key stays as it
//     is, where layout 2 wrote "%7B" (the tokens of key "a{b" were
//     rate:fleetcap:{a%7Bb}). The semaphores' keys keep their names. Of
//     layout 2's keys, the rate limits and the watches expire by
//     themselves (a rate limit starts again at full burst); the overrides
//     do not, and are not read where they are: Claim refuses while
//     fleetcap:control holds any (Overrides), until they are moved or
//     dropped. And a semaphore's waiting room changes: the per-process
//     line ({<key>}:queue, :qexp) and the standby set ({<key>}:standby)
//     give way to {<key>}:waiting, :slots, :procs and :places, where a
//     freed seat is given to the first waiter in the call that frees it
//     (package semaphore). Layout 2's waiting tokens lapse with their
//     keys; a layout-2 process left running would not see layout 3's
//     waiters, which the check refuses.
//   - 4: every seat carries a fencing token: a key's last one is kept in
//     <semaphore.prefix>{<key>}:fence, and the message that sends a
//     waiting process its seat names the fence after the member (a
//     layout-3 process would not read it); a seat of weight n holds n
//     members of {<key>}:holders, and the slots entries name the weight;
//     a fair key keeps its values' last arrivals in {<key>}:shares and
//     its tokens' real arrivals in {<key>}:reals. Layout 3's other keys
//     keep their names and contents.
//   - 5: a process may hold spare seats of a key (package semaphore,
//     spare.go): one member of {<key>}:holders of weight n, listed in
//     {<key>}:spares with the process's seat channel; a call that finds
//     the key full sends "spare:<key>" on each such channel, and the
//     process gives them back. A layout-4 process would neither send nor
//     heed it. Layout 4's keys keep their names and contents.
//   - 6: a standby place keeps its token's arrival in its member of
//     {<key>}:places (the token, a tab, the arrival), where layout 5 kept
//     it in the HASH {<key>}:since, which is gone; a waiting token's
//     entry in {<key>}:slots names that arrival before its label (an
//     entry of layout 5, left in line by a killed process, leaves the
//     line when its turn comes). A layout-5 process would not find the
//     places. Layout 5's since keys lapse with their TTL; a place of
//     layout 5 left behind lapses, and its token goes back among the
//     parked as of then, not with its arrival.
//   - 7: a rate limit's waiting room is a paced room of package semaphore
//     (pace.go), a waiting room of the kind a semaphore's is, under
//     <prefix>paced:{<tag>}: :parked, :aside (a ZSET, where layout 6 kept
//     rate:<prefix>{<tag>}:aside as a HASH), and :next, :duty and :served,
//     where layout 6 kept rate:<prefix>{<tag>}:room, :next, :duty, :served
//     and :aside. A layout-6 process would not find the tokens. Layout
//     6's rooms lapse with their TTL; the tasks that waited in them come
//     back by themselves at their worker.parked_retry delay (they were
//     enqueued scheduled for it) and wait anew, behind the tokens parked
//     since. The limits' tokens (rate:<prefix>{<tag>}) keep their name.
//     The notes of the rooms of rendered keys move from rate:<prefix>rooms
//     to <prefix>rooms (package semaphore); layout 6's lapse with their
//     TTL, and the tasks of the rooms they noted come back at their
//     delay.
//
// The record is one Redis hash, fleetcap:layout (Key), without a TTL. Its
// field "version" is the layout the fleet's data is in; a field
// "process <name>" per live worker or producer holds "<layout> <lease
// expiry>", the expiry in milliseconds of the Redis server's clock. Every
// process renews its lease every Lease/3 (Lease is 30 s) and gives it back
// when it closes; a killed process's lease lapses by itself. One key
// serves a Redis Cluster as well (its script touches that key alone) and
// the embedded Redis, whose file keeps it.
//
// A process starts (Claim) only when
//   - no process of another layout holds a live lease;
//   - the recorded version is not newer than its own (it cannot read a
//     newer layout's data; an older one is taken over: a newer build knows
//     its predecessors' layouts);
//   - none of the parked keys of the config's plain cap keys is a LIST
//     (layout 1's data, which carries no record);
//   - taking over from an older layout, no runtime overrides of it wait
//     in fleetcap:control, where this build does not read them (unless
//     the prefix is "fleetcap:", whose overrides are that hash).
//
// Otherwise it refuses with an *Error that names both layouts and what to
// do. The checks and the record are made in one script, so two processes
// of different layouts that start at once cannot both pass. A build from
// before 46ae4d4 that runs but has parked nothing is invisible to the
// check: stop the old fleet before starting a new one.
//
// A later layout that changes a key keeps this record's format, bumps
// Version, and checks at Claim for its predecessor's data that may outlive
// the predecessor's processes, as this one checks for layout 1's lists and
// layout 2's overrides. The record itself stays fleetcap:layout, one for
// the whole Redis whatever the fleets' prefixes: it is how builds of
// different layouts find each other.
package layout

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
)

// Version is the Redis layout this build speaks.
const Version = 7

// Key is the Redis hash that records the layout and its live processes.
const Key = "fleetcap:layout"

// DefaultLease is how long a process's lease lasts after its last renewal;
// it is renewed every third of it.
const DefaultLease = 30 * time.Second

// firstVersioned is the commit from which builds record their layout;
// the builds before it speak layout 1.
const firstVersioned = "46ae4d4"

// OldOverridesKey is where the layouts before 3 kept the runtime overrides,
// whatever the prefix.
const OldOverridesKey = "fleetcap:control"

// overridesMoved is the layout that moved the overrides under the prefix.
const overridesMoved = 3

//go:embed claim.lua
var claimSrc string

var claimScript = redis.NewScript(claimSrc)

// Options configure Claim.
type Options struct {
	// Role is what the process is, "worker" or "producer": the start of
	// its name in the record, which names the host and pid too.
	Role string
	// SemaphorePrefix and CapKeys are the config's semaphore.prefix and
	// its plain (not templated) cap keys: where layout 1 kept its lists.
	SemaphorePrefix string
	CapKeys         []string
	// Logger receives the renewals' warnings; default slog.Default().
	Logger *slog.Logger

	// Version is the layout claimed; default (0) Version. Tests stand in
	// for other builds with it.
	Version int
	// Lease is the lease of the process; default DefaultLease.
	Lease time.Duration
}

// Process is a live process of another layout, as the record shows it.
type Process struct {
	Name   string        // role@host:pid:nonce
	Layout string        // its layout ("?": an entry this build cannot read)
	Left   time.Duration // until its lease lapses, unless it is renewed
}

// Error is a refused start: Redis holds another layout than this build's.
type Error struct {
	Want  int    // this build's layout
	Found string // the other layout: "1" for the lists of the builds before 46ae4d4
	// Live are the processes of the other layout that hold a lease; none
	// when the record's version or a list refused the start.
	Live []Process
	// Lists are the parked keys found as LISTs (layout 1), with the TTL
	// each has left (-1: none).
	Lists []List
	// Overrides is the hash of runtime overrides of an older layout, which
	// kept them under one name whatever the prefix; nil: none found.
	Overrides *Overrides
}

// Overrides is the runtime overrides hash of the layouts before 3, found
// where this build does not read it.
type Overrides struct {
	Key    string // where they are: fleetcap:control (OldOverridesKey)
	Fields int64  // how many
	MoveTo string // where this build reads this fleet's: <prefix>control
}

// List is one of layout 1's lists of parked tokens.
type List struct {
	Key string
	TTL time.Duration // -1: no TTL
}

// Error says what this build found and what to do.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fleetcap: this build speaks Redis layout %d, but ", e.Want)
	switch {
	case len(e.Live) > 0:
		last := time.Duration(0)
		names := make([]string, 0, len(e.Live))
		for _, p := range e.Live {
			last = max(last, p.Left)
			if len(names) < 3 {
				names = append(names, p.Name)
			}
		}
		more := ""
		if len(e.Live) > len(names) {
			more = fmt.Sprintf(" and %d more", len(e.Live)-len(names))
		}
		fmt.Fprintf(&b, "%d process(es) of layout %s hold a live lease in %s (%s%s). "+
			"One Redis serves one layout at a time: stop every process of the layout-%s build, then start this one "+
			"(a process that stops gives its lease back; a killed one's lapses within %s); "+
			"or run the layout-%s build here instead",
			len(e.Live), e.Found, Key, strings.Join(names, ", "), more, e.Found, last.Round(time.Second), e.Found)
		if slices.ContainsFunc(e.Live, func(p Process) bool { return p.Layout == "?" }) {
			fmt.Fprintf(&b, `; an entry of layout "?" is one this build cannot read: once its process is gone, delete it (HDEL %s "process <name>")`, Key)
		}
	case len(e.Lists) > 0:
		l := e.Lists[0]
		lapse := "it has no TTL"
		if l.TTL >= 0 {
			lapse = "this one's lapses in " + l.TTL.Round(time.Second).String()
		}
		more := ""
		if len(e.Lists) > 1 {
			more = fmt.Sprintf(" (and %d more such keys)", len(e.Lists)-1)
		}
		fmt.Fprintf(&b, "%s is a LIST%s: data of layout 1, kept by the fleetcap builds from before %s (they record no layout). "+
			"Stop every process of that build; its lists of parked tasks lapse within their TTL (%s), then start this one; "+
			"or delete them (DEL %s): their tasks come back at their retry time all the same",
			l.Key, more, firstVersioned, lapse, l.Key)
	case e.Overrides != nil:
		o := e.Overrides
		fmt.Fprintf(&b, "%s holds %d runtime override(s) of layout %s, which kept the overrides of every fleet on this Redis there; "+
			"this build reads this fleet's from %s (its semaphore.prefix + \"control\"). "+
			"Once every process of layout %s is stopped, move them (RENAME %s %s; on a Cluster, HSET the fields of %s on %s, then DEL %s), "+
			"or drop them (DEL %s); with several fleets on this Redis, give each its own keys' fields",
			o.Key, o.Fields, e.Found, o.MoveTo, e.Found, o.Key, o.MoveTo, o.Key, o.MoveTo, o.Key, o.Key)
	default:
		if _, err := strconv.Atoi(e.Found); err != nil {
			fmt.Fprintf(&b, "%s records the layout %q, which no fleetcap build writes: repair or delete that key", Key, e.Found)
			break
		}
		fmt.Fprintf(&b, "the data on this Redis is in layout %s (%s), which this build cannot read. "+
			"Run a build that speaks layout %s or later; to go back to layout %d on purpose, stop every process, "+
			"remove what layout %s wrote, and delete %s",
			e.Found, Key, e.Found, e.Want, e.Found, Key)
	}
	return b.String()
}

// Lease is a process's claim on the layout: renewed in the background
// until Close.
type Lease struct {
	rdb   redis.UniversalClient
	opts  Options
	name  string
	lists []string
	log   *slog.Logger

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// Claim checks that rdb speaks this build's layout and records this
// process as a live speaker of it, with a lease renewed until Close. A
// refusal is an *Error and writes nothing (it may drop leases that
// lapsed); any other error is Redis's.
func Claim(ctx context.Context, rdb redis.UniversalClient, opts Options) (*Lease, error) {
	if rdb == nil || opts.Role == "" || opts.Version < 0 || opts.Lease < 0 {
		return nil, fmt.Errorf("layout: Claim wants a client, a role, and no negative version or lease (role %q, version %d, lease %s)",
			opts.Role, opts.Version, opts.Lease)
	}
	if opts.Version == 0 {
		opts.Version = Version
	}
	if opts.Lease == 0 {
		opts.Lease = DefaultLease
	}
	if opts.Lease < 3*time.Millisecond {
		return nil, fmt.Errorf("layout: a lease of %s is shorter than 3ms", opts.Lease)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	l := &Lease{rdb: rdb, opts: opts, name: processName(opts.Role), log: opts.Logger,
		lists: layout1Parked(opts.SemaphorePrefix, opts.CapKeys), stop: make(chan struct{}), done: make(chan struct{})}
	if err := l.checkLists(ctx); err != nil {
		return nil, err
	}
	if err := l.checkOverrides(ctx); err != nil {
		return nil, err
	}
	if err := l.claim(ctx, "start"); err != nil {
		return nil, err
	}
	go l.renewLoop()
	return l, nil
}

// Name is the process's name in the record.
func (l *Lease) Name() string { return l.name }

// Close stops the renewals and gives the lease back (a failure to give it
// back is returned: the lease then lapses by itself). It is safe to call
// more than once.
func (l *Lease) Close() error {
	if !l.halt() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := l.rdb.HDel(ctx, Key, "process "+l.name).Err(); err != nil {
		return fmt.Errorf("layout: give back the lease of %s (it lapses within %s): %w", l.name, l.opts.Lease, err)
	}
	return nil
}

// halt stops the renewals, once: it reports whether this call did.
func (l *Lease) halt() bool {
	halted := false
	l.once.Do(func() {
		close(l.stop)
		<-l.done
		halted = true
	})
	return halted
}

// layout1Parked are the names layout 1 gave the waiting rooms of keys: its
// builds put no escape in the hash tag.
func layout1Parked(prefix string, keys []string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, prefix+"{"+k+"}:parked")
	}
	return out
}

// checkLists refuses when a parked key is a LIST (layout 1).
func (l *Lease) checkLists(ctx context.Context) error {
	if len(l.lists) == 0 {
		return nil
	}
	types := make([]*redis.StatusCmd, len(l.lists))
	ttls := make([]*redis.DurationCmd, len(l.lists))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range l.lists {
			types[i] = p.Type(ctx, k)
			ttls[i] = p.PTTL(ctx, k)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("layout: cannot check the Redis layout: read the types of the parked keys: %w", err)
	}
	e := &Error{Want: l.opts.Version, Found: "1"}
	for i, k := range l.lists {
		if types[i].Val() != "list" {
			continue
		}
		ttl := ttls[i].Val()
		if ttl < 0 {
			ttl = -1
		}
		e.Lists = append(e.Lists, List{Key: k, TTL: ttl})
	}
	if len(e.Lists) > 0 {
		return e
	}
	return nil
}

// checkOverrides refuses while the runtime overrides of a layout before 3
// wait in OldOverridesKey, unmoved: this build would run without them (a
// paused key would run). Once a layout of 3 or later is recorded, that
// hash, if any, is a fleet's of prefix "fleetcap:", not old data.
func (l *Lease) checkOverrides(ctx context.Context) error {
	moveTo := rediskey.Control(l.opts.SemaphorePrefix)
	if l.opts.SemaphorePrefix == "" || moveTo == OldOverridesKey || l.opts.Version < overridesMoved {
		return nil
	}
	var recorded *redis.StringCmd
	var fields *redis.IntCmd
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		recorded = p.HGet(ctx, Key, "version")
		fields = p.HLen(ctx, OldOverridesKey)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("layout: cannot check the Redis layout: read %s and %s: %w", Key, OldOverridesKey, err)
	}
	found := recorded.Val()
	v, err := strconv.Atoi(found)
	if old := found == "" || err == nil && v < overridesMoved; !old || fields.Val() == 0 {
		return nil // not an older layout's (the claim refuses another record)
	}
	if found == "" {
		found = "1" // the builds before 46ae4d4 recorded nothing
	}
	return &Error{Want: l.opts.Version, Found: found, Overrides: &Overrides{Key: OldOverridesKey, Fields: fields.Val(), MoveTo: moveTo}}
}

// claim runs the claim script; mode is "start" or "renew". It returns an
// *Error when the script refused (start) or found another layout (renew).
func (l *Lease) claim(ctx context.Context, mode string) error {
	reply, err := claimScript.Run(ctx, l.rdb, []string{Key}, l.opts.Version, l.name, l.opts.Lease.Milliseconds(), mode).Slice()
	if err != nil {
		return fmt.Errorf("layout: cannot check the Redis layout: claim %s: %w", Key, err)
	}
	if len(reply) < 2 || (len(reply)-2)%3 != 0 {
		return fmt.Errorf("layout: claim %s: a reply of %d values", Key, len(reply))
	}
	recorded, _ := reply[0].(string)
	recordedOK, _ := reply[1].(int64)
	e := &Error{Want: l.opts.Version}
	for i := 2; i+2 < len(reply); i += 3 {
		name, _ := reply[i].(string)
		layout, _ := reply[i+1].(string)
		left, _ := reply[i+2].(int64)
		e.Live = append(e.Live, Process{Name: name, Layout: layout, Left: time.Duration(left) * time.Millisecond})
		if e.Found == "" {
			e.Found = layout // the first one's, should there be several
		}
	}
	switch {
	case len(e.Live) > 0:
		return e
	case recorded != "" && recorded != strconv.Itoa(l.opts.Version) && (recordedOK == 0 || mode == "renew"):
		e.Found = recorded
		return e
	case recordedOK == 0:
		return fmt.Errorf("layout: claim %s: refused without a reason", Key)
	}
	if recorded != "" && recorded != strconv.Itoa(l.opts.Version) {
		l.log.Info("layout: this fleet's Redis layout moves on", "from", recorded, "to", l.opts.Version, "key", Key)
	}
	return nil
}

// renewLoop renews the lease every third of it until Close, and says
// loudly when it finds another layout beside this one (a process of
// another build started while this one could not renew, or a build from
// before 46ae4d4 parked a task).
func (l *Lease) renewLoop() {
	defer close(l.done)
	every := l.opts.Lease / 3
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), every)
		err := l.claim(ctx, "renew")
		if err == nil {
			err = l.checkLists(ctx)
		}
		cancel()
		var le *Error
		switch {
		case errors.As(err, &le):
			l.log.Error("layout: another Redis layout beside this process's: "+le.Error(), "process", l.name)
		case err != nil:
			l.log.Warn("layout: cannot renew this process's lease (it lapses unless a renewal gets through)",
				"process", l.name, "lease", l.opts.Lease, "err", err)
		}
	}
}

// processName names this process in the record: its role, host, pid and
// a nonce (two processes of one pid, in tests, stay apart).
func processName(role string) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	nonce := make([]byte, 4)
	_, _ = rand.Read(nonce) // crypto/rand.Read never fails (Go 1.24+)
	return fmt.Sprintf("%s@%s:%d:%s", role, host, os.Getpid(), hex.EncodeToString(nonce))
}
