package validation

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
)

// SGLang's HiCache rules, as SGLang 0.5.23 applies them when it resolves
// its server arguments (sglang/srt/arg_groups/hicache_hook.py and
// kv_cache_hook.py, run by `python -m sglang.launch_server` before it
// starts anything). The CRD's enums admit every value SGLang's parser
// accepts for each flag on its own; some combinations SGLang then
// rewrites with nothing but a log line, and some it refuses. The webhook
// warns about the first (the engine runs with another value than the spec
// says) and refuses the second (the engine would never start). The
// conformance suite (test/conformance, TestSGLangServerArgs) runs every
// combination the CRD admits through SGLang's own parser and holds these
// rules to what it does.

// SGLang's defaults for the HiCache flags a spec leaves unset
// (sglang/srt/arg_groups/fields/memory.py): the webhook adds no flag for an
// unset field, so the engine runs with these.
const (
	SGLangWritePolicy    = "write_through"
	SGLangIOBackend      = "kernel"
	SGLangMemLayout      = "page_first"
	SGLangPrefetchPolicy = "timeout"
	SGLangHostMemoryMode = "cache"
)

// Flags of SGLang the HiCache rules read from engineOverrides.args (the
// CRD has no field for them).
const (
	flagHostMemoryMode = "--hicache-host-memory-mode"
	// FlagStorageExtraConfig configures the storage backend; the dynamic
	// backend reads the class to load from it.
	FlagStorageExtraConfig = "--hicache-storage-backend-extra-config"
	hostMemoryBufferOnly   = "buffer_only"
)

// hiCacheExclusiveWhy is SGLang's reason for refusing flag, one of
// inject.HiCacheExclusiveFlags, together with --enable-hierarchical-cache.
func hiCacheExclusiveWhy(flag string) string {
	why := "SGLang refuses it with --enable-hierarchical-cache, which the webhook always sets (\"mutually exclusive\")"
	if flag == "--disable-radix-cache" {
		why += ": HiCache is a tier of the radix cache"
	}
	return why
}

// HiCacheSettings are the HiCache settings of an SGLang engine, as the
// values of its flags. StorageBackend is empty for none.
type HiCacheSettings struct {
	WritePolicy, IOBackend, MemLayout, StorageBackend, PrefetchPolicy, HostMemoryMode string
}

// HiCacheRewrite is a setting SGLang replaces while it resolves its
// arguments: the engine runs Flag with To, not From.
type HiCacheRewrite struct {
	// Field is the spec field that asked for From (or left it to SGLang's
	// default).
	Field *field.Path
	Flag  string
	From  string
	To    string
	// Why is SGLang's reason.
	Why string
}

// HiCacheIntent is what cb asks SGLang for: each spec.hiCache field, or
// SGLang's default where the spec leaves it unset (the webhook then adds
// no flag), and --hicache-host-memory-mode from engineOverrides.args.
func HiCacheIntent(cb *v1alpha1.CacheBackend) HiCacheSettings {
	s := HiCacheSettings{
		WritePolicy: SGLangWritePolicy, IOBackend: SGLangIOBackend, MemLayout: SGLangMemLayout,
		PrefetchPolicy: SGLangPrefetchPolicy, HostMemoryMode: SGLangHostMemoryMode,
	}
	if h := cb.Spec.HiCache; h != nil {
		or := func(dst *string, v string) {
			if v != "" {
				*dst = v
			}
		}
		or(&s.WritePolicy, string(h.WritePolicy))
		or(&s.IOBackend, string(h.IOBackend))
		or(&s.MemLayout, string(h.MemLayout))
		or(&s.StorageBackend, string(h.StorageBackend))
		or(&s.PrefetchPolicy, string(h.StoragePrefetchPolicy))
	}
	if _, v, ok := overrideFlag(cb, flagHostMemoryMode); ok {
		s.HostMemoryMode = v
	}
	return s
}

// ResolveHiCache returns the settings SGLang runs with for the settings s,
// and each rewrite on the way, in SGLang's order
// (validate_hicache_host_memory_mode, resolve_layout_io_compatibility,
// resolve_storage_layout_compatibility in hicache_hook.py).
func ResolveHiCache(s HiCacheSettings) (HiCacheSettings, []HiCacheRewrite) {
	hc := field.NewPath("spec", "hiCache")
	var rw []HiCacheRewrite
	set := func(dst *string, path *field.Path, flag, to, why string) {
		rw = append(rw, HiCacheRewrite{Field: path, Flag: flag, From: *dst, To: to, Why: why})
		*dst = to
	}
	if s.HostMemoryMode == hostMemoryBufferOnly && s.WritePolicy == "write_back" {
		set(&s.WritePolicy, hc.Child("writePolicy"), "--hicache-write-policy", "write_through",
			"with --hicache-host-memory-mode buffer_only host memory is only a staging buffer, so there is no host tier to write back to")
	}
	switch {
	case s.MemLayout == "page_first_direct" && s.IOBackend == "kernel":
		set(&s.IOBackend, hc.Child("ioBackend"), "--hicache-io-backend", "direct",
			"its kernel I/O backend does not support memLayout page_first_direct")
	case s.MemLayout == "page_first" && s.IOBackend == "direct":
		set(&s.MemLayout, hc.Child("memLayout"), "--hicache-mem-layout", "page_first_direct",
			"its direct I/O backend does not support memLayout page_first")
	}
	if s.StorageBackend == "mooncake" && s.MemLayout == "layer_first" {
		to := "page_first"
		if s.IOBackend == "direct" {
			to = "page_first_direct"
		}
		set(&s.MemLayout, hc.Child("memLayout"), "--hicache-mem-layout", to,
			fmt.Sprintf("its mooncake storage backend does not support memLayout layer_first (it takes %s with ioBackend %s)", to, s.IOBackend))
	}
	return s, rw
}

// HiCacheWarnings are the admission warnings of cb: one per setting SGLang
// will run with another value than the spec asks for.
func HiCacheWarnings(cb *v1alpha1.CacheBackend) []string {
	if cb.Spec.Type != v1alpha1.BackendTypeSGLangHiCache || len(validateHiCache(cb)) > 0 {
		return nil
	}
	_, rw := ResolveHiCache(HiCacheIntent(cb))
	var out []string
	for _, r := range rw {
		from := r.From
		if !specSets(cb, r.Field) {
			from += " (SGLang's default, the field being unset)"
		}
		out = append(out, fmt.Sprintf("%s: SGLang runs %s %s, not %s: %s; set %s: %s to say what runs",
			r.Field, r.Flag, r.To, from, r.Why, r.Field, r.To))
	}
	if w := dynamicStorageWarning(cb); w != "" {
		out = append(out, w)
	}
	return out
}

// dynamicStorageWarning warns about storageBackend dynamic without
// --hicache-storage-backend-extra-config in engineOverrides: SGLang's
// parser accepts it, and its storage factory then fails when the engine
// starts, unless the pod's own command line names the class to load
// (which the validating webhook does not see).
func dynamicStorageWarning(cb *v1alpha1.CacheBackend) string {
	if cb.Spec.HiCache == nil || cb.Spec.HiCache.StorageBackend != "dynamic" {
		return ""
	}
	if _, _, ok := overrideFlag(cb, FlagStorageExtraConfig); ok {
		return ""
	}
	return fmt.Sprintf("spec.hiCache.storageBackend: dynamic loads the class that %s names (backend_name, module_path, class_name); "+
		"unless the engine's command line sets it, SGLang fails at start with \"Unknown storage backend 'dynamic'\": "+
		"add it to spec.integration.engineOverrides.optIn.args (it names code to load, so only pods that opt in receive it)", FlagStorageExtraConfig)
}

// specSets reports whether cb's spec sets the spec.hiCache field path.
func specSets(cb *v1alpha1.CacheBackend, path *field.Path) bool {
	h := cb.Spec.HiCache
	if h == nil {
		return false
	}
	switch path.String() {
	case "spec.hiCache.writePolicy":
		return h.WritePolicy != ""
	case "spec.hiCache.ioBackend":
		return h.IOBackend != ""
	case "spec.hiCache.memLayout":
		return h.MemLayout != ""
	}
	return false
}

// validateHiCache returns the combinations of an SGLangHiCache backend
// that SGLang refuses to start with.
func validateHiCache(cb *v1alpha1.CacheBackend) field.ErrorList {
	if cb.Spec.Type != v1alpha1.BackendTypeSGLangHiCache || cb.Spec.Integration.EngineOverrides == nil {
		return nil
	}
	var errs field.ErrorList
	for i, a := range inject.OverrideArgs(cb.Spec.Integration.EngineOverrides) {
		key, _, _ := strings.Cut(a, "=")
		for _, f := range inject.HiCacheExclusiveFlags {
			if inject.SpellsFlag(key, f, true) {
				errs = append(errs, field.Forbidden(overrideArgPath(cb, i), fmt.Sprintf("%s is %s: %s", key, f, hiCacheExclusiveWhy(f))))
			}
		}
	}
	if i, v, ok := overrideFlag(cb, flagHostMemoryMode); ok {
		switch {
		case v != SGLangHostMemoryMode && v != hostMemoryBufferOnly:
			errs = append(errs, field.NotSupported(overrideArgPath(cb, i), v, []string{SGLangHostMemoryMode, hostMemoryBufferOnly}))
		case v == hostMemoryBufferOnly && (cb.Spec.HiCache == nil || cb.Spec.HiCache.StorageBackend == ""):
			errs = append(errs, field.Forbidden(overrideArgPath(cb, i),
				"SGLang refuses --hicache-host-memory-mode buffer_only without a storage backend (host memory is then only a staging buffer): set spec.hiCache.storageBackend"))
		}
	}
	return errs
}

// overrideArgPath is the field path of argument i of
// inject.OverrideArgs: engineOverrides.args, then optIn.args.
func overrideArgPath(cb *v1alpha1.CacheBackend, i int) *field.Path {
	over := field.NewPath("spec", "integration", "engineOverrides")
	if n := len(cb.Spec.Integration.EngineOverrides.Args); i >= n {
		return over.Child("optIn", "args").Index(i - n)
	}
	return over.Child("args").Index(i)
}

// overrideFlag finds the last use of SGLang flag name (in any spelling
// SGLang's parser reads) in cb's engineOverrides (args, then optIn.args):
// the index in inject.OverrideArgs of the argument that holds its value,
// and the value.
func overrideFlag(cb *v1alpha1.CacheBackend, name string) (int, string, bool) {
	o := cb.Spec.Integration.EngineOverrides
	if o == nil {
		return 0, "", false
	}
	args := inject.OverrideArgs(o)
	at := -1
	for i, a := range args {
		if a == "--" {
			break
		}
		key, _, _ := strings.Cut(a, "=")
		if inject.SpellsFlag(key, name, true) {
			at = i
		}
	}
	if at < 0 {
		return 0, "", false
	}
	uses := inject.FlagUses(args[at:], name, true)
	if len(uses) == 0 {
		return 0, "", false
	}
	return at, uses[0].Value, true
}
