package logging

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestNew(t *testing.T) {
	for _, tc := range []struct {
		development bool
		debug       bool
	}{{development: false, debug: false}, {development: true, debug: true}} {
		l, err := New(tc.development)
		require.NoError(t, err)
		assert.Equal(t, tc.debug, l.Core().Enabled(zapcore.DebugLevel), "development=%v", tc.development)
		assert.True(t, l.Core().Enabled(zapcore.InfoLevel))
	}
}

func TestConsole(t *testing.T) {
	var b bytes.Buffer
	l := Console(&b)
	l.Debug("hidden")
	l.Info("API server warning", zap.String("object", "ns/name"))
	assert.Equal(t, "INFO\tAPI server warning\t{\"object\": \"ns/name\"}\n", b.String(), "info and above, no timestamp")
}
