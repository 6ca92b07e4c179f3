// Package snapshot saves the whole dataset of an in-process miniredis to a
// JSON file and loads it back: miniredis keeps nothing when its process
// ends, and the worker's embedded Redis must keep its tasks across
// restarts. Every key of databases 0-15 is saved by its type (strings,
// lists, sets, sorted sets with their scores, hashes with their field
// TTLs) with its expiry; a type it cannot save (a stream, a HyperLogLog)
// fails the save rather than being dropped.
package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Databases is how many databases are saved: 0 to Databases-1, as many as
// a Redis server has by default.
const Databases = 16

// format and version name the file's layout; Load refuses others.
const (
	format  = "fleetcap-embedded-redis"
	version = 1
)

// file is the JSON document. Keys, values, members and fields are bytes
// (base64 in JSON): Redis strings are binary, and asynq stores its tasks
// as protobuf.
type file struct {
	Format    string     `json:"format"`
	Version   int        `json:"version"`
	SavedAt   time.Time  `json:"saved_at"`
	Databases []database `json:"databases"`
}

type database struct {
	Index int   `json:"db"`
	Keys  []key `json:"keys"`
}

// key is one key; exactly the field of its type is set.
type key struct {
	Name      []byte     `json:"key"`
	Type      string     `json:"type"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	String    []byte     `json:"string,omitempty"`
	List      [][]byte   `json:"list,omitempty"`
	Set       [][]byte   `json:"set,omitempty"`
	ZSet      []member   `json:"zset,omitempty"`
	Hash      []field    `json:"hash,omitempty"`
}

type member struct {
	Member []byte `json:"member"`
	Score  string `json:"score"` // strconv 'g' form: exact, and +Inf/-Inf survive
}

type field struct {
	Field     []byte     `json:"field"`
	Value     []byte     `json:"value"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// Save writes every key of m to path, atomically: a temporary file in the
// same directory (created if missing), synced, then renamed over path. On
// an error path is left as it was. Nothing may write to m meanwhile (close
// its server first).
func Save(m *miniredis.Miniredis, path string) error {
	now := time.Now()
	f := file{Format: format, Version: version, SavedAt: now.UTC()}
	for i := range Databases {
		db := m.DB(i) // a Miniredis-level access: expired keys go first
		keys, err := saveDB(db, now)
		if err != nil {
			return fmt.Errorf("snapshot: database %d: %w", i, err)
		}
		if len(keys) > 0 {
			f.Databases = append(f.Databases, database{Index: i, Keys: keys})
		}
	}
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return writeAtomically(path, data)
}

func saveDB(db *miniredis.RedisDB, now time.Time) ([]key, error) {
	var keys []key
	for _, name := range db.Keys() {
		k := key{Name: []byte(name), Type: db.Type(name), ExpiresAt: expiry(now, db.TTL(name))}
		var err error
		switch k.Type {
		case "string":
			var v string
			v, err = db.Get(name)
			k.String = []byte(v)
		case "list":
			var vs []string
			vs, err = db.List(name)
			k.List = asBytes(vs)
		case "set":
			var vs []string
			vs, err = db.Members(name)
			k.Set = asBytes(vs)
		case "zset":
			k.ZSet, err = saveZSet(db, name)
		case "hash":
			k.Hash, err = saveHash(db, name, now)
		default:
			err = fmt.Errorf("type %q cannot be saved", k.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", name, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

func saveZSet(db *miniredis.RedisDB, name string) ([]member, error) {
	scores, err := db.SortedSet(name)
	if err != nil {
		return nil, err
	}
	members, err := db.ZMembers(name) // in score order: the file reads in order
	if err != nil {
		return nil, err
	}
	out := make([]member, len(members))
	for i, m := range members {
		out[i] = member{Member: []byte(m), Score: strconv.FormatFloat(scores[m], 'g', -1, 64)}
	}
	return out, nil
}

func saveHash(db *miniredis.RedisDB, name string, now time.Time) ([]field, error) {
	fields, err := db.HKeys(name)
	if err != nil {
		return nil, err
	}
	out := make([]field, len(fields))
	for i, f := range fields {
		out[i] = field{Field: []byte(f), Value: []byte(db.HGet(name, f)), ExpiresAt: expiry(now, db.HTTL(name, f))}
	}
	return out, nil
}

// expiry is when a TTL ends, or nil for none (miniredis reports none as 0).
func expiry(now time.Time, ttl time.Duration) *time.Time {
	if ttl <= 0 {
		return nil
	}
	t := now.Add(ttl).UTC()
	return &t
}

func asBytes(vs []string) [][]byte {
	out := make([][]byte, len(vs))
	for i, v := range vs {
		out[i] = []byte(v)
	}
	return out
}

// writeAtomically replaces path by data, or leaves it as it was.
func writeAtomically(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("snapshot: write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil { // the rename itself survives a crash
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Load reads the file at path into m, which should hold no keys, and
// returns how many keys it loaded. Keys whose expiry passed while the file
// sat on disk are skipped, as Redis skips them loading its own file. A
// missing file returns an error matching fs.ErrNotExist; any other problem
// (unreadable, not this format, a bad value) is an error, and m may then
// hold part of the file.
func Load(m *miniredis.Miniredis, path string) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return load(m, data)
}

// load decodes a saved dataset into m.
func load(m *miniredis.Miniredis, data []byte) (int, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return 0, fmt.Errorf("not a saved dataset: %w", err)
	}
	if f.Format != format || f.Version != version {
		return 0, fmt.Errorf("not a saved dataset of this version: format %q version %d, want %q version %d", f.Format, f.Version, format, version)
	}
	now := time.Now()
	n := 0
	for _, d := range f.Databases {
		if d.Index < 0 || d.Index >= Databases {
			return n, fmt.Errorf("database %d: out of range 0..%d", d.Index, Databases-1)
		}
		db := m.DB(d.Index)
		for _, k := range d.Keys {
			loaded, err := loadKey(db, k, now)
			if err != nil {
				return n, fmt.Errorf("database %d: key %q: %w", d.Index, k.Name, err)
			}
			if loaded {
				n++
			}
		}
	}
	return n, nil
}

// loadKey writes one key into db; false when it has expired.
func loadKey(db *miniredis.RedisDB, k key, now time.Time) (bool, error) {
	ttl, live := remaining(k.ExpiresAt, now)
	if !live {
		return false, nil
	}
	name := string(k.Name)
	if db.Exists(name) {
		return false, errors.New("given twice")
	}
	var err error
	switch k.Type {
	case "string":
		err = db.Set(name, string(k.String))
	case "list":
		err = nonEmpty(len(k.List))
		if err == nil {
			_, err = db.Push(name, asStrings(k.List)...)
		}
	case "set":
		err = nonEmpty(len(k.Set))
		if err == nil {
			_, err = db.SetAdd(name, asStrings(k.Set)...)
		}
	case "zset":
		err = loadZSet(db, name, k.ZSet)
	case "hash":
		err = loadHash(db, name, k.Hash, now)
	default:
		err = fmt.Errorf("unknown type %q", k.Type)
	}
	if err != nil {
		return false, err
	}
	if !db.Exists(name) {
		return false, nil // a hash whose every field expired
	}
	if ttl > 0 {
		db.SetTTL(name, ttl)
	}
	return true, nil
}

func loadZSet(db *miniredis.RedisDB, name string, members []member) error {
	if err := nonEmpty(len(members)); err != nil {
		return err
	}
	for _, m := range members {
		score, err := strconv.ParseFloat(m.Score, 64)
		if err != nil {
			return fmt.Errorf("member %q: score %q is not a number", m.Member, m.Score)
		}
		if _, err := db.ZAdd(name, score, string(m.Member)); err != nil {
			return err
		}
	}
	return nil
}

func loadHash(db *miniredis.RedisDB, name string, fields []field, now time.Time) error {
	if err := nonEmpty(len(fields)); err != nil {
		return err
	}
	for _, f := range fields {
		ttl, live := remaining(f.ExpiresAt, now)
		if !live {
			continue
		}
		db.HSet(name, string(f.Field), string(f.Value))
		if ttl > 0 && !db.HExpire(name, string(f.Field), ttl) {
			return fmt.Errorf("field %q: its TTL was not set", f.Field)
		}
	}
	return nil
}

// remaining is the TTL left at now of an expiry (0: none), and whether the
// key is still alive.
func remaining(expiresAt *time.Time, now time.Time) (time.Duration, bool) {
	if expiresAt == nil {
		return 0, true
	}
	ttl := expiresAt.Sub(now)
	return ttl, ttl > 0
}

func nonEmpty(n int) error {
	if n == 0 {
		return errors.New("empty (Redis holds no empty list, set, sorted set or hash)")
	}
	return nil
}

func asStrings(bs [][]byte) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}
