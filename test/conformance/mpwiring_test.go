package conformance_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// TestVLLMParsesTheMPWiring: the multiprocess-mode --kv-transfer-config
// (inject.MPKVTransferConfig; issue 23's groundwork, the webhook does not
// add it yet) for each role, on `vllm serve`, goes through vLLM 0.33's own
// parser and EngineArgs; vLLM registers the connector name, loads
// LMCache's own class for the config (with lmcache installed its registry
// entry would too: the module path only turns a broken lmcache into an
// import error, which this environment cannot show), keeps the role, and
// LMCache's connector would dial the node-local Service's tcp:// address
// on the rendered port; the other lmcache.mp.* keys are ones LMCache's
// adapter reads (vllm_multi_process_adapter.ExtraConfigDefault), isolated
// IPC resolved on, as the server's --isolated-ipc.
func TestVLLMParsesTheMPWiring(t *testing.T) {
	const host = "cache.llm.svc.cluster.local"
	const port = int32(5555)
	roles := []v1alpha1.IntegrationRole{v1alpha1.RoleReadWrite, v1alpha1.RoleReadOnly, v1alpha1.RoleWriteOnly}
	var req struct {
		Cases  []argvCase `json:"cases"`
		Models []string   `json:"models"`
	}
	req.Models = []string{model}
	for _, r := range roles {
		req.Cases = append(req.Cases, argvCase{Name: string(r), Argv: []string{"vllm", "serve", model,
			inject.KVTransferConfigFlag, inject.MPKVTransferConfig(host, port, r)}})
	}
	var resp struct {
		VLLM    string       `json:"vllm"`
		Results []vllmResult `json:"results"`
	}
	pyenv.RunJSON(t, pyenv.VLLM, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "vllm_args.py"), req, &resp)
	require.Len(t, resp.Results, len(roles))
	for i, r := range roles {
		t.Run(string(r), func(t *testing.T) {
			res := resp.Results[i]
			require.Empty(t, res.Error, "vLLM %s refused %q", resp.VLLM, req.Cases[i].Argv)
			require.NotNil(t, res.ConnectorRegistered)
			assert.True(t, *res.ConnectorRegistered, "vLLM knows the connector's name")
			assert.Equal(t, inject.LMCacheMPConnectorModulePath+"."+inject.LMCacheMPConnector, res.ConnectorClass, "LMCache's own class")
			assert.Equal(t, inject.KVRole(r), res.KVTransferConfig["kv_role"])
			assert.Equal(t, "tcp://"+host+":5555", res.MPServerURL, "the address LMCache's connector dials")
			// Every other lmcache.mp.* key is one LMCache's adapter knows
			// (it would ignore another), resolved to what was meant.
			extra, ok := res.KVTransferConfig["kv_connector_extra_config"].(map[string]any)
			require.True(t, ok, "%v", res.KVTransferConfig)
			for k := range extra {
				name := strings.TrimPrefix(k, "lmcache.mp.")
				if name == "host" || name == "port" {
					continue
				}
				assert.Contains(t, res.MPExtraConfigNames, name, "LMCache's adapter reads %s", k)
			}
			assert.Equal(t, true, res.MPExtraConfig["isolated_ipc"], "isolated IPC, as the server's --isolated-ipc")
			t.Logf("vLLM %s: %s loads %s, dials %s", resp.VLLM, inject.LMCacheMPConnector, res.ConnectorClass, res.MPServerURL)
		})
	}
}
