package cli

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
)

// Modes of Explanation.Mode: how the CacheBackend a pod belongs to serves
// its cache.
const (
	// ModeInProcess: one lmcache_server (Deployment or StatefulSet) behind
	// a Service; engines wired with LMCacheConnectorV1 and
	// LMCACHE_REMOTE_URL lm://.
	ModeInProcess = "in-process"
	// ModeMultiprocess: LMCache's multiprocess mode, one `lmcache server`
	// per node (a DaemonSet) behind a node-local Service; engines wired
	// with LMCacheMPConnector to tcp:// and isolated IPC.
	ModeMultiprocess = "multiprocess"
	// ModeHiCache: SGLang HiCache, no server.
	ModeHiCache = "hicache"
)

// States of Explanation.NodeServer: the multiprocess server of the pod's
// node, as the backend's status.multiprocess lists it.
const (
	NodeServerReady    = "ready"
	NodeServerNotReady = "not-ready"
	// NodeServerNone: the status lists every node's server and none on
	// the pod's node: the engine has no server to reach.
	NodeServerNone = "none"
	// NodeServerNotListed: the status lists the maximum number of nodes
	// (the unready first) and not this one: its server is ready.
	NodeServerNotListed = "not-listed"
	// NodeServerUnknown: status.multiprocess is not published yet.
	NodeServerUnknown = "unknown"
	// NodeServerUnscheduled: the pod has no node yet.
	NodeServerUnscheduled = "unscheduled"
)

// ModeOf is the mode cb serves its cache in.
func ModeOf(cb *v1alpha1.CacheBackend) string { return topology.Of(cb).String() }

// ExpectedConnector is the kv_connector a vLLM pod wired by cb names in
// its --kv-transfer-config ("" for a backend the webhook wires otherwise).
func ExpectedConnector(cb *v1alpha1.CacheBackend) string {
	switch ModeOf(cb) {
	case ModeMultiprocess:
		return inject.LMCacheMPConnector
	case ModeInProcess:
		if cb.Spec.Runtime == v1alpha1.RuntimeSGLang {
			return ""
		}
		return inject.LMCacheConnector
	}
	return ""
}

// kvTransferConfig is the part of vLLM's --kv-transfer-config the CLI reads.
type kvTransferConfig struct {
	Connector string         `json:"kv_connector"`
	Extra     map[string]any `json:"kv_connector_extra_config"`
}

// PodConnector reads the kv_connector of the first container of pod whose
// command line sets --kv-transfer-config (in any spelling vLLM reads), and
// that container's name. It returns "" when no container sets it; a value
// that is not JSON is returned as "invalid JSON".
func PodConnector(pod *corev1.Pod) (connector, container string, extra map[string]any) {
	for _, c := range pod.Spec.Containers {
		cmdline := append(append([]string{}, c.Command...), c.Args...)
		for _, u := range inject.FlagUses(cmdline, inject.KVTransferConfigFlag, true) {
			if u.Partial {
				continue
			}
			var cfg kvTransferConfig
			if err := json.Unmarshal([]byte(u.Value), &cfg); err != nil {
				return "invalid JSON", c.Name, nil
			}
			return cfg.Connector, c.Name, cfg.Extra
		}
	}
	return "", "", nil
}

// describeMode adds to e what the mode of cb means for pod: its mode, the
// connector it is wired with against the one the mode expects, and in
// multiprocess mode the server of its node, its private /dev/shm and the
// server's tiers.
func describeMode(pod *corev1.Pod, cb *v1alpha1.CacheBackend, e *Explanation) {
	e.Mode = ModeOf(cb)
	connector, container, extra := PodConnector(pod)
	e.Connector = connector
	wired := e.Outcome == ExplainInjected || e.Outcome == ExplainUnverified
	want := ExpectedConnector(cb)
	if wired && want != "" && connector != "" && connector != want {
		e.WiringMismatch = true
		e.Lines = append(e.Lines, fmt.Sprintf("connector mismatch: container %q is wired with %s, but the backend runs in %s mode, which wires %s: "+
			"the pod was wired before the mode changed; roll its workload (kubectl rollout restart) to rewire it", container, connector, e.Mode, want))
	}
	if e.Mode != ModeMultiprocess {
		return
	}
	s := render.MPServerFor(cb)
	e.Lines = append(e.Lines, fmt.Sprintf("multiprocess mode: one lmcache server per node (DaemonSet %s/%s), reached through the node-local Service %s "+
		"(internalTrafficPolicy Local) at %s: the engine talks only to the server of its own node",
		cb.Namespace, topology.ServiceName(cb), topology.ServiceName(cb), topology.Endpoint(cb, "")))
	e.Node, e.NodeServer = pod.Spec.NodeName, NodeServerUnscheduled
	if e.Node != "" {
		var line string
		e.NodeServer, line = nodeServer(e.Node, cb.Status.Multiprocess)
		e.Lines = append(e.Lines, line)
	}
	if wired && connector == inject.LMCacheMPConnector {
		line := fmt.Sprintf("engine wiring: container %q, --kv-transfer-config %s", container, connector)
		if h, ok := extra["lmcache.mp.host"]; ok {
			line += fmt.Sprintf(" to %v:%v", h, extra["lmcache.mp.port"])
		}
		if v, _ := extra["lmcache.mp.isolated_ipc"].(bool); v {
			line += ", isolated IPC (CUDA IPC handles, no shared host memory)"
		} else {
			line += ", without lmcache.mp.isolated_ipc: the server runs --isolated-ipc and cannot reach this engine's memory"
		}
		e.Lines = append(e.Lines, line)
		e.Lines = append(e.Lines, sharedMemory(pod, container))
	}
	e.Lines = append(e.Lines, Tiers(s))
}

// nodeServer says what status.multiprocess lists for node.
func nodeServer(node string, st *v1alpha1.MultiprocessStatus) (string, string) {
	if st == nil {
		return NodeServerUnknown, fmt.Sprintf("server of node %s: unknown, status.multiprocess is not published yet", node)
	}
	count := fmt.Sprintf("%d of %d node servers ready", st.ReadyServers, st.DesiredServers)
	for _, n := range st.Nodes {
		if n.Node != node {
			continue
		}
		if n.Ready {
			return NodeServerReady, fmt.Sprintf("server of node %s: pod %s, ready (%s)", node, n.Pod, count)
		}
		return NodeServerNotReady, fmt.Sprintf("server of node %s: pod %s, NOT ready (%s): the engine's connector waits for it (mq_timeout, 300 s by default), then the engine exits", node, n.Pod, count)
	}
	if len(st.Nodes) >= v1alpha1.MaxMultiprocessNodes {
		return NodeServerNotListed, fmt.Sprintf("server of node %s: not among the %d nodes listed, the unready first: ready (%s)", node, len(st.Nodes), count)
	}
	return NodeServerNone, fmt.Sprintf("server of node %s: none: no server pod runs on the node (spec.remoteStorage.lmCacheServer.pod's nodeSelector, tolerations or affinity leave it out; %s); "+
		"the node-local Service has no fallback to another node, so the engine cannot reach a server", node, count)
}

// sharedMemory says whether container mounts a private memory-backed
// /dev/shm, which isolated IPC needs.
func sharedMemory(pod *corev1.Pod, container string) string {
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.MountPath != "/dev/shm" {
				continue
			}
			for _, v := range pod.Spec.Volumes {
				if v.Name != m.Name {
					continue
				}
				if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
					size := "no sizeLimit"
					if v.EmptyDir.SizeLimit != nil {
						size = "sizeLimit " + v.EmptyDir.SizeLimit.String()
					}
					return fmt.Sprintf("private /dev/shm: volume %s (emptyDir, medium Memory, %s)", v.Name, size)
				}
				return fmt.Sprintf("/dev/shm: volume %s, not a memory-backed emptyDir (the pod's own, kept by the webhook)", v.Name)
			}
		}
		return fmt.Sprintf("no private /dev/shm mounted in container %q: the container runtime's default (64 MiB) is too small for isolated IPC (spec.multiprocess.engineSharedMemory)", container)
	}
	return ""
}

// Tiers describes the multiprocess server's tiers for a person.
func Tiers(s render.MPServer) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server tiers: L1 %d GiB of host memory (%s, eviction from %d%% full, frees %d%%)", s.L1SizeGiB, s.EvictionPolicy, s.WatermarkPercent, s.RatioPercent)
	var l2 []string
	if r := s.RESP; r != nil {
		t := fmt.Sprintf("RESP (Redis/Valkey) %s:%d, %d GiB", r.Host, r.Port, r.CapacityGiB)
		if r.Credentials != "" {
			t += ", credentials from Secret " + r.Credentials
		}
		l2 = append(l2, t+", no TLS")
	}
	if d := s.Disk; d != nil {
		class := "the default class"
		if d.StorageClassName != nil {
			class = "class " + *d.StorageClassName
		}
		l2 = append(l2, fmt.Sprintf("disk %s, %d GiB, a generic ephemeral volume of %s (kept over a container restart, empty after the server pod is replaced)", d.Path, d.CapacityGiB, class))
	}
	if len(l2) == 0 {
		b.WriteString("; no L2")
	} else {
		b.WriteString("; L2: " + strings.Join(l2, "; "))
	}
	return b.String()
}
