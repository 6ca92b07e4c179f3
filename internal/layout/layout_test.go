package layout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fleetcap/fleetcap/internal/testutil/redistest"
	"github.com/fleetcap/fleetcap/internal/testutil/syncbuf"
	"github.com/fleetcap/fleetcap/internal/testutil/waitfor"
)

// claim claims layout version for role, and closes the lease at test end.
func claim(t *testing.T, rdb redis.UniversalClient, opts Options) *Lease {
	t.Helper()
	l, err := Claim(context.Background(), rdb, opts)
	if err != nil {
		t.Fatalf("Claim(%s, layout %d): %v", opts.Role, opts.Version, err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// refused claims and wants an *Error whose message says every one of want.
func refused(t *testing.T, rdb redis.UniversalClient, opts Options, want ...string) *Error {
	t.Helper()
	l, err := Claim(context.Background(), rdb, opts)
	if err == nil {
		_ = l.Close()
		t.Fatalf("Claim(%s, layout %d) started", opts.Role, opts.Version)
	}
	var le *Error
	if !errors.As(err, &le) {
		t.Fatalf("Claim: %v, want an *Error", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("message %q does not say %q", err, w)
		}
	}
	return le
}

// record is the layout hash as it stands.
func record(t *testing.T, rdb redis.UniversalClient) map[string]string {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), Key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// older and newer stand for the builds of another layout than this one's.
var older, newer = Version - 1, Version + 1

// TestAnotherLiveLayoutRefuses: while a process of another layout holds a
// live lease, a claim is refused with a message naming both layouts, the
// process and what to do, and writes nothing; the first process of the
// layout is recorded with its version.
func TestAnotherLiveLayoutRefuses(t *testing.T) {
	rdb := redistest.Start(t).Client()
	old := claim(t, rdb, Options{Role: "worker", Version: older})
	if got := record(t, rdb); got["version"] != strconv.Itoa(older) || !strings.HasPrefix(got["process "+old.Name()], strconv.Itoa(older)+" ") {
		t.Fatalf("record after the first claim = %v", got)
	}
	before := record(t, rdb)
	le := refused(t, rdb, Options{Role: "producer"},
		fmt.Sprintf("this build speaks Redis layout %d", Version), fmt.Sprintf("1 process(es) of layout %d hold a live lease in fleetcap:layout (", older)+old.Name()+")",
		fmt.Sprintf("stop every process of the layout-%d build, then start this one", older), fmt.Sprintf("or run the layout-%d build here instead", older))
	if le.Want != Version || le.Found != strconv.Itoa(older) || len(le.Live) != 1 || le.Live[0].Left <= 0 || le.Live[0].Left > DefaultLease {
		t.Errorf("error = %+v", le)
	}
	if after := record(t, rdb); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a refused claim wrote: %v, then %v", before, after)
	}
	// The same layout starts beside it.
	claim(t, rdb, Options{Role: "worker", Version: older})
}

// TestTakeOverOnceTheOldProcessesAreGone: a process of a newer layout
// starts once the older one's processes are gone, whether one gave its
// lease back (Close) or one was killed (its lease lapsed), and records its
// version.
func TestTakeOverOnceTheOldProcessesAreGone(t *testing.T) {
	rdb := redistest.Start(t).Client()
	stopped := claim(t, rdb, Options{Role: "worker", Version: older})
	killed := claim(t, rdb, Options{Role: "worker", Version: older, Lease: 300 * time.Millisecond})
	if err := stopped.Close(); err != nil {
		t.Fatal(err)
	}
	killed.halt() // as a killed process: no renewal, nothing given back
	le := refused(t, rdb, Options{Role: "worker"}, killed.Name())
	if len(le.Live) != 1 {
		t.Errorf("live = %+v, want the killed process alone", le.Live)
	}
	var l *Lease
	waitfor.Condition(t, 5*time.Second, "this layout starts once the killed process's lease lapsed", func() bool {
		var err error
		l, err = Claim(context.Background(), rdb, Options{Role: "worker"})
		if err != nil && !errors.As(err, new(*Error)) {
			t.Fatal(err)
		}
		return err == nil
	})
	t.Cleanup(func() { _ = l.Close() })
	got := record(t, rdb)
	if got["version"] != strconv.Itoa(Version) || len(got) != 2 || !strings.HasPrefix(got["process "+l.Name()], strconv.Itoa(Version)+" ") {
		t.Errorf("record after the take-over = %v, want version %d and this process alone", got, Version)
	}
	// Now the older layout is the one refused.
	refused(t, rdb, Options{Role: "worker", Version: older}, fmt.Sprintf("this build speaks Redis layout %d, but 1 process(es) of layout %d", older, Version))
}

// TestNewerDataRefuses: a layout older than the recorded one refuses even
// with no process live (it cannot read the newer data), and so does a
// record no build writes.
func TestNewerDataRefuses(t *testing.T) {
	rdb := redistest.Start(t).Client()
	if err := claim(t, rdb, Options{Role: "worker", Version: newer}).Close(); err != nil {
		t.Fatal(err)
	}
	refused(t, rdb, Options{Role: "producer"}, fmt.Sprintf("the data on this Redis is in layout %d (fleetcap:layout), which this build cannot read", newer),
		fmt.Sprintf("Run a build that speaks layout %d or later", newer), "delete fleetcap:layout")
	rdb.HSet(context.Background(), Key, "version", "two")
	refused(t, rdb, Options{Role: "worker"}, `fleetcap:layout records the layout "two"`)
	rdb.HSet(context.Background(), Key, "version", Version, "process ghost", "garbage")
	le := refused(t, rdb, Options{Role: "worker"}, "layout ? hold a live lease", `an entry of layout "?" is one this build cannot read`)
	if len(le.Live) != 1 || le.Live[0].Name != "ghost" {
		t.Errorf("live = %+v", le.Live)
	}
}

// TestLayout1ListsRefuse: a parked key of a declared cap that is a LIST
// (a build from before 46ae4d4) refuses the start with its name, its TTL
// and what to do, and nothing is written or lost.
func TestLayout1ListsRefuse(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	parked := "fleetcap:sem:{legacy-api}:parked"
	rdb.RPush(ctx, parked, "default\x00task-1", "default\x00task-2")
	rdb.PExpire(ctx, parked, 90*time.Second)
	rdb.RPush(ctx, "fleetcap:sem:{b}:parked", "t")
	opts := Options{Role: "worker", SemaphorePrefix: "fleetcap:sem:", CapKeys: []string{"a", "b", "legacy-api"}}
	le := refused(t, rdb, opts, "but fleetcap:sem:{b}:parked is a LIST (and 1 more such keys): data of layout 1",
		"builds from before 46ae4d4", "it has no TTL", "DEL fleetcap:sem:{b}:parked")
	if le.Found != "1" || len(le.Lists) != 2 || le.Lists[1].Key != parked || le.Lists[1].TTL <= 80*time.Second {
		t.Errorf("error = %+v", le)
	}
	if n, _ := rdb.Exists(ctx, Key).Result(); n != 0 {
		t.Error("a refused claim wrote the record")
	}
	if got, _ := rdb.LRange(ctx, parked, 0, -1).Result(); len(got) != 2 {
		t.Errorf("the old list holds %q", got)
	}
	rdb.Del(ctx, "fleetcap:sem:{b}:parked")
	refused(t, rdb, opts, "this one's lapses in 1m30s")
	rdb.Del(ctx, parked)
	rdb.ZAdd(ctx, parked, redis.Z{Score: 1, Member: "default\x00task-1"}) // the room since layout 2
	claim(t, rdb, opts)
}

// TestOldOverridesRefuse: taking over from layout 2 (or 1), whose runtime
// overrides lived in fleetcap:control whatever the prefix, a claim is
// refused while that hash holds any, with where they go now and how, and
// writes nothing; once they are moved it starts. A fleet of prefix
// "fleetcap:" reads that very hash, and once layout 3 is recorded the hash
// is such a fleet's, not old data.
func TestOldOverridesRefuse(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	opts := Options{Role: "worker", SemaphorePrefix: "fleetcap:sem:"}
	rdb.HSet(ctx, OldOverridesKey, "capacity:legacy-api", "0", "rate:stripe", `{"rate":5,"per":"1s","burst":5}`)
	rdb.HSet(ctx, Key, "version", "2")
	before := record(t, rdb)
	le := refused(t, rdb, opts, fmt.Sprintf("this build speaks Redis layout %d, but fleetcap:control holds 2 runtime override(s) of layout 2", Version),
		"this build reads this fleet's from fleetcap:sem:control", "Once every process of layout 2 is stopped",
		"RENAME fleetcap:control fleetcap:sem:control", "DEL fleetcap:control")
	if le.Found != "2" || le.Overrides == nil || *le.Overrides != (Overrides{Key: OldOverridesKey, Fields: 2, MoveTo: "fleetcap:sem:control"}) {
		t.Errorf("error = %+v, overrides %+v", le, le.Overrides)
	}
	if after := record(t, rdb); fmt.Sprint(after) != fmt.Sprint(before) || rdb.HLen(ctx, OldOverridesKey).Val() != 2 {
		t.Errorf("a refused claim wrote: %v, then %v", before, after)
	}
	// Layout 2 itself reads them there; so does a fleet of prefix "fleetcap:".
	if err := claim(t, rdb, Options{Role: "worker", SemaphorePrefix: "fleetcap:sem:", Version: 2}).Close(); err != nil {
		t.Fatal(err)
	}
	if err := claim(t, rdb, Options{Role: "worker", SemaphorePrefix: "fleetcap:"}).Close(); err != nil {
		t.Fatal(err)
	}
	// Now layout 3 is recorded: fleetcap:control is the "fleetcap:" fleet's.
	claim(t, rdb, opts)

	// Without a record (the builds before 46ae4d4) it refuses as well.
	rdb.Del(ctx, Key)
	refused(t, rdb, opts, "fleetcap:control holds 2 runtime override(s) of layout 1")
	if err := rdb.Rename(ctx, OldOverridesKey, "fleetcap:sem:control").Err(); err != nil {
		t.Fatal(err)
	}
	claim(t, rdb, opts)
}

// TestRenewals: a live process's lease is renewed by the server's clock
// until Close, which gives it back; a renewal after the record was lost
// writes it again.
func TestRenewals(t *testing.T) {
	rdb := redistest.Start(t).Client()
	l := claim(t, rdb, Options{Role: "worker", Lease: 150 * time.Millisecond})
	field := "process " + l.Name()
	first := record(t, rdb)[field]
	waitfor.Condition(t, 5*time.Second, "the lease is renewed", func() bool { return record(t, rdb)[field] != first })
	rdb.Del(context.Background(), Key) // as a Redis that lost its data
	waitfor.Condition(t, 5*time.Second, "a renewal records the process and the version again", func() bool {
		got := record(t, rdb)
		return got["version"] == strconv.Itoa(Version) && got[field] != ""
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := record(t, rdb)[field]; ok {
		t.Error("Close left the lease")
	}
}

// TestRenewalFindsAnotherLayout: a process whose renewal finds a process
// of another layout live (one that started while this one could not
// renew) logs it as an error.
func TestRenewalFindsAnotherLayout(t *testing.T) {
	rdb := redistest.Start(t).Client()
	var log syncbuf.Buffer
	l := claim(t, rdb, Options{Role: "worker", Lease: 90 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	rdb.HSet(context.Background(), Key, "process intruder", fmt.Sprintf("%d 99999999999999", newer))
	waitfor.Condition(t, 5*time.Second, "a renewal logs the other layout", func() bool {
		return strings.Contains(log.String(), "level=ERROR") &&
			strings.Contains(log.String(), fmt.Sprintf("1 process(es) of layout %d hold a live lease in fleetcap:layout (intruder)", newer))
	})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestOnAClusterAndOnMiniredis: the record and the list check work on a
// Redis Cluster (the record is one key; the lists live on other nodes) and
// on the embedded Redis (miniredis).
func TestOnAClusterAndOnMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	mini := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = mini.Close() })
	cluster := redistest.StartCluster(t, 3).Client(t)
	for name, rdb := range map[string]redis.UniversalClient{"miniredis": mini, "cluster": cluster} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			keys := make([]string, 20) // spread over the nodes
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			opts := Options{Role: "worker", SemaphorePrefix: "fleetcap:sem:", CapKeys: keys}
			rdb.RPush(ctx, "fleetcap:sem:{k7}:parked", "t")
			refused(t, rdb, opts, "fleetcap:sem:{k7}:parked is a LIST")
			rdb.Del(ctx, "fleetcap:sem:{k7}:parked")
			old := claim(t, rdb, Options{Role: "worker", Version: overridesMoved - 1})
			refused(t, rdb, opts, old.Name())
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}
			rdb.HSet(ctx, OldOverridesKey, "capacity:k1", "0")
			refused(t, rdb, opts, "fleetcap:control holds 1 runtime override(s) of layout 2")
			rdb.Del(ctx, OldOverridesKey)
			claim(t, rdb, opts)
			if got := record(t, rdb)["version"]; got != strconv.Itoa(Version) {
				t.Errorf("version = %q", got)
			}
		})
	}
}

// TestReadmeSaysTheLayout: the README's paragraph on the layout names this
// build's version and the key.
func TestReadmeSaysTheLayout(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"layout " + strconv.Itoa(Version), "`" + Key + "`", "TestWorkerRefusesAnotherLayout"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md does not say %q", want)
		}
	}
}
