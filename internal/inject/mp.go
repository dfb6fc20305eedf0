package inject

import (
	"encoding/json"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Names of LMCache's multiprocess-mode connector (issue 23). vLLM 0.33
// registers a connector of that name whose loader takes LMCache's own
// class when lmcache imports and otherwise, silently, a built-in copy
// whose constructor does not match LMCache 0.5.6. kv_connector_module_path
// is always given, so that an engine image without a working lmcache fails
// at start with the import error instead of running the copy.
const (
	LMCacheMPConnector           = "LMCacheMPConnector"
	LMCacheMPConnectorModulePath = "lmcache.integration.vllm.lmcache_mp_connector"
)

// MPKVTransferConfig is the --kv-transfer-config of a vLLM engine wired to
// the multiprocess-mode server at host (a DNS name; the connector adds
// tcp://) and port. The webhook does not call it yet: no CacheBackend
// selects the mode (docs/design/multiprocess-mode.md).
func MPKVTransferConfig(host string, port int32, role v1alpha1.IntegrationRole) string {
	b, _ := json.Marshal(struct {
		Connector  string         `json:"kv_connector"`
		ModulePath string         `json:"kv_connector_module_path"`
		Role       string         `json:"kv_role"`
		Extra      map[string]any `json:"kv_connector_extra_config"`
	}{LMCacheMPConnector, LMCacheMPConnectorModulePath, KVRole(role), map[string]any{
		"lmcache.mp.host": "tcp://" + host,
		"lmcache.mp.port": port,
		// As the server's --isolated-ipc (render.MPServerArgs).
		"lmcache.mp.isolated_ipc": true,
	}})
	return string(b)
}
