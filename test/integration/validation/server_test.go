package validation_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/test/integration/suite"
)

type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeaderWithContext(_ context.Context, _ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

// TestValidatingWebhookServerRules: through the API server, extraArgs
// (which lmcache_server exits on) is refused with its field path and the
// reason, and storage.pvc is admitted with the warning that lmcache_server
// keeps KV in memory only.
func TestValidatingWebhookServerRules(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	w := &warnings{}
	wcfg := rest.CopyConfig(suite.Cfg)
	wcfg.WarningHandlerWithContext = w
	c, err := client.New(wcfg, client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)

	cb := suite.NewBackend(ns, "extra")
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{ExtraArgs: []string{"--verbose"}}}
	err = c.Create(context.Background(), cb, client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.remoteStorage.lmCacheServer.extraArgs: Forbidden: "+validation.ExtraArgsRefused)

	cb = suite.NewBackend(ns, "stored")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	require.NoError(t, c.Create(context.Background(), cb, client.DryRunAll))
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Contains(t, w.seen, validation.StorageInMemoryOnly)
}

// TestInProcessServerOnLMCache057IsRefused: through the API server, a
// CacheBackend with the in-process shape and an LMCache 0.5.7 image (which
// has no lmcache_server) is refused at the image's field path with the
// reason; the same image in multiprocess mode is admitted.
func TestInProcessServerOnLMCache057IsRefused(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "inprocess")
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Image: "lmcache/vllm-openai:v0.5.7rc2"}}
	err := suite.K8s.Create(context.Background(), cb)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `spec.remoteStorage.lmCacheServer.image: Invalid value: "lmcache/vllm-openai:v0.5.7rc2": the server image runs LMCache 0.5.7rc2 (read from the image tag), which has no lmcache_server`)
	assert.Contains(t, err.Error(), "set spec.multiprocess")

	mp := suite.NewBackend(ns, "mp")
	mp.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Image: "lmcache/vllm-openai:v0.5.7rc2"}}
	mp.Spec.Multiprocess = &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("4Gi")}}
	require.NoError(t, suite.K8s.Create(context.Background(), mp, client.DryRunAll))
}
