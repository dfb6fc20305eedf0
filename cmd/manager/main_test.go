package main

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestApplyMemoryLimit(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	limit, applied := applyMemoryLimit("268435456", 0.9) // 256Mi, from the downward API
	assert.True(t, applied)
	assert.EqualValues(t, 241591910, limit)
	assert.EqualValues(t, 241591910, debug.SetMemoryLimit(-1), "the runtime honours it")

	_, applied = applyMemoryLimit("400MiB", 0.9)
	assert.False(t, applied, "a limit with a unit was set by a person and is kept")
	_, applied = applyMemoryLimit("", 0.9)
	assert.False(t, applied)
}
