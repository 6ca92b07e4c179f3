package snapshot

import (
	"path/filepath"
	"testing"
)

// FuzzLoad: any file content loads or fails with an error, never a panic;
// and what loads saves and loads again to the same number of keys.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(`{"format":"fleetcap-embedded-redis","version":1,"databases":[{"db":0,"keys":[` +
		`{"key":"cw==","type":"string","string":"dg=="},{"key":"bA==","type":"list","list":["YQ==","Yg=="]},` +
		`{"key":"eg==","type":"zset","zset":[{"member":"bQ==","score":"+Inf"}]},` +
		`{"key":"aA==","type":"hash","hash":[{"field":"Zg==","value":"dg==","expires_at":"2999-01-01T00:00:00Z"}]}]}]}`))
	f.Add([]byte(`{"format":"fleetcap-embedded-redis","version":1}`))
	f.Add([]byte(`{}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newMini(t)
		n, err := load(m, data)
		if err != nil {
			return
		}
		path := filepath.Join(dir, "again.json")
		if err := Save(m, path); err != nil {
			t.Fatalf("a loaded dataset does not save: %v", err)
		}
		// A key may expire between the two loads, but none may appear.
		if again, err := Load(newMini(t), path); err != nil || again > n {
			t.Fatalf("loaded %d keys, saved and loaded again %d (%v)", n, again, err)
		}
	})
}
