package snapshot

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// newMini is a miniredis whose TTLs run on the wall clock, as the worker's.
func newMini(t *testing.T) *miniredis.Miniredis {
	t.Helper()
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	return m
}

// TestRoundTrip saves a key of every type the worker's Redis holds, with
// binary values, infinite scores and TTLs on keys and on hash fields, in
// two databases, and finds each again after loading into a fresh miniredis.
func TestRoundTrip(t *testing.T) {
	m := newMini(t)
	bin := "\x00\xff\xfe proto\x08\x01"
	db0, db3 := m.DB(0), m.DB(3)
	if err := db0.Set("s", bin); err != nil {
		t.Fatal(err)
	}
	db0.SetTTL("s", time.Hour)
	if _, err := db0.Push("l", "a", bin, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := db0.SetAdd("set", "x", bin); err != nil {
		t.Fatal(err)
	}
	for member, score := range map[string]float64{"m1": 1.5, bin: -2, "top": math.Inf(1), "bottom": math.Inf(-1), "ms": 1764498000123} {
		if _, err := db0.ZAdd("z", score, member); err != nil {
			t.Fatal(err)
		}
	}
	db0.HSet("h", "f1", "v1", "f2", bin)
	if !db0.HExpire("h", "f2", time.Hour) {
		t.Fatal("HExpire")
	}
	if err := db3.Set("other-db", "v"); err != nil {
		t.Fatal(err)
	}

	path := filepath.Join(t.TempDir(), "sub", "embedded.json")
	if err := Save(m, path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("saved file: %v, %v; want mode 0600", fi, err)
	}
	got := newMini(t)
	n, err := Load(got, path)
	if err != nil || n != 6 {
		t.Fatalf("Load = %d, %v; want 6 keys", n, err)
	}
	g0 := got.DB(0)
	if v, _ := g0.Get("s"); v != bin {
		t.Errorf("string = %q", v)
	}
	if ttl := g0.TTL("s"); ttl < 59*time.Minute || ttl > time.Hour {
		t.Errorf("string TTL = %s, want about 1h", ttl)
	}
	if v, _ := g0.List("l"); !reflect.DeepEqual(v, []string{"a", bin, "c"}) {
		t.Errorf("list = %q", v)
	}
	if v, _ := g0.Members("set"); !reflect.DeepEqual(v, []string{bin, "x"}) {
		t.Errorf("set = %q", v)
	}
	want, _ := m.DB(0).SortedSet("z")
	if v, _ := g0.SortedSet("z"); !reflect.DeepEqual(v, want) {
		t.Errorf("zset = %v, want %v", v, want)
	}
	if g0.HGet("h", "f1") != "v1" || g0.HGet("h", "f2") != bin || g0.HTTL("h", "f1") != 0 || g0.HTTL("h", "f2") < 59*time.Minute {
		t.Errorf("hash = %q %q, field TTLs %s %s", g0.HGet("h", "f1"), g0.HGet("h", "f2"), g0.HTTL("h", "f1"), g0.HTTL("h", "f2"))
	}
	if g0.TTL("l") != 0 {
		t.Errorf("list got a TTL: %s", g0.TTL("l"))
	}
	if v, _ := got.DB(3).Get("other-db"); v != "v" {
		t.Errorf("database 3: %q", v)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*.tmp")); len(leftovers) != 0 {
		t.Errorf("temporary files left: %q", leftovers)
	}
}

// TestExpiredKeysAreNotLoaded: a key (or a hash field) whose expiry passed
// while the file sat on disk is skipped, as Redis skips it.
func TestExpiredKeysAreNotLoaded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "embedded.json")
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339Nano)
	doc := `{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[
	  {"key":"Z29uZQ==","type":"string","string":"dg==","expires_at":"` + past + `"},
	  {"key":"a2VwdA==","type":"string","string":"dg=="},
	  {"key":"aA==","type":"hash","hash":[{"field":"Zg==","value":"dg==","expires_at":"` + past + `"}]}]}]}`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	m := newMini(t)
	n, err := Load(m, path)
	if err != nil || n != 1 {
		t.Fatalf("Load = %d, %v; want 1 key", n, err)
	}
	if keys := m.DB(0).Keys(); !reflect.DeepEqual(keys, []string{"kept"}) {
		t.Errorf("keys = %q, want only kept", keys)
	}
}

// TestUnsavableTypeFailsTheSave: a stream is not dropped silently: the save
// fails naming the key and its type, and the file saved before stays.
func TestUnsavableTypeFailsTheSave(t *testing.T) {
	path := filepath.Join(t.TempDir(), "embedded.json")
	m := newMini(t)
	if err := m.Set("k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := Save(m, path); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)
	if _, err := m.XAdd("events", "*", []string{"f", "v"}); err != nil {
		t.Fatal(err)
	}
	err := Save(m, path)
	if err == nil || !strings.Contains(err.Error(), `key "events": type "stream" cannot be saved`) {
		t.Errorf("Save with a stream: %v", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a failed save changed the file")
	}
}

// TestLoadRefusesBadFiles: a missing file says so (fs.ErrNotExist); a
// corrupt file, another format and bad values are errors.
func TestLoadRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(newMini(t), filepath.Join(dir, "missing.json")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	for name, c := range map[string]struct{ doc, want string }{
		"truncated":   {`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[{"key":"aw==","ty`, "not a saved dataset"},
		"not JSON":    {"\x00\x01garbage", "not a saved dataset"},
		"other file":  {`{"hello":"world"}`, "not a saved dataset of this version"},
		"new version": {`{"format":"fleetcap-embedded-redis","version":2}`, "version 2"},
		"bad db":      {`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":99,"keys":[]}]}`, "database 99: out of range"},
		"bad type":    {`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[{"key":"aw==","type":"stream"}]}]}`, `unknown type "stream"`},
		"bad score":   {`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[{"key":"aw==","type":"zset","zset":[{"member":"bQ==","score":"x"}]}]}]}`, `score "x" is not a number`},
		"empty list":  {`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[{"key":"aw==","type":"list"}]}]}`, "empty"},
		"twice":       {`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[{"key":"aw==","type":"string"},{"key":"aw==","type":"string"}]}]}`, "given twice"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(c.doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(newMini(t), path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
	}
	if _, err := Load(newMini(t), dir); err == nil {
		t.Error("a directory: no error")
	}
}

// TestSaveIntoABadPlace: a path whose directory cannot be made fails, and
// says where.
func TestSaveIntoABadPlace(t *testing.T) {
	blocker := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := Save(newMini(t), filepath.Join(blocker, "embedded.json"))
	if err == nil || !strings.Contains(err.Error(), blocker) {
		t.Errorf("Save under a file: %v", err)
	}
}
