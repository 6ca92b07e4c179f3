package worker

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/alicebob/miniredis/v2"

	"github.com/fleetcap/fleetcap/internal/snapshot"
)

// EmbeddedFileError is a redis.embedded_file that the worker cannot load
// (unreadable, corrupt, of another version): it refuses to start rather
// than serve an empty queue in place of the tasks the file holds.
type EmbeddedFileError struct {
	Path string
	Err  error
}

func (e *EmbeddedFileError) Error() string {
	return fmt.Sprintf("redis.embedded_file %s: cannot load it: %v (the tasks of the embedded Redis are in it: repair it, or move it away to start empty)", e.Path, e.Err)
}

func (e *EmbeddedFileError) Unwrap() error { return e.Err }

// newEmbedded is a miniredis whose TTLs run on the wall clock, as a Redis
// server's do (by default a miniredis key never expires).
func newEmbedded() *miniredis.Miniredis {
	m := miniredis.NewMiniRedis()
	m.ClockTTL(true)
	return m
}

// StartEmbedded starts an in-process Redis (miniredis) listening on addr,
// for trying fleetcap out without a Redis server. Its keys expire on the
// wall clock. It keeps nothing when closed (the worker's embedded Redis
// saves to redis.embedded_file). The caller closes it.
func StartEmbedded(addr string) (*miniredis.Miniredis, error) {
	m := newEmbedded()
	if err := m.StartAddr(addr); err != nil {
		return nil, fmt.Errorf("embedded redis on %s: %w", addr, err)
	}
	return m, nil
}

// startEmbedded starts the embedded Redis on redis.embedded_addr with the
// data of redis.embedded_file, when that exists.
func (w *Worker) startEmbedded() error {
	m := newEmbedded()
	if path := w.cfg.Redis.EmbeddedFile; path != "" {
		n, err := snapshot.Load(m, path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			w.log.Info("worker: embedded redis starts empty; it will save to redis.embedded_file at stop", "file", path)
		case err != nil:
			return &EmbeddedFileError{Path: path, Err: err}
		default:
			w.log.Info("worker: embedded redis loaded redis.embedded_file", "file", path, "keys", n)
		}
	}
	if err := m.StartAddr(w.cfg.Redis.EmbeddedAddr); err != nil {
		return fmt.Errorf("embedded redis on %s: %w", w.cfg.Redis.EmbeddedAddr, err)
	}
	w.embedded = m
	return nil
}

// stopEmbedded stops the embedded Redis and then saves its data to
// redis.embedded_file, so that nothing written after the save is lost. It
// runs once; later calls return the first one's error.
func (w *Worker) stopEmbedded() error {
	w.embeddedStop.Do(func() {
		if w.embedded == nil {
			return
		}
		w.embedded.Close()
		path := w.cfg.Redis.EmbeddedFile
		if path == "" {
			return
		}
		if err := snapshot.Save(w.embedded, path); err != nil {
			w.embeddedErr = fmt.Errorf("worker: embedded redis: not saved, its data is lost: %w", err)
			return
		}
		w.log.Info("worker: embedded redis saved to redis.embedded_file", "file", path)
	})
	return w.embeddedErr
}
