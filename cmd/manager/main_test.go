package main

import (
	"bytes"
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
