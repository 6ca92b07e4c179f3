package ratelimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/semaphore"
)

// Waiting for tokens outside any process. A scheduler whose tasks wait in a
// queue rather than in a goroutine (the worker) parks a token per task that
// found no tokens (and its producer one per task it holds back before it
// is ever dequeued), and asks NextDue, when the first is due, which task to
// bring back: one token a time, in arrival order, fleet-wide (however many
// processes ask, NextDue hands out at most one token per interval the
// limit earns cost tokens in). The tokens wait in the limit's waiting
// room, a paced room of package semaphore: a room of the kind a
// semaphore's tasks wait in, whose tokens go out at a pace. Of the
// processes that ask, one at a time holds the duty of a room (a lease of
// DutyLease, renewed as it asks, and given up once the room is empty):
// only it looks at the tokens; the others are told to ask again after
// DutyLease, and one of them takes the duty over once the holder stops
// asking (it stopped, or died); a worker takes it over from a producer at
// once (Options.EnqueueOnly).

// Park puts token in key's room (semaphore.PacedRooms.Park), and returns
// how many tokens wait there now, token included.
func (l *Limiter) Park(ctx context.Context, key, token string, ttl time.Duration) (int, error) {
	return l.rooms.Park(ctx, key, token, ttl, false)
}

// ParkNew is Park for a token made just now, which cannot have stepped
// aside: it costs one command less.
func (l *Limiter) ParkNew(ctx context.Context, key, token string, ttl time.Duration) (int, error) {
	return l.rooms.Park(ctx, key, token, ttl, true)
}

// Void takes back a hand-out of key's room (NextDue) whose task no longer
// waits (semaphore.PacedRooms.Void): the next comes one interval of cost
// tokens sooner.
func (l *Limiter) Void(ctx context.Context, key string, limit Limit, cost int) error {
	if err := checkArgs(key, limit, cost); err != nil {
		return err
	}
	return l.rooms.Void(ctx, key, l.handOutGap(limit, cost))
}

// StepAside takes back a hand-out of key's room, as Void does, whose task
// waits in a paused queue, or is still in a worker's hands; a Park of its
// token within ttl gives it back its arrival (semaphore.PacedRooms.StepAside).
func (l *Limiter) StepAside(ctx context.Context, key string, h Handout, limit Limit, cost int, ttl time.Duration) error {
	if err := checkArgs(key, limit, cost); err != nil {
		return err
	}
	return l.rooms.StepAside(ctx, key, h, l.handOutGap(limit, cost), ttl)
}

// handOutGap is the time between two hand-outs of a room: the interval the
// limit earns cost tokens in.
func (l *Limiter) handOutGap(limit Limit, cost int) time.Duration {
	return time.Duration(float64(cost) * float64(limit.Interval()))
}

// Waiting returns how many tokens wait in key's room.
func (l *Limiter) Waiting(ctx context.Context, key string) (int, error) {
	return l.rooms.Waiting(ctx, key)
}

// DutyKey is the Redis key that names the process on duty in key's room.
func (l *Limiter) DutyKey(key string) string { return l.rooms.DutyKey(key) }

// ErrRoomEmpty is returned by NextDue when no token waits in the room.
var ErrRoomEmpty = semaphore.ErrRoomEmpty

// A Handout is a token NextDue handed out of a room.
type Handout = semaphore.Handout

// NextDue hands out the first token of key's room once cost tokens of the
// limit are due, or hands out nothing (Handout.Token ""); either way wait is how
// long until the next hand-out may be due, the time to ask again (after a
// hand-out, the interval the limit earns cost tokens in, or less when it
// was late). While another process holds the room's duty, it hands out
// nothing and says DutyLease; so does an EnqueueOnly Limiter while no
// other Limiter asked for the duty within the last 3 DutyLeases. It
// returns ErrRoomEmpty when no token waits.
func (l *Limiter) NextDue(ctx context.Context, key string, limit Limit, cost int) (h Handout, wait time.Duration, err error) {
	// The duty is asked for first, unless this Limiter took it lately;
	// then only when the tokens are not due (the pop says when the room is
	// empty). An EnqueueOnly Limiter always asks first: a worker may have
	// taken its duty over.
	checked := l.enqueueOnly || !l.duties.fresh(key)
	if checked {
		if wait, err := l.takeDuty(ctx, key); err != nil || wait > 0 {
			return Handout{}, wait, err
		}
	}
	peek, err := l.Peek(ctx, key, limit, cost)
	if err != nil {
		return Handout{}, 0, err
	}
	if !peek.Allowed {
		if !checked {
			if wait, err := l.takeDuty(ctx, key); err != nil || wait > 0 {
				return Handout{}, wait, err
			}
		}
		return Handout{}, peek.RetryAfter, nil
	}
	h, wait, err = l.rooms.Pop(ctx, key, l.handOutGap(limit, cost), DutyLease)
	if errors.Is(err, ErrRoomEmpty) {
		l.duties.gave(key)
	}
	return h, wait, err
}

// takeDuty takes or renews this Limiter's duty of key's room: 0 on duty,
// DutyLease (the wait before asking again) when another process holds it,
// ErrRoomEmpty when nobody waits.
func (l *Limiter) takeDuty(ctx context.Context, key string) (time.Duration, error) {
	onDuty, err := l.rooms.Duty(ctx, key, DutyLease)
	if err != nil || !onDuty {
		l.duties.gave(key)
		if err != nil {
			return 0, err
		}
		return DutyLease, nil
	}
	l.duties.took(key)
	return 0, nil
}

// DutyLease is how long a process's duty of handing out a room's tokens
// lasts without its asking again, and how long NextDue tells the other
// processes to wait before they ask.
const DutyLease = time.Second

// duties are the rooms whose duty this Limiter took lately: within half a
// lease it renews none of them, so that handing out costs no round trip
// more (the duty's lease runs on meanwhile).
type duties struct {
	mu    sync.Mutex
	since map[string]time.Time // key -> when its duty was taken or renewed
}

func (d *duties) fresh(key string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.since[key]
	return ok && time.Since(at) < DutyLease/2
}

func (d *duties) took(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.since == nil {
		d.since = map[string]time.Time{}
	}
	d.since[key] = time.Now()
}

func (d *duties) gave(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.since, key)
}

// The rooms of rendered keys. A worker watches the room of every plain
// key, but knows the keys a template renders only from the tasks it parks
// itself; a producer that holds a rendered key's tasks back notes the room
// (NoteRoom) when it parks a task in it while empty, so that the workers'
// sweeps find it (Rooms) and bring its tasks back.

// A NotedRoom is the room of a key rendered from a template, noted at At
// (Unix ms).
type NotedRoom struct {
	Template, Key string
	At            int64
}

// NoteRoom notes that key's room, of a limit whose key is rendered from
// template, took a task; the notes lapse ttl after the last.
func (l *Limiter) NoteRoom(ctx context.Context, template, key string, ttl time.Duration) error {
	member, err := json.Marshal([2]string{template, key})
	if err != nil {
		return fmt.Errorf("ratelimit: note the room of %q: %w", key, err)
	}
	pipe := l.rdb.Pipeline()
	pipe.ZAdd(ctx, l.roomsKey(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: string(member)})
	pipe.PExpire(ctx, l.roomsKey(), ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("ratelimit: note the room of %q: %w", key, err)
	}
	return nil
}

// Rooms returns the rooms noted after after (Unix ms), oldest first, and
// forgets the notes from before forget.
func (l *Limiter) Rooms(ctx context.Context, after, forget int64) ([]NotedRoom, error) {
	pipe := l.rdb.Pipeline()
	pipe.ZRemRangeByScore(ctx, l.roomsKey(), "-inf", "("+strconv.FormatInt(forget, 10))
	noted := pipe.ZRangeByScoreWithScores(ctx, l.roomsKey(), &redis.ZRangeBy{Min: "(" + strconv.FormatInt(after, 10), Max: "+inf"})
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("ratelimit: read the noted rooms: %w", err)
	}
	var out []NotedRoom
	for _, z := range noted.Val() {
		member, _ := z.Member.(string)
		var room [2]string
		if err := json.Unmarshal([]byte(member), &room); err != nil {
			return nil, fmt.Errorf("ratelimit: a noted room %q: %w", member, err)
		}
		out = append(out, NotedRoom{Template: room[0], Key: room[1], At: int64(z.Score)})
	}
	return out, nil
}

// roomsKey holds the noted rooms: "rate:" + prefix + "rooms".
func (l *Limiter) roomsKey() string { return "rate:" + l.prefix + "rooms" }
