package semaphore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/rediskey"
)

// Paced rooms. A rate limit's tasks wait in a waiting room of the kind a
// semaphore's tasks wait in (the line, line.lua): parked in arrival order,
// a token that steps aside keeping its arrival for when its task comes
// back. What lets a token out differs: here a pace, one token each
// interval the limit earns its cost in (pace.lua), handed out by one
// process at a time (the duty); package admission asks for them as the
// limit's tokens come due (package ratelimit). A paced room's keys are
// those of a semaphore's room under a start of their own,
// <prefix>paced:{<key>}:, so that a key's paced room and its semaphore's
// room never share a name, and in the same hash tag: :parked, :aside, and
// the pace's own :next, :duty and :served.

// paceScript takes the line of a room (line.lua), not the rest of a
// semaphore's room (room.lua), whose functions each call would define for
// nothing: about 6 µs of the server's time a call.
var paceScript = redis.NewScript(luaFile("line.lua") + luaFile("pace.lua"))

// ErrRoomEmpty is returned by PacedRooms.Pop, and Duty, when no token
// waits in the room.
var ErrRoomEmpty = errors.New("semaphore: nobody waits in the room")

// PacedRooms parks tokens in paced rooms and hands them out. It is safe for
// concurrent use; besides the Service's Redis client it holds only its
// name in the rooms' duty leases.
type PacedRooms struct {
	rdb    redis.UniversalClient
	prefix string
	name   string // in the duty leases: the Service's id, and "/1" for a worker, "/0" for a producer
}

// PacedRooms returns a handle on the Service's paced rooms, named in the
// duty leases (see Duty) by the Service and its role: two handles of one
// Service and role share a room's duty. enqueueOnly says that its process
// does not run the tasks it brings back (a producer): it hands a room's
// tokens out only while a process that runs them (a worker) asked for the
// room's duty lately, and a worker takes the duty over from it (see Pop).
func (s *Service) PacedRooms(enqueueOnly bool) *PacedRooms {
	role := "/1"
	if enqueueOnly {
		role = "/0"
	}
	return &PacedRooms{rdb: s.rdb, prefix: s.prefix, name: s.id + role}
}

// DutyLease is how long a process's duty of handing out a paced room's
// tokens lasts without its asking again (see Duty), and how long the
// other processes wait before they ask.
const DutyLease = time.Second

// A Handout is a token Pop handed out of a room.
type Handout struct {
	Token   string // "" when none was
	Arrival int64  // when the token was parked, server µs (see StepAside)
}

// Park puts token in key's room, keeping its place if it is there already
// (or the arrival it had when it stepped aside, StepAside), and returns how
// many tokens wait there now, token included. fresh says that the token was
// made just now, and cannot have stepped aside: it is not looked for. The
// room lapses ttl after its last Park.
func (p *PacedRooms) Park(ctx context.Context, key, token string, ttl time.Duration, fresh bool) (int, error) {
	if key == "" || token == "" || ttl < time.Millisecond {
		return 0, fmt.Errorf("semaphore: Park in a paced room wants a key, a token and a ttl of at least 1ms, got %q, %q, %s", key, token, ttl)
	}
	isNew := "0"
	if fresh {
		isNew = "1"
	}
	rep, err := p.run(ctx, key, "park", "token", token, "ttl", ttl.Milliseconds(), "new", isNew)
	if err != nil {
		return 0, fmt.Errorf("semaphore: park in the paced room of %q: %w", key, err)
	}
	n, err := rep.int("parked")
	return int(n), err
}

// Pop hands out the first token of key's room, unless the last hand-out
// was made less than gap ago (Handout.Token ""); either way wait is how
// long until the next may be due, the time to ask again (after a hand-out
// gap, or less when it was late). It hands out nothing while another
// process holds the room's duty (see Duty), nor, for a producer's rooms,
// while no worker asked for the duty lately: wait is then DutyLease. It
// returns ErrRoomEmpty, and gives the duty up, when no token waits.
func (p *PacedRooms) Pop(ctx context.Context, key string, gap time.Duration) (h Handout, wait time.Duration, err error) {
	if key == "" || gap <= 0 {
		return Handout{}, 0, fmt.Errorf("semaphore: Pop wants a key and a gap above 0, got %q, %s", key, gap)
	}
	rep, err := p.run(ctx, key, "pop", "gap", gap.Microseconds(), "holder", p.name, "retry", DutyLease.Microseconds())
	if err != nil {
		return Handout{}, 0, fmt.Errorf("semaphore: the paced room of %q: %w", key, err)
	}
	waitUs, err := rep.int("wait")
	if err != nil {
		return Handout{}, 0, err
	}
	if h.Token = rep.str("token"); h.Token == "" && waitUs < 0 {
		return Handout{}, 0, ErrRoomEmpty
	}
	if h.Token != "" {
		if h.Arrival, err = rep.int("arrival"); err != nil {
			return Handout{}, 0, err
		}
	}
	return h, time.Duration(waitUs) * time.Microsecond, nil
}

// Duty takes or renews this process's duty of handing out key's tokens,
// for DutyLease: onDuty is false while another process holds it (a worker
// takes it over from a producer). It returns ErrRoomEmpty, and gives the
// duty up, when no token waits.
func (p *PacedRooms) Duty(ctx context.Context, key string) (onDuty bool, err error) {
	if key == "" {
		return false, errors.New("semaphore: Duty wants a key")
	}
	rep, err := p.run(ctx, key, "duty", "holder", p.name, "lease", DutyLease.Milliseconds())
	if err != nil {
		return false, fmt.Errorf("semaphore: the duty of the paced room of %q: %w", key, err)
	}
	empty, err := rep.int("empty")
	if err != nil {
		return false, err
	}
	if empty == 1 {
		return false, ErrRoomEmpty
	}
	held, err := rep.int("onduty")
	return held == 1, err
}

// Void takes back a hand-out of key's room whose task no longer waits (an
// operator deleted it, or it ran meanwhile): it does not count against the
// pace, so the next token is handed out gap sooner.
func (p *PacedRooms) Void(ctx context.Context, key string, gap time.Duration) error {
	if key == "" || gap <= 0 {
		return fmt.Errorf("semaphore: Void wants a key and a gap above 0, got %q, %s", key, gap)
	}
	if _, err := p.run(ctx, key, "void", "gap", gap.Microseconds()); err != nil {
		return fmt.Errorf("semaphore: the paced room of %q: %w", key, err)
	}
	return nil
}

// StepAside takes back a hand-out of key's room, as Void does, whose task
// waits in a paused queue, or is still in a worker's hands: the task runs,
// or parks again, once its queue resumes or it comes back, and a Park of
// its token within ttl gives it back the arrival it had, ahead of the
// tokens parked after it.
func (p *PacedRooms) StepAside(ctx context.Context, key string, h Handout, gap, ttl time.Duration) error {
	if key == "" || h.Token == "" || gap <= 0 || ttl < time.Millisecond {
		return fmt.Errorf("semaphore: StepAside wants a key, a token, a gap above 0 and a ttl of at least 1ms, got %q, %q, %s, %s", key, h.Token, gap, ttl)
	}
	_, err := p.run(ctx, key, "aside", "gap", gap.Microseconds(), "token", h.Token, "arrival", h.Arrival, "ttl", ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("semaphore: the paced room of %q: %w", key, err)
	}
	return nil
}

// Waiting returns how many tokens wait in key's room.
func (p *PacedRooms) Waiting(ctx context.Context, key string) (int, error) {
	n, err := p.rdb.ZCard(ctx, p.keys(key).parked).Result()
	if err != nil {
		return 0, fmt.Errorf("semaphore: the paced room of %q: %w", key, err)
	}
	return int(n), nil
}

// DutyKey is the Redis key that names the process on duty in key's room
// (see Duty): for tests and operators who look at it.
func (p *PacedRooms) DutyKey(key string) string { return p.base(key) + "duty" }

func (p *PacedRooms) base(key string) string {
	return p.prefix + "paced:{" + rediskey.HashTag(key) + "}:"
}

// keys are the room keys of key's paced room (keysAt), of which it uses
// parked and aside.
func (p *PacedRooms) keys(key string) keys { return keysAt(p.base(key)) }

// run calls pace.lua on key's room with op and its name/value arguments.
func (p *PacedRooms) run(ctx context.Context, key, op string, args ...any) (reply, error) {
	base := p.base(key)
	ks := append(p.keys(key).all(), base+"next", base+"duty", base+"served")
	v, err := paceScript.Run(ctx, p.rdb, ks, append([]any{"op", op}, args...)...).Result()
	if err != nil {
		return nil, err
	}
	return parseReply(v)
}
