package semaphore

import (
	"fmt"
	"testing"
)

// TestRoomNamesStayBoundedAndRight: the names kept for a key are the ones
// built for it, before and after the cache fills and is cleared.
func TestRoomNamesStayBoundedAndRight(t *testing.T) {
	s := &Service{prefix: "p:", names: roomNames{of: map[string]keys{}}}
	for i := range roomNamesMax + 10 {
		key := fmt.Sprintf("k%d", i)
		for range 2 { // built, then kept
			k := s.keysFor(key)
			if want := "p:{" + key + "}:holders"; k.holders != want || k.quick()[0] != want || k.all()[0] != want {
				t.Fatalf("keysFor(%q): holders %q, quick %q, all %q; want %q", key, k.holders, k.quick()[0], k.all()[0], want)
			}
		}
		if n := len(s.names.of); n > roomNamesMax {
			t.Fatalf("%d names kept after %d keys; at most %d", n, i+1, roomNamesMax)
		}
	}
	if k := s.keysFor("t{x}"); k.spares != "p:{t{x%7D}:spares" || len(k.all()) != 12 || len(k.quick()) != 7 {
		t.Fatalf("keysFor of a key with braces: %+v", k)
	}
}
