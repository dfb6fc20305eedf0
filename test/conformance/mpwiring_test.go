package conformance_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/engineversion"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// TestVLLMParsesTheMPWiring: the multiprocess-mode --kv-transfer-config
// (inject.MPKVTransferConfig, which the webhook adds; see
// TestVLLMParsesTheWebhooksMPWiring for the webhook's whole command line)
// for each role, on `vllm serve`, goes through each supported vLLM's own
// parser and EngineArgs; vLLM registers the connector name, loads
// LMCache's own class for the config (with lmcache installed its registry
// entry would too: the module path only turns a broken lmcache into an
// import error, which this environment cannot show), keeps the role, and
// LMCache's connector would dial the node-local Service's tcp:// address
// on the rendered port; the other lmcache.mp.* keys are ones LMCache's
// adapter reads (vllm_multi_process_adapter.ExtraConfigDefault), isolated
// IPC resolved on, as the server's --isolated-ipc.
//
// It runs against every supported vLLM and LMCache pair (pyenv.Cells).
func TestVLLMParsesTheMPWiring(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "vllm") {
		t.Run(cell.Env, func(t *testing.T) { testMPTransferConfig(t, cell) })
	}
}

func testMPTransferConfig(t *testing.T, cell pyenv.Cell) {
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
	pyenv.RunJSON(t, cell.Env, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "vllm_args.py"), req, &resp)
	require.Len(t, resp.Results, len(roles))
	require.Equal(t, cell.VLLM(), resp.VLLM, "the environment runs the cell's vLLM")
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

// TestVLLMParsesTheWebhooksMPWiring: the command line vLLM parses is the
// one the webhook produces, for every supported vLLM and LMCache pair
// (pyenv.Cells: one environment each), for a pod that declares its vLLM
// release and for one whose release the webhook cannot tell. For a
// CacheBackend in multiprocess mode (its status.endpoint the one the
// operator publishes) and each role, every shape of vLLM engine container
// goes through inject.Decide and is started as the kubelet would
// (startContainer); that vLLM's own parser must accept the wired command
// line, load LMCache's MP connector class for it, keep the role and dial
// the node-local Service's address with isolated IPC, and the engine
// process gets the MP env (no in-process LMCACHE_* variables) and the
// private /dev/shm mount. On vLLM 0.34 and later, vLLM's own
// extensible-KV-cache decision for each wired command line, on a CUDA
// machine, is off (LMCache's isolated IPC cannot export driver-mapped
// memory); the command line the webhook produced before it followed the
// release (the module path, no opt-out) is shown to turn it on. The
// sleep-mode refusal is held to vLLM's own reading of the flag: the
// webhook leaves unwired exactly the pods whose command line vLLM parses
// with enable_sleep_mode on.
func TestVLLMParsesTheWebhooksMPWiring(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "vllm") {
		t.Run(cell.Env, func(t *testing.T) {
			for _, declared := range []bool{true, false} {
				name := "release declared"
				if !declared {
					name = "release unknown"
				}
				t.Run(name, func(t *testing.T) { testMPWiring(t, cell, declared) })
			}
		})
	}
}

func testMPWiring(t *testing.T, cell pyenv.Cell, declared bool) {
	mp := func(r v1alpha1.IntegrationRole) v1alpha1.CacheBackend {
		return lmcacheVLLM(withRole(r), func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Multiprocess = &v1alpha1.Multiprocess{Port: 5555, L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("8Gi")}}
		})
	}
	type mpCase struct {
		name    string
		role    v1alpha1.IntegrationRole
		pod     *corev1.Pod
		outcome inject.Outcome
		reason  string
		sleep   bool
	}
	release := func(p *corev1.Pod) {
		if declared {
			p.Annotations[v1alpha1.AnnotationVLLMVersion] = cell.VLLM()
		}
	}
	var cases []mpCase
	for _, s := range shapes {
		for _, r := range []v1alpha1.IntegrationRole{v1alpha1.RoleReadWrite, v1alpha1.RoleReadOnly, v1alpha1.RoleWriteOnly} {
			cases = append(cases, mpCase{name: fmt.Sprintf("%s, role %s", s.name, r), role: r, pod: newEnginePod(s.c(userFlags...), release), outcome: inject.Injected})
		}
	}
	plain := shapes[0].c
	for _, sleep := range [][]string{{"--enable-sleep-mode"}, {"--enable_sleep_mode"}, {"--enable-sleep"}, {"--no-enable-sleep-mode", "--enable-sleep-mode"}} {
		cases = append(cases, mpCase{name: "sleep mode " + strings.Join(sleep, " "), role: v1alpha1.RoleReadWrite, pod: newEnginePod(plain(sleep...), release),
			outcome: inject.Skipped, reason: v1alpha1.SkippedIsolatedIPCUnsupported, sleep: true})
	}
	cases = append(cases, mpCase{name: "sleep mode turned off last", role: v1alpha1.RoleReadWrite,
		pod: newEnginePod(plain("--enable-sleep-mode", "--no-enable-sleep-mode"), release), outcome: inject.Injected})
	// The chunk guard: LMCache's MP connector refuses a block size (times
	// the decode context parallel size) that does not divide the server's
	// chunk; the webhook's reading of the flags is held to vLLM's.
	for _, bs := range []struct {
		args    []string
		outcome inject.Outcome
	}{
		{[]string{"--block-size", "128"}, inject.Injected},
		{[]string{"--block-size", "48"}, inject.Skipped},
		{[]string{"--block_size=400"}, inject.Skipped},
		{[]string{"--block-size", "128", "-dcp", "4"}, inject.Skipped},
	} {
		tc := mpCase{name: "block size " + strings.Join(bs.args, " "), role: v1alpha1.RoleReadWrite, pod: newEnginePod(plain(bs.args...), release), outcome: bs.outcome}
		if bs.outcome == inject.Skipped {
			tc.reason = v1alpha1.SkippedChunkSizeMisaligned
		}
		cases = append(cases, tc)
	}

	var req struct {
		Cases  []argvCase `json:"cases"`
		Fields []string   `json:"fields"`
		Models []string   `json:"models"`
	}
	req.Models, req.Fields = []string{model}, []string{"model", "enable_sleep_mode", "max_model_len", "block_size", "decode_context_parallel_size"}
	decisions := make([]inject.Decision, len(cases))
	procs := make([]Process, len(cases))
	for i, tc := range cases {
		d, c := admit(t, mp(tc.role), tc.pod, inject.Options{})
		decisions[i] = d
		procs[i] = startContainer(t, c, vllmEntrypoint, vllmStubs...)
		req.Cases = append(req.Cases, argvCase{Name: tc.name, Argv: procs[i].Argv})
	}
	host := topology.Host(ptr.To(mp("")), "")
	// The wiring of dc9f750, before it followed the release: the module
	// path and nothing else.
	req.Cases = append(req.Cases, argvCase{Name: "dc9f750", Argv: []string{"vllm", "serve", model,
		inject.KVTransferConfigFlag, inject.MPKVTransferConfig(host, 5555, v1alpha1.RoleReadWrite)}})
	var resp struct {
		VLLM    string       `json:"vllm"`
		Results []vllmResult `json:"results"`
	}
	pyenv.RunJSON(t, cell.Env, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "vllm_args.py"), req, &resp)
	require.Len(t, resp.Results, len(cases)+1)
	require.Equal(t, cell.VLLM(), resp.VLLM, "the environment runs the cell's vLLM")
	t.Logf("vLLM %s parsed %d command lines", resp.VLLM, len(cases)+1)
	extensible := engineversion.MustParse(resp.VLLM).AtLeast(inject.ExtensibleKVCacheSince)
	before := resp.Results[len(cases)]
	require.Empty(t, before.Error)
	if extensible {
		assert.Equal(t, true, before.ExtensibleKVCache, "vLLM %s turns the extensible KV cache on for dc9f750's wiring", resp.VLLM)
	} else {
		assert.Nil(t, before.ExtensibleKVCache, "vLLM %s has no extensible KV cache", resp.VLLM)
	}

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, p, res := decisions[i], procs[i], resp.Results[i]
			t.Logf("engine argv: %q", p.Argv)
			require.Equal(t, tc.outcome, d.Outcome, "webhook: %s", d.Message)
			assert.Equal(t, tc.reason, d.Reason)
			require.Empty(t, res.Error, "vLLM's parser refused the engine's command line")
			assert.Equal(t, model, res.Fields["model"], "the model")
			assert.Equal(t, tc.sleep, res.Fields["enable_sleep_mode"], "vLLM's reading of the sleep-mode flags")
			aligned := true // vLLM's default block size (16, 64) divides the chunk
			if bs, ok := res.Fields["block_size"].(float64); ok {
				dcp, _ := res.Fields["decode_context_parallel_size"].(float64)
				aligned = inject.MPChunkTokens%(int(bs)*max(int(dcp), 1)) == 0
			}
			assert.Equal(t, !aligned, tc.reason == v1alpha1.SkippedChunkSizeMisaligned, "vLLM reads block size %v, decode context parallel size %v", res.Fields["block_size"], res.Fields["decode_context_parallel_size"])
			if tc.outcome != inject.Injected {
				assert.Nil(t, res.KVTransferConfig, "an unwired pod gets no kv_transfer_config")
				assert.Empty(t, d.Pod.Spec.Volumes)
				return
			}
			require.NotNil(t, res.KVTransferConfig, "the engine reads no kv_transfer_config")
			assert.Equal(t, inject.LMCacheMPConnector, res.KVTransferConfig["kv_connector"])
			assert.Equal(t, inject.KVRole(tc.role), res.KVTransferConfig["kv_role"])
			require.NotNil(t, res.ConnectorRegistered)
			assert.True(t, *res.ConnectorRegistered, "vLLM knows the connector's name")
			assert.Equal(t, inject.LMCacheMPConnectorModulePath+"."+inject.LMCacheMPConnector, res.ConnectorClass, "LMCache's own class")
			assert.Equal(t, "tcp://"+host+":5555", res.MPServerURL, "the address LMCache's connector dials")
			assert.Equal(t, true, res.MPExtraConfig["isolated_ipc"], "isolated IPC, as the server's --isolated-ipc")
			if declared {
				assert.Equal(t, inject.LMCacheMPConnectorModulePath, res.KVTransferConfig["kv_connector_module_path"])
				assert.Equal(t, "vllm="+cell.VLLM()+" (annotation); lmcache=unknown", d.Pod.Annotations[v1alpha1.AnnotationWiredFor])
			} else {
				assert.Nil(t, res.KVTransferConfig["kv_connector_module_path"], "no module path for a release the webhook cannot tell")
				assert.Equal(t, "vllm=unknown; lmcache=unknown", d.Pod.Annotations[v1alpha1.AnnotationWiredFor])
			}
			if extensible {
				assert.Equal(t, false, res.ExtensibleKVCache, "vLLM %s's extensible KV cache, which LMCache's isolated IPC cannot export", resp.VLLM)
			} else {
				assert.Nil(t, res.ExtensibleKVCache)
			}
			if !strings.HasPrefix(tc.name, "sleep mode") && !strings.HasPrefix(tc.name, "block size") {
				assert.Equal(t, 4096.0, res.Fields["max_model_len"], "the user's own flags")
			}

			assert.Equal(t, "0", p.Env["PYTHONHASHSEED"])
			assert.Equal(t, "false", p.Env["LMCACHE_TRACK_USAGE"])
			for k := range p.Env {
				assert.False(t, strings.HasPrefix(k, "LMCACHE_") && k != "LMCACHE_TRACK_USAGE", "in-process LMCache variable %s", k)
			}
			engine := d.Pod.Spec.Containers[0]
			assert.Contains(t, engine.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.VolumeEngineSharedMemory, MountPath: inject.DevShm})
			require.Len(t, d.Pod.Spec.Volumes, 2, "/dev/shm and the numba cache")
			v := d.Pod.Spec.Volumes[0]
			assert.Equal(t, v1alpha1.VolumeEngineSharedMemory, v.Name)
			require.NotNil(t, v.EmptyDir)
			assert.Equal(t, corev1.StorageMediumMemory, v.EmptyDir.Medium)
			assert.Equal(t, "1Gi", v.EmptyDir.SizeLimit.String())
		})
	}
}

// TestInProcessRefusalsAreLMCaches: for every supported LMCache, the
// webhook leaves an engine of that release unwired from an in-process
// CacheBackend exactly when vLLM's LMCacheConnectorV1 cannot import the
// adapter it names, and the validating webhook refuses the in-process
// server shape with an image of that release exactly when the release
// ships no lmcache_server: both held to the installed LMCache.
func TestInProcessRefusalsAreLMCaches(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "lmcache") {
		t.Run(cell.Env, func(t *testing.T) {
			var got struct {
				LMCache      string `json:"lmcache"`
				Adapter      bool   `json:"adapter"`
				ServerModule bool   `json:"server_module"`
				ServerScript bool   `json:"server_script"`
			}
			pyenv.RunJSON(t, cell.Env, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "lmcache_inprocess.py"), map[string]any{}, &got)
			require.Equal(t, cell.LMCache(), got.LMCache)
			t.Logf("LMCache %s: in-process adapter %v, lmcache.v1.server %v, lmcache_server %v", got.LMCache, got.Adapter, got.ServerModule, got.ServerScript)
			assert.Equal(t, got.ServerModule, got.ServerScript, "the script and its module go together")

			pod := newEnginePod(shapes[0].c(), func(p *corev1.Pod) { p.Annotations[v1alpha1.AnnotationLMCacheVersion] = got.LMCache })
			d, _ := admit(t, lmcacheVLLM(), pod, inject.Options{})
			if got.Adapter {
				assert.Equal(t, inject.Injected, d.Outcome, d.Message)
			} else {
				assert.Equal(t, inject.Skipped, d.Outcome, d.Message)
				assert.Equal(t, v1alpha1.SkippedEngineRelease, d.Reason)
			}

			cb := lmcacheVLLM(func(cb *v1alpha1.CacheBackend) {
				cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Image: "lmcache/vllm-openai:v" + got.LMCache}}
			})
			errs := validation.Validate(&cb)
			if got.ServerScript {
				assert.Empty(t, errs)
			} else {
				require.Len(t, errs, 1)
				assert.Equal(t, "spec.remoteStorage.lmCacheServer.image", errs[0].Field)
			}
		})
	}
}
