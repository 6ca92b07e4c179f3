package admission

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// ratePace is how a Gate tells whether a rate limit's key is busy (see
// Gate), a key at a time: until when the tasks it parked in the key's room
// are due, and a bucket that counts the tasks it sent to their queue
// against the limit's pace. It keeps at most paceKeysMax keys (a template
// renders a key per tenant): past that, it forgets the keys it has no
// task waiting for and whose bucket is full, which is as if it had never
// seen them.
type ratePace struct {
	mu    sync.Mutex
	keys  map[string]*keyPace // by rendered key
	clock func() time.Time
}

const paceKeysMax = 10000

// keyPace is the pace of one key.
type keyPace struct {
	bucket *rate.Limiter
	until  time.Time // the room holds tasks this Gate parked until about then
}

func newRatePace() *ratePace {
	return &ratePace{keys: map[string]*keyPace{}, clock: time.Now}
}

// busy reports whether a new task of rate limit l waits in its room: the
// tasks this Gate parked there are not all due yet, so that it would
// overtake them, or sending it to its queue would go past l's pace; a
// task that is sent counts against it.
func (p *ratePace) busy(l Limit) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k, now := p.key(l), p.clock()
	return now.Before(k.until) || !k.bucket.AllowN(now, l.Spec.Rate.Cost)
}

// parked notes that a task of l parked in its room, where waiting tasks
// wait now (it included): they are due one interval of the limit's cost
// after another.
func (p *ratePace) parked(l Limit, waiting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.key(l)
	k.until = p.clock().Add(time.Duration(waiting*l.Spec.Rate.Cost) * l.Rate.Interval())
}

// key is the pace of l's key, its bucket at the rate and burst in force.
func (p *ratePace) key(l Limit) *keyPace {
	every := rate.Every(l.Rate.Interval())
	k, ok := p.keys[l.Key]
	if !ok {
		if len(p.keys) >= paceKeysMax {
			p.forget()
		}
		k = &keyPace{bucket: rate.NewLimiter(every, l.Rate.Burst)}
		p.keys[l.Key] = k
	}
	if k.bucket.Limit() != every {
		k.bucket.SetLimit(every)
	}
	if k.bucket.Burst() != l.Rate.Burst {
		k.bucket.SetBurst(l.Rate.Burst)
	}
	return k
}

// forget drops the keys whose parked tasks are due and whose bucket is
// full again.
func (p *ratePace) forget() {
	now := p.clock()
	for key, k := range p.keys {
		if !now.Before(k.until) && k.bucket.TokensAt(now) >= float64(k.bucket.Burst()) {
			delete(p.keys, key)
		}
	}
}
