// Package gitops tests what GitOps tools read from a CacheBackend: the Argo
// CD health check shipped under examples/argocd, evaluated with gopher-lua
// (the interpreter Argo CD embeds) against its own health_test.yaml in
// Argo CD's layout, and kstatus (Flux, kubectl wait) on the same states.
package gitops

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"

	"github.com/inferencecache/operator/internal/apidoc"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"
)

const customization = "../../examples/argocd/resource_customizations/inferencecache.io/CacheBackend"

type healthTests struct {
	Tests []struct {
		HealthStatus struct {
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"healthStatus"`
		InputPath string `json:"inputPath"`
	} `json:"tests"`
}

// toLua converts decoded YAML into Lua values the way Argo CD hands objects
// to health scripts: maps become tables, lists 1-based tables.
func toLua(L *lua.LState, v any) lua.LValue {
	switch x := v.(type) {
	case map[string]any:
		t := L.NewTable()
		for k, e := range x {
			t.RawSetString(k, toLua(L, e))
		}
		return t
	case []any:
		t := L.NewTable()
		for _, e := range x {
			t.Append(toLua(L, e))
		}
		return t
	case string:
		return lua.LString(x)
	case bool:
		return lua.LBool(x)
	case int64:
		return lua.LNumber(x)
	case float64:
		return lua.LNumber(x)
	case nil:
		return lua.LNil
	default:
		return lua.LString("")
	}
}

func load(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	j, err := yaml.YAMLToJSON(raw)
	require.NoError(t, err)
	u := &unstructured.Unstructured{}
	require.NoError(t, u.UnmarshalJSON(j), "integers stay int64, as from the API server")
	return u
}

func TestArgoCDHealth(t *testing.T) {
	script, err := os.ReadFile(filepath.Join(customization, "health.lua"))
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(customization, "health_test.yaml"))
	require.NoError(t, err)
	var tests healthTests
	require.NoError(t, yaml.UnmarshalStrict(raw, &tests))
	require.NotEmpty(t, tests.Tests)
	for _, tc := range tests.Tests {
		t.Run(tc.InputPath, func(t *testing.T) {
			obj := load(t, filepath.Join(customization, tc.InputPath))
			L := lua.NewState(lua.Options{SkipOpenLibs: false})
			defer L.Close()
			L.SetGlobal("obj", toLua(L, obj.Object))
			require.NoError(t, L.DoString(string(script)))
			ret, ok := L.Get(-1).(*lua.LTable)
			require.True(t, ok, "health.lua returns a table")
			assert.Equal(t, tc.HealthStatus.Status, ret.RawGetString("status").String())
			assert.Equal(t, tc.HealthStatus.Message, ret.RawGetString("message").String())
		})
	}
}

// TestKstatusOfTheSameStates: kstatus agrees with the Argo CD check on each
// fixture with a status (kstatus reads a CacheBackend without any status as
// Current; the operator publishes status from its first reconcile).
func TestKstatusOfTheSameStates(t *testing.T) {
	want := map[string]status.Status{
		"testdata/ready.yaml":            status.CurrentStatus,
		"testdata/rolling.yaml":          status.InProgressStatus,
		"testdata/degraded.yaml":         status.FailedStatus,
		"testdata/stale-generation.yaml": status.InProgressStatus,
		"testdata/hicache-ready.yaml":    status.CurrentStatus,
		// EnginesWired=False is a report: kstatus reads Ready, Reconciling
		// and Stalled only.
		"testdata/ready-engines-unwired.yaml": status.CurrentStatus,
		// Multiprocess mode: the same conditions; kstatus does not read
		// status.multiprocess.
		"testdata/mp-ready.yaml":           status.CurrentStatus,
		"testdata/mp-partially-ready.yaml": status.InProgressStatus,
		"testdata/mp-no-nodes.yaml":        status.CurrentStatus,
	}
	for path, st := range want {
		t.Run(path, func(t *testing.T) {
			res, err := status.Compute(load(t, filepath.Join(customization, path)))
			require.NoError(t, err)
			assert.Equal(t, st, res.Status, res.Message)
		})
	}
}

// TestAPIReferenceIsCurrent: docs/reference/api.md is what the generator
// makes of the current CRD, so the reference cannot drift from the types.
func TestAPIReferenceIsCurrent(t *testing.T) {
	crd, err := os.ReadFile("../../kustomize/base/crd/inferencecache.io_cachebackends.yaml")
	require.NoError(t, err)
	want, err := apidoc.Generate(crd)
	require.NoError(t, err)
	got, err := os.ReadFile("../../docs/reference/api.md")
	require.NoError(t, err)
	assert.Equal(t, want, string(got), "run make manifests")
}
