package worker

import (
	"fmt"
	"log/slog"
	"os"
)

// asynqLogger writes asynq's log lines to slog.
type asynqLogger struct{ log *slog.Logger }

func newAsynqLogger(l *slog.Logger) *asynqLogger {
	return &asynqLogger{log: l.With("component", "asynq")}
}

func (a *asynqLogger) Debug(args ...any) { a.log.Debug(fmt.Sprint(args...)) }
func (a *asynqLogger) Info(args ...any)  { a.log.Info(fmt.Sprint(args...)) }
func (a *asynqLogger) Warn(args ...any)  { a.log.Warn(fmt.Sprint(args...)) }
func (a *asynqLogger) Error(args ...any) { a.log.Error(fmt.Sprint(args...)) }

// Fatal logs and exits, as asynq's Logger contract says.
func (a *asynqLogger) Fatal(args ...any) {
	a.log.Error(fmt.Sprint(args...))
	os.Exit(1)
}
