package inject

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/engineversion"
	"github.com/inferencecache/operator/internal/topology"
)

// Releases are the vLLM and LMCache releases the webhook wires a pod for,
// read as package engineversion documents: the pod's annotations, the
// engine container's image tag, the CacheBackend's
// spec.integration.versions.
type Releases struct {
	VLLM, LMCache engineversion.Detected
	// Problems are the declarations that could not be read (the release
	// is then unknown), for the decision's message.
	Problems []string
}

// ReleasesOf reads the releases pod's engine container c runs.
func ReleasesOf(pod *corev1.Pod, c *corev1.Container, cb *v1alpha1.CacheBackend) Releases {
	var r Releases
	declared := cb.Spec.Integration.Versions
	if declared == nil {
		declared = &v1alpha1.EngineVersions{}
	}
	image := engineversion.ParseImage(c.Image)
	read := func(p engineversion.Project, annotation, decl string) engineversion.Detected {
		d, err := engineversion.DetectIn(p, pod.Annotations[annotation], image, decl)
		if err != nil {
			where := annotation
			if d.Source == engineversion.FromBackend {
				where = "spec.integration.versions." + string(p)
			}
			r.Problems = append(r.Problems, fmt.Sprintf("%s: %v", where, err))
			return engineversion.Detected{Source: engineversion.Unknown}
		}
		return d
	}
	r.VLLM = read(engineversion.VLLM, v1alpha1.AnnotationVLLMVersion, declared.VLLM)
	r.LMCache = read(engineversion.LMCache, v1alpha1.AnnotationLMCacheVersion, declared.LMCache)
	return r
}

// String is the receipt's record (AnnotationWiredFor):
// "vllm=0.34.0 (image); lmcache=unknown".
func (r Releases) String() string {
	return "vllm=" + r.VLLM.String() + "; lmcache=" + r.LMCache.String()
}

// VLLMReleaseUnknown reports whether a receipt's record (the value of
// AnnotationWiredFor, Releases.String) says the webhook could not tell
// the pod's vLLM release.
func VLLMReleaseUnknown(wiredFor string) bool {
	return strings.HasPrefix(wiredFor, "vllm="+engineversion.Detected{}.String()+";")
}

// Release thresholds the wiring follows, each from the engines' own code.
var (
	// ExtensibleKVCacheSince: vLLM 0.34 maps the KV cache with the CUDA
	// driver's virtual-memory API by default on CUDA and ROCm
	// (VllmConfig._resolve_extensible_kv_cache), unless the connector
	// declares legacy CUDA IPC; vLLM assumes that for LMCacheMPConnector
	// only when kv_connector_module_path is unset
	// (kv_connector/factory.py), and LMCache (0.5.6, 0.5.7rc2) declares
	// nothing. LMCache's isolated IPC cannot export that memory.
	ExtensibleKVCacheSince = engineversion.MustParse("0.34.0")
	// InProcessAdapterRemovedSince: LMCache 0.5.7 moved the in-process
	// adapter vLLM's LMCacheConnectorV1 imports
	// (lmcache.integration.vllm.vllm_v1_adapter) and removed the lm://
	// connector and lmcache_server.
	InProcessAdapterRemovedSince = engineversion.MustParse("0.5.7")
)

// Flags of vLLM's extensible KV cache (vLLM 0.34; earlier releases refuse
// them as unrecognized arguments).
const (
	ExtensibleKVCacheOptOut = "--no-enable-extensible-kv-cache"
	extensibleKVCacheOn     = "--enable-extensible-kv-cache"
	extensibleKVCacheOff    = "--disable-extensible-kv-cache"
)

// mpWiring is how an engine of release r is wired to the MP server: with
// kv_connector_module_path (an engine without a working lmcache then fails
// at start instead of running vLLM's built-in copy) and, on vLLM 0.34 and
// later, the extensible KV cache turned off. For a vLLM release the webhook
// cannot tell, neither: every supported release parses that command line,
// vLLM 0.34 then treats LMCacheMPConnector as legacy CUDA IPC (its
// extensible cache off), and vLLM 0.33 loads LMCache's class when lmcache
// imports.
func mpWiring(r Releases) (modulePath, optOut bool) {
	if !r.VLLM.Known {
		return false, false
	}
	return true, r.VLLM.Version.AtLeast(ExtensibleKVCacheSince)
}

// setsExtensibleKVCache returns the spelling of vLLM's extensible KV cache
// flag cmdline sets last ("" when none): the engine's own choice.
func setsExtensibleKVCache(cmdline []string) string {
	last := ""
	for _, a := range cmdline {
		if a == "--" {
			break
		}
		key, _, _ := strings.Cut(a, "=")
		for _, f := range []string{extensibleKVCacheOn, ExtensibleKVCacheOptOut, extensibleKVCacheOff} {
			if SpellsFlag(key, f, true) {
				last = f
			}
		}
	}
	return last
}

// inProcessRefused returns why an engine of release r cannot use the
// in-process connector, or "".
func inProcessRefused(r Releases) string {
	if !r.LMCache.Known || !r.LMCache.Version.AtLeast(InProcessAdapterRemovedSince) {
		return ""
	}
	return fmt.Sprintf("the engine runs LMCache %s, which has no in-process adapter (vLLM's %s imports lmcache.integration.vllm.vllm_v1_adapter, removed in LMCache 0.5.7) and no lm:// connector: "+
		"wired, the engine would fail at start; wire it to a CacheBackend in multiprocess mode (spec.multiprocess)", r.LMCache, LMCacheConnector)
}

// note is what the decision's message says about the releases: the
// declarations it could not read, and an unknown vLLM release in
// multiprocess mode (wired as every supported release accepts).
func (r Releases) note(cb *v1alpha1.CacheBackend) string {
	var notes []string
	notes = append(notes, r.Problems...)
	if topology.Of(cb) == topology.Multiprocess && !r.VLLM.Known {
		notes = append(notes, fmt.Sprintf("the engine's vLLM release is unknown: wired without kv_connector_module_path, as every supported vLLM accepts "+
			"(declare it with the pod annotation %s or spec.integration.versions.vllm)", v1alpha1.AnnotationVLLMVersion))
	}
	return strings.Join(notes, "; ")
}
