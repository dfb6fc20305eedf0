package server

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/kvindex"
)

// BackendInformer answers kvindex.Backends from a watch of the
// CacheBackends' metadata: a Hello costs a map lookup, never a request to
// the API server, however many arrive for names that do not exist. It
// holds each CacheBackend's metadata only (name, namespace, labels), a few
// hundred bytes each, which the API server bounds like any list.
type BackendInformer struct {
	informer cache.SharedIndexInformer
}

// NewBackendInformer watches every namespace's CacheBackends through md.
// Start it before serving.
func NewBackendInformer(md metadata.Interface) *BackendInformer {
	gvr := v1alpha1.GroupVersion.WithResource("cachebackends")
	f := metadatainformer.NewSharedInformerFactory(md, 10*time.Minute)
	return &BackendInformer{informer: f.ForResource(gvr).Informer()}
}

// Start runs the watch until ctx ends and returns once the first list is
// in, so that a Hello is never refused for a backend the index has not
// read yet; it fails after timeout (no RBAC for cachebackends, no CRD).
func (b *BackendInformer) Start(ctx context.Context, timeout time.Duration) error {
	go b.informer.Run(ctx.Done())
	wait, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if !cache.WaitForCacheSync(wait.Done(), b.informer.HasSynced) {
		return fmt.Errorf("the CacheBackends were not listed within %s (is the CRD installed, may the index list cachebackends?): %w", timeout, wait.Err())
	}
	return nil
}

// Exists implements kvindex.Backends.
func (b *BackendInformer) Exists(_ context.Context, ref kvindex.BackendRef) (bool, error) {
	_, ok, err := b.informer.GetStore().GetByKey(ref.Namespace + "/" + ref.Name)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return ok, err
}
