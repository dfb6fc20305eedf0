package controller_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestProberSpeaksLMCacheHealth: the probe passes only for a server that
// answers LMCache's HEALTH request with code 200 within the timeout; a
// listener that accepts and says nothing, one that closes at once, and one
// that answers FAIL all fail it. (No control plane is used; the package's
// suite starts one anyway. test/conformance runs the same probe against
// the real lmcache_server.)
func TestProberSpeaksLMCacheHealth(t *testing.T) {
	listen := func(t *testing.T, serve func(net.Listener)) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close() })
		go serve(l)
		return l.Addr().String()
	}
	silent := func(l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }()
		}
	}
	closing := func(l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}
	for _, tc := range []struct {
		name  string
		serve func(net.Listener)
		want  string
	}{
		{"answers 200", func(l net.Listener) { suite.ServeHealth(l, lmcacheproto.CodeSuccess) }, ""},
		{"accepts and says nothing", silent, "i/o timeout"},
		{"closes at once", closing, "reading the reply to HEALTH"},
		{"answers 400", func(l net.Listener) { suite.ServeHealth(l, lmcacheproto.CodeFail) }, "code 400"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := listen(t, tc.serve)
			p := &controller.Prober{Interval: time.Minute, Timeout: 300 * time.Millisecond,
				Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				}}
			cb := &v1alpha1.CacheBackend{}
			cb.Namespace, cb.Name, cb.UID = "llm", "cache-"+fmt.Sprint(time.Now().UnixNano()), "u"
			start := time.Now()
			err, probed := p.Check(context.Background(), cb)
			assert.True(t, probed)
			assert.Less(t, time.Since(start), 2*time.Second, "bounded by the timeout")
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), "does not answer LMCache's HEALTH request")
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestFunctionalProbe: a closed port keeps Ready=False with a reason and
// FunctionalProbeOK=False; once the server answers, both become True.
func TestFunctionalProbe(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	addr := fmt.Sprintf("cache.%s.svc.cluster.local:65432", ns)
	suite.ClosedTargets.Store(addr, true)
	defer suite.ClosedTargets.Delete(addr)

	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonFunctionalProbeFailed))
	probe := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK)
	require.NotNil(t, probe)
	assert.Equal(t, metav1.ConditionFalse, probe.Status)
	assert.Contains(t, probe.Message, "connection refused")

	suite.ClosedTargets.Delete(addr)
	got = suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK))
}

// TestProbeSlotClearedOnEveryExit: each way out of the ready state clears
// the backend's probe slot and the FunctionalProbeOK condition: the
// workload becoming unavailable, an apply failure, immutable StatefulSet
// storage, and deletion.
func TestProbeSlotClearedOnEveryExit(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	ready := func(cb *v1alpha1.CacheBackend, sts bool) client.ObjectKey {
		key := client.ObjectKeyFromObject(cb)
		if sts {
			suite.WaitStatefulSet(t, key, nil)
			setStatefulSetStatus(t, key, 1, 1)
		} else {
			suite.WaitDeployment(t, key, nil)
			suite.MarkDeploymentAvailable(t, key)
		}
		suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
		require.True(t, suite.Prober.HasSlot(key), "probed before Ready")
		return key
	}
	cleared := func(key client.ObjectKey) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() error {
			if suite.Prober.HasSlot(key) {
				return fmt.Errorf("probe slot of %s still held", key)
			}
			cb := &v1alpha1.CacheBackend{}
			if err := suite.K8s.Get(ctx, key, cb); err == nil && meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionFunctionalProbeOK) != nil {
				return fmt.Errorf("FunctionalProbeOK still published")
			}
			return nil
		})
	}

	t.Run("workload unavailable", func(t *testing.T) {
		cb := suite.NewBackend(ns, "unavailable")
		require.NoError(t, suite.K8s.Create(ctx, cb))
		key := ready(cb, false)
		suite.MarkDeploymentRolling(t, key)
		cleared(key)
	})
	t.Run("name conflict", func(t *testing.T) {
		cb := suite.NewBackend(ns, "applyfail")
		require.NoError(t, suite.K8s.Create(ctx, cb))
		key := ready(cb, false)
		// A foreign StatefulSet holds the name the switched kind needs.
		require.NoError(t, suite.K8s.Create(ctx, foreignStatefulSet(ns, "applyfail")))
		suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet })
		suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonNameConflict))
		cleared(key)
	})
	t.Run("immutable StatefulSet storage", func(t *testing.T) {
		cb := suite.STSBackend(ns, "drift", 1, true)
		require.NoError(t, suite.K8s.Create(ctx, cb))
		key := ready(cb, true)
		suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.Size = resource.MustParse("30Gi") })
		suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonImmutableStatefulSetStorage))
		cleared(key)
	})
	t.Run("deleted", func(t *testing.T) {
		cb := suite.NewBackend(ns, "deleted")
		require.NoError(t, suite.K8s.Create(ctx, cb))
		key := ready(cb, false)
		require.NoError(t, suite.K8s.Delete(ctx, cb))
		testutil.Eventually(t, 10*time.Second, func() error {
			if suite.Prober.HasSlot(key) {
				return fmt.Errorf("probe slot still held")
			}
			return nil
		})
	})
}
