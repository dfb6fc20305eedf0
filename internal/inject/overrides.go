package inject

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// The engineOverrides guard. spec.integration.engineOverrides puts env and
// arguments into the engine container of every pod the CacheBackend's
// selector matches, pods that other people in the namespace may have
// written and that run under their ServiceAccounts. The author of a
// CacheBackend must not be able to run code in them through it, nor hand
// them Secrets they did not ask for. So:
//
//   - engineOverrides.args and .env hold only the allow-list below
//     (AllowedFlags, AllowedEnvNames): settings the engines and LMCache
//     document as configuration, none of which loads code, reads a file
//     named by its value or points the engine at another server; a value
//     comes literally, from a fieldRef or resourceFieldRef, or from a
//     Secret;
//   - anything else goes under engineOverrides.optIn, and a CacheBackend
//     with an optIn (or, stored before the allow-list, unlisted entries)
//     wires only the pods annotated AnnotationAllowOverrides="true": the
//     workload's own author consents, per workload;
//   - env names that make a dynamic loader, a shell or a language runtime
//     load code (DeniedEnvNames, and any LD_* name) are rejected by the
//     validating webhook and never injected, optIn or not;
//   - an env value from a Secret (valueFrom.secretKeyRef) is injected only
//     into pods that opt in with AnnotationAllowSecretOverrides="true".
//
// Pods that do not opt in are admitted unwired, with the reason
// v1alpha1.SkippedOverrideNotAllowed.

// AnnotationAllowOverrides opts a pod in to engineOverrides.optIn: set on a
// workload's pod template, it says that the workload's author lets the
// CacheBackends that match it put settings outside the allow-list into its
// engine.
const AnnotationAllowOverrides = "inferencecache.io/allow-overrides"

// Arity is how many values an allowed flag takes, as the engine's argument
// parser reads it.
type Arity uint8

// Arities.
const (
	// NoValue: a switch (argparse store_true, or a BooleanOptionalAction
	// spelling).
	NoValue Arity = iota
	// OneValue: the next argument, or --flag=value.
	OneValue
	// OneOrMore: every following argument up to the next flag (nargs "+").
	OneOrMore
)

// AllowedFlag is one flag engineOverrides.args may set.
type AllowedFlag struct {
	Name  string
	Arity Arity
}

// allowedFlags are the engine flags engineOverrides.args may set, per
// runtime: sizes, parallelism, dtypes, scheduling and logging. None names a
// file, a module, a class, a plugin, a template, a URL or remote code
// (--trust-remote-code, --tokenizer, --hf-overrides, --chat-template,
// --worker-extension-cls, --tool-parser-plugin, ... are not here).
// test/conformance checks each against the engine's own parser.
var allowedFlags = map[v1alpha1.Runtime][]AllowedFlag{
	v1alpha1.RuntimeVLLM: {
		{"--block-size", OneValue},
		{"--enable-prefix-caching", NoValue},
		{"--enable-chunked-prefill", NoValue},
		{"--max-model-len", OneValue},
		{"--max-num-seqs", OneValue},
		{"--max-num-batched-tokens", OneValue},
		{"--gpu-memory-utilization", OneValue},
		{"--tensor-parallel-size", OneValue},
		{"--pipeline-parallel-size", OneValue},
		{"--data-parallel-size", OneValue},
		{"--dtype", OneValue},
		{"--kv-cache-dtype", OneValue},
		{"--seed", OneValue},
		{"--served-model-name", OneOrMore},
		{"--enforce-eager", NoValue},
		{"--max-logprobs", OneValue},
		{"--cpu-offload-gb", OneValue},
		{"--disable-log-stats", NoValue},
		{"--enable-log-requests", NoValue},
		{"--uvicorn-log-level", OneValue},
	},
	v1alpha1.RuntimeSGLang: {
		{"--mem-fraction-static", OneValue},
		{"--max-running-requests", OneValue},
		{"--max-total-tokens", OneValue},
		{"--chunked-prefill-size", OneValue},
		{"--context-length", OneValue},
		{"--tp-size", OneValue},
		{"--dp-size", OneValue},
		{"--dtype", OneValue},
		{"--kv-cache-dtype", OneValue},
		{"--random-seed", OneValue},
		{"--served-model-name", OneValue},
		{"--schedule-policy", OneValue},
		{"--log-level", OneValue},
		{"--enable-metrics", NoValue},
		{"--hicache-host-memory-mode", OneValue},
		{"--hicache-storage-prefetch-retry-max-attempts", OneValue},
	},
}

// allowedEnv are the env names engineOverrides.env may set: settings each
// engine (vLLM's vllm/envs.py, SGLang's sglang/srt/environ.py) and LMCache
// (its config, read from LMCACHE_<FIELD>) and the Hugging Face Hub client
// define, that are numbers, sizes, switches, log levels or the Hub token. Not here: anything naming a file, a URL, a host,
// a plugin, a class or a script (VLLM_LOGGING_CONFIG_PATH, VLLM_PLUGINS,
// LMCACHE_CONFIG_FILE, LMCACHE_CONTROLLER_URL, LMCACHE_LOOKUP_URL,
// LMCACHE_EXTERNAL_LOOKUP_CLIENT, ...), and the generic ones (HOME,
// PYTHONHASHSEED, PYTHONWARNINGS, BROWSER, GIT_SSH_COMMAND, ...).
// test/conformance checks each against the engines' own code.
var allowedEnv = map[string][]string{
	envVLLM: {
		"VLLM_LOGGING_LEVEL", "VLLM_LOGGING_PREFIX", "VLLM_LOGGING_COLOR", "VLLM_LOG_STATS_INTERVAL",
		"VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE",
		"VLLM_ALLOW_LONG_MAX_MODEL_LEN", "VLLM_CPU_KVCACHE_SPACE", "VLLM_KV_CACHE_LAYOUT",
		"VLLM_WORKER_MULTIPROC_METHOD", "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_DISABLE_LOG_LOGO",
	},
	envSGLang: {
		"SGLANG_TIMEOUT_KEEP_ALIVE", "SGLANG_WARMUP_TIMEOUT", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
		"SGLANG_LOG_GC", "SGLANG_LOG_MS", "SGLANG_LOG_FORWARD_ITERS", "SGLANG_ENABLE_TORCH_INFERENCE_MODE",
		"SGLANG_CACHE_HIT_RATE_WINDOW_SECONDS",
	},
	envHF: {"HF_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"},
	envLMCache: {
		"LMCACHE_CHUNK_SIZE", "LMCACHE_LOCAL_CPU", "LMCACHE_MAX_LOCAL_CPU_SIZE", "LMCACHE_MAX_LOCAL_DISK_SIZE",
		"LMCACHE_LOCAL_CPU_USE_HUGEPAGES", "LMCACHE_RESERVE_LOCAL_CPU_SIZE", "LMCACHE_SAVE_DECODE_CACHE",
		"LMCACHE_SAVE_UNFULL_CHUNK", "LMCACHE_USE_LAYERWISE", "LMCACHE_CACHE_POLICY", "LMCACHE_MIN_RETRIEVE_TOKENS",
		"LMCACHE_BLOCKING_TIMEOUT_SECS", "LMCACHE_ENABLE_ASYNC_LOADING", "LMCACHE_NUMA_MODE",
		"LMCACHE_PRIORITY_LIMIT", "LMCACHE_LOOKUP_TIMEOUT_MS", "LMCACHE_PY_ENABLE_GC", "LMCACHE_REMOTE_SERDE",
	},
}

// The owners of the env allow-list's names.
const (
	envVLLM    = "vLLM"
	envSGLang  = "SGLang"
	envLMCache = "LMCache"
	// envHF: the Hugging Face Hub client both engines download models
	// with (huggingface_hub/constants.py).
	envHF = "huggingface_hub"
)

// AllowedFlags are the flags engineOverrides.args may set for runtime rt.
func AllowedFlags(rt v1alpha1.Runtime) []AllowedFlag {
	return slices.Clone(allowedFlags[runtimeOrDefault(rt)])
}

// AllowedEnvNames are the env names engineOverrides.env may set for a
// backend of type t and runtime rt, by their owner (vLLM, SGLang, LMCache).
func AllowedEnvNames(rt v1alpha1.Runtime, t v1alpha1.BackendType) map[string][]string {
	out := map[string][]string{envHF: slices.Clone(allowedEnv[envHF])}
	switch runtimeOrDefault(rt) {
	case v1alpha1.RuntimeVLLM:
		out[envVLLM] = slices.Clone(allowedEnv[envVLLM])
	case v1alpha1.RuntimeSGLang:
		out[envSGLang] = slices.Clone(allowedEnv[envSGLang])
	}
	if t == v1alpha1.BackendTypeLMCache || t == "" {
		out[envLMCache] = slices.Clone(allowedEnv[envLMCache])
	}
	return out
}

// runtimeOrDefault is the CRD's default runtime for an empty one.
func runtimeOrDefault(rt v1alpha1.Runtime) v1alpha1.Runtime {
	if rt == "" {
		return v1alpha1.RuntimeVLLM
	}
	return rt
}

// optInHint says how to pass a setting outside the allow-list.
func optInHint(list string) string {
	return fmt.Sprintf("move it to spec.integration.engineOverrides.optIn.%s: it then reaches only the pods whose template is annotated %s: \"true\" (see docs/security.md)", list, AnnotationAllowOverrides)
}

// EnvNotAllowed reports why engineOverrides.env may not hold e (a name
// outside the allow-list of cb's runtime and type, or a value from a
// ConfigMap or file), or "". The deny-list (EnvNameDenied) is separate: it
// applies to optIn too.
func EnvNotAllowed(rt v1alpha1.Runtime, t v1alpha1.BackendType, e corev1.EnvVar) string {
	listed := false
	for _, names := range AllowedEnvNames(rt, t) {
		listed = listed || slices.Contains(names, e.Name)
	}
	if !listed {
		return fmt.Sprintf("%s is not on the allow-list of engineOverrides.env for %s %s (engine and LMCache settings that load no code and name no file or server); %s",
			e.Name, t, runtimeOrDefault(rt), optInHint("env"))
	}
	if v := e.ValueFrom; v != nil && (v.ConfigMapKeyRef != nil || v.FileKeyRef != nil) {
		return fmt.Sprintf("%s reads its value from a ConfigMap or a file, which the pods' authors did not choose; %s", e.Name, optInHint("env"))
	}
	return ""
}

// ArgRefusal is an argument of engineOverrides.args outside the allow-list.
type ArgRefusal struct {
	Index   int
	Message string
}

// ArgsNotAllowed returns the arguments of args (engineOverrides.args of a
// backend of runtime rt) that the allow-list does not admit: each must be
// an allowed flag, spelled in full, followed by as many values as it takes
// (or one as --flag=value).
func ArgsNotAllowed(rt v1alpha1.Runtime, args []string) []ArgRefusal {
	allowed := allowedFlags[runtimeOrDefault(rt)]
	var out []ArgRefusal
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !looksLikeFlag(a) {
			out = append(out, ArgRefusal{i, fmt.Sprintf("%q is not a flag: engineOverrides.args holds flags of the allow-list, each followed by its value; %s", a, optInHint("args"))})
			continue
		}
		name, _, inline := strings.Cut(a, "=")
		at := slices.IndexFunc(allowed, func(f AllowedFlag) bool { return f.Name == name })
		if at < 0 {
			out = append(out, ArgRefusal{i, fmt.Sprintf("%s is not on the allow-list of engineOverrides.args for %s (flags that load no code and name no file, module or server; spelled in full); %s",
				name, runtimeOrDefault(rt), optInHint("args"))})
			for !inline && i+1 < len(args) && !looksLikeFlag(args[i+1]) {
				i++ // its values: one refusal per flag
			}
			continue
		}
		switch allowed[at].Arity {
		case NoValue:
			if inline {
				out = append(out, ArgRefusal{i, name + " takes no value"})
			}
		case OneValue, OneOrMore:
			if inline {
				continue
			}
			n := 0
			for i+1 < len(args) && !looksLikeFlag(args[i+1]) && (n == 0 || allowed[at].Arity == OneOrMore) {
				i, n = i+1, n+1
			}
			if n == 0 {
				out = append(out, ArgRefusal{i, name + " needs a value (the next argument, or " + name + "=value)"})
			}
		}
	}
	return out
}

// looksLikeFlag is argparse's reading of an argument as an option: it
// starts with "-" and is not a negative number.
func looksLikeFlag(a string) bool {
	if !strings.HasPrefix(a, "-") || a == "-" {
		return false
	}
	_, err := strconv.ParseFloat(a, 64)
	return err != nil
}

// OutsideAllowList reports why cb's engineOverrides.args or .env hold
// something outside the allow-list (possible for a CacheBackend stored
// before the validating webhook enforced it), or "".
func OutsideAllowList(cb *v1alpha1.CacheBackend) string {
	o := cb.Spec.Integration.EngineOverrides
	if o == nil {
		return ""
	}
	if r := ArgsNotAllowed(cb.Spec.Runtime, o.Args); len(r) > 0 {
		return fmt.Sprintf("engineOverrides.args[%d] %q is outside the allow-list", r[0].Index, o.Args[r[0].Index])
	}
	for i, e := range o.Env {
		if EnvNotAllowed(cb.Spec.Runtime, cb.Spec.Type, e) != "" {
			return fmt.Sprintf("engineOverrides.env[%d] %s is outside the allow-list", i, e.Name)
		}
	}
	for i, a := range o.Args {
		if ExpandsVariable(a) {
			return fmt.Sprintf("engineOverrides.args[%d] references a variable of the container's environment", i)
		}
	}
	for i, e := range o.Env {
		if ExpandsVariable(e.Value) {
			return fmt.Sprintf("engineOverrides.env[%d] %s references a variable of the container's environment", i, e.Name)
		}
	}
	return ""
}

// ExpandsVariable reports whether the kubelet may expand a variable
// reference in v, an argument or env value of a container: v holds a "$("
// not escaped as "$$(". The kubelet replaces $(NAME) with NAME's value in
// the container's environment (a Secret-backed HF_TOKEN of the engine's
// owner, for one) and "$$" with "$"; a value without an unescaped "$("
// comes out of it with no variable's value in it.
func ExpandsVariable(v string) bool {
	for i := 0; i+1 < len(v); i++ {
		if v[i] != '$' {
			continue
		}
		switch v[i+1] {
		case '$':
			i++ // an escaped "$"
		case '(':
			return true
		}
	}
	return false
}

// ExpandsVariableMessage is why a value with an unescaped "$(" is refused.
const ExpandsVariableMessage = "the kubelet would replace $(NAME) with the value of NAME in the container's environment (another team's Secret-backed variable, for one); " +
	"write $$( for a literal $("

// NeedsOptIn reports why cb wires only the pods annotated
// AnnotationAllowOverrides="true" (it has an optIn, or unlisted entries),
// or "".
func NeedsOptIn(cb *v1alpha1.CacheBackend) string {
	o := cb.Spec.Integration.EngineOverrides
	if o == nil {
		return ""
	}
	if o.OptIn != nil && (len(o.OptIn.Args) > 0 || len(o.OptIn.Env) > 0) {
		return "its engineOverrides.optIn holds settings outside the allow-list"
	}
	return OutsideAllowList(cb)
}

// overrideEnv is every env var of cb's engineOverrides, optIn included, in
// the order they are injected.
func overrideEnv(o *v1alpha1.EngineOverrides) []corev1.EnvVar {
	if o.OptIn == nil {
		return o.Env
	}
	return append(slices.Clone(o.Env), o.OptIn.Env...)
}

// OverrideArgs is every argument of engineOverrides, optIn included, in the
// order they are appended.
func OverrideArgs(o *v1alpha1.EngineOverrides) []string {
	if o == nil {
		return nil
	}
	if o.OptIn == nil {
		return slices.Clone(o.Args)
	}
	return append(slices.Clone(o.Args), o.OptIn.Args...)
}

// AnnotationAllowSecretOverrides opts a pod in to engineOverrides env
// values read from Secrets.
const AnnotationAllowSecretOverrides = "inferencecache.io/allow-secret-overrides"

// DeniedEnvNames are environment variables engineOverrides may never set:
// each makes a loader, shell or runtime load code or change what it loads.
var DeniedEnvNames = []string{
	"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", // and every other LD_*
	"BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PATH",
	"NODE_OPTIONS", "NODE_PATH",
	"PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONEXECUTABLE",
	"PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB",
	"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
	"GLIBC_TUNABLES", "GCONV_PATH", "MALLOC_CONF", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
	"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
	"VLLM_PLUGINS", "HF_ENDPOINT", "TRANSFORMERS_TRUST_REMOTE_CODE",
}

// EnvNameDenied reports why engineOverrides may not set env var name, or "".
func EnvNameDenied(name string) string {
	if strings.HasPrefix(name, "LD_") {
		return "LD_* variables change what the dynamic loader loads"
	}
	for _, d := range DeniedEnvNames {
		if name == d {
			return name + " makes a loader, shell, runtime or client load code or trust other servers"
		}
	}
	return ""
}

// ReadsSecret reports whether an override env var takes its value from a Secret.
func ReadsSecret(e corev1.EnvVar) bool {
	return e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
}
