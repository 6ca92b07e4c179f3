// Package tcpproxy is a TCP proxy for partition tests: it listens on a free
// loopback port and forwards every connection to a target, until Cut drops
// the connections it carries and blackholes new ones (accepted, never
// forwarded nor answered: a client sees its reads time out, as in a network
// partition). Restore forwards again. SetDialDelay makes new connections
// slow to open, as a congested network or a far server does.
package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from Addr to a target address.
type Proxy struct {
	l      net.Listener
	target string

	mu        sync.Mutex
	dialDelay time.Duration // new connections wait this long before they are forwarded
	cut       bool
	closed    bool
	conns     map[net.Conn]struct{} // forwarded: both sides
	holes     map[net.Conn]struct{} // accepted while cut, held unanswered
	wg        sync.WaitGroup
	accepts   int
}

// New starts a proxy on 127.0.0.1:0 that forwards to target (host:port).
func New(target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}, holes: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Cut closes every forwarded connection and blackholes new ones until
// Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// Restore closes the blackholed connections (their clients reconnect) and
// forwards new connections again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	holes := p.holes
	p.holes = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range holes {
		_ = c.Close()
	}
}

// SetDialDelay makes every connection accepted from now on wait d before it
// is forwarded (0: none); connections already forwarded are not slowed.
func (p *Proxy) SetDialDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dialDelay = d
}

// Accepted is how many connections the proxy accepted so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts
}

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.l.Close()
	p.Cut()
	p.Restore()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		p.accepts++
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		if p.cut {
			p.holes[c] = struct{}{}
			p.mu.Unlock()
			continue
		}
		p.conns[c] = struct{}{}
		delay := p.dialDelay
		p.mu.Unlock()
		p.wg.Add(1)
		go p.forward(c, delay)
	}
}

// forward dials the target for c, after delay, and copies both ways until
// either side closes or Cut closes them.
func (p *Proxy) forward(c net.Conn, delay time.Duration) {
	defer p.wg.Done()
	time.Sleep(delay)
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		p.drop(c)
		return
	}
	p.mu.Lock()
	if _, live := p.conns[c]; !live {
		p.mu.Unlock()
		_ = up.Close()
		_ = c.Close()
		return
	}
	p.conns[up] = struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	p.drop(c)
	p.drop(up)
	<-done
}

func (p *Proxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}
