package semaphore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Wake messages. Every Service listens on a pub/sub channel of its own
// (wakePrefix + its id); the scripts that free a seat, and a waiter that
// leaves the fleet-wide line, publish the semaphore's key there to the
// Services first in line, and the Service nudges its line of that key. The
// subscription is made once, by the first line that waits, and is what
// lets a line sleep a long safety-net backoff instead of polling.

// wakeListener is a Service's subscription to its wake channel. Its lock
// is never held while Redis is asked anything: a line that finds a
// subscription being made waits for that attempt on a channel.
type wakeListener struct {
	mu        sync.Mutex
	ps        *redis.PubSub // nil until subscribed
	attempt   chan struct{} // closed when the subscription being made is settled; nil when none is
	closed    bool
	listening bool
}

// listen subscribes s to its wake channel, once, and reports whether wake
// messages reach s. It waits until Redis confirms the subscription, so
// that no message sent after a line's next attempt can be missed. A failed
// attempt is retried by the next caller.
func (s *Service) listen() bool {
	wl := &s.wakes
	wl.mu.Lock()
	for wl.attempt != nil {
		ch := wl.attempt
		wl.mu.Unlock()
		<-ch
		wl.mu.Lock()
	}
	if wl.listening || wl.closed {
		ok := wl.listening
		wl.mu.Unlock()
		return ok
	}
	attempt := make(chan struct{})
	wl.attempt = attempt
	wl.mu.Unlock()

	ps, err := s.subscribe()

	wl.mu.Lock()
	wl.attempt = nil
	close(attempt)
	switch {
	case err != nil:
		wl.mu.Unlock()
		s.log.Warn("semaphore: wake subscription failed; waiting on backoff only", "err", err)
		return false
	case wl.closed:
		wl.mu.Unlock()
		_ = ps.Close()
		return false
	}
	wl.ps, wl.listening = ps, true
	wl.mu.Unlock()
	go s.readWakes(ps)
	return true
}

// subscribe makes the subscription and waits for Redis to confirm it.
func (s *Service) subscribe() (*redis.PubSub, error) {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	ps := s.rdb.Subscribe(ctx, s.wakePrefix()+s.id)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, err
	}
	return ps, nil
}

// listening reports whether wake messages reach s.
func (s *Service) listening() bool {
	s.wakes.mu.Lock()
	defer s.wakes.mu.Unlock()
	return s.wakes.listening
}

// stopListening closes the subscription (Close calls it).
func (s *Service) stopListening() {
	wl := &s.wakes
	wl.mu.Lock()
	ps := wl.ps
	wl.ps, wl.listening, wl.closed = nil, false, true
	wl.mu.Unlock()
	if ps != nil {
		_ = ps.Close() // only closes our own subscription connection
	}
}

// readWakes nudges the line named by each wake message.
func (s *Service) readWakes(ps *redis.PubSub) {
	for msg := range ps.Channel() {
		if l := s.lineOf(msg.Payload); l != nil {
			l.nudge()
		}
	}
}

// wakePrefix is the prefix of the channels that wake a waiting Service; the
// Service's id completes the name.
func (s *Service) wakePrefix() string { return s.prefix + "wake:" }
