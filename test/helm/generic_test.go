package helm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/helmchart"
)

// extraWorkload is a second workload as kustomize/base may gain one (the
// cache-index): a Deployment with two containers, flags and no resources,
// and its Service.
const extraWorkload = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: inferencecache-cache-index
  labels: {app.kubernetes.io/name: inferencecache-cache-index}
spec:
  replicas: 1
  selector:
    matchLabels: {app.kubernetes.io/name: inferencecache-cache-index}
  template:
    metadata:
      labels: {app.kubernetes.io/name: inferencecache-cache-index}
    spec:
      containers:
        - name: cache-index
          image: inferencecache/cache-index:v0.1.0
          args: [--listen=:9090, --store=memory, --lease-seconds=30, --peer=inferencecache-webhook.inferencecache-system.svc:443, serve]
        - name: redis-proxy
          image: registry.example/proxy@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
---
apiVersion: v1
kind: Service
metadata:
  name: inferencecache-cache-index
spec:
  selector: {app.kubernetes.io/name: inferencecache-cache-index}
  ports: [{name: grpc, port: 9090, targetPort: 9090, protocol: TCP}]
`

// TestGeneratorFollowsTheOverlays: the generator names no object of the
// overlays. Given a kustomize tree whose base gains a workload, the chart it
// writes renders that workload too, equal to the kustomize build for the
// production and dev overlays, with its own values.
func TestGeneratorFollowsTheOverlays(t *testing.T) {
	work := t.TempDir()
	root := filepath.Join(work, "kustomize")
	out, err := exec.Command("cp", "-r", "../../kustomize", root).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, os.WriteFile(filepath.Join(root, "base", "cache-index.yaml"), []byte(extraWorkload), 0o600))
	addResource(t, filepath.Join(root, "base", "kustomization.yaml"), "cache-index.yaml")

	chart := filepath.Join(work, "chart")
	require.NoError(t, helmchart.Generate(root, chart))
	sameObjects(t, chart, root, `{createNamespace: true}`, "overlays/production")
	sameObjects(t, chart, root, `{createNamespace: true, certManager: {enabled: false}, operator: {manager: {image: {tag: latest}, flags: {kveventSubscriberImage: {tag: latest}}}}, index: {cacheIndex: {image: {tag: latest}}}}`, "overlays/dev")

	objs := renderChartObjects(t, chart, map[string]any{"cacheIndex": map[string]any{
		"replicas":   3,
		"cacheIndex": map[string]any{"image": map[string]any{"tag": "v0.2.0"}, "flags": map[string]any{"store": "redis"}},
	}})
	d := objs["apps/v1 Deployment inferencecache-system/inferencecache-cache-index"]
	require.NotNil(t, d)
	spec := d["spec"].(map[string]any)
	assert.EqualValues(t, 3, spec["replicas"])
	c := spec["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	assert.Equal(t, "inferencecache/cache-index:v0.2.0", c["image"])
	assert.Equal(t, []any{"--listen=:9090", "--store=redis", "--lease-seconds=30", "--peer=inferencecache-webhook.inferencecache-system.svc:443", "serve"}, c["args"])
	// A flag naming an object by its namespace follows the release's.
	manifest, err := renderChartIn(chart, "elsewhere", nil)
	require.NoError(t, err)
	assert.True(t, strings.Contains(manifest, `"--peer=inferencecache-webhook.elsewhere.svc:443"`), "the flag names the release's namespace")
	for _, line := range strings.Split(manifest, "\n") {
		if strings.HasPrefix(line, "# Source: ") {
			continue // the template's file name
		}
		assert.NotContains(t, line, "inferencecache-system", "the release's namespace everywhere")
	}
	_, err = renderChart(chart, map[string]any{"cacheIndex": map[string]any{"replica": 3}})
	assert.ErrorContains(t, err, "replica", "the new workload's values are closed too")
}

// addResource appends a file to the resources of a kustomization.
func addResource(t *testing.T, kustomization, file string) {
	t.Helper()
	raw, err := os.ReadFile(kustomization)
	require.NoError(t, err)
	k := map[string]any{}
	require.NoError(t, yaml.Unmarshal(raw, &k))
	k["resources"] = append(k["resources"].([]any), file)
	raw, err = yaml.Marshal(k)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(kustomization, raw, 0o600))
}
