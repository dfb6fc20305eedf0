package inject

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/topology"
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
// tcp://) and port: what the webhook ensures on the engine container of a
// pod whose CacheBackend sets spec.multiprocess (DesiredFor), for an engine
// whose vLLM release the webhook knows.
//
// It names kv_connector_module_path; MPKVTransferConfigFor leaves it out
// for an engine whose vLLM release the webhook cannot tell (mpWiring).
func MPKVTransferConfig(host string, port int32, role v1alpha1.IntegrationRole) string {
	return MPKVTransferConfigFor(host, port, role, true)
}

// MPKVTransferConfigFor is MPKVTransferConfig, with the module path only
// when modulePath is set.
func MPKVTransferConfigFor(host string, port int32, role v1alpha1.IntegrationRole, modulePath bool) string {
	path := ""
	if modulePath {
		path = LMCacheMPConnectorModulePath
	}
	b, _ := json.Marshal(struct {
		Connector  string         `json:"kv_connector"`
		ModulePath string         `json:"kv_connector_module_path,omitempty"`
		Role       string         `json:"kv_role"`
		Extra      map[string]any `json:"kv_connector_extra_config"`
	}{LMCacheMPConnector, path, KVRole(role), map[string]any{
		"lmcache.mp.host": "tcp://" + host,
		"lmcache.mp.port": port,
		// As the server's --isolated-ipc (render.MPServerArgs).
		"lmcache.mp.isolated_ipc": true,
	}})
	return string(b)
}

// Names the multiprocess-mode wiring uses.
const (
	// DevShm is where the engine container gets its private shared memory.
	DevShm = "/dev/shm"
	// DefaultEngineSharedMemory is the size of that memory when
	// spec.multiprocess.engineSharedMemory is unset (the CRD's default).
	DefaultEngineSharedMemory = "1Gi"
	envTrackUsage             = "LMCACHE_TRACK_USAGE"
	// SleepModeFlag turns on vLLM's sleep mode (CuMemAllocator), whose
	// memory LMCache's isolated IPC cannot share.
	SleepModeFlag = "--enable-sleep-mode"
)

// AllocConfEnv are the variables PyTorch reads its CUDA caching
// allocator's settings from (PYTORCH_ALLOC_CONF is the newer name; torch
// 2.14 reads both).
var AllocConfEnv = []string{"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}

// mpEnv is the environment of an engine wired to the MP server. The
// server hashes token ids with blake3, so Python's hash() keys nothing;
// PYTHONHASHSEED=0 (as LMCache's own operator sets) only makes every
// wired engine seed the same wherever a process does hash with it (a
// fallback, vLLM's NONE_HASH). LMCache's usage telemetry is off, as the
// server's (render.MPServerEnv).
func mpEnv() []corev1.EnvVar {
	return []corev1.EnvVar{{Name: envPythonHashSeed, Value: "0"}, {Name: envTrackUsage, Value: "false"}}
}

// EngineSharedMemory is the sizeLimit of the private /dev/shm of an
// engine wired to cb's MP server.
func EngineSharedMemory(cb *v1alpha1.CacheBackend) resource.Quantity {
	if mp := cb.Spec.Multiprocess; mp != nil && mp.EngineSharedMemory != nil {
		return mp.EngineSharedMemory.DeepCopy()
	}
	return resource.MustParse(DefaultEngineSharedMemory)
}

// mpTransfer is the --kv-transfer-config of an engine wired to cb's MP
// server, reached through its node-local Service.
func mpTransfer(cb *v1alpha1.CacheBackend, domain string, modulePath bool) Flag {
	return Flag{KVTransferConfigFlag, MPKVTransferConfigFor(topology.Host(cb, domain), topology.Port(cb), cb.Spec.Integration.Role, modulePath)}
}

// isolatedIPCUnsupported returns why LMCache's isolated IPC cannot share
// the KV cache of container c (whose command line is cmdline), or "".
// Isolated IPC exports cudaMalloc memory only (research §5): PyTorch's
// expandable segments and vLLM's sleep mode allocate with the CUDA
// virtual-memory API instead.
func isolatedIPCUnsupported(c *corev1.Container, cmdline []string) string {
	for _, e := range c.Env {
		if !slices.Contains(AllocConfEnv, e.Name) {
			continue
		}
		if e.ValueFrom != nil {
			return fmt.Sprintf("container %q reads %s from %s, which the webhook cannot check for expandable_segments:True", c.Name, e.Name, valueSource(e.ValueFrom))
		}
		if ExpandableSegments(e.Value) {
			return fmt.Sprintf("container %q sets %s=%q: PyTorch's expandable segments are not cudaMalloc memory, which LMCache's isolated IPC (multiprocess mode) needs", c.Name, e.Name, e.Value)
		}
	}
	if setsExtensibleKVCache(cmdline) == extensibleKVCacheOn {
		return fmt.Sprintf("container %q turns on vLLM's extensible KV cache (%s): its driver-mapped memory is not cudaMalloc memory, which LMCache's isolated IPC (multiprocess mode) needs", c.Name, extensibleKVCacheOn)
	}
	if SleepModeOn(cmdline) {
		return fmt.Sprintf("container %q turns on vLLM's sleep mode (%s): its CuMemAllocator memory is not cudaMalloc memory, which LMCache's isolated IPC (multiprocess mode) needs", c.Name, SleepModeFlag)
	}
	return ""
}

func valueSource(v *corev1.EnvVarSource) string {
	switch {
	case v.ConfigMapKeyRef != nil:
		return "ConfigMap " + v.ConfigMapKeyRef.Name
	case v.SecretKeyRef != nil:
		return "Secret " + v.SecretKeyRef.Name
	default:
		return "a valueFrom source"
	}
}

// ExpandableSegments reports whether a PyTorch allocator setting
// (comma-separated key:value pairs) turns expandable segments on, in any
// case.
func ExpandableSegments(conf string) bool {
	for _, kv := range strings.Split(conf, ",") {
		k, v, _ := strings.Cut(kv, ":")
		if strings.TrimSpace(k) == "expandable_segments" && strings.EqualFold(strings.TrimSpace(v), "true") {
			return true
		}
	}
	return false
}

// SleepModeOn reports whether vLLM's sleep mode is on for cmdline: the
// last of --enable-sleep-mode and --no-enable-sleep-mode (argparse's
// BooleanOptionalAction, in any spelling vLLM's parser reads) is the
// positive one. It is off by default.
func SleepModeOn(cmdline []string) bool {
	on := false
	for _, a := range cmdline {
		if a == "--" {
			break
		}
		key, _, _ := strings.Cut(a, "=")
		switch {
		case SpellsFlag(key, "--no-enable-sleep-mode", true):
			on = false
		case SpellsFlag(key, SleepModeFlag, true):
			on = true
		}
	}
	return on
}

// mountsDevShm reports whether c mounts anything at /dev/shm.
func mountsDevShm(c *corev1.Container) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return path.Clean(m.MountPath) == DevShm })
}

// ensureDevShm gives the engine container c of pod p a private
// memory-backed /dev/shm of size, unless c already mounts one (the
// user's is kept). It returns a conflict when the pod already has a
// volume of the webhook's name that c does not mount there.
func ensureDevShm(p *corev1.Pod, c *corev1.Container, size resource.Quantity) []string {
	if mountsDevShm(c) {
		return nil
	}
	name := v1alpha1.VolumeEngineSharedMemory
	if slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == name }) {
		return []string{"volume " + name}
	}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: DevShm})
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &size},
	}})
	return nil
}

// MPChunkTokens is the chunk size of the multiprocess server the operator
// renders: LMCache's default (--chunk-size is not passed; 256 in LMCache
// 0.5.6 and 0.5.7rc2, MPServerConfig.chunk_size).
const MPChunkTokens = 256

// chunkMisaligned returns why LMCache's MP connector would refuse the
// block size cmdline sets, or "". LMCache 0.5.6 raises at start unless the
// chunk is a multiple of the engine's block size times its decode context
// parallel size (LMCacheMPSchedulerAdapter: "LMCache chunk size ... must
// be a multiple of ..."); LMCache 0.5.7 instead rounds the node server's
// chunk up once, for every engine of the node. A command line without
// --block-size gets vLLM's default (16 in 0.33, 64 in 0.34), which
// divides 256.
func chunkMisaligned(cmdline []string) string {
	bs := lastValue(cmdline, "--block-size", true)
	if bs == "" {
		return ""
	}
	n, _ := strconv.Atoi(bs)
	dcp := decodeContextParallel(cmdline)
	if MPChunkTokens%(n*dcp) == 0 {
		return ""
	}
	return fmt.Sprintf("the engine's block size %d (times decode context parallel size %d) does not divide the multiprocess server's chunk of %d tokens: "+
		"LMCache's MP connector refuses it at start (LMCache 0.5.7 would change the node server's chunk for every engine); use a --block-size that divides %d",
		n, dcp, MPChunkTokens, MPChunkTokens)
}

// decodeContextParallel is the command line's --decode-context-parallel-size
// (-dcp), 1 when unset or unreadable.
func decodeContextParallel(cmdline []string) int {
	dcp := 1
	if v := lastValue(cmdline, "--decode-context-parallel-size", true); v != "" {
		dcp, _ = strconv.Atoi(v)
	}
	for i, a := range cmdline {
		if a == "--" {
			break
		}
		v, ok := "", false
		switch {
		case a == "-dcp" && i+1 < len(cmdline):
			v, ok = cmdline[i+1], true
		case strings.HasPrefix(a, "-dcp="):
			v, ok = strings.TrimPrefix(a, "-dcp="), true
		}
		if n, err := strconv.Atoi(v); ok && err == nil && n > 0 {
			dcp = n
		}
	}
	return dcp
}
