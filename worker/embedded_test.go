package worker

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEmbeddedFilePath: LoadConfig puts redis.embedded_file beside the
// config file by default and makes a relative one relative to the config's
// directory; an absolute one stays; a config for a Redis server has none;
// ParseConfig (no file) keeps nothing unless told.
func TestEmbeddedFilePath(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	dir := t.TempDir()
	abs := filepath.Join(t.TempDir(), "data.json")
	for _, c := range []struct{ yaml, want string }{
		{"", filepath.Join(dir, ".fleetcap", "embedded.json")},
		{"redis: {embedded_file: state/e.json}\n", filepath.Join(dir, "state", "e.json")},
		{"redis: {embedded_file: " + abs + "}\n", abs},
		{"redis: {url: \"redis://h:6379\"}\n", ""},
	} {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, []byte(c.yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(path)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Redis.EmbeddedFile != c.want {
			t.Errorf("%q: embedded_file = %q, want %q", c.yaml, cfg.Redis.EmbeddedFile, c.want)
		}
	}
	cfg, err := ParseConfig(nil)
	if err != nil || cfg.Redis.EmbeddedFile != "" {
		t.Errorf("ParseConfig: embedded_file = %q, %v; want none", cfg.Redis.EmbeddedFile, err)
	}
}
