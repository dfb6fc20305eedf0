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

// fakeLayout writes OCI layouts of the manager, the index and the
// kvevent-subscriber, each holding one (random) multi-platform index, as
// make image does without building binaries, and returns the manager's,
// the index's and the subscriber's digests.
func fakeLayout(t *testing.T, dir string) (string, string, string) {
	t.Helper()
	var digests []string
	for _, name := range []string{"inferencecache-operator", "inferencecache-cache-index", "inferencecache-kvevent-subscriber"} {
		idx, err := random.Index(64, 1, 2)
		require.NoError(t, err)
		lp, err := layout.Write(filepath.Join(dir, name), empty.Index)
		require.NoError(t, err)
		require.NoError(t, lp.AppendIndex(idx))
		d, err := idx.Digest()
		require.NoError(t, err)
		digests = append(digests, d.String())
	}
	return digests[0], digests[1], digests[2]
}

// TestBuild: both bundles pin the manager, the index and the manager's
// kvevent-subscriber argument (issue 24: no bundle set it, so the webhook
// added no sidecar) by their layouts' digests under the registry, label
// every object with the version, and keep the overlay's difference
// (cert-manager objects only in production).
func TestBuild(t *testing.T) {
	images := t.TempDir()
	digest, indexDigest, subscriberDigest := fakeLayout(t, images)
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
						args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
						assert.Contains(t, args, installer.SubscriberFlag+"registry.example/ic/inferencecache-kvevent-subscriber@"+subscriberDigest)
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

// TestBuildKeepsTheSubscriberOff: an overlay that sets the subscriber
// argument empty (the KV-event pipeline off) keeps it empty in the bundle.
func TestBuildKeepsTheSubscriberOff(t *testing.T) {
	images := t.TempDir()
	fakeLayout(t, images)
	overlay := t.TempDir()
	base, err := filepath.Abs("../../kustomize/overlays/production")
	require.NoError(t, err)
	rel, err := filepath.Rel(overlay, base)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(`resources: [`+rel+`]
patches:
  - target: {kind: Deployment, name: inferencecache-operator}
    patch: |-
      - op: replace
        path: /spec/template/spec/containers/0/args/5
        value: --kvevent-subscriber-image=
`), 0o600))
	b, err := installer.Build(installer.Options{Overlay: overlay, ImagesDir: images, Registry: "r", Version: "v"})
	require.NoError(t, err)
	assert.Contains(t, string(b), "- --kvevent-subscriber-image=\n")
	assert.NotContains(t, string(b), "inferencecache-kvevent-subscriber@")
}
