package gitops

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/cli"
)

// TestArgoCDSyncWaves: examples/gitops/argocd builds with krusty and puts
// the CacheBackend in an earlier sync wave than the engine.
func TestArgoCDSyncWaves(t *testing.T) {
	objs, err := cli.ReadFile("../../examples/gitops/argocd", true)
	require.NoError(t, err)
	waves := map[string]string{}
	for _, o := range objs {
		waves[o.GetKind()] = o.GetAnnotations()["argocd.argoproj.io/sync-wave"]
	}
	assert.Equal(t, map[string]string{"CacheBackend": "-1", "Deployment": "0"}, waves)
}

// TestFluxDependsOn: in examples/gitops/flux the engine's Kustomization
// depends on the CacheBackend's, which health-checks the CacheBackend;
// each leaves out the other's object.
func TestFluxDependsOn(t *testing.T) {
	raw, err := os.ReadFile("../../examples/gitops/flux/kustomizations.yaml")
	require.NoError(t, err)
	type ks struct {
		Metadata struct{ Name string }
		Spec     struct {
			DependsOn    []struct{ Name string }       `json:"dependsOn"`
			HealthChecks []struct{ Kind, Name string } `json:"healthChecks"`
			Wait         bool
			Patches      []struct{ Patch string }
		}
	}
	docs := map[string]ks{}
	for _, doc := range splitYAML(raw) {
		var k ks
		require.NoError(t, yaml.Unmarshal(doc, &k))
		docs[k.Metadata.Name] = k
	}
	cache, engine := docs["qwen-cache"], docs["qwen-engine"]
	require.Len(t, cache.Spec.HealthChecks, 1)
	assert.Equal(t, "CacheBackend", cache.Spec.HealthChecks[0].Kind)
	assert.Contains(t, cache.Spec.Patches[0].Patch, "kind: Deployment")
	require.Len(t, engine.Spec.DependsOn, 1)
	assert.Equal(t, "qwen-cache", engine.Spec.DependsOn[0].Name)
	assert.Contains(t, engine.Spec.Patches[0].Patch, "kind: CacheBackend")
}

func splitYAML(raw []byte) [][]byte {
	var out [][]byte
	start := 0
	s := string(raw)
	for i := 0; i+4 <= len(s); i++ {
		if s[i:i+4] == "\n---" {
			out = append(out, raw[start:i])
			start = i + 4
		}
	}
	return append(out, raw[start:])
}
