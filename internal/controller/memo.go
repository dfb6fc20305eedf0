package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// memo is what this process knows of each backend that the cache it reads
// may not show yet, and what it learnt once per pod. The cache lags the
// reconciler's own writes: a reconcile woken in that window reads the
// status from before its last write, and must neither take "the cache
// already shows this" for "nothing to write" nor report an observation
// again. One entry per backend, for the backend's UID (a backend deleted
// and created again under its name starts afresh); forget drops it.
type memo struct {
	mu sync.Mutex
	m  map[client.ObjectKey]memoEntry
}

// memoEntry is one backend's memo.
type memoEntry struct {
	uid types.UID
	// status is the status this process last wrote.
	status *v1alpha1.CacheBackendStatus
	// unmatched: EngineSelectorUnmatched was recorded for the current run
	// of zero matches.
	unmatched bool
	// unwired is the EnginesWired reason EnginesUnwired was last recorded
	// for ("" since EnginesWired was last True).
	unwired string
	// sidecars says which wired engine pods (by UID) carry the
	// kvevent-subscriber sidecar (indexPods).
	sidecars map[types.UID]bool
	// forbidden are the engine pods (by UID) whose eviction RBAC refused,
	// each with the start of its node's server it was to follow, reported
	// (EngineEvictionForbidden) once: a reconcile that reads the status
	// from before the new identity was recorded, or whose identity changed
	// on another node, neither tries nor reports them again. Only pods
	// still planned are kept.
	forbidden map[types.UID]time.Time
}

// get returns cb's entry (empty when none is kept for cb's UID).
func (m *memo) get(cb *v1alpha1.CacheBackend) memoEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.m[client.ObjectKeyFromObject(cb)]; ok && e.uid == cb.UID {
		return e
	}
	return memoEntry{uid: cb.UID}
}

// update changes cb's entry with f.
func (m *memo) update(cb *v1alpha1.CacheBackend, f func(*memoEntry)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := client.ObjectKeyFromObject(cb)
	e, ok := m.m[key]
	if !ok || e.uid != cb.UID {
		e = memoEntry{uid: cb.UID}
	}
	f(&e)
	if m.m == nil {
		m.m = map[client.ObjectKey]memoEntry{}
	}
	m.m[key] = e
}

// forget drops the entry of the backend named key.
func (m *memo) forget(key client.ObjectKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
}
