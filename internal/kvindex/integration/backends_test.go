package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/metadata"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/controlplane"
)

// TestHelloNeedsAnExistingCacheBackend runs the index's backend check
// (server.BackendInformer, as cache-index --require-backend builds it)
// against a real kube-apiserver with the CacheBackend CRD: a Hello for a
// backend that exists is welcomed, one for a name that does not is
// refused, and a backend created or deleted later is seen through the
// watch.
func TestHelloNeedsAnExistingCacheBackend(t *testing.T) {
	dir, err := controlplane.Dir()
	if err != nil {
		t.Fatalf("the integration test needs the local control plane: %v", err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir,
		CRDInstallOptions: envtest.CRDInstallOptions{Paths: []string{"../../../kustomize/base/crd"}, ErrorIfPathMissing: true}}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting kube-apiserver and etcd: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	newBackend := func(name string) *v1alpha1.CacheBackend {
		return &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
			Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
				EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "vllm"}}}}
	}
	if err := k8s.Create(ctx, newBackend("cache")); err != nil {
		t.Fatal(err)
	}

	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	backends := server.NewBackendInformer(md)
	if err := backends.Start(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), Backends: backends})
	hello := func(backend string) error {
		s := ix.NewSession(kvindex.Caller{Username: "system:serviceaccount:team-a:vllm", Namespace: "team-a", ServiceAccount: "vllm", PodName: "vllm-0", PodUID: "u0"}, func() {})
		defer s.Close()
		_, err := s.Handle(ctx, &pb.IngestRequest{Message: &pb.IngestRequest_Hello{Hello: &pb.Hello{
			ProtocolVersion: kvindex.ProtocolVersion, Model: "m", DataParallelSize: 1,
			Pod:          &pb.PodIdentity{Namespace: "team-a", Name: "vllm-0", Uid: "u0"},
			CacheBackend: &pb.CacheBackendRef{Namespace: "team-a", Name: backend},
			HashScheme:   &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16},
		}}})
		return err
	}
	// eventually waits for the watch to deliver a change.
	eventually := func(backend string, welcomed bool) {
		t.Helper()
		var err error
		for range 100 {
			if err = hello(backend); (err == nil) == welcomed {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("hello for %s: %v; want welcomed=%v", backend, err, welcomed)
	}

	t.Run("an existing backend is welcomed", func(t *testing.T) {
		if err := hello("cache"); err != nil {
			t.Fatalf("hello for team-a/cache: %v", err)
		}
	})
	t.Run("a backend that does not exist is refused", func(t *testing.T) {
		if err := hello("junk"); !errors.Is(err, kvindex.ErrForbidden) {
			t.Fatalf("hello for team-a/junk: %v; want forbidden", err)
		}
	})
	t.Run("a backend created later is welcomed, a deleted one refused", func(t *testing.T) {
		late := newBackend("late")
		if err := k8s.Create(ctx, late); err != nil {
			t.Fatal(err)
		}
		eventually("late", true)
		if err := k8s.Delete(ctx, late); err != nil {
			t.Fatal(err)
		}
		eventually("late", false)
	})
}
