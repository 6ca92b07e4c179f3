package semaphore

import (
	"context"
	"fmt"
	"time"
)

var roomStatsScript = roomScript("roomstats.lua")

// roomStatsStandbyMax bounds the standby tokens whose arrival RoomStats
// looks up: a key's standby places are its standby budget (a few, or a
// few hundred), and a reading must stay one short script call.
const roomStatsStandbyMax = 1000

// roomStatsTopValues is how many share values RoomStats lists, and
// roomStatsRealsMax how many tokens of a fair key it looks at for them
// and for the oldest real arrival.
const (
	roomStatsTopValues = 5
	roomStatsRealsMax  = 20000
)

// RoomStats is a reading of a key's waiting room (see Enter and Park), in
// the Redis server's time.
type RoomStats struct {
	// Waiting is the callers waiting for a seat of the key, fleet-wide:
	// Parked, the tokens that hold a standby place (or held one that
	// lapsed and goes back among the parked, keeping its place), and the
	// Acquire calls waiting in a process.
	Waiting int
	// Parked is the tasks waiting in Redis: their tokens are in the room
	// and the tasks sit in their queue, not in a worker slot.
	Parked int
	// Standby is the standby places in use: tasks waiting in a worker slot
	// for the next seat, or let out of the room and on their way to one.
	Standby int
	// Aside is the tokens that stepped out of the line for a while and
	// keep their arrival for when their task comes back (StepAside): its
	// queue is paused, its worker died with it, or it waits for another
	// key. Not in Waiting. A task deleted meanwhile is counted until its
	// note lapses with the room's keys (an hour at most).
	Aside int
	// OldestArrival is when the task that has waited longest came (its
	// first arrival, kept however often it went back); zero when nobody
	// waits.
	OldestArrival time.Time
	// OldestWait is how long that task has waited at the reading; 0 when
	// nobody waits.
	OldestWait time.Duration
	// ReadAt is the server's time of the reading.
	ReadAt time.Time
	// TopValues are, on a fair key (WithShare), the share values with the
	// most tokens waiting, most first (at most roomStatsTopValues).
	TopValues []ShareWaiting
}

// ShareWaiting is how many tokens of one share value wait.
type ShareWaiting struct {
	Value   string `json:"value"`
	Waiting int    `json:"waiting"`
}

// RoomStats reads how many tasks wait for key and since when, in one
// script call that changes nothing. A key nobody waits for reads as zero.
func (s *Service) RoomStats(ctx context.Context, key string) (RoomStats, error) {
	if err := checkKey(key); err != nil {
		return RoomStats{}, err
	}
	rep, err := s.runNamed(ctx, roomStatsScript, s.keysFor(key), "placesmax", roomStatsStandbyMax,
		"top", roomStatsTopValues, "realsmax", roomStatsRealsMax)
	if err != nil {
		return RoomStats{}, fmt.Errorf("semaphore: room stats of %q: %w", key, err)
	}
	var n [8]int64
	for i, name := range []string{"now", "parked", "waiting", "places", "live", "inboth", "oldest", "aside"} {
		if n[i], err = rep.int(name); err != nil {
			return RoomStats{}, fmt.Errorf("semaphore: room stats of %q: %w", key, err)
		}
	}
	now, parked, waiting, places, live, inboth, oldest, aside := n[0], n[1], n[2], n[3], n[4], n[5], n[6], n[7]
	st := RoomStats{Waiting: int(parked + places + waiting - inboth), Parked: int(parked), Standby: int(live), Aside: int(aside),
		ReadAt: time.UnixMicro(now)}
	if fair, _ := rep.int("fair"); fair == 1 {
		// Arrivals are virtual on a fair key: the real ones tell the wait.
		if oldest, err = rep.int("oldestreal"); err != nil {
			return RoomStats{}, fmt.Errorf("semaphore: room stats of %q: %w", key, err)
		}
		values := rep["values"]
		list, _ := values.([]any)
		for i := 0; i+1 < len(list); i += 2 {
			value, _ := list[i].(string)
			n, err := replyInt(list[i+1])
			if err != nil {
				return RoomStats{}, fmt.Errorf("semaphore: room stats of %q: %w", key, err)
			}
			st.TopValues = append(st.TopValues, ShareWaiting{Value: value, Waiting: int(n)})
		}
	}
	if oldest > 0 {
		st.OldestArrival = time.UnixMicro(oldest)
		st.OldestWait = max(time.Duration(now-oldest)*time.Microsecond, 0)
	}
	return st, nil
}
