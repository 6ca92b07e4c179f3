package tcpproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo starts an echo server for the test.
func echo(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

func roundTrip(c net.Conn, msg string, within time.Duration) (string, error) {
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	return bufio.NewReader(c).ReadString('\n')
}

func TestCutAndRestore(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := roundTrip(c, "hello", time.Second); err != nil || got != "hello\n" {
		t.Fatalf("before the cut: %q, %v", got, err)
	}

	p.Cut()
	if _, err := roundTrip(c, "again", time.Second); err == nil {
		t.Fatal("a connection carried across the cut")
	}
	hole, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err) // blackholed: accepted, then never answered
	}
	defer hole.Close()
	if _, err := roundTrip(hole, "lost", 200*time.Millisecond); err == nil {
		t.Fatal("a new connection was answered during the cut")
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("during the cut: want a timeout, got %v", err)
	}

	p.Restore()
	c2, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if got, err := roundTrip(c2, "back", time.Second); err != nil || got != "back\n" {
		t.Fatalf("after the restore: %q, %v", got, err)
	}
	if n := p.Accepted(); n != 3 {
		t.Fatalf("accepted %d connections, want 3", n)
	}
}

func TestDialDelay(t *testing.T) {
	p, err := New(echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	fast, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	if _, err := roundTrip(fast, "warm", time.Second); err != nil {
		t.Fatal(err)
	}

	const delay = 300 * time.Millisecond
	p.SetDialDelay(delay)
	slow, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	start := time.Now()
	if got, err := roundTrip(slow, "late", 5*time.Second); err != nil || got != "late\n" {
		t.Fatalf("a delayed connection: %q, %v", got, err)
	}
	if took := time.Since(start); took < delay {
		t.Fatalf("a new connection answered after %s, before the %s delay", took, delay)
	}
	start = time.Now()
	if _, err := roundTrip(fast, "still fast", time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= delay {
		t.Fatalf("a connection made before the delay took %s", took)
	}
}
