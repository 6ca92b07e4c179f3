package ratelimit

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

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
