// Package helm tests the Helm chart charts/inferencecache-operator with the
// Helm Go library, in a module of its own so Helm's dependencies stay out of
// the operator's go.mod: rendered as `helm template` does, its objects equal
// the kustomize overlays' (production by default, dev with certManager off,
// plus the monitoring and namespace-opt-in components when switched on);
// values.schema.json rejects unknown keys and wrong types; `helm lint` finds
// nothing; and the rendered chart applies twice with kubectl apply
// --server-side on a local API server, the second apply writing nothing.
package helm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/release"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/installer"
	"github.com/inferencecache/operator/test/manifests"
)

const (
	chartDir = "../../charts/inferencecache-operator"
	// namespace is the overlays' namespace, the release's namespace here.
	namespace = "inferencecache-system"
)

// object is one decoded manifest, numbers as float64 on both sides.
type object = map[string]any

// render renders the chart as `helm template -n inferencecache-system`
// does, schema validation included.
func render(vals map[string]any) (string, error) {
	return renderChart(chartDir, vals)
}

func renderChart(dir string, vals map[string]any) (string, error) {
	return renderChartIn(dir, namespace, vals)
}

func renderChartIn(dir, ns string, vals map[string]any) (string, error) {
	acc, err := installDryRun(dir, ns, vals)
	if err != nil {
		return "", err
	}
	return acc.Manifest(), nil
}

// installDryRun runs `helm install --dry-run=client` of the chart in dir.
func installDryRun(dir, ns string, vals map[string]any) (release.Accessor, error) {
	chrt, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	install := action.NewInstall(&action.Configuration{})
	install.DryRunStrategy = action.DryRunClient
	install.Replace = true
	install.ReleaseName = "inferencecache"
	install.Namespace = ns
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return nil, err
	}
	return release.NewAccessor(rel)
}

// renderNotes renders the chart and returns its NOTES.txt.
func renderNotes(vals map[string]any) (string, error) {
	acc, err := installDryRun(chartDir, namespace, vals)
	if err != nil {
		return "", err
	}
	return acc.Notes(), nil
}

// renderObjects renders and decodes the chart's objects by key.
func renderObjects(t *testing.T, vals map[string]any) map[string]object {
	t.Helper()
	return renderChartObjects(t, chartDir, vals)
}

func renderChartObjects(t *testing.T, dir string, vals map[string]any) map[string]object {
	t.Helper()
	manifest, err := renderChart(dir, vals)
	require.NoError(t, err)
	out := map[string]object{}
	for _, doc := range strings.Split(manifest, "\n---") {
		o := object{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &o), doc)
		if len(o) == 0 {
			continue
		}
		k := key(o)
		require.NotContains(t, out, k, "rendered twice")
		out[k] = o
	}
	return out
}

// kustomize builds an overlay of kustomize/, with components, as `kubectl
// apply -k` would.
func kustomize(t *testing.T, overlay string, components ...string) map[string]object {
	t.Helper()
	return kustomizeIn(t, "../../kustomize", overlay, components...)
}

func kustomizeIn(t *testing.T, root, overlay string, components ...string) map[string]object {
	t.Helper()
	dir := t.TempDir()
	abs := func(p string) string {
		a, err := filepath.Abs(filepath.Join(root, p))
		require.NoError(t, err)
		r, err := filepath.Rel(dir, a)
		require.NoError(t, err)
		return r
	}
	k := object{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": []string{abs(overlay)}}
	var comps []string
	for _, c := range components {
		comps = append(comps, abs(c))
	}
	if len(comps) > 0 {
		k["components"] = comps
	}
	raw, err := yaml.Marshal(k)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), raw, 0o600))
	objs, err := manifests.Build(dir)
	require.NoError(t, err)
	out := map[string]object{}
	for _, u := range objs {
		raw, err := json.Marshal(u.Object)
		require.NoError(t, err)
		o := object{}
		require.NoError(t, json.Unmarshal(raw, &o))
		out[key(o)] = o
	}
	return out
}

func key(o object) string {
	md, _ := o["metadata"].(map[string]any)
	return fmt.Sprintf("%s %s %v/%v", o["apiVersion"], o["kind"], md["namespace"], md["name"])
}

// chartLabels are what the chart adds to every object's metadata.
var chartLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// withoutChartMetadata removes the chart's labels (after checking them) and
// the CRD's keep annotation, leaving what kustomize would have written.
func withoutChartMetadata(t *testing.T, o object) object {
	t.Helper()
	md := o["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	assert.Equal(t, "Helm", labels["app.kubernetes.io/managed-by"], key(o))
	assert.NotEmpty(t, labels["app.kubernetes.io/version"], key(o))
	for _, l := range chartLabels {
		delete(labels, l)
	}
	if len(labels) == 0 {
		delete(md, "labels")
	}
	if o["kind"] == "CustomResourceDefinition" {
		ann := md["annotations"].(map[string]any)
		assert.Equal(t, "keep", ann["helm.sh/resource-policy"], "the CRD outlives helm uninstall")
		delete(ann, "helm.sh/resource-policy")
	}
	return o
}

func keys(m map[string]object) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestChartEqualsKustomize: for each switch setting the chart renders the
// same objects (kind, name, namespace) as the matching kustomize build, each
// one field for field (Deployments' images, args, ports, probes and
// securityContext; webhook rules, failurePolicy and namespaceSelector; RBAC
// rules; the CRD's schema), but for the chart's own labels. The Namespace
// object is the chart's only with createNamespace (Helm's
// --create-namespace makes it otherwise).
func TestChartEqualsKustomize(t *testing.T) {
	for _, tc := range []struct {
		name       string
		vals       string
		overlay    string
		components []string
	}{
		{"defaults are the production overlay", `{createNamespace: true}`, "overlays/production", nil},
		// The dev overlay does not pin the images (the base's :latest).
		{"certManager off is the dev overlay", `{createNamespace: true, certManager: {enabled: false}, operator: {manager: {image: {tag: latest}, flags: {kveventSubscriberImage: {tag: latest}}}}, index: {cacheIndex: {image: {tag: latest}}}}`, "overlays/dev", nil},
		{"monitoring adds the monitoring component", `{createNamespace: true, monitoring: {enabled: true}}`, "overlays/production", []string{"components/monitoring"}},
		{"engineEviction off adds the without-engine-eviction component", `{createNamespace: true, engineEviction: {enabled: false}}`, "overlays/production", []string{"components/without-engine-eviction"}},
		{"namespaceOptIn adds the namespace-opt-in component", `{createNamespace: true, namespaceOptIn: {enabled: true}, certManager: {enabled: false}, operator: {manager: {image: {tag: latest}, flags: {kveventSubscriberImage: {tag: latest}}}}, index: {cacheIndex: {image: {tag: latest}}}}`, "overlays/dev", []string{"components/namespace-opt-in"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sameObjects(t, chartDir, "../../kustomize", tc.vals, tc.overlay, tc.components...)
		})
	}
	t.Run("without-engine-eviction removes the eviction grant and nothing else", func(t *testing.T) {
		with, without := kustomize(t, "overlays/production"), kustomize(t, "overlays/production", "components/without-engine-eviction")
		var removed []string
		for k := range with {
			if _, ok := without[k]; !ok {
				removed = append(removed, k)
			} else {
				assert.Equal(t, with[k], without[k], k)
			}
		}
		slices.Sort(removed)
		assert.Equal(t, []string{"rbac.authorization.k8s.io/v1 ClusterRole <nil>/inferencecache-operator-engine-eviction",
			"rbac.authorization.k8s.io/v1 ClusterRoleBinding <nil>/inferencecache-operator-engine-eviction"}, removed)
		assert.Len(t, without, len(with)-2)
	})
	t.Run("without createNamespace there is no Namespace object", func(t *testing.T) {
		chart := renderObjects(t, nil)
		want := kustomize(t, "overlays/production")
		delete(want, "v1 Namespace <nil>/"+namespace)
		assert.Equal(t, keys(want), keys(chart))
	})
}

// sameObjects asserts that the chart in dir, rendered with vals, has the
// objects of the kustomize build of overlay (under root), field for field
// but for the chart's own labels.
func sameObjects(t *testing.T, dir, root, vals, overlay string, components ...string) {
	t.Helper()
	v := map[string]any{}
	require.NoError(t, yaml.Unmarshal([]byte(vals), &v))
	chart := renderChartObjects(t, dir, v)
	want := kustomizeIn(t, root, overlay, components...)
	require.Equal(t, keys(want), keys(chart), "the same objects")
	for k, o := range chart {
		assert.Equal(t, want[k], withoutChartMetadata(t, o), k)
	}
}

// TestChartEqualsTheReleaseBundle: the chart with its images pinned as the
// release pins them renders the objects of dist/install.yaml (the bundle
// `make build-installer` writes, built here by the same code from layouts
// of random images), field for field, but for the chart's own labels and
// the bundle's version label (issue 24).
func TestChartEqualsTheReleaseBundle(t *testing.T) {
	images := t.TempDir()
	digests := map[string]string{}
	for _, name := range []string{"inferencecache-operator", "inferencecache-cache-index", "inferencecache-kvevent-subscriber"} {
		idx, err := random.Index(64, 1, 2)
		require.NoError(t, err)
		lp, err := layout.Write(filepath.Join(images, name), empty.Index)
		require.NoError(t, err)
		require.NoError(t, lp.AppendIndex(idx))
		d, err := idx.Digest()
		require.NoError(t, err)
		digests[name] = d.String()
	}
	const registry = "registry.example/ic"
	bundle, err := installer.Build(installer.Options{Overlay: "../../kustomize/overlays/production", ImagesDir: images, Registry: registry, Version: "v9.9.9"})
	require.NoError(t, err)
	want := map[string]object{}
	for _, doc := range strings.Split(string(bundle), "\n---\n") {
		o := object{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &o))
		if len(o) == 0 {
			continue
		}
		md := o["metadata"].(map[string]any)
		labels, _ := md["labels"].(map[string]any)
		assert.Equal(t, "v9.9.9", labels["app.kubernetes.io/version"], key(o))
		delete(labels, "app.kubernetes.io/version")
		if len(labels) == 0 {
			delete(md, "labels")
		}
		want[key(o)] = o
	}
	image := func(name string) map[string]any {
		return map[string]any{"repository": registry + "/" + name, "digest": digests[name]}
	}
	chart := renderChartObjects(t, chartDir, map[string]any{
		"createNamespace": true,
		"operator": map[string]any{"manager": map[string]any{
			"image": image("inferencecache-operator"),
			"flags": map[string]any{"kveventSubscriberImage": image("inferencecache-kvevent-subscriber")},
		}},
		"index": map[string]any{"cacheIndex": map[string]any{"image": image("inferencecache-cache-index")}},
	})
	require.Equal(t, keys(want), keys(chart), "the same objects")
	for k, o := range chart {
		assert.Equal(t, want[k], withoutChartMetadata(t, o), k)
	}
}
