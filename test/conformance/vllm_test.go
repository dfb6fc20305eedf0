package conformance_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

const model = "Qwen/Qwen2.5-0.5B-Instruct"

// vllmEntrypoint is the ENTRYPOINT of vLLM's images (vllm/vllm-openai,
// vllm/vllm-openai-cpu, lmcache/vllm-openai): a container with args only
// runs `vllm serve <args>`.
var vllmEntrypoint = []string{"vllm", "serve"}

// vllmStubs are the programs that start vLLM.
var vllmStubs = []string{"vllm", "python", "python3"}

// wantEvents is the KV-event intent: the engine publishes on endpoint and
// serves replay on replay, with dp ranks, and a kvevent-subscriber follows
// every rank's sockets.
type wantEvents struct {
	endpoint, replay, topic string
	dp                      int
	sidecar                 bool
}

type vllmCase struct {
	name    string
	backend v1alpha1.CacheBackend
	pod     *corev1.Pod
	opts    inject.Options

	outcome inject.Outcome
	reason  string
	// kvEventsSkipped is the pod's AnnotationKVEventsSkipped ("" when absent).
	kvEventsSkipped string
	// transfer is the kv_transfer_config the engine must read (nil: none).
	transfer map[string]string
	// events is the kv_events_config intent (nil: none).
	events *wantEvents
	// hashAlgo is the block-hash algorithm the engine must use.
	hashAlgo string
	// fields are EngineArgs attributes the engine must read (the user's own flags).
	fields map[string]any
}

// roles is the contract of spec.integration.role (docs/reference/api.md).
var roles = map[v1alpha1.IntegrationRole]string{
	"": "kv_both", v1alpha1.RoleReadWrite: "kv_both", v1alpha1.RoleReadOnly: "kv_consumer", v1alpha1.RoleWriteOnly: "kv_producer",
}

func lmcacheTransfer(role v1alpha1.IntegrationRole) map[string]string {
	return map[string]string{"kv_connector": "LMCacheConnectorV1", "kv_role": roles[role]}
}

func ipcEvents() *wantEvents {
	return &wantEvents{endpoint: inject.KVEventsPubIPC, replay: inject.KVEventsReplayIPC, topic: inject.KVEventsTopic, dp: 1, sidecar: true}
}

func tcpEvents(dp int) *wantEvents {
	return &wantEvents{
		endpoint: fmt.Sprintf("tcp://*:%d", inject.KVEventsPort),
		replay:   fmt.Sprintf("tcp://127.0.0.1:%d", inject.KVEventsPort+dp),
		topic:    inject.KVEventsTopic, dp: dp, sidecar: true,
	}
}

func withRole(r v1alpha1.IntegrationRole) func(*v1alpha1.CacheBackend) {
	return func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.Role = r }
}

func observed(cb *v1alpha1.CacheBackend) {
	cb.Spec.Observation = &v1alpha1.Observation{ModelID: model}
}

func lmcacheVLLM(mut ...func(*v1alpha1.CacheBackend)) v1alpha1.CacheBackend {
	return newBackend(v1alpha1.RuntimeVLLM, v1alpha1.BackendTypeLMCache, mut...)
}

// shapes are the ways an engine container starts vLLM, each with the
// user's own flags appended.
var shapes = []struct {
	name string
	c    func(user ...string) corev1.Container
}{
	{"vllm serve <model>", func(u ...string) corev1.Container {
		return corev1.Container{Command: []string{"vllm", "serve", model}, Args: u}
	}},
	{"vllm serve --model", func(u ...string) corev1.Container {
		return corev1.Container{Command: []string{"vllm", "serve"}, Args: append([]string{"--model", model}, u...)}
	}},
	{"api_server module", func(u ...string) corev1.Container {
		return corev1.Container{Command: []string{"python3", "-m", "vllm.entrypoints.openai.api_server"}, Args: append([]string{"--model", model}, u...)}
	}},
	{"args only", func(u ...string) corev1.Container {
		return corev1.Container{Args: append([]string{"--model", model}, u...)}
	}},
	{"args only, positional model", func(u ...string) corev1.Container {
		return corev1.Container{Args: append([]string{model}, u...)}
	}},
	{"absolute path", func(u ...string) corev1.Container {
		return corev1.Container{Command: []string{"/usr/local/bin/vllm", "serve", model}, Args: u}
	}},
	{"env wrapper", func(u ...string) corev1.Container {
		return corev1.Container{Command: []string{"env", "VLLM_LOGGING_LEVEL=INFO", "vllm", "serve", model}, Args: u}
	}},
	{"nohup wrapper", func(u ...string) corev1.Container {
		return corev1.Container{Command: []string{"nohup", "python", "-m", "vllm.entrypoints.cli.main", "serve", model}, Args: u}
	}},
}

var userFlags = []string{"--max-model-len", "4096", "--gpu-memory-utilization=0.85", "--enable-prefix-caching"}
var userFields = map[string]any{"max_model_len": 4096.0, "gpu_memory_utilization": 0.85, "enable_prefix_caching": true}

func vllmCases() []vllmCase {
	var cases []vllmCase
	// Every shape, every role, KV events off and on.
	for _, s := range shapes {
		for _, r := range []v1alpha1.IntegrationRole{"", v1alpha1.RoleReadWrite, v1alpha1.RoleReadOnly, v1alpha1.RoleWriteOnly} {
			cases = append(cases, vllmCase{
				name: fmt.Sprintf("%s, role %q, no KV events", s.name, r), backend: lmcacheVLLM(withRole(r)),
				pod: newEnginePod(s.c(userFlags...)), outcome: inject.Injected, transfer: lmcacheTransfer(r), hashAlgo: "sha256", fields: userFields,
			})
			cases = append(cases, vllmCase{
				name: fmt.Sprintf("%s, role %q, KV events", s.name, r), backend: lmcacheVLLM(withRole(r), observed), opts: observeOptions(),
				pod: newEnginePod(s.c(userFlags...)), outcome: inject.Injected, transfer: lmcacheTransfer(r), events: ipcEvents(),
				hashAlgo: inject.HashAlgoSHA256CBOR, fields: userFields,
			})
		}
		// Observation set but the manager has no subscriber image: no events.
		cases = append(cases, vllmCase{
			name: s.name + ", modelID without a subscriber image", backend: lmcacheVLLM(observed),
			pod: newEnginePod(s.c()), outcome: inject.Injected, transfer: lmcacheTransfer(""), hashAlgo: "sha256",
		})
		// Data parallel: tcp:// endpoints, one port per rank.
		for _, dp := range []struct {
			flags []string
			n     int
		}{{[]string{"--data-parallel-size", "2"}, 2}, {[]string{"-dp", "4"}, 4}, {[]string{"--data-parallel-size=3"}, 3}, {[]string{"--data_parallel_size", "2"}, 2}} {
			cases = append(cases, vllmCase{
				name: fmt.Sprintf("%s, %s, KV events", s.name, strings.Join(dp.flags, " ")), backend: lmcacheVLLM(observed), opts: observeOptions(),
				pod: newEnginePod(s.c(dp.flags...)), outcome: inject.Injected, transfer: lmcacheTransfer(""), events: tcpEvents(dp.n),
				hashAlgo: inject.HashAlgoSHA256CBOR, fields: map[string]any{"data_parallel_size": float64(dp.n)},
			})
		}
	}

	plain := shapes[0].c
	cases = append(cases,
		vllmCase{
			name: "data parallel without KV events", backend: lmcacheVLLM(), pod: newEnginePod(plain("-dp", "2")),
			outcome: inject.Injected, transfer: lmcacheTransfer(""), hashAlgo: "sha256", fields: map[string]any{"data_parallel_size": 2.0},
		},
		vllmCase{
			name: "underscore spellings of the user's flags", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--max_model_len=2048", "--gpu_memory_utilization", "0.5", "--block_size", "32")),
			outcome: inject.Injected, transfer: lmcacheTransfer(""), events: ipcEvents(), hashAlgo: inject.HashAlgoSHA256CBOR,
			fields: map[string]any{"max_model_len": 2048.0, "gpu_memory_utilization": 0.5, "block_size": 32.0},
		},
		vllmCase{
			name: "the user's own --kv-transfer-config equal to the webhook's is kept once", backend: lmcacheVLLM(withRole(v1alpha1.RoleReadOnly)),
			pod:     newEnginePod(plain("--kv-transfer-config", `{ "kv_role": "kv_consumer", "kv_connector": "LMCacheConnectorV1" }`)),
			outcome: inject.Injected, transfer: lmcacheTransfer(v1alpha1.RoleReadOnly), hashAlgo: "sha256",
		},
		vllmCase{
			name: "the user's own --kv-transfer-config of another connector is kept, the pod unwired", backend: lmcacheVLLM(),
			pod:     newEnginePod(plain("--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`)),
			outcome: inject.Skipped, reason: v1alpha1.SkippedUserConfig,
			transfer: map[string]string{"kv_connector": "NixlConnector", "kv_role": "kv_both"}, hashAlgo: "sha256",
		},
		vllmCase{
			name: "the user's own --kv_transfer_config= (underscores, inline) of another role is kept, the pod unwired", backend: lmcacheVLLM(),
			pod:     newEnginePod(plain(`--kv_transfer_config={"kv_connector":"LMCacheConnectorV1","kv_role":"kv_producer"}`)),
			outcome: inject.Skipped, reason: v1alpha1.SkippedUserConfig, transfer: lmcacheTransfer(v1alpha1.RoleWriteOnly), hashAlgo: "sha256",
		},
		vllmCase{
			name: "the user's own --kv-events-config is kept, no sidecar", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","topic":"mine"}`)),
			outcome: inject.Injected, kvEventsSkipped: v1alpha1.KVEventsUserConfig, transfer: lmcacheTransfer(""),
			events: &wantEvents{endpoint: "tcp://*:6000", topic: "mine", dp: 1}, hashAlgo: "sha256",
		},
		vllmCase{
			name: "prefix caching off: vLLM publishes no block events, so no stream and no sidecar", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--no-enable-prefix-caching")),
			outcome: inject.Injected, kvEventsSkipped: v1alpha1.KVEventsPrefixCachingOff, transfer: lmcacheTransfer(""), hashAlgo: "sha256",
			fields: map[string]any{"enable_prefix_caching": false},
		},
		vllmCase{
			name: "prefix caching off, abbreviated: still off for vLLM, still no sidecar", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--no-enable-prefix")),
			outcome: inject.Injected, kvEventsSkipped: v1alpha1.KVEventsPrefixCachingOff, transfer: lmcacheTransfer(""), hashAlgo: "sha256",
			fields: map[string]any{"enable_prefix_caching": false},
		},
		vllmCase{
			name: "the user's own hash algorithm is kept and told to the sidecar", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--prefix-caching-hash-algo=xxhash")),
			outcome: inject.Injected, transfer: lmcacheTransfer(""), events: ipcEvents(), hashAlgo: "xxhash",
		},
		// vLLM's parser (argparse, allow_abbrev left on) takes any unique
		// prefix of a long flag for the flag.
		vllmCase{
			name: "the user's own abbreviated --kv-transfer-conf of another connector is kept, the pod unwired", backend: lmcacheVLLM(),
			pod:     newEnginePod(plain("--kv-transfer-conf", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`)),
			outcome: inject.Skipped, reason: v1alpha1.SkippedUserConfig,
			transfer: map[string]string{"kv_connector": "NixlConnector", "kv_role": "kv_both"}, hashAlgo: "sha256",
		},
		vllmCase{
			name: "the user's own abbreviated --kv_transfer= of another role is kept, the pod unwired", backend: lmcacheVLLM(),
			pod:     newEnginePod(plain(`--kv_transfer={"kv_connector":"LMCacheConnectorV1","kv_role":"kv_consumer"}`)),
			outcome: inject.Skipped, reason: v1alpha1.SkippedUserConfig, transfer: lmcacheTransfer(v1alpha1.RoleReadOnly), hashAlgo: "sha256",
		},
		vllmCase{
			name: "the user's own abbreviated --kv-events-conf is kept, no sidecar", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--kv-events-conf", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:6000","topic":"mine"}`)),
			outcome: inject.Injected, kvEventsSkipped: v1alpha1.KVEventsUserConfig, transfer: lmcacheTransfer(""),
			events: &wantEvents{endpoint: "tcp://*:6000", topic: "mine", dp: 1}, hashAlgo: "sha256",
		},
		vllmCase{
			name: "the user's own abbreviated hash algorithm is kept and told to the sidecar", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--prefix-caching-hash", "xxhash_cbor")),
			outcome: inject.Injected, transfer: lmcacheTransfer(""), events: ipcEvents(), hashAlgo: "xxhash_cbor",
		},
		vllmCase{
			name: "the user's own hash algorithm without KV events is kept", backend: lmcacheVLLM(),
			pod:     newEnginePod(plain("--prefix-caching-hash-algo", "sha256_cbor")),
			outcome: inject.Injected, transfer: lmcacheTransfer(""), hashAlgo: "sha256_cbor",
		},
		vllmCase{
			name: "engineOverrides args are appended", backend: lmcacheVLLM(observed, func(cb *v1alpha1.CacheBackend) {
				cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Args: []string{"--block-size", "16", "--enable-prefix-caching"}}
			}), opts: observeOptions(),
			pod:     newEnginePod(plain("--max-model-len", "4096")),
			outcome: inject.Injected, transfer: lmcacheTransfer(""), events: ipcEvents(), hashAlgo: inject.HashAlgoSHA256CBOR,
			fields: map[string]any{"block_size": 16.0, "max_model_len": 4096.0, "enable_prefix_caching": true},
		},
		vllmCase{
			name: "host network: cache wired, no KV events", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain(), func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
			outcome: inject.Injected, kvEventsSkipped: v1alpha1.KVEventsHostNetwork, transfer: lmcacheTransfer(""), hashAlgo: "sha256",
		},
		vllmCase{
			name: "multi-node data parallel: cache wired, no KV events", backend: lmcacheVLLM(observed), opts: observeOptions(),
			pod:     newEnginePod(plain("--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "2")),
			outcome: inject.Injected, kvEventsSkipped: v1alpha1.KVEventsDataParallel, transfer: lmcacheTransfer(""), hashAlgo: "sha256",
			fields: map[string]any{"data_parallel_size": 4.0, "data_parallel_size_local": 2.0, "data_parallel_start_rank": 2.0},
		},
	)

	// Shell-wrapped command lines: the webhook cannot extend the inner
	// command line, so the pod must be left unwired (and say so); had it
	// been wired, the engine would have to see the wiring.
	for _, sh := range []corev1.Container{
		{Command: []string{"sh", "-c", "exec vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"/bin/bash", "-o", "pipefail", "-c", "vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"sh", "-c"}, Args: []string{"vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"sh", "-ec", `exec vllm serve "$0" --max-model-len 4096`, model}},
		{Command: []string{"env", "-u", "TERM", "sh", "-c", "exec vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"nohup", "sh", "-c", "exec vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"setsid", "bash", "-c", "exec vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"timeout", "--signal=TERM", "1h", "sh", "-c", "exec vllm serve " + model + " --max-model-len 4096"}},
		{Command: []string{"stdbuf", "-oL", "sh", "-c", "exec vllm serve " + model + " --max-model-len 4096"}},
	} {
		for _, obs := range []bool{false, true} {
			cb, opts := lmcacheVLLM(), inject.Options{}
			if obs {
				cb, opts = lmcacheVLLM(observed), observeOptions()
			}
			cases = append(cases, vllmCase{
				name: fmt.Sprintf("shell-wrapped %q (KV events %v)", append(sh.Command, sh.Args...), obs), backend: cb, opts: opts, pod: newEnginePod(sh),
				outcome: inject.Skipped, reason: v1alpha1.SkippedShellWrapper, hashAlgo: "sha256", fields: map[string]any{"max_model_len": 4096.0},
			})
		}
	}
	return cases
}

type vllmResult struct {
	Name                string         `json:"name"`
	Error               string         `json:"error"`
	Warnings            []string       `json:"warnings"`
	KVTransferConfig    map[string]any `json:"kv_transfer_config"`
	KVEventsConfig      map[string]any `json:"kv_events_config"`
	ConnectorRegistered *bool          `json:"connector_registered"`
	ConnectorClass      string         `json:"connector_class"`
	MPServerURL         string         `json:"mp_server_url"`
	MPExtraConfig       map[string]any `json:"mp_extra_config"`
	MPExtraConfigNames  []string       `json:"mp_extra_config_names"`
	HashAlgo            string         `json:"hash_algo"`
	// ExtensibleKVCache is vLLM's own extensible-KV-cache decision for the
	// command line on a CUDA machine (true, false or "error: ..."), nil
	// for a vLLM without it (before 0.34).
	ExtensibleKVCache any            `json:"extensible_kv_cache"`
	DataParallelSize  int            `json:"data_parallel_size"`
	Ranks             []vllmRank     `json:"ranks"`
	Fields            map[string]any `json:"fields"`
}

// argvCase is one command line given to an engine's own parser
// (py/vllm_args.py, py/sglang_args.py).
type argvCase struct {
	Name string   `json:"name"`
	Argv []string `json:"argv"`
}

type vllmRank struct {
	Endpoint string `json:"endpoint"`
	Replay   string `json:"replay_endpoint"`
	Binds    bool   `json:"binds"`
	Error    string `json:"error"`
}

// TestVLLMParsesEveryCommandLine feeds every vLLM command line the webhook
// produces (each shape of container, role, KV events on and off, ipc:// and
// data-parallel tcp://, the hash-algorithm flag, the user's own flags, shell
// wrappers) to vLLM's own serve parser and EngineArgs, in one Python process.
//
// It runs against every supported vLLM (pyenv.Cells): the in-process and
// KV-event wiring does not depend on the release.
func TestVLLMParsesEveryCommandLine(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "vllm") {
		t.Run(cell.Env, func(t *testing.T) { testEveryCommandLine(t, cell) })
	}
}

func testEveryCommandLine(t *testing.T, cell pyenv.Cell) {
	cases := vllmCases()
	var req struct {
		Cases      []argvCase `json:"cases"`
		Fields     []string   `json:"fields"`
		Models     []string   `json:"models"`
		Connectors []string   `json:"connectors"`
	}
	req.Models, req.Connectors = []string{model}, []string{inject.LMCacheConnector}
	fieldSet := map[string]bool{"model": true}
	decisions := make([]inject.Decision, len(cases))
	procs := make([]Process, len(cases))
	for i, tc := range cases {
		d, c := admit(t, tc.backend, tc.pod, tc.opts)
		decisions[i] = d
		procs[i] = startContainer(t, c, vllmEntrypoint, vllmStubs...)
		req.Cases = append(req.Cases, argvCase{Name: tc.name, Argv: procs[i].Argv})
		for f := range tc.fields {
			fieldSet[f] = true
		}
	}
	for f := range fieldSet {
		req.Fields = append(req.Fields, f)
	}
	var resp struct {
		VLLM             string            `json:"vllm"`
		Results          []vllmResult      `json:"results"`
		ConnectorClasses map[string]string `json:"connector_classes"`
	}
	pyenv.RunJSON(t, cell.Env, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "vllm_args.py"), req, &resp)
	require.Len(t, resp.Results, len(cases))
	require.Equal(t, cell.VLLM(), resp.VLLM, "the environment runs the cell's vLLM")
	t.Logf("vLLM %s parsed %d command lines", resp.VLLM, len(cases))

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, p, res := decisions[i], procs[i], resp.Results[i]
			t.Logf("engine argv: %q", p.Argv)
			require.Equal(t, tc.outcome, d.Outcome, "webhook: %s", d.Message)
			assert.Equal(t, tc.reason, d.Reason)
			assert.Equal(t, tc.kvEventsSkipped, d.Pod.Annotations[v1alpha1.AnnotationKVEventsSkipped])
			require.Empty(t, res.Error, "vLLM's parser refused the engine's command line")
			for _, w := range res.Warnings {
				assert.NotContains(t, strings.ToLower(w), "duplicate", "vLLM read a flag twice")
			}

			if tc.transfer == nil {
				assert.Nil(t, res.KVTransferConfig, "the engine reads a kv_transfer_config")
			} else {
				require.NotNil(t, res.KVTransferConfig, "the engine reads no kv_transfer_config")
				for k, v := range tc.transfer {
					assert.Equal(t, v, res.KVTransferConfig[k], "kv_transfer_config.%s", k)
				}
				require.NotNil(t, res.ConnectorRegistered)
				assert.True(t, *res.ConnectorRegistered, "connector %v is not in vLLM's KVConnectorFactory", res.KVTransferConfig["kv_connector"])
				if tc.transfer["kv_connector"] == inject.LMCacheConnector {
					assert.Equal(t, "vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector.LMCacheConnectorV1", resp.ConnectorClasses[inject.LMCacheConnector])
				}
			}
			assert.Equal(t, tc.hashAlgo, res.HashAlgo, "prefix_caching_hash_algo")
			assert.Equal(t, model, res.Fields["model"], "the model")
			for f, v := range tc.fields {
				assert.Equal(t, v, res.Fields[f], "the user's own %s", f)
			}
			side := sidecarEnv(d.Pod)
			if tc.events == nil {
				assert.Nil(t, res.KVEventsConfig, "the engine reads a kv_events_config")
				assert.Nil(t, side, "a kvevent-subscriber without an event stream")
				return
			}
			checkEvents(t, *tc.events, res, side)
		})
	}
}

func checkEvents(t *testing.T, want wantEvents, res vllmResult, side map[string]string) {
	t.Helper()
	cfg := res.KVEventsConfig
	require.NotNil(t, cfg, "the engine reads no kv_events_config")
	assert.Equal(t, true, cfg["enable_kv_cache_events"])
	assert.Equal(t, "zmq", cfg["publisher"])
	assert.Equal(t, want.endpoint, cfg["endpoint"])
	if want.replay != "" {
		assert.Equal(t, want.replay, cfg["replay_endpoint"])
	}
	assert.Equal(t, want.topic, cfg["topic"])
	assert.Equal(t, want.dp, res.DataParallelSize)
	require.Len(t, res.Ranks, want.dp)
	if !want.sidecar {
		assert.Nil(t, side, "a kvevent-subscriber on the user's own event stream")
		return
	}
	require.NotNil(t, side, "no kvevent-subscriber")
	assert.Equal(t, want.topic, side["KV_EVENTS_TOPIC"])
	assert.Equal(t, strconv.Itoa(want.dp), side["KV_EVENTS_DP_SIZE"])
	assert.Equal(t, res.HashAlgo, side["KV_EVENTS_HASH_ALGORITHM"], "the sidecar is told another hash algorithm than the engine uses")
	// Every rank's sockets, as vLLM's ZmqEventPublisher offsets them, are
	// the ones the subscriber follows (cmd/kvevent-subscriber offsets the
	// port by the rank), and vLLM binds both.
	for r, rank := range res.Ranks {
		require.Empty(t, rank.Error, "rank %d", r)
		assert.True(t, rank.Binds, "rank %d: vLLM connects its PUB socket to %s instead of binding it", r, rank.Endpoint)
		assert.Equal(t, subscriberRank(t, side["KV_EVENTS_ENDPOINT"], r), local(rank.Endpoint), "rank %d PUB", r)
		assert.Equal(t, subscriberRank(t, side["KV_EVENTS_REPLAY_ENDPOINT"], r), rank.Replay, "rank %d replay", r)
	}
}

// subscriberRank is rank r's endpoint as the kvevent-subscriber computes it.
func subscriberRank(t *testing.T, ep string, r int) string {
	t.Helper()
	if r == 0 {
		return ep
	}
	i := strings.LastIndex(ep, ":")
	port, err := strconv.Atoi(ep[i+1:])
	require.NoError(t, err, "endpoint %q", ep)
	return ep[:i+1] + strconv.Itoa(port+r)
}

// local is the address a container of the pod connects to for a socket
// vLLM binds on every interface.
func local(ep string) string {
	return strings.Replace(ep, "tcp://*:", "tcp://127.0.0.1:", 1)
}
