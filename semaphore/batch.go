package semaphore

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Auto-pipelining. The hot script calls (acquire, release, hand-over) and
// the quick path's plain give (quick.go) of concurrent callers are sent
// together: a call joins a pending batch, and a few flusher goroutines
// each take the whole pending batch and send it as one pipeline, so Redis
// reads and answers many calls per system call and this process writes
// and reads them with one each. A flusher runs only while calls are
// pending; with one caller at a time a batch is that one call. Scripts go
// as EVALSHA; those the server does not know yet (NOSCRIPT) are sent
// again as EVAL, which also loads them.
//
// Three batches are on the wire at most: calls that come meanwhile wait
// for one of them and go together in the next. With four at once, S2's
// worker sent 1.1 calls per pipeline and spent its CPU on system calls.
// With one, it sent 2.4, but S3's fifty uncontended callers waited a whole
// round trip for every batch: two gave them 29,000-35,000 cycles/s against
// 22,000-27,000 with one (three runs each, alternating). Three against two
// (2026-12-08, alternating): S3 more cycles in 10 of 12 rounds (median
// +11%, from -22% to +32%), and S2 more capped tasks/s in 4 of 4 (4,892 to
// 5,480 against 4,574 to 5,418; capped/bare 0.973 to 1.064 against 0.871
// to 0.969): with Redis about three quarters busy, a call less often waits
// a round trip for a flusher.
//
// go-redis 9.23's own auto-pipeliner (Client.AutoPipeline, experimental)
// did worse in S3, each call sent through it from its goroutine: 23,082
// and 19,316 cycles/s with its defaults, 31,460 and 27,373 full-duplex,
// against 33,155 and 30,789 through these batches (two rounds,
// alternating, 2026-12-07).

const (
	maxFlushers = 3   // batches on the wire at once
	maxBatch    = 128 // calls in one pipeline
)

// evalCall is one script call, or a few plain commands, waiting for its
// batch.
type evalCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd // the script's reply
	// plain queues plain commands in place of a script (script is nil);
	// their replies are in the commands it queued.
	plain func(context.Context, redis.Pipeliner)
	done  chan struct{}
}

type batcher struct {
	rdb      redis.UniversalClient
	mu       sync.Mutex
	pending  []*evalCall
	flushers int
}

// run sends script through the next batch and waits for its reply. The
// batch is bounded by storeTimeout, not by the caller's context: a call
// that changes seats must not be cut off on the wire.
func (b *batcher) run(script *redis.Script, keys []string, args ...any) *redis.Cmd {
	c := &evalCall{script: script, keys: keys, args: args}
	b.wait(c)
	return c.cmd
}

// runPlain sends the commands queue queues through the next batch and
// waits for their replies, as run does a script.
func (b *batcher) runPlain(queue func(context.Context, redis.Pipeliner)) {
	b.wait(&evalCall{plain: queue})
}

func (b *batcher) wait(c *evalCall) {
	b.mu.Lock()
	if b.flushers == 0 && len(b.pending) == 0 {
		// Nothing is on the wire or waiting: send the call from this
		// goroutine. Starting a flusher for a lone call costs a goroutine
		// and the growth of its stack (S2's worker spent a seventh of its
		// CPU growing stacks). Calls that come meanwhile start flushers.
		b.flushers++
		b.mu.Unlock()
		c.done = make(chan struct{})
		b.send([]*evalCall{c})
		close(c.done)
		b.mu.Lock()
		b.flushers--
		start := len(b.pending) > 0 && b.flushers < maxFlushers
		if start {
			b.flushers++
		}
		b.mu.Unlock()
		if start {
			go b.flush()
		}
		return
	}
	b.mu.Unlock()
	b.submit(c)
	<-c.done
}

// submit puts c in the next batch without waiting for it; c.done is
// closed once c is answered.
func (b *batcher) submit(c *evalCall) {
	c.done = make(chan struct{})
	b.mu.Lock()
	b.pending = append(b.pending, c)
	start := b.flushers < maxFlushers
	if start {
		b.flushers++
	}
	b.mu.Unlock()
	if start {
		go b.flush()
	}
}

// flush sends pending batches until none is left.
func (b *batcher) flush() {
	for {
		b.mu.Lock()
		n := min(len(b.pending), maxBatch)
		if n == 0 {
			b.flushers--
			b.mu.Unlock()
			return
		}
		batch := b.pending[:n:n]
		if n == len(b.pending) {
			b.pending = nil
		} else {
			b.pending = b.pending[n:]
		}
		b.mu.Unlock()
		b.send(batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

func (b *batcher) send(batch []*evalCall) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if len(batch) == 1 && batch[0].script != nil {
		c := batch[0]
		c.cmd = c.script.Run(ctx, b.rdb, c.keys, c.args...)
		return
	}
	pipe := b.rdb.Pipeline()
	for _, c := range batch {
		if c.plain != nil {
			c.plain(ctx, pipe)
			continue
		}
		c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	var retry []*evalCall
	for _, c := range batch {
		if c.plain != nil {
			continue
		}
		if err := c.cmd.Err(); err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")) {
			retry = append(retry, c)
		}
	}
	if len(retry) == 0 {
		return
	}
	pipe = b.rdb.Pipeline()
	for _, c := range retry {
		c.cmd = c.script.Eval(ctx, pipe, c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx)
}

// batchers hands out the batcher for a key. On a Redis Cluster there is
// one per hash slot, so that a batch only waits for the node its calls go
// to (a pipeline over several nodes waits for the slowest); elsewhere one
// batcher serves every key.
type batchers struct {
	rdb     redis.UniversalClient
	one     *batcher // nil on a cluster
	mu      sync.Mutex
	perSlot map[uint16]*batcher // at most 16384
}

func newBatchers(rdb redis.UniversalClient) *batchers {
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		return &batchers{rdb: rdb, perSlot: make(map[uint16]*batcher)}
	}
	return &batchers{rdb: rdb, one: &batcher{rdb: rdb}}
}

// of returns the batcher for calls on key (a Redis key name).
func (bs *batchers) of(key string) *batcher {
	if bs.one != nil {
		return bs.one
	}
	slot := keySlot(key)
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.perSlot[slot]
	if b == nil {
		b = &batcher{rdb: bs.rdb}
		bs.perSlot[slot] = b
	}
	return b
}

// keySlot is the Redis Cluster hash slot of a key: CRC16 (XMODEM) of its
// hash tag (what stands between the first "{" and the next "}", when not
// empty) or of the whole name, modulo 16384.
func keySlot(key string) uint16 {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}
