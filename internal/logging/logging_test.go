package logging

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
