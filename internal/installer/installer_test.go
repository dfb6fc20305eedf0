package installer_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/installer"
)

// fakeLayout writes OCI layouts of the manager and the index, each holding
// one (random) multi-platform index, as make image does without building
// binaries, and returns the manager's and the index's digests.
func fakeLayout(t *testing.T, dir string) (string, string) {
	t.Helper()
	var digests []string
	for _, name := range []string{"inferencecache-operator", "inferencecache-cache-index"} {
		idx, err := random.Index(64, 1, 2)
		require.NoError(t, err)
		lp, err := layout.Write(filepath.Join(dir, name), empty.Index)
		require.NoError(t, err)
		require.NoError(t, lp.AppendIndex(idx))
		d, err := idx.Digest()
		require.NoError(t, err)
		digests = append(digests, d.String())
	}
	return digests[0], digests[1]
}

// TestBuild: both bundles pin the manager and the index by their layouts'
// digests under the registry, label every object with the version, and keep the overlay's
// difference (cert-manager objects only in production).
func TestBuild(t *testing.T) {
	images := t.TempDir()
	digest, indexDigest := fakeLayout(t, images)
	for _, tc := range []struct {
		overlay     string
		certManager bool
	}{
		{"../../kustomize/overlays/production", true},
		{"../../kustomize/overlays/dev", false},
	} {
		t.Run(filepath.Base(tc.overlay), func(t *testing.T) {
			b, err := installer.Build(installer.Options{Overlay: tc.overlay, ImagesDir: images, Registry: "registry.example/ic/", Version: "v9.9.9"})
			require.NoError(t, err)
			f := filepath.Join(t.TempDir(), "install.yaml")
			require.NoError(t, os.WriteFile(f, b, 0o600))
			objs, err := cli.ReadFile(f, false)
			require.NoError(t, err)
			want, err := cli.ReadFile(tc.overlay, true)
			require.NoError(t, err)
			assert.Len(t, objs, len(want), "the overlay's objects, no more, no fewer")
			var certs, managers, indexes int
			for _, o := range objs {
				assert.Equal(t, "v9.9.9", o.GetLabels()["app.kubernetes.io/version"], "%s %s", o.GetKind(), o.GetName())
				assert.Equal(t, "inferencecache", o.GetLabels()["app.kubernetes.io/part-of"], "%s %s", o.GetKind(), o.GetName())
				switch o.GetKind() {
				case "Certificate", "Issuer":
					certs++
				case "Deployment":
					cs, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
					require.NoError(t, err)
					require.Len(t, cs, 1)
					image := cs[0].(map[string]any)["image"]
					switch o.GetName() {
					case "inferencecache-operator":
						managers++
						assert.Equal(t, "registry.example/ic/inferencecache-operator@"+digest, image)
					case "inferencecache-index":
						indexes++
						assert.Equal(t, "registry.example/ic/inferencecache-cache-index@"+indexDigest, image)
					default:
						t.Errorf("unexpected Deployment %s", o.GetName())
					}
				}
			}
			assert.Equal(t, 1, managers)
			assert.Equal(t, 1, indexes)
			assert.Equal(t, tc.certManager, certs == 2)
		})
	}
}

// TestBuildWithoutLayout: no image layout, no bundle (it would pin nothing).
func TestBuildWithoutLayout(t *testing.T) {
	_, err := installer.Build(installer.Options{Overlay: "../../kustomize/overlays/dev", ImagesDir: t.TempDir(), Registry: "r", Version: "v"})
	assert.ErrorContains(t, err, "run make image first")
}

// TestBuildOrder: kubectl apply -f goes top to bottom, so the Namespace and
// the CRD come before every object that lives in them.
func TestBuildOrder(t *testing.T) {
	images := t.TempDir()
	fakeLayout(t, images)
	b, err := installer.Build(installer.Options{Overlay: "../../kustomize/overlays/production", ImagesDir: images, Registry: "r", Version: "v"})
	require.NoError(t, err)
	f := filepath.Join(t.TempDir(), "install.yaml")
	require.NoError(t, os.WriteFile(f, b, 0o600))
	objs, err := cli.ReadFile(f, false)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(objs), 2)
	kinds := []string{objs[0].GetKind(), objs[1].GetKind()}
	assert.ElementsMatch(t, []string{"Namespace", "CustomResourceDefinition"}, kinds)
}
