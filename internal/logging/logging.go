// Package logging builds the one zap logger the operator's binaries
// (manager, cache-index, kvevent-subscriber) log through, behind logr.
package logging

import (
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
