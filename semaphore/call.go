package semaphore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The scripts' wire format. Every script of the seats and the waiting room
// (lua/room.lua) takes its arguments as name/value pairs and answers with
// name/value pairs, so that a call reads like what it asks, and a reply is
// read by name, not by position.

// storeTimeout bounds one script call. Calls that change seats do not take
// the caller's cancellation: a call cut off on the wire could leave a seat
// taken that nobody knows about.
const storeTimeout = 5 * time.Second

// reply is a script's answer, by name.
type reply map[string]any

func parseReply(v any) (reply, error) {
	list, ok := v.([]any)
	if !ok || len(list)%2 != 0 {
		return nil, fmt.Errorf("semaphore: a script replied %T %v, want name/value pairs", v, v)
	}
	r := make(reply, len(list)/2)
	for i := 0; i < len(list); i += 2 {
		name, ok := list[i].(string)
		if !ok {
			return nil, fmt.Errorf("semaphore: a script replied the name %v (%T)", list[i], list[i])
		}
		r[name] = list[i+1]
	}
	return r, nil
}

// int reads an integer value: a Lua number, or a string of digits
// (arrivals, which Lua would round).
func (r reply) int(name string) (int64, error) {
	v, ok := r[name]
	if !ok {
		return 0, fmt.Errorf("semaphore: a script's reply lacks %q", name)
	}
	n, err := replyInt(v)
	if err != nil {
		return 0, fmt.Errorf("semaphore: a script's reply %q: %w", name, err)
	}
	return n, nil
}

// uint reads an unsigned integer value sent as text (fences, which Lua
// numbers would round).
func (r reply) uint(name string) (uint64, error) {
	n, err := strconv.ParseUint(r.str(name), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("semaphore: a script's reply %q: %w", name, err)
	}
	return n, nil
}

func (r reply) str(name string) string {
	s, _ := r[name].(string)
	return s
}

func (r reply) strings(name string) []string { return replyStrings(r[name]) }

// replyInt reads an integer of a script reply: a Lua number, or a string
// of digits (arrivals, which Lua would round; ZSET scores in the "%.17g"
// form Redis prints them in). An empty string is 0.
func replyInt(v any) (int64, error) {
	switch v := v.(type) {
	case int64:
		return v, nil
	case string:
		if v == "" {
			return 0, nil
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n, nil
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, err
		}
		return int64(f), nil
	default:
		return 0, fmt.Errorf("unexpected %T", v)
	}
}

// replyStrings reads a list of strings of a script reply.
func replyStrings(v any) []string {
	list, ok := v.([]any)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(list))
	for _, x := range list {
		if s, ok := x.(string); ok && s != "" {
			out = append(out, s)
		}
	}
	return out
}

// runNamed runs a room script on k with name/value args and reads its
// reply, bounded by ctx and storeTimeout.
func (s *Service) runNamed(ctx context.Context, script *redis.Script, k keys, args ...any) (reply, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	v, err := script.Run(ctx, s.rdb, k.all(), args...).Result()
	if err != nil {
		return nil, err
	}
	return parseReply(v)
}

// runBatched is runNamed through the auto-pipeliner (batch.go): for the
// hot calls of concurrent callers.
func (s *Service) runBatched(script *redis.Script, k keys, args ...any) (reply, error) {
	v, err := s.batch.of(k.holders).run(script, k.all(), args...).Result()
	if err != nil {
		return nil, err
	}
	return parseReply(v)
}

// settleArgs are the arguments every script that passes seats on takes:
// where this Service hears of seats, and whether it brings tokens let out
// of the room back (see passOn); extra follow.
func (s *Service) settleArgs(key string, extra ...any) []any {
	return append([]any{"channel", s.id, "prefix", s.seatPrefix(), "key", key, "wake", s.wakeFlag()}, extra...)
}

// passOn hands on what a script that passed seats on gave this Service:
// seats for its own waiters ("granted": token, member, fence triples), in memory,
// and the tokens let out of the room ("woken"), to Options.OnWake. now is
// the server time of the call ("now" of the reply when zero).
func (s *Service) passOn(key string, r reply, now time.Time) { s.passOnFrom(key, r, now, false) }

// passOnFrom is passOn; recheck says the call was a recheck, whose grants
// may be seats another call gave, reported again (seatMsg.rechecked).
func (s *Service) passOnFrom(key string, r reply, now time.Time, recheck bool) {
	if ms, err := r.int("now"); now.IsZero() && err == nil {
		now = time.UnixMilli(ms)
	}
	// The arrivals first: a token let out may come back to enter before
	// this returns (its seat's waiter starts, and hands it on as it does).
	s.noteLetOut(key, r.strings("arrivals"))
	granted := r.strings("granted")
	settled, later := r.strings("settled"), r.strings("later")
	for i := 0; i+2 < len(granted); i += 3 {
		fence, err := strconv.ParseUint(granted[i+2], 10, 64)
		if err != nil {
			// Never hand out a seat with a wrong fence: the waiter's next
			// recheck finds the seat held and asks for a fence again.
			s.log.Error("semaphore: a grant's fence this build cannot read; the waiter rechecks for it", "key", key, "fence", granted[i+2], "err", err)
			continue
		}
		m := seatMsg{member: granted[i+1], fence: fence, now: now, rechecked: recheck}
		if j := slices.Index(settled, granted[i]); j >= 0 {
			m.settled, m.later = true, laterOf(later, j, len(settled))
		}
		if s.deliver(key, granted[i], m) {
			s.localHandOvers.Add(1)
			continue
		}
		if s.handedMeanwhile(key, granted[i], m) {
			continue
		}
		// A token enrolled by a call whose reply is not handed on yet
		// takes it as it is registered (enrol.go), with the tokens let out
		// in its place: they come back only as its task starts, as for
		// any seat delivered.
		if !s.keepEarly(key, granted[i], m) && m.settled {
			s.woke(key, m.later) // nobody waits for that seat: nothing to wait for
		}
	}
	s.woke(key, r.strings("woken"))
	s.noteHead(key, r)
	s.noteNext(key, r)
}

// noteLetOut keeps the arrivals of the tokens a call let out of key's room
// (token, arrival pairs), for their enter here: a task this Service's
// OnWake brings back mostly comes to this process, and its enter need not
// look its place up (see Enter).
func (s *Service) noteLetOut(key string, arrivals []string) {
	for i := 0; i+1 < len(arrivals); i += 2 {
		s.letOut.Note(letOutKey(key, arrivals[i]), arrivals[i+1])
	}
}

// letOutKey names a token let out of key's room in Service.letOut.
func letOutKey(key, token string) string { return key + "\x00" + token }

// wakeFlag tells the scripts whether to let tokens out of a room: only a
// Service with OnWake does, so that others leave the rooms alone.
func (s *Service) wakeFlag() string {
	if s.onWake != nil {
		return "1"
	}
	return "0"
}

// woke hands the tokens a call let out of key's room to Options.OnWake.
func (s *Service) woke(key string, tokens []string) {
	if len(tokens) > 0 && s.onWake != nil {
		go s.onWake(key, tokens)
	}
}

// laterOf is the share of the tokens let out in the places of n settled
// waiters (see release.lua) that the j-th of them hands to OnWake as it
// starts: one each, in order, and the last takes what is left.
func laterOf(later []string, j, n int) []string {
	if j >= len(later) {
		return nil
	}
	if j == n-1 {
		return later[j:]
	}
	return later[j : j+1]
}

// seatPrefix is the prefix of the channels seats are sent on; a Service's
// id completes the name of its own.
func (s *Service) seatPrefix() string { return s.prefix + "seat:" }
