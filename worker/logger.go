package worker

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/fleetcap/fleetcap/internal/asynqx"
)

// asynqLogger writes asynq's log lines to slog.
type asynqLogger struct {
	log *slog.Logger
	// kept says whether the worker keeps the task of id out of the
	// archive (see requeue): asynq's "Retry exhausted" warning before it is
	// routine for such a task.
	kept func(id string) bool
}

func newAsynqLogger(l *slog.Logger) *asynqLogger {
	return &asynqLogger{log: l.With("component", "asynq"), kept: func(string) bool { return false }}
}

func (a *asynqLogger) Debug(args ...any) { a.log.Debug(fmt.Sprint(args...)) }
func (a *asynqLogger) Info(args ...any)  { a.log.Info(fmt.Sprint(args...)) }
func (a *asynqLogger) Warn(args ...any) {
	msg := fmt.Sprint(args...)
	if id, ok := asynqx.ExhaustedTaskID(msg); ok && a.kept(id) {
		a.log.Debug(msg)
		return
	}
	a.log.Warn(msg)
}
func (a *asynqLogger) Error(args ...any) { a.log.Error(fmt.Sprint(args...)) }

// Fatal logs and exits, as asynq's Logger contract says.
func (a *asynqLogger) Fatal(args ...any) {
	a.log.Error(fmt.Sprint(args...))
	os.Exit(1)
}
