package controller_test

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
	ns := newNamespace(t)
	w := &warnings{}
	wcfg := rest.CopyConfig(cfg)
	wcfg.WarningHandlerWithContext = w
	c, err := client.New(wcfg, client.Options{Scheme: scheme})
	require.NoError(t, err)

	cb := newBackend(ns, "extra")
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{ExtraArgs: []string{"--verbose"}}}
	err = c.Create(context.Background(), cb, client.DryRunAll)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.remoteStorage.lmCacheServer.extraArgs: Forbidden: "+validation.ExtraArgsRefused)

	cb = newBackend(ns, "stored")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	require.NoError(t, c.Create(context.Background(), cb, client.DryRunAll))
	w.mu.Lock()
	defer w.mu.Unlock()
	assert.Contains(t, w.seen, validation.StorageInMemoryOnly)
}
