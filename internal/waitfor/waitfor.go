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
