package main

import (
	"bytes"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/version"
)

// TestVersionFlag: --version prints the shared version line and starts
// nothing (no kubeconfig is needed).
func TestVersionFlag(t *testing.T) {
	defer func(v string) { version.Version = v }(version.Version)
	version.Version = "v1.2.3-test"
	var out bytes.Buffer
	require.NoError(t, run([]string{"--version"}, &out))
	assert.Equal(t, version.String("manager")+"\n", out.String())
	assert.Contains(t, out.String(), "manager v1.2.3-test ")
}

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

// TestKVIndexEndpoint: by default the sidecars forward to the install
// bundle's index Service, named in the operator's namespace and the
// cluster's domain; the flag replaces it whole.
func TestKVIndexEndpoint(t *testing.T) {
	assert.Equal(t, "inferencecache-index.inferencecache-system.svc.cluster.local:9400", kvIndexEndpoint("", "inferencecache-system", "cluster.local"))
	assert.Equal(t, "inferencecache-index.ops.svc.corp.example:9400", kvIndexEndpoint("", "ops", "corp.example"))
	assert.Equal(t, "index.example:443", kvIndexEndpoint("index.example:443", "ops", "cluster.local"))
}
