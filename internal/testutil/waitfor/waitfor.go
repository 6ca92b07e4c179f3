// Package waitfor is the tests' one way to wait: poll a condition until it
// holds, with a deadline, instead of sleeping and hoping.
package waitfor

import (
	"testing"
	"time"
)

// Condition polls cond every few milliseconds until it holds and returns
// how long that took; it fails the test when within passes first.
func Condition(tb testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	tb.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			tb.Fatalf("not true within %s: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// Eventually polls cond like Condition until it holds or within passes,
// and reports whether it held. It never fails the test itself, so that a
// goroutine other than the test's may wait with it (a goroutine must not
// call t.Fatal): the caller reports the failure and ends what waits on it.
func Eventually(within time.Duration, cond func() bool) bool {
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
