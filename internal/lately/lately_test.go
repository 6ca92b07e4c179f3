package lately_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetcap/fleetcap/internal/lately"
)

// TestMarksLapseAndForget runs on synctest's clock, so that a pause of the
// test's goroutine on a loaded machine cannot age a mark.
func TestMarksLapseAndForget(t *testing.T) { synctest.Test(t, marksLapseAndForget) }

func marksLapseAndForget(t *testing.T) {
	m := lately.Marks{For: 50 * time.Millisecond, Max: 10}
	if m.Recent("a") {
		t.Fatal("a key never marked is recent")
	}
	m.Mark("a")
	if !m.Recent("a") {
		t.Fatal("a key marked just now is not recent")
	}
	m.Forget("a")
	if m.Recent("a") {
		t.Fatal("a forgotten key is recent")
	}
	m.Mark("b")
	time.Sleep(50 * time.Millisecond) // For exactly: still recent
	if !m.Recent("b") {
		t.Fatal("a mark For old is not recent")
	}
	time.Sleep(time.Millisecond) // past For: the mark must have lapsed
	if m.Recent("b") {
		t.Fatal("a mark older than For is recent")
	}
}

func TestMarksStayBounded(t *testing.T) {
	m := lately.Marks{For: time.Hour, Max: 3}
	for i := range 5 {
		m.Mark(fmt.Sprint(i))
	}
	for i, want := range []bool{true, true, true, false, false} {
		if got := m.Recent(fmt.Sprint(i)); got != want {
			t.Errorf("key %d recent: %v, want %v (at most 3 live marks)", i, got, want)
		}
	}
	m.Mark("0") // a key already marked is marked again
	if !m.Recent("0") {
		t.Error("a marked key could not be marked again when full")
	}
}

// TestMarksWithin runs on synctest's clock too: Within asks for a shorter
// window than For, and never a longer one.
func TestMarksWithin(t *testing.T) { synctest.Test(t, marksWithin) }

func marksWithin(t *testing.T) {
	m := lately.Marks{For: 50 * time.Millisecond, Max: 10}
	if m.Within("a", time.Hour) {
		t.Fatal("a key never marked is within an hour")
	}
	m.Mark("a")
	time.Sleep(20 * time.Millisecond)
	if !m.Within("a", 20*time.Millisecond) {
		t.Fatal("a mark 20ms old is not within 20ms")
	}
	if m.Within("a", 10*time.Millisecond) {
		t.Fatal("a mark 20ms old is within 10ms")
	}
	time.Sleep(31 * time.Millisecond)
	if m.Within("a", time.Hour) {
		t.Fatal("a mark older than For is within an hour")
	}
}

// TestNotesTakeOnce runs on synctest's clock: Take hands a note's value
// back once, and never a lapsed one.
func TestNotesTakeOnce(t *testing.T) { synctest.Test(t, notesTakeOnce) }

func notesTakeOnce(t *testing.T) {
	n := lately.Notes[string]{For: 50 * time.Millisecond, Max: 10}
	if v, ok := n.Take("a"); ok {
		t.Fatalf("a key never noted gave %q", v)
	}
	n.Note("a", "1")
	n.Note("a", "2") // the later note wins
	if v, ok := n.Take("a"); !ok || v != "2" {
		t.Fatalf("Take = %q, %v; want the last note, 2", v, ok)
	}
	if v, ok := n.Take("a"); ok {
		t.Fatalf("a note taken twice gave %q", v)
	}
	n.Note("b", "x")
	time.Sleep(51 * time.Millisecond)
	if v, ok := n.Take("b"); ok {
		t.Fatalf("a note older than For gave %q", v)
	}
}
