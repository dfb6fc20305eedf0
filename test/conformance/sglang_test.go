package conformance_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// SGLang's side of the conformance suite: every HiCache setting the CRD
// admits, with KV events on and off and the ways a container starts
// SGLang, goes through the webhook (inject.Decide), the engine process's
// argv is read the way the kubelet starts the container, and SGLang 0.5.23's
// own server-argument parser (prepare_server_args, then the resolution
// `python -m sglang.launch_server` runs before it starts anything) reads
// it. What SGLang does with each command line is then held to the
// validating webhook's rules (internal/validation/hicache.go): a
// combination SGLang refuses is refused at admission, one it rewrites
// gets an admission warning naming each rewritten field, and nothing else
// does.

// sglangStubs are the programs that start SGLang.
var sglangStubs = []string{"python3", "python", "sglang"}

// sglangSubscriberBlockSize is cmd/kvevent-subscriber's --block-size when
// the webhook gives it no KV_EVENTS_BLOCK_SIZE.
const sglangSubscriberBlockSize = "16"

// sglangShapes are the ways an engine container starts SGLang, with the
// model path and the user's own flags.
var sglangShapes = []struct {
	name string
	c    func(model string, user ...string) corev1.Container
}{
	{"launch_server module", func(m string, u ...string) corev1.Container {
		return corev1.Container{Command: []string{"python3", "-m", "sglang.launch_server"}, Args: append([]string{"--model-path", m}, u...)}
	}},
	{"sglang serve", func(m string, u ...string) corev1.Container {
		return corev1.Container{Command: []string{"sglang", "serve", "--model-path", m}, Args: u}
	}},
	{"env wrapper", func(m string, u ...string) corev1.Container {
		return corev1.Container{Command: []string{"env", "SGLANG_LOGGING_LEVEL=info", "python3", "-m", "sglang.launch_server", "--model-path=" + m}, Args: u}
	}},
	{"absolute path, all in command", func(m string, u ...string) corev1.Container {
		return corev1.Container{Command: append([]string{"/usr/bin/python3", "-m", "sglang.launch_server", "--model-path", m}, u...)}
	}},
}

// sglangUser are a user's own flags, kept by the webhook (--device cpu:
// this machine has no GPU), and the fields SGLang must read from them.
var (
	sglangUser       = []string{"--device", "cpu", "--host", "0.0.0.0", "--port", "30000", "--mem-fraction-static=0.8"}
	sglangUserFields = map[string]any{"device": "cpu", "host": "0.0.0.0", "port": 30000.0, "mem_fraction_static": 0.8}
)

type sglangCase struct {
	name    string
	backend v1alpha1.CacheBackend
	// c is the engine container for a model path.
	c       func(model string) corev1.Container
	opts    inject.Options
	outcome inject.Outcome
	reason  string
	// refusal is part of SGLang's error for a command line it refuses (the
	// webhook must refuse the backend).
	refusal string
	// fields are ServerArgs fields SGLang must read (the user's own flags).
	fields map[string]any
}

func sglangBackend(h *v1alpha1.HiCache, mut ...func(*v1alpha1.CacheBackend)) v1alpha1.CacheBackend {
	return newBackend(v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache,
		append([]func(*v1alpha1.CacheBackend){func(cb *v1alpha1.CacheBackend) { cb.Spec.HiCache = h }}, mut...)...)
}

func sglangObserved(cb *v1alpha1.CacheBackend) {
	cb.Spec.Observation = &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"}
}

func sglangOverrides(args ...string) func(*v1alpha1.CacheBackend) {
	return func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{OptIn: &v1alpha1.OptInOverrides{Args: args}}
	}
}

// The values the CRD admits for each spec.hiCache field ("" is unset),
// read from its enums (api/v1alpha1); TestSGLangCasesCoverTheCRD holds
// them to the generated CRD.
var (
	sglangWritePolicies = []string{"", "write_back", "write_through", "write_through_selective"}
	sglangIOBackends    = []string{"", "direct", "kernel"}
	sglangMemLayouts    = []string{"", "layer_first", "page_first", "page_first_direct"}
	sglangStorages      = []string{"", "file", "mooncake", "hf3fs", "nixl", "aibrix", "eic", "dynamic"}
	sglangPrefetches    = []string{"", "best_effort", "wait_complete", "timeout"}
	sglangRatios        = []string{"2", "1.5", "10.25", "1.01"}
	sglangSizes         = []int32{1, 64, 65536}
	sglangPageSizes     = []int32{0, 1, 16, 64, 4096}
)

func sglangCases(t *testing.T) []sglangCase {
	var cases []sglangCase
	add := func(name string, cb v1alpha1.CacheBackend, shape int, user []string) {
		s := sglangShapes[shape%len(sglangShapes)]
		tc := sglangCase{name: name + " (" + s.name + ")", backend: cb, outcome: inject.Injected, fields: sglangUserFields,
			c: func(m string) corev1.Container { return s.c(m, user...) }}
		if cb.Spec.Observation != nil {
			tc.opts = observeOptions()
		}
		cases = append(cases, tc)
	}
	// Every I/O backend x memory layout x storage backend (the settings
	// SGLang's HiCache resolution weighs together), each with the next
	// write policy, prefetch policy, pool size and page size in turn, KV
	// events on every other one.
	i := 0
	for _, io := range sglangIOBackends {
		for _, layout := range sglangMemLayouts {
			for _, storage := range sglangStorages {
				h := &v1alpha1.HiCache{
					WritePolicy: v1alpha1.HiCacheWritePolicy(sglangWritePolicies[i%len(sglangWritePolicies)]),
					IOBackend:   v1alpha1.HiCacheIOBackend(io), MemLayout: v1alpha1.HiCacheMemLayout(layout),
					StorageBackend: v1alpha1.HiCacheStorageBackend(storage),
				}
				if storage != "" {
					h.StoragePrefetchPolicy = v1alpha1.HiCachePrefetchPolicy(sglangPrefetches[i%len(sglangPrefetches)])
				}
				switch i % 3 {
				case 0:
					h.Ratio = ptr.To(sglangRatios[i/3%len(sglangRatios)])
				case 1:
					h.SizeGB = ptr.To(sglangSizes[i/3%len(sglangSizes)])
				}
				if p := sglangPageSizes[i%len(sglangPageSizes)]; p > 0 {
					h.PageSize = ptr.To(p)
				}
				var mut []func(*v1alpha1.CacheBackend)
				if i%2 == 1 {
					mut = append(mut, sglangObserved)
				}
				name := fmt.Sprintf("io=%s layout=%s storage=%s write=%s prefetch=%s", unset(io), unset(layout), unset(storage), unset(string(h.WritePolicy)), unset(string(h.StoragePrefetchPolicy)))
				add(name, sglangBackend(h, mut...), i, sglangUser)
				i++
			}
		}
	}
	// No hiCache at all, and an empty one: --enable-hierarchical-cache only.
	add("no hiCache", sglangBackend(nil), 0, sglangUser)
	add("empty hiCache, KV events", sglangBackend(&v1alpha1.HiCache{}, sglangObserved), 1, sglangUser)
	add("pageSize, KV events", sglangBackend(&v1alpha1.HiCache{PageSize: ptr.To[int32](32)}, sglangObserved), 2, sglangUser)
	// KV events with data-parallel ranks (tcp:// endpoints).
	add("KV events, dp-size 2", sglangBackend(&v1alpha1.HiCache{PageSize: ptr.To[int32](16)}, sglangObserved), 0,
		append([]string{"--dp-size", "2"}, sglangUser...))
	// The port the sidecar names the worker by (its router-facing URL):
	// the user's own, abbreviated as SGLang's parser allows, and SGLang's
	// default when the command line sets none.
	add("KV events, the user's own port", sglangBackend(&v1alpha1.HiCache{PageSize: ptr.To[int32](16)}, sglangObserved), 1,
		[]string{"--device", "cpu", "--host", "0.0.0.0", "--por", "31000"})
	cases[len(cases)-1].fields = map[string]any{"device": "cpu", "host": "0.0.0.0", "port": 31000.0}
	add("KV events, SGLang's default port", sglangBackend(&v1alpha1.HiCache{PageSize: ptr.To[int32](16)}, sglangObserved), 2,
		[]string{"--device", "cpu"})
	cases[len(cases)-1].fields = map[string]any{"device": "cpu"}
	// engineOverrides.args SGLang's HiCache handling reads.
	for _, o := range []struct {
		name    string
		h       *v1alpha1.HiCache
		args    []string
		refusal string
	}{
		{"buffer_only host memory with storage", &v1alpha1.HiCache{StorageBackend: "file"}, []string{"--hicache-host-memory-mode", "buffer_only"}, ""},
		{"buffer_only host memory, write_back", &v1alpha1.HiCache{StorageBackend: "file", WritePolicy: "write_back"}, []string{"--hicache-host-memory-mode=buffer_only"}, ""},
		{"buffer_only host memory, abbreviated", &v1alpha1.HiCache{StorageBackend: "mooncake", WritePolicy: "write_back", MemLayout: "layer_first"}, []string{"--hicache-host-memory-m", "buffer_only"}, ""},
		{"cache host memory", &v1alpha1.HiCache{WritePolicy: "write_back"}, []string{"--hicache-host-memory-mode", "cache"}, ""},
		{"buffer_only host memory without storage", &v1alpha1.HiCache{}, []string{"--hicache-host-memory-mode", "buffer_only"}, "requires a storage backend"},
		{"unknown host memory mode", &v1alpha1.HiCache{}, []string{"--hicache-host-memory-mode", "buffer"}, "invalid choice"},
		{"disable-radix-cache", &v1alpha1.HiCache{}, []string{"--disable-radix-cache"}, "mutually exclusive"},
		{"disable-radix-cache abbreviated", nil, []string{"--disable-radix"}, "mutually exclusive"},
		{"enable-lmcache", &v1alpha1.HiCache{}, []string{"--enable-lmcache"}, "mutually exclusive"},
		{"unified cache external linker", &v1alpha1.HiCache{}, []string{"--enable-unified-cache-external-linker"}, "mutually exclusive"},
		{"dynamic storage with its class", &v1alpha1.HiCache{StorageBackend: "dynamic"},
			[]string{validation.FlagStorageExtraConfig, `{"backend_name":"mine","module_path":"my.storage","class_name":"MyStorage"}`}, ""},
		{"other flags", &v1alpha1.HiCache{IOBackend: "direct"}, []string{"--hicache-storage-prefetch-retry-max-attempts", "4", "--schedule-policy", "lpm"}, ""},
	} {
		add("engineOverrides: "+o.name, sglangBackend(o.h, sglangOverrides(o.args...)), len(cases), sglangUser)
		cases[len(cases)-1].refusal = o.refusal
	}
	// The example (examples/sglang-hicache): its CacheBackend and its
	// engine's container, with the local model config and the CPU device.
	example := sglangExample(t)
	cases = append(cases, sglangCase{name: "examples/sglang-hicache", backend: example.backend, outcome: inject.Injected, c: example.c,
		fields: map[string]any{"host": "0.0.0.0", "port": 30000.0}})
	// A shell-wrapped command line is left unwired (the webhook cannot
	// extend it): SGLang runs it as written, without HiCache.
	cases = append(cases, sglangCase{
		name: "shell-wrapped command", backend: sglangBackend(&v1alpha1.HiCache{IOBackend: "direct"}, sglangObserved), opts: observeOptions(),
		c: func(m string) corev1.Container {
			return corev1.Container{Command: []string{"sh", "-c", "exec python3 -m sglang.launch_server --model-path " + m + " " + strings.Join(sglangUser, " ")}}
		},
		outcome: inject.Skipped, reason: v1alpha1.SkippedShellWrapper, fields: sglangUserFields,
	})
	return cases
}

type sglangExampleCase struct {
	backend v1alpha1.CacheBackend
	c       func(model string) corev1.Container
}

// sglangExample reads examples/sglang-hicache: the CacheBackend, and the
// engine Deployment's container with its --model-path replaced by model
// and --device cpu added (no hub access, no GPU here).
func sglangExample(t *testing.T) sglangExampleCase {
	t.Helper()
	dir := filepath.Join(pyenv.Root(t), "examples", "sglang-hicache")
	var cb v1alpha1.CacheBackend
	b, err := os.ReadFile(filepath.Join(dir, "cachebackend.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.UnmarshalStrict(b, &cb))
	var dep appsv1.Deployment
	b, err = os.ReadFile(filepath.Join(dir, "engine.yaml"))
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &dep))
	require.Len(t, dep.Spec.Template.Spec.Containers, 1)
	// The case pods carry the case label; the example's selector is its own.
	cb.Namespace, cb.UID, cb.Generation = caseNamespace, "uid-example", 1
	cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": caseLabel}
	c := dep.Spec.Template.Spec.Containers[0]
	return sglangExampleCase{backend: cb, c: func(model string) corev1.Container {
		c := *c.DeepCopy()
		i := slices.Index(c.Args, "--model-path")
		require.GreaterOrEqual(t, i, 0, "the example's engine sets no --model-path")
		c.Args[i+1] = model
		c.Args = append(c.Args, "--device", "cpu")
		return c
	}}
}

func unset(s string) string {
	if s == "" {
		return "unset"
	}
	return s
}

// sglangResult is one command line as SGLang read it (py/sglang_args.py).
type sglangResult struct {
	Name     string         `json:"name"`
	Accepted bool           `json:"accepted"`
	Stage    string         `json:"stage"`
	Error    string         `json:"error"`
	Raw      map[string]any `json:"raw"`
	Resolved map[string]any `json:"resolved"`
	Logs     []struct {
		Level, Logger, Message string
	} `json:"logs"`
	StorageError string `json:"storage_error"`
	KVEvents     *struct {
		Config      map[string]any `json:"config"`
		IgnoredKeys []string       `json:"ignored_keys"`
	} `json:"kv_events"`
}

// sglangModel writes a small Llama config.json (no weights: SGLang's
// argument resolution reads only the config) and returns its folder.
func sglangModel(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "llama")
	require.NoError(t, os.Mkdir(dir, 0o755))
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
		"num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
		"torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
	}
	b, err := json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644))
	return dir
}

// TestSGLangServerArgs feeds every SGLang command line the webhook
// produces to SGLang's own parser twice: with the model path `dummy`
// (SGLang stops before its model-dependent resolution) and with a real
// model config on the CPU device (the whole resolution, its HiCache
// handling included). Every command line of a backend the validating
// webhook admits is accepted; each one SGLang refuses is refused at
// admission; each setting SGLang rewrites is named by an admission
// warning, and the warnings predict exactly what SGLang runs with.
func TestSGLangServerArgs(t *testing.T) {
	modelDir := sglangModel(t)
	cases := sglangCases(t)
	var req struct {
		Cases  []argvCase `json:"cases"`
		Fields []string   `json:"fields"`
	}
	for f := range sglangUserFields {
		req.Fields = append(req.Fields, f)
	}
	variants := []string{"dummy", modelDir}
	decisions := make([][]inject.Decision, len(cases))
	procs := make([][]Process, len(cases))
	for i, tc := range cases {
		for _, m := range variants {
			d, c := admit(t, tc.backend, newEnginePod(tc.c(m)), tc.opts)
			p := startContainer(t, c, nil, sglangStubs...)
			decisions[i] = append(decisions[i], d)
			procs[i] = append(procs[i], p)
			req.Cases = append(req.Cases, argvCase{Name: tc.name, Argv: p.Argv})
		}
	}
	var resp struct {
		SGLang string         `json:"sglang"`
		Cases  []sglangResult `json:"cases"`
	}
	pyenv.RunJSON(t, pyenv.SGLang, filepath.Join(pyenv.Root(t), "test", "conformance", "py", "sglang_args.py"), req, &resp)
	require.Len(t, resp.Cases, len(req.Cases))
	t.Logf("SGLang %s read %d command lines", resp.SGLang, len(req.Cases))

	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cb := tc.backend
			errs := validation.Validate(&cb)
			warnings := validation.HiCacheWarnings(&cb)
			dummy, full := resp.Cases[2*i], resp.Cases[2*i+1]
			d := decisions[i][1]
			t.Logf("engine argv: %q", procs[i][1].Argv)
			require.Equal(t, tc.outcome, d.Outcome, "webhook: %s", d.Message)
			assert.Equal(t, tc.reason, d.Reason)
			for _, w := range warnings {
				t.Logf("admission warning: %s", w)
			}

			if tc.refusal != "" || len(errs) > 0 {
				// Refused at admission exactly when SGLang refuses it.
				assert.NotEmpty(t, errs, "SGLang refuses this command line (%s: %s) but the validating webhook admits the backend", full.Stage, full.Error)
				assert.False(t, full.Accepted, "the validating webhook refuses the backend (%v) but SGLang accepts it", errs)
				assert.Contains(t, full.Error, tc.refusal, "SGLang refuses it for another reason")
				for _, e := range errs {
					assert.True(t, strings.HasPrefix(e.Field, "spec."), "error %v names no spec field", e)
				}
				return
			}
			require.True(t, dummy.Accepted, "SGLang's parser refuses the command line with model path dummy (%s): %s", dummy.Stage, dummy.Error)
			require.True(t, full.Accepted, "SGLang refuses the command line (%s): %s", full.Stage, full.Error)
			for f, v := range tc.fields {
				assert.Equal(t, v, full.Resolved[f], "the user's own %s", f)
			}
			if tc.outcome != inject.Injected {
				assert.Equal(t, false, full.Raw["enable_hierarchical_cache"])
				return
			}
			assert.Equal(t, true, full.Resolved["enable_hierarchical_cache"])

			// What the command line asks for is the backend's intent
			// (SGLang's default for an unset field)...
			intent := validation.HiCacheIntent(&cb)
			for _, r := range []sglangResult{dummy, full} {
				assert.Equal(t, intent, sglangSettings(r.Raw), "the command line does not ask SGLang for the spec's settings")
			}
			h := cb.Spec.HiCache
			if h == nil {
				h = &v1alpha1.HiCache{}
			}
			// ... and SGLang runs exactly what the rules predict.
			want, rewrites := validation.ResolveHiCache(intent)
			got := sglangSettings(full.Resolved)
			assert.Equal(t, want, got, "SGLang runs other HiCache settings than the validating webhook predicts")
			// The dynamic storage backend without its class: SGLang's
			// parser accepts it, its storage factory fails at start.
			var rewriteWarnings []string
			dynamicWarned := false
			for _, w := range warnings {
				if strings.HasPrefix(w, "spec.hiCache.storageBackend: dynamic ") {
					dynamicWarned = true
				} else {
					rewriteWarnings = append(rewriteWarnings, w)
				}
			}
			assert.Equal(t, full.StorageError != "", dynamicWarned, "SGLang's storage factory fails (%q) exactly when the webhook warns", full.StorageError)
			if full.StorageError != "" {
				assert.Contains(t, full.StorageError, "Unknown storage backend 'dynamic'")
			}
			rewritten := got != intent
			assert.Equal(t, rewritten, len(rewriteWarnings) > 0, "SGLang rewrites a setting exactly when the webhook warns (warnings %q)", warnings)
			assert.Len(t, rewriteWarnings, len(rewrites))
			for _, r := range rewrites {
				assert.True(t, containsPrefix(warnings, r.Field.String()+": "), "no warning names %s", r.Field)
				assert.True(t, loggedBy(full, "hicache_hook"), "SGLang rewrote %s without its own log line", r.Flag)
			}
			for _, f := range sglangChangedFields(intent, got) {
				assert.True(t, containsPrefix(warnings, "spec.hiCache."+f+": "), "SGLang rewrites %s and no warning names spec.hiCache.%s", f, f)
			}
			// The pool size and page size are SGLang's as given.
			if h.Ratio != nil {
				r, err := strconv.ParseFloat(*h.Ratio, 64)
				require.NoError(t, err)
				assert.Equal(t, r, full.Resolved["hicache_ratio"])
			}
			if h.SizeGB != nil {
				assert.Equal(t, float64(*h.SizeGB), full.Resolved["hicache_size"])
			}
			if h.PageSize != nil {
				assert.Equal(t, float64(*h.PageSize), full.Resolved["page_size"])
			}
			sglangCheckEvents(t, d, procs[i][1], full)
		})
	}
}

// sglangCheckEvents checks the KV-event wiring of an admitted SGLang pod
// against what SGLang reads: the --kv-events-config the webhook set is the
// publisher configuration SGLang's KVEventsConfig reads, with no key it
// ignores, and the subscriber hashes blocks of the page size SGLang runs.
func sglangCheckEvents(t *testing.T, d inject.Decision, p Process, res sglangResult) {
	t.Helper()
	side := sidecarEnv(d.Pod)
	uses := inject.FlagUses(p.Argv, inject.KVEventsConfigFlag, true)
	if d.Backend.Spec.Observation == nil {
		assert.Nil(t, res.KVEvents, "SGLang publishes KV events")
		assert.Nil(t, side)
		return
	}
	require.Len(t, uses, 1, "the engine gets no %s", inject.KVEventsConfigFlag)
	require.NotNil(t, res.KVEvents, "SGLang reads no kv_events_config")
	require.NotNil(t, side, "no kvevent-subscriber")
	var set map[string]any
	require.NoError(t, json.Unmarshal([]byte(uses[0].Value), &set))
	assert.Empty(t, res.KVEvents.IgnoredKeys, "SGLang ignores keys of the --kv-events-config the webhook sets")
	for k, v := range set {
		assert.Equal(t, v, res.KVEvents.Config[k], "kv_events_config.%s", k)
	}
	assert.Equal(t, "zmq", res.KVEvents.Config["publisher"])
	assert.Equal(t, side["KV_EVENTS_ENDPOINT"], strings.Replace(fmt.Sprint(res.KVEvents.Config["endpoint"]), "tcp://*:", "tcp://127.0.0.1:", 1), "the subscriber follows another PUB socket than SGLang's")
	assert.Equal(t, side["KV_EVENTS_REPLAY_ENDPOINT"], res.KVEvents.Config["replay_endpoint"])
	assert.Equal(t, side["KV_EVENTS_TOPIC"], res.KVEvents.Config["topic"])
	assert.Equal(t, "sglang", side["KV_EVENTS_ENGINE"])
	block, ok := side["KV_EVENTS_BLOCK_SIZE"]
	if !ok {
		block = sglangSubscriberBlockSize
	}
	assert.Equal(t, fmt.Sprint(res.Resolved["page_size"]), block, "the subscriber hashes blocks of %s tokens, SGLang pages of %v", block, res.Resolved["page_size"])
	// The index names the worker to SGLang's router by the pod's IP and
	// this port: it must be the one SGLang serves on.
	assert.Equal(t, fmt.Sprint(res.Resolved["port"]), side["WORKER_PORT"], "the sidecar names the worker by port %s, SGLang serves on %v", side["WORKER_PORT"], res.Resolved["port"])
}

// sglangSettings reads the HiCache settings of a parsed command line.
func sglangSettings(f map[string]any) validation.HiCacheSettings {
	s := func(k string) string {
		if v, ok := f[k].(string); ok {
			return v
		}
		return ""
	}
	return validation.HiCacheSettings{
		WritePolicy: s("hicache_write_policy"), IOBackend: s("hicache_io_backend"), MemLayout: s("hicache_mem_layout"),
		StorageBackend: s("hicache_storage_backend"), PrefetchPolicy: s("hicache_storage_prefetch_policy"),
		HostMemoryMode: s("hicache_host_memory_mode"),
	}
}

// sglangChangedFields names the spec.hiCache fields whose setting differs
// between a and b.
func sglangChangedFields(a, b validation.HiCacheSettings) []string {
	var out []string
	for _, f := range []struct {
		name string
		x, y string
	}{
		{"writePolicy", a.WritePolicy, b.WritePolicy}, {"ioBackend", a.IOBackend, b.IOBackend},
		{"memLayout", a.MemLayout, b.MemLayout}, {"storageBackend", a.StorageBackend, b.StorageBackend},
		{"storagePrefetchPolicy", a.PrefetchPolicy, b.PrefetchPolicy}, {"hostMemoryMode", a.HostMemoryMode, b.HostMemoryMode},
	} {
		if f.x != f.y {
			out = append(out, f.name)
		}
	}
	return out
}

func containsPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

func loggedBy(r sglangResult, logger string) bool {
	for _, l := range r.Logs {
		if strings.HasSuffix(l.Logger, logger) {
			return true
		}
	}
	return false
}

// TestSGLangCasesCoverTheCRD holds the values the SGLang cases run to the
// CRD's enums for spec.hiCache (kustomize/base/crd), so that a value the
// CRD starts to admit is run through SGLang's parser too.
func TestSGLangCasesCoverTheCRD(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(pyenv.Root(t), "kustomize", "base", "crd", "inferencecache.io_cachebackends.yaml"))
	require.NoError(t, err)
	var crd apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.Unmarshal(b, &crd))
	require.Len(t, crd.Spec.Versions, 1)
	hc := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties["hiCache"]
	require.NotEmpty(t, hc.Properties, "no spec.hiCache in the CRD")
	enum := func(name string) []string {
		var out []string
		for _, v := range hc.Properties[name].Enum {
			var s string
			require.NoError(t, json.Unmarshal(v.Raw, &s))
			out = append(out, s)
		}
		return out
	}
	set := func(vs []string) []string { return vs[1:] } // without "" (unset)
	assert.ElementsMatch(t, enum("writePolicy"), set(sglangWritePolicies))
	assert.ElementsMatch(t, enum("ioBackend"), set(sglangIOBackends))
	assert.ElementsMatch(t, enum("memLayout"), set(sglangMemLayouts))
	assert.ElementsMatch(t, enum("storageBackend"), set(sglangStorages))
	assert.ElementsMatch(t, enum("storagePrefetchPolicy"), set(sglangPrefetches))
	// Every field of spec.hiCache is set by some case.
	var fields []string
	for f := range hc.Properties {
		fields = append(fields, f)
	}
	assert.ElementsMatch(t, []string{"ratio", "sizeGB", "writePolicy", "ioBackend", "memLayout", "storageBackend", "storagePrefetchPolicy", "pageSize"}, fields,
		"spec.hiCache has fields the SGLang cases do not set")
	ps := hc.Properties["pageSize"]
	assert.Equal(t, float64(sglangPageSizes[len(sglangPageSizes)-1]), *ps.Maximum, "the largest page size the CRD admits")
	assert.Equal(t, float64(sglangSizes[len(sglangSizes)-1]), *hc.Properties["sizeGB"].Maximum, "the largest sizeGB the CRD admits")
}
