package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// archive writes a .tar.gz holding files (name → content) into dir and
// returns its sha256.
func archive(t *testing.T, dir, name string, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for n, content := range files {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Size: int64(len(content)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(content))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	require.NoError(t, gz.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644))
	sum := sha256.Sum256(buf.Bytes())
	return hex.EncodeToString(sum[:])
}

func TestManifest(t *testing.T) {
	dist := t.TempDir()
	linux := archive(t, dist, "kubectl-cachebackend_v0.2.0_linux_amd64.tar.gz", map[string]string{"kubectl-cachebackend": "elf", "LICENSE": "Apache"})
	windows := archive(t, dist, "kubectl-cachebackend_v0.2.0_windows_amd64.tar.gz", map[string]string{"kubectl-cachebackend.exe": "pe"})
	archive(t, dist, "kubectl-cachebackend_v0.1.0_linux_amd64.tar.gz", map[string]string{"kubectl-cachebackend": "old"})
	require.NoError(t, os.WriteFile(filepath.Join(dist, "install.yaml"), nil, 0o644))

	p, err := Manifest(dist, "v0.2.0", "https://example.com/releases/v0.2.0/")
	require.NoError(t, err)
	assert.Equal(t, "cachebackend", p.Metadata.Name)
	assert.Equal(t, "v0.2.0", p.Spec.Version)
	assert.Equal(t, []Platform{
		{Selector: Selector{MatchLabels: map[string]string{"os": "linux", "arch": "amd64"}},
			URI: "https://example.com/releases/v0.2.0/kubectl-cachebackend_v0.2.0_linux_amd64.tar.gz", Sha256: linux,
			Bin: "kubectl-cachebackend", Files: []FileOperation{{From: "kubectl-cachebackend", To: "."}, {From: "LICENSE", To: "."}}},
		{Selector: Selector{MatchLabels: map[string]string{"os": "windows", "arch": "amd64"}},
			URI: "https://example.com/releases/v0.2.0/kubectl-cachebackend_v0.2.0_windows_amd64.tar.gz", Sha256: windows,
			Bin: "kubectl-cachebackend.exe", Files: []FileOperation{{From: "kubectl-cachebackend.exe", To: "."}}},
	}, p.Spec.Platforms)

	_, err = Manifest(dist, "v9.9.9", "https://example.com")
	assert.ErrorContains(t, err, "no archive kubectl-cachebackend_v9.9.9_<os>_<arch>.tar.gz")

	archive(t, dist, "kubectl-cachebackend_v0.3.0_linux_arm64.tar.gz", map[string]string{"README": "no binary"})
	_, err = Manifest(dist, "v0.3.0", "https://example.com")
	assert.ErrorContains(t, err, "holds no kubectl-cachebackend")
}
