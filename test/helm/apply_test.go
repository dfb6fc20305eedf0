package helm

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/test/controlplane"
)

// TestRenderedChartAppliesTwice: the chart rendered with its defaults (the
// production overlay's objects; its Namespace too) applies with kubectl
// apply --server-side on a real API server (etcd + kube-apiserver), and a
// second apply of the same manifest writes nothing: every object keeps its
// resourceVersion. cert-manager cannot run here: its Issuer and Certificate
// kinds are registered by the stand-in CRDs of test/install, so this proves
// the chart applies, not that cert-manager issues the certificate.
func TestRenderedChartAppliesTwice(t *testing.T) {
	manifest, err := render(map[string]any{"createNamespace": true})
	require.NoError(t, err)
	work := t.TempDir()
	file := filepath.Join(work, "chart.yaml")
	require.NoError(t, os.WriteFile(file, []byte(manifest), 0o600))

	bin, err := controlplane.Dir()
	require.NoError(t, err, "the local control plane")
	env := &envtest.Environment{
		BinaryAssetsDirectory: bin,
		CRDDirectoryPaths:     []string{"../install/testdata"},
		ErrorIfCRDPathMissing: true,
	}
	_, err = env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := env.AddUser(envtest.User{Name: "helm-test", Groups: []string{"system:masters"}}, nil)
	require.NoError(t, err)
	kubeconfig, err := admin.KubeConfig()
	require.NoError(t, err)
	kubeconfigFile := filepath.Join(work, "kubeconfig")
	require.NoError(t, os.WriteFile(kubeconfigFile, kubeconfig, 0o600))
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", kubeconfigFile}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	// resourceVersions of every object of the manifest, by kind/namespace/name.
	versions := func() map[string]string {
		var list struct {
			Items []struct {
				Kind     string `json:"kind"`
				Metadata struct {
					Namespace, Name, ResourceVersion string
				} `json:"metadata"`
			} `json:"items"`
		}
		require.NoError(t, json.Unmarshal([]byte(kubectl("get", "-f", file, "-o", "json")), &list))
		out := map[string]string{}
		for _, i := range list.Items {
			out[i.Kind+" "+i.Metadata.Namespace+"/"+i.Metadata.Name] = i.Metadata.ResourceVersion
		}
		return out
	}

	first := kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", file)
	assert.Contains(t, first, "deployment.apps/inferencecache-operator serverside-applied")
	assert.Contains(t, first, "certificate.cert-manager.io/inferencecache-webhook serverside-applied")
	kubectl("wait", "--for=condition=Established", "crd/cachebackends.inferencecache.io", "--timeout=30s")
	before := versions()
	assert.Len(t, before, strings.Count(manifest, "\nkind: "), "every object of the manifest is there")

	second := kubectl("apply", "--server-side", "--field-manager=helm-test", "-f", file)
	assert.NotContains(t, strings.ToLower(second), "error")
	assert.Equal(t, before, versions(), "the second apply changed nothing")
	out := kubectl("get", "mutatingwebhookconfiguration", "inferencecache-pod-injector", "-o", "jsonpath={.metadata.annotations}")
	assert.Contains(t, out, "inferencecache-system/inferencecache-webhook", "cert-manager is asked to inject the CA")
}
