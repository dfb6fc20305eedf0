package apply

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// intents remembers, per child, the intent last applied and the
// resourceVersion the child had once it was applied, in the style of
// cluster-api's SSA cache: while neither the rendered intent nor the
// child (as the controller's cache shows it) has changed since, the
// server-side dry run that would find nothing to change is not sent. Any
// change of the live object, by anyone, moves its resourceVersion, so the
// skip never hides drift; a cache lagging behind the apply only costs one
// more dry run.
type intents struct {
	mu   sync.Mutex
	seen map[intentKey]intentEntry
}

type intentKey struct {
	gvk             schema.GroupVersionKind
	namespace, name string
}

type intentEntry struct {
	hash            [sha256.Size]byte
	resourceVersion string
}

func keyOf(o *unstructured.Unstructured) intentKey {
	return intentKey{o.GroupVersionKind(), o.GetNamespace(), o.GetName()}
}

func hashOf(o *unstructured.Unstructured) ([sha256.Size]byte, bool) {
	raw, err := json.Marshal(o.Object)
	if err != nil {
		return [sha256.Size]byte{}, false
	}
	return sha256.Sum256(raw), true
}

// liveVersion reads the child's resourceVersion from c (the controller's
// cache: no request); "" when it cannot be read.
func liveVersion(ctx context.Context, c client.Client, o *unstructured.Unstructured) (string, bool) {
	obj, err := c.Scheme().New(o.GroupVersionKind())
	if err != nil {
		return "", false
	}
	co, ok := obj.(client.Object)
	if !ok {
		return "", false
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(o), co); err != nil {
		return "", apierrors.IsNotFound(err)
	}
	return co.GetResourceVersion(), true
}

// unchanged reports whether every object's intent was applied and its
// child has not changed since.
func (x *intents) unchanged(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) bool {
	for _, o := range objs {
		h, ok := hashOf(o)
		if !ok {
			return false
		}
		x.mu.Lock()
		e, known := x.seen[keyOf(o)]
		x.mu.Unlock()
		if !known || e.hash != h || e.resourceVersion == "" {
			return false
		}
		if rv, _ := liveVersion(ctx, c, o); rv != e.resourceVersion {
			return false
		}
	}
	return true
}

// versions reads the children's resourceVersions from c (the cache)
// before an apply: what record falls back to for a child the apply did not
// write.
func versions(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) map[intentKey]string {
	out := make(map[intentKey]string, len(objs))
	for _, o := range objs {
		out[keyOf(o)], _ = liveVersion(ctx, c, o)
	}
	return out
}

// record remembers intent as applied: applied holds the objects as the
// apply returned them (with their new resourceVersion where they were
// written; in any order), intent the rendered objects, before the
// resourceVersions read before the apply. A child the apply left alone
// (its dry run showed no difference) is recorded at the version read
// before the apply, never at one read after it: a change someone made in
// between would otherwise be taken for the applied state and never
// repaired. An older version only costs one more dry run.
func (x *intents) record(intent, applied []*unstructured.Unstructured, before map[intentKey]string) {
	written := make(map[intentKey]string, len(applied))
	for _, o := range applied {
		written[keyOf(o)] = o.GetResourceVersion()
	}
	for _, o := range intent {
		h, ok := hashOf(o)
		if !ok {
			continue
		}
		rv := written[keyOf(o)]
		if rv == "" {
			rv = before[keyOf(o)]
		}
		x.mu.Lock()
		if x.seen == nil {
			x.seen = map[intentKey]intentEntry{}
		}
		x.seen[keyOf(o)] = intentEntry{hash: h, resourceVersion: rv}
		x.mu.Unlock()
	}
}

// forget drops what is remembered of objs, after a failed apply.
func (x *intents) forget(objs []*unstructured.Unstructured) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, o := range objs {
		delete(x.seen, keyOf(o))
	}
}
