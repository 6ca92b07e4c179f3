package admission

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/fleetcap/fleetcap/internal/lately"
)

// ratePace is how a Gate tells whether a rate limit of a plain key is busy
// (see Gate): the keys it parked tasks for lately, and a bucket a key that
// counts the tasks it sent to their queue against the limit's pace.
type ratePace struct {
	parked *lately.Marks

	mu      sync.Mutex
	buckets map[string]*rate.Limiter // by plain key: a config's few
}

// A Gate parks the tasks of a rate limit for ratePaceFor after it parked
// one, so that none overtakes those waiting.
const ratePaceFor = time.Second

func newRatePace() *ratePace {
	return &ratePace{parked: &lately.Marks{For: ratePaceFor, Max: 1024}, buckets: map[string]*rate.Limiter{}}
}

// busy reports whether a new task of rate limit l waits in its room: the
// Gate parked tasks there lately, or sending it to its queue would go past
// l's pace; a task that is sent counts against it.
func (p *ratePace) busy(l Limit) bool {
	if p.parked.Recent(l.Key) {
		return true
	}
	if p.bucket(l).AllowN(time.Now(), l.Spec.Rate.Cost) {
		return false
	}
	p.parked.Mark(l.Key)
	return true
}

// bucket is the bucket of l's key, at the rate and burst in force.
func (p *ratePace) bucket(l Limit) *rate.Limiter {
	every := rate.Limit(float64(l.Rate.Rate) / l.Rate.Per.Seconds())
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.buckets[l.Key]
	if !ok {
		b = rate.NewLimiter(every, l.Rate.Burst)
		p.buckets[l.Key] = b
	}
	if b.Limit() != every {
		b.SetLimit(every)
	}
	if b.Burst() != l.Rate.Burst {
		b.SetBurst(l.Rate.Burst)
	}
	return b
}
