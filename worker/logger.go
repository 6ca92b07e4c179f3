package worker

import (
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/fleetcap/fleetcap/internal/asynqx"
)

// asynqLogger writes asynq's log lines to slog.
type asynqLogger struct {
	log *slog.Logger
	// revoked holds the IDs of originals the worker revoked after
	// requeueing a copy: asynq warns "revoke task id=..." for each, which
	// for these is routine (the worker logs the copy itself).
	revoked sync.Map
}

func newAsynqLogger(l *slog.Logger) *asynqLogger {
	return &asynqLogger{log: l.With("component", "asynq")}
}

// revoking notes that the task with id is about to be revoked by the
// worker.
func (a *asynqLogger) revoking(id string) { a.revoked.Store(id, struct{}{}) }

func (a *asynqLogger) Debug(args ...any) { a.log.Debug(fmt.Sprint(args...)) }
func (a *asynqLogger) Info(args ...any)  { a.log.Info(fmt.Sprint(args...)) }
func (a *asynqLogger) Warn(args ...any) {
	msg := fmt.Sprint(args...)
	if id, ok := asynqx.RevokedTaskID(msg); ok {
		if _, ours := a.revoked.LoadAndDelete(id); ours {
			a.log.Debug(msg)
			return
		}
	}
	a.log.Warn(msg)
}
func (a *asynqLogger) Error(args ...any) { a.log.Error(fmt.Sprint(args...)) }

// Fatal logs and exits, as asynq's Logger contract says.
func (a *asynqLogger) Fatal(args ...any) {
	a.log.Error(fmt.Sprint(args...))
	os.Exit(1)
}
