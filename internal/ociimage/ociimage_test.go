package ociimage_test

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/internal/ociimage"
)

const testVersion = "v0.0.0-imagetest"

// TestManagerImageLayout builds the manager's image layout into a
// temporary folder and opens it as a registry or runtime would: one
// multi-platform index, both platforms, user 65532, the entrypoint, the OCI
// labels, the CA certificates, and a static amd64 binary that prints the
// linked version.
func TestManagerImageLayout(t *testing.T) {
	out := t.TempDir()
	built, err := ociimage.Build(context.Background(), ociimage.Options{
		RepoRoot: "../..", OutDir: out, Version: testVersion, Revision: "0123abcd",
		Source: "https://github.com/inferencecache/operator", Only: []string{"manager"},
	})
	require.NoError(t, err)
	require.Len(t, built, 1)
	require.Equal(t, filepath.Join(out, "inferencecache-operator"), built[0].Path)

	lp, err := layout.FromPath(built[0].Path)
	require.NoError(t, err)
	top, err := lp.ImageIndex()
	require.NoError(t, err)
	tm, err := top.IndexManifest()
	require.NoError(t, err)
	require.Len(t, tm.Manifests, 1, "index.json names one multi-platform index")
	assert.Equal(t, testVersion, tm.Manifests[0].Annotations[ociimage.AnnotationRefName])
	assert.Equal(t, built[0].Digest, tm.Manifests[0].Digest)

	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	platforms := map[string]v1.Hash{}
	for _, d := range im.Manifests {
		require.NotNil(t, d.Platform)
		platforms[d.Platform.OS+"/"+d.Platform.Architecture] = d.Digest
	}
	require.Equal(t, []string{"linux/amd64", "linux/arm64"}, keys(platforms))

	certs, err := os.ReadFile(ociimage.DefaultCABundle)
	require.NoError(t, err)
	for plat, digest := range platforms {
		img, err := idx.Image(digest)
		require.NoError(t, err)
		cf, err := img.ConfigFile()
		require.NoError(t, err)
		assert.Equal(t, "65532:65532", cf.Config.User, plat)
		assert.Equal(t, []string{"/manager"}, cf.Config.Entrypoint, plat)
		assert.Equal(t, plat, cf.OS+"/"+cf.Architecture)
		assert.Equal(t, testVersion, cf.Config.Labels["org.opencontainers.image.version"], plat)
		assert.Equal(t, "0123abcd", cf.Config.Labels["org.opencontainers.image.revision"], plat)
		assert.Equal(t, "https://github.com/inferencecache/operator", cf.Config.Labels["org.opencontainers.image.source"], plat)

		files := flatten(t, img)
		assert.Equal(t, certs, files["etc/ssl/certs/ca-certificates.crt"], "%s: the build machine's CA bundle", plat)
		assert.Contains(t, string(files["etc/passwd"]), "nonroot:x:65532:65532:")
		bin := files["manager"]
		require.NotEmpty(t, bin, plat)
		f, err := elf.NewFile(bytes.NewReader(bin))
		require.NoError(t, err)
		wantMachine := map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}[plat]
		assert.Equal(t, wantMachine, f.Machine, plat)
		for _, p := range f.Progs {
			assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s: static binary (no dynamic loader)", plat)
		}
		libs, _ := f.ImportedLibraries()
		assert.Empty(t, libs, plat)

		if plat == "linux/amd64" {
			path := filepath.Join(t.TempDir(), "manager")
			require.NoError(t, os.WriteFile(path, bin, 0o755))
			got, err := exec.Command(path, "--version").CombinedOutput()
			require.NoError(t, err, "%s", got)
			assert.Regexp(t, `^manager `+testVersion+` \(revision \S+, go\S+ linux/amd64\)\n$`, string(got))
		}
	}
}

// TestMissingCmdIsSkipped: an image whose cmd/ folder does not exist yet
// (kvevent-subscriber, cache-index before they land) is left out.
func TestMissingCmdIsSkipped(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "cmd"), 0o755))
	built, err := ociimage.Build(context.Background(), ociimage.Options{RepoRoot: root, OutDir: t.TempDir(), Version: testVersion})
	require.NoError(t, err)
	assert.Empty(t, built)
	names := map[string]string{}
	for _, i := range ociimage.Images {
		names[i.Cmd] = i.Name
	}
	assert.Equal(t, "inferencecache-operator", names["manager"])
	assert.Contains(t, names, "kvevent-subscriber")
	assert.Contains(t, names, "cache-index")
}

// flatten reads the image's filesystem (later layers win).
func flatten(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		require.NoError(t, err)
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[h.Name] = b
	}
}

func keys(m map[string]v1.Hash) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	if len(out) == 2 && out[0] > out[1] {
		out[0], out[1] = out[1], out[0]
	}
	return out
}
