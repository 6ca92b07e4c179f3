package semaphore

import (
	"fmt"
	"time"
)

// AcquireOption tunes one Acquire, TryAcquire or WithPermit call.
type AcquireOption func(*acquireConfig)

type acquireConfig struct {
	ttl          time.Duration
	waitTimeout  time.Duration // 0: wait until ctx is done
	maxAttempts  int           // 0: no cap
	autoRenew    bool
	holder       string
	seats        int    // the permit's weight: seats it takes (WithWeight)
	share        string // its fair-share value (WithShare); "" for none
	shareWeight  int    // that value's weight
	room         *Room  // the waiting room it entered (Enter)
	startsOnSeat bool   // its task starts as its seat comes (WithStartOnSeat)
	newToken     bool   // the token was never in the room (WithNewToken)
	err          error
}

// WithTTL sets the lease length; the Service's DefaultTTL otherwise.
func WithTTL(d time.Duration) AcquireOption {
	return func(c *acquireConfig) {
		if err := checkTTL("WithTTL", d); err != nil {
			c.err = err
			return
		}
		c.ttl = d
	}
}

// WithWaitTimeout bounds how long Acquire waits in all; when it runs out,
// Acquire fails with ReasonTimeout. Without it Acquire waits until its
// context is done.
func WithWaitTimeout(d time.Duration) AcquireOption {
	return func(c *acquireConfig) {
		if d <= 0 {
			c.err = fmt.Errorf("semaphore: WithWaitTimeout: timeout must be > 0, got %s", d)
			return
		}
		c.waitTimeout = d
	}
}

// WithMaxAttempts caps how many times Acquire asks the store; past it,
// Acquire fails with ReasonExhausted.
func WithMaxAttempts(n int) AcquireOption {
	return func(c *acquireConfig) {
		if n < 1 {
			c.err = fmt.Errorf("semaphore: WithMaxAttempts: attempts must be >= 1, got %d", n)
			return
		}
		c.maxAttempts = n
	}
}

// WithAutoRenew renews the lease about every TTL/3 until Release or
// StopAutoRenew. When a renewal finds the seat gone, Permit.Lost is closed.
func WithAutoRenew() AcquireOption {
	return func(c *acquireConfig) { c.autoRenew = true }
}

// WithHolder records who holds the seat (Holders reports it); the worker
// passes the task ID.
func WithHolder(label string) AcquireOption {
	return func(c *acquireConfig) { c.holder = label }
}

// WithWeight makes the permit take n seats of the key's permits (n >= 1,
// and at most the permits); UsedPermits counts seats. Waiters are served
// in arrival order whatever their weight: a heavy one at the head of the
// line is not overtaken by lighter ones that came after it, unless its
// process is no longer heard of (it is passed over, as any waiter of such
// a process is).
func WithWeight(n int) AcquireOption {
	return func(c *acquireConfig) {
		if n < 1 {
			c.err = fmt.Errorf("semaphore: WithWeight: weight must be >= 1, got %d", n)
			return
		}
		c.seats = n
	}
}

// WithShare makes the caller wait as one of the share value's waiters, on
// a key where every caller gives one (a fair key): when the key is full,
// the values that have callers waiting take turns at the seats that free,
// a value of weight w w times as often as one of weight 1, first come
// first served within a value (start-time fair queueing on the arrival
// order). weight must be >= 1. Give every caller of a fair key a share: a
// caller without one is placed by its real arrival, which is no turn of
// any value.
func WithShare(value string, weight int) AcquireOption {
	return func(c *acquireConfig) {
		switch {
		case value == "":
			c.err = fmt.Errorf("semaphore: WithShare: the value must not be empty")
			return
		case weight < 1:
			c.err = fmt.Errorf("semaphore: WithShare: weight must be >= 1, got %d", weight)
			return
		}
		c.share, c.shareWeight = value, weight
	}
}

// WithStartOnSeat tells Enter that the task starts as soon as its seat
// comes, with nothing else to wait for (no other cap, no rate limit). A
// seat that a release of this Service gives it, while every task of the
// key waiting here is such a one, then gives up the task's standby place
// in the same call, and the tokens let out in its place are handed to
// OnWake when the Entry settles (Settle): one call less a task, and, as
// with settle.lua, nobody is brought to a slot before the task leaves its
// own.
func WithStartOnSeat() AcquireOption {
	return func(c *acquireConfig) { c.startsOnSeat = true }
}

// WithNewToken tells Reserve and Park that their token was never in the
// key's waiting room (its task's ID was made just now): the room takes it
// as new without looking for an arrival it kept, or for the places it may
// hold, a few commands fewer a call. Leave it out for a token that may
// have waited before.
func WithNewToken() AcquireOption {
	return func(c *acquireConfig) { c.newToken = true }
}

// roomKeyTTL is how long the keys of the waiting room c's token entered
// outlive a call: its Room's TTL (Enter), else the default.
func (c acquireConfig) roomKeyTTL() time.Duration {
	if c.room != nil {
		return c.room.TTL
	}
	return defaultRoomTTL
}

// lineArgs are the script arguments that place c's token in line: its
// fair share, if it has one, and whether it is new (WithNewToken).
func (c acquireConfig) lineArgs() []any {
	var args []any
	if c.share != "" {
		args = append(args, "share", c.share, "shareweight", c.shareWeight)
	}
	if c.newToken {
		args = append(args, "new", "1")
	}
	return args
}

// acquireConfig reads the options of a call for a permit of key, a
// semaphore of permits seats.
func (s *Service) acquireConfig(key string, permits int, opts []AcquireOption) (acquireConfig, error) {
	if err := checkPermits(permits); err != nil {
		return acquireConfig{}, err
	}
	return s.lineConfig(key, permits, opts)
}

// lineConfig reads the options of a call of the waiting room (Enter,
// Reserve, Park) on key, of permits seats (0: paused, when any weight
// goes; the caller checked permits).
func (s *Service) lineConfig(key string, permits int, opts []AcquireOption) (acquireConfig, error) {
	c := acquireConfig{ttl: s.ttl, seats: 1}
	if err := checkKey(key); err != nil {
		return c, err
	}
	for _, o := range opts {
		if o == nil {
			return c, fmt.Errorf("semaphore: nil AcquireOption")
		}
		o(&c)
		if c.err != nil {
			return c, c.err
		}
	}
	if permits > 0 && c.seats > permits {
		return c, fmt.Errorf("semaphore: WithWeight: weight %d is more than the %d permits of %q", c.seats, permits, key)
	}
	return c, nil
}

// checkTTL rejects a lease shorter than a millisecond: leases are kept in
// whole milliseconds, and a 0 ms lease would end as it began.
func checkTTL(what string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("semaphore: %s: ttl must be at least 1ms, got %s", what, d)
	}
	return nil
}
