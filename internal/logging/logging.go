// Package logging builds the one zap logger the operator's binaries
// (manager, cache-index, kvevent-subscriber) log through, behind logr, and
// the console logger of the commands a person runs.
package logging

import (
	"io"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// New is a JSON logger at info level with ISO 8601 timestamps, or, with
// development, zap's human-readable console logger at debug level.
func New(development bool) (*zap.Logger, error) {
	if development {
		return zap.NewDevelopment()
	}
	cfg := zap.NewProductionConfig()
	cfg.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	return cfg.Build()
}

// Console is the logger of a command a person runs (the kubectl plugin,
// the demo): zap's console encoding without timestamps, at info level, to
// w (stderr). Set it before the first use of controller-runtime's client,
// whose warnings (the API server's, deprecations) log through it; without
// one controller-runtime prints "log.SetLogger(...) was never called" with
// a stack trace.
func Console(w io.Writer) *zap.Logger {
	enc := zap.NewDevelopmentEncoderConfig()
	enc.TimeKey = ""
	return zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), zap.InfoLevel))
}
