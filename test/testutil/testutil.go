// Package testutil holds the helpers the integration and end-to-end suites
// share: polling, absence, event counting, the Ready matcher, the scheme and
// the manager's log level. One copy, used by internal/controller, test/e2e
// and test/install.
package testutil

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Poll is the interval between two checks of Eventually.
const Poll = 100 * time.Millisecond

// Eventually polls cond until it returns nil, or fails the test with cond's
// last error once timeout has passed.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s: %v", timeout, err)
		}
		time.Sleep(Poll)
	}
}

// Gone returns nil once the object key no longer exists.
func Gone(ctx context.Context, c client.Reader, key client.ObjectKey, obj client.Object) error {
	err := c.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("%T %s still exists", obj, key)
}

// CountEvents counts the events of namespace ns with reason regarding the
// object name, including the repeats the recorder folded into one event.
func CountEvents(t testing.TB, c client.Reader, ns, name, reason string) int {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, c.List(context.Background(), &list, client.InNamespace(ns)))
	n := 0
	for _, e := range list.Items {
		if e.Regarding.Name == name && e.Reason == reason {
			k := max(1, int(e.DeprecatedCount))
			if e.Series != nil {
				k = max(k, int(e.Series.Count))
			}
			n += k
		}
	}
	return n
}

// WaitEvent waits until at least atLeast events with reason regard name.
func WaitEvent(t testing.TB, c client.Reader, ns, name, reason string, atLeast int) {
	t.Helper()
	Eventually(t, 15*time.Second, func() error {
		if n := CountEvents(t, c, ns, name, reason); n < atLeast {
			return fmt.Errorf("%d %s events on %s, want at least %d", n, reason, name, atLeast)
		}
		return nil
	})
}

// ReadyIs matches a CacheBackend whose status was evaluated for its current
// generation and whose Ready condition has status (any when empty) and
// reason (any when empty). It is the one Ready matcher of the suites.
func ReadyIs(status metav1.ConditionStatus, reason string) func(*v1alpha1.CacheBackend) error {
	return func(cb *v1alpha1.CacheBackend) error {
		c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || (status != "" && c.Status != status) || (reason != "" && c.Reason != reason) || cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("condition Ready is %+v at observedGeneration %d/%d, want %s %s", c, cb.Status.ObservedGeneration, cb.Generation, status, reason)
		}
		return nil
	}
}

// Scheme returns a scheme with the built-in kinds and the operator's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}

// ZapLevel is the manager's log level in tests: errors only, unless
// TEST_VERBOSE_MANAGER is set.
func ZapLevel() zapcore.Level {
	if os.Getenv("TEST_VERBOSE_MANAGER") != "" {
		return -1
	}
	return 2
}

// RunManager starts mgr in the background, as the suites' TestMain do, and
// returns a function that stops it and waits until it returned.
func RunManager(ctx context.Context, mgr manager.Manager) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// StartBackend creates cb and returns its key: the first lines of every
// test that starts from a CacheBackend.
func StartBackend(t testing.TB, c client.Client, cb *v1alpha1.CacheBackend) client.ObjectKey {
	t.Helper()
	require.NoError(t, c.Create(context.Background(), cb))
	return client.ObjectKeyFromObject(cb)
}

// HiCacheBackend is an engine-local (SGLangHiCache) backend llm/hicache of
// generation gen, selecting app=sglang pods: the unit tests' fixture.
func HiCacheBackend(gen int64) *v1alpha1.CacheBackend {
	ratio := "2"
	return &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "hicache", UID: "uid-hicache", Generation: gen},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeSGLang, Type: v1alpha1.BackendTypeSGLangHiCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "sglang"}},
			HiCache:        &v1alpha1.HiCache{Ratio: &ratio, WritePolicy: "write_through"},
			Integration: v1alpha1.Integration{EngineOverrides: &v1alpha1.EngineOverrides{
				Env: []corev1.EnvVar{{Name: "SGLANG_TIMEOUT_KEEP_ALIVE", Value: "5"}},
			}},
		},
	}
}
