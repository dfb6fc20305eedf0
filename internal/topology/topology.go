// Package topology is where a CacheBackend's cache lives and how engines
// reach it: its mode (one decision: an in-process LMCache server, a
// node-local server per node, or the engines' own memory), the address
// engines are wired to, and when a published address has settled (the
// webhook's cache, which lags the API server, holds it). It reads the
// spec and the status only; render, workload, inject, evaluate, rollout,
// the controller and the CLI ask it.
package topology

import (
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Mode is where a backend's cache lives.
type Mode uint8

// Modes.
const (
	// InProcess: a managed lmcache_server (Deployment or StatefulSet)
	// behind one Service; engines reach it with lm://.
	InProcess Mode = iota + 1
	// Multiprocess: LMCache's multiprocess server, one per node (a
	// DaemonSet) behind a node-local Service; engines reach their own
	// node's with tcp://.
	Multiprocess
	// EngineLocal: no server (SGLang HiCache); the engines hold the cache.
	EngineLocal
)

// String is the mode as the CLI prints it.
func (m Mode) String() string {
	switch m {
	case InProcess:
		return "in-process"
	case Multiprocess:
		return "multiprocess"
	case EngineLocal:
		return "hicache"
	}
	return "unknown"
}

// Of is cb's mode: EngineLocal for SGLangHiCache, Multiprocess for an
// LMCache backend with spec.multiprocess, InProcess otherwise.
func Of(cb *v1alpha1.CacheBackend) Mode {
	switch {
	case cb.Spec.Type == v1alpha1.BackendTypeSGLangHiCache:
		return EngineLocal
	case cb.Spec.Type == v1alpha1.BackendTypeLMCache && cb.Spec.Multiprocess != nil:
		return Multiprocess
	}
	return InProcess
}

// Ports and domain the address takes when the spec names none.
const (
	// DefaultPort is the in-process server's port.
	DefaultPort = int32(65432)
	// DefaultMPPort is the multiprocess server's ZMQ request port.
	DefaultMPPort = int32(5555)
	// DefaultClusterDomain is the cluster's DNS domain unless the
	// manager's --cluster-domain says otherwise.
	DefaultClusterDomain = "cluster.local"
)

// ServiceName is the name of cb's cache-server Service (in multiprocess
// mode its node-local Service), and of its workload.
func ServiceName(cb *v1alpha1.CacheBackend) string { return cb.Name }

// Port is the cache server's TCP port (in multiprocess mode, its ZMQ
// request port).
func Port(cb *v1alpha1.CacheBackend) int32 {
	if Of(cb) == Multiprocess {
		if p := cb.Spec.Multiprocess.Port; p != 0 {
			return p
		}
		return DefaultMPPort
	}
	if rs := cb.Spec.RemoteStorage; rs != nil && rs.LMCacheServer != nil && rs.LMCacheServer.Port != 0 {
		return rs.LMCacheServer.Port
	}
	return DefaultPort
}

// Host is the fully qualified DNS name of cb's cache-server Service,
// <name>.<namespace>.svc.<domain> (domain "" is DefaultClusterDomain; a
// trailing dot on it is dropped). The full suffix, not <name>.<namespace>.svc:
// the short name is first looked up through the pod's resolver search
// path, where <name>.<namespace>.svc.svc.<domain> is an endpoint of Service
// <namespace> in a namespace named "svc", which its owner controls. The
// full name has too many labels to match any Service under a search suffix.
func Host(cb *v1alpha1.CacheBackend, domain string) string {
	domain = strings.TrimSuffix(domain, ".")
	if domain == "" {
		domain = DefaultClusterDomain
	}
	return ServiceName(cb) + "." + cb.Namespace + ".svc." + domain
}

// Endpoint is the LMCache remote URL of cb's cache server,
// lm://<Host>:<port>: what the webhook injects and, once the server is
// available, status.endpoint. In multiprocess mode it is the node-local
// Service's ZMQ address, tcp://<Host>:<port>, which reaches the server of
// the engine's own node. It is derived from the spec only.
func Endpoint(cb *v1alpha1.CacheBackend, domain string) string {
	scheme := "lm://"
	if Of(cb) == Multiprocess {
		scheme = "tcp://"
	}
	return scheme + Host(cb, domain) + ":" + strconv.Itoa(int(Port(cb)))
}

// SettleTime is how long a published endpoint takes to reach the
// webhook's cache of CacheBackends: pods admitted sooner may be admitted
// without it.
const SettleTime = 3 * time.Second

// Settled reports whether engine pods created now are wired by the
// webhook: st publishes the endpoint want (any, when want is empty), and
// has for SettleTime, so that the webhook's cache, which lags the API
// server, holds it too. For the whole-workload rolls that is counted from
// the Ready transition; in multiprocess mode (byPublication) from
// status.endpointPublishedAt, which does not wait for every node's server
// (the per-node evictions wait for their own node's), plus a second (the
// time is stored in whole seconds), or from the Ready transition when no
// publication time is recorded (a CRD from before the field prunes it).
func Settled(st *v1alpha1.CacheBackendStatus, want string, byPublication bool, now time.Time) bool {
	if st.Endpoint == "" || (want != "" && st.Endpoint != want) {
		return false
	}
	if byPublication && st.EndpointPublishedAt != nil {
		return now.Sub(st.EndpointPublishedAt.Time) >= SettleTime+time.Second
	}
	ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
	return ready != nil && ready.Status == metav1.ConditionTrue && now.Sub(ready.LastTransitionTime.Time) >= SettleTime
}

// Publication is the endpoint st publishes and when it was published, as
// one string; "" when st publishes none, another than want (any, when want
// is empty), or records no publication time (a CRD from before
// status.endpointPublishedAt prunes it). In multiprocess mode the
// whole-workload engine rolls write its hash: it stays while node servers
// come and go, and changes only when the endpoint is published anew.
func Publication(st *v1alpha1.CacheBackendStatus, want string) string {
	if st.Endpoint == "" || (want != "" && st.Endpoint != want) || st.EndpointPublishedAt == nil {
		return ""
	}
	return st.Endpoint + "@" + st.EndpointPublishedAt.UTC().Format(time.RFC3339)
}

// Since is when the webhook could first inject cb's published endpoint:
// its Ready transition plus the settle time (in multiprocess mode its
// publication, status.endpointPublishedAt, plus the settle time and a
// second); nil while cb publishes no endpoint (pods admitted now are
// admitted before it).
func Since(cb *v1alpha1.CacheBackend) *time.Time {
	if p := cb.Status.EndpointPublishedAt; Of(cb) == Multiprocess && cb.Status.Endpoint != "" && p != nil {
		// Multiprocess mode: the webhook wires while the endpoint is
		// published, Ready (every node's server) or not.
		t := p.Add(SettleTime + time.Second)
		return &t
	}
	ready := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
	if cb.Status.Endpoint == "" || ready == nil || ready.Status != metav1.ConditionTrue {
		return nil
	}
	t := ready.LastTransitionTime.Add(SettleTime)
	return &t
}
