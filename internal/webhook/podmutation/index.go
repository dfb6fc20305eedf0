package podmutation

import (
	"context"
	"fmt"
	"sync"

	toolscache "k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Index selects the CacheBackend that claims a pod without listing the
// CacheBackends of its namespace: it is kept from the informer's events
// (it is a toolscache.ResourceEventHandler) and holds, per namespace, each
// backend under one pair of its selector (its anchor: the smallest key and
// its value). A pod is matched only against the backends anchored at one
// of its own labels, so selection costs per label of the pod, not per
// CacheBackend in the namespace. The objects are the informer's, shared
// and never modified.
type Index struct {
	mu     sync.RWMutex
	byNS   map[string]*nsIndex
	synced func() bool
}

type nsIndex struct {
	byName   map[string]*v1alpha1.CacheBackend
	byAnchor map[labelPair][]*v1alpha1.CacheBackend
}

type labelPair struct{ key, value string }

// NewIndex returns an empty index; register it on the CacheBackend
// informer with AddEventHandler and pass the registration's HasSynced to
// SetSynced, or let IndexBackends do both.
func NewIndex() *Index {
	return &Index{byNS: map[string]*nsIndex{}}
}

// IndexBackends returns an Index kept from the CacheBackend informer of
// informers (the manager's cache), as the manager serves the webhook.
func IndexBackends(ctx context.Context, informers crcache.Informers) (*Index, error) {
	inf, err := informers.GetInformer(ctx, &v1alpha1.CacheBackend{})
	if err != nil {
		return nil, fmt.Errorf("getting the CacheBackend informer: %w", err)
	}
	x := NewIndex()
	reg, err := inf.AddEventHandler(x)
	if err != nil {
		return nil, fmt.Errorf("indexing CacheBackends: %w", err)
	}
	x.SetSynced(reg.HasSynced)
	return x, nil
}

// SetSynced sets the check that the index holds the informer's initial
// list; until it passes, Synced is false.
func (x *Index) SetSynced(f func() bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.synced = f
}

// Synced reports whether the index holds every CacheBackend the informer
// listed at start.
func (x *Index) Synced() bool {
	x.mu.RLock()
	f := x.synced
	x.mu.RUnlock()
	return f != nil && f()
}

// Select is v1alpha1.Claimant over the CacheBackends of namespace, found
// through the label pairs they select by: of those that select labels, the
// first by name; nil when none does.
func (x *Index) Select(namespace string, labels map[string]string) *v1alpha1.CacheBackend {
	x.mu.RLock()
	defer x.mu.RUnlock()
	ns := x.byNS[namespace]
	if ns == nil {
		return nil
	}
	var best *v1alpha1.CacheBackend
	for k, v := range labels {
		for _, cb := range ns.byAnchor[labelPair{k, v}] {
			if cb.Selects(labels) && (best == nil || cb.Name < best.Name) {
				best = cb
			}
		}
	}
	return best
}

// anchor is the pair a backend is found under; false for an empty
// selector, which matches nothing.
func anchor(cb *v1alpha1.CacheBackend) (labelPair, bool) {
	var a labelPair
	found := false
	for k, v := range cb.Spec.EngineSelector.MatchLabels {
		if !found || k < a.key {
			a, found = labelPair{k, v}, true
		}
	}
	return a, found
}

func (x *Index) put(cb *v1alpha1.CacheBackend) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ns := x.byNS[cb.Namespace]
	if ns == nil {
		ns = &nsIndex{byName: map[string]*v1alpha1.CacheBackend{}, byAnchor: map[labelPair][]*v1alpha1.CacheBackend{}}
		x.byNS[cb.Namespace] = ns
	}
	ns.remove(cb.Name)
	ns.byName[cb.Name] = cb
	if a, ok := anchor(cb); ok {
		ns.byAnchor[a] = append(ns.byAnchor[a], cb)
	}
}

func (x *Index) delete(namespace, name string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	ns := x.byNS[namespace]
	if ns == nil {
		return
	}
	ns.remove(name)
	if len(ns.byName) == 0 {
		delete(x.byNS, namespace)
	}
}

func (ns *nsIndex) remove(name string) {
	old := ns.byName[name]
	if old == nil {
		return
	}
	delete(ns.byName, name)
	a, ok := anchor(old)
	if !ok {
		return
	}
	list := ns.byAnchor[a]
	for i, cb := range list {
		if cb == old {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(ns.byAnchor, a)
	} else {
		ns.byAnchor[a] = list
	}
}

// OnAdd implements toolscache.ResourceEventHandler.
func (x *Index) OnAdd(obj any, _ bool) {
	if cb, ok := obj.(*v1alpha1.CacheBackend); ok {
		x.put(cb)
	}
}

// OnUpdate implements toolscache.ResourceEventHandler.
func (x *Index) OnUpdate(_, obj any) { x.OnAdd(obj, false) }

// OnDelete implements toolscache.ResourceEventHandler.
func (x *Index) OnDelete(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if cb, ok := obj.(*v1alpha1.CacheBackend); ok {
		x.delete(cb.Namespace, cb.Name)
	}
}

var _ toolscache.ResourceEventHandler = (*Index)(nil)
