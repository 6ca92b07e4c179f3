package semaphore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The rooms of rendered keys, a cap's or a rate limit's. A worker watches
// the room of every plain key, but knows the keys a template renders only
// from the tasks it parks itself; a producer that holds a rendered key's
// tasks back notes the room (NoteRenderedRoom) when it parks a task in it
// while empty, so that the workers' sweeps find it (RenderedRooms) and
// bring its tasks back. The notes are one ZSET of the fleet,
// <prefix>rooms.

// A NotedRoom is the room of a key rendered from a template, noted at At
// (Unix ms).
type NotedRoom struct {
	Template, Key string
	At            int64
}

// NoteRenderedRoom notes that key's room, of a limit whose key is
// rendered from template, took a task; the notes lapse ttl after the last.
func (s *Service) NoteRenderedRoom(ctx context.Context, template, key string, ttl time.Duration) error {
	member, err := json.Marshal([2]string{template, key})
	if err != nil {
		return fmt.Errorf("semaphore: note the room of %q: %w", key, err)
	}
	pipe, notes := s.rdb.Pipeline(), s.prefix+"rooms"
	pipe.ZAdd(ctx, notes, redis.Z{Score: float64(time.Now().UnixMilli()), Member: string(member)})
	pipe.PExpire(ctx, notes, ttl)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("semaphore: note the room of %q: %w", key, err)
	}
	return nil
}

// RenderedRooms returns the rooms noted after after (Unix ms), oldest
// first, and forgets the notes from before forget.
func (s *Service) RenderedRooms(ctx context.Context, after, forget int64) ([]NotedRoom, error) {
	pipe, notes := s.rdb.Pipeline(), s.prefix+"rooms"
	pipe.ZRemRangeByScore(ctx, notes, "-inf", "("+strconv.FormatInt(forget, 10))
	noted := pipe.ZRangeByScoreWithScores(ctx, notes, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(after, 10), Max: "+inf"})
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("semaphore: read the noted rooms: %w", err)
	}
	var out []NotedRoom
	for _, z := range noted.Val() {
		member, _ := z.Member.(string)
		var room [2]string
		if err := json.Unmarshal([]byte(member), &room); err != nil {
			return nil, fmt.Errorf("semaphore: a noted room %q: %w", member, err)
		}
		out = append(out, NotedRoom{Template: room[0], Key: room[1], At: int64(z.Score)})
	}
	return out, nil
}
