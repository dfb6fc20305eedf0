package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// ownedBy is a controller reference to owner.
func ownedBy(owner client.Object, kind string) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: owner.GetName(), UID: owner.GetUID(), Controller: ptr.To(true)}}
}

// chain creates a ReplicaSet controlled by dep and a pod controlled by
// the ReplicaSet, both with labels, as the Deployment controller would
// (envtest runs none).
func chain(t *testing.T, dep *appsv1.Deployment, name string, labels map[string]string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	rs := &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: dep.Namespace, Name: name, Labels: labels, OwnerReferences: ownedBy(dep, "Deployment")},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img"}}}}},
	}
	require.NoError(t, suite.K8s.Create(ctx, rs))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: dep.Namespace, Name: name + "-0", Labels: labels, OwnerReferences: ownedBy(rs, "ReplicaSet")},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	require.NoError(t, suite.K8s.Create(ctx, pod))
	return pod
}

// setPodStatus marks pod Ready with restarts container restarts.
func setPodStatus(t *testing.T, pod *corev1.Pod, restarts int32) {
	t.Helper()
	require.NoError(t, suite.K8s.Get(context.Background(), client.ObjectKeyFromObject(pod), pod))
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: pod.Spec.Containers[0].Name, Ready: true, RestartCount: restarts, Image: "img", ImageID: "img"}}
	require.NoError(t, suite.K8s.Status().Update(context.Background(), pod))
}

// TestServerRestartRollsEnginesWithoutPolling: a cache-server container
// restart (restartCount in pod status, through the API server) is seen by
// the watch on server pods and rolls the wired engines exactly once, while
// a reconcile of the backend at rest asks for no later reconcile at all.
func TestServerRestartRollsEnginesWithoutPolling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	server := suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	require.NoError(t, suite.K8s.Get(ctx, key, cb))
	serverPod := chain(t, server, "cache-5c9f", render.SelectorLabels(cb))
	setPodStatus(t, serverPod, 0)
	suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if err := testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady)(cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == "" {
			return fmt.Errorf("no server instance observed yet")
		}
		return nil
	})
	// The instance before the restart: the wait below compares with it
	// (cb was read before the server pod existed, with no instance).
	require.NoError(t, suite.K8s.Get(ctx, key, cb))

	// An engine Deployment whose pod the webhook wires.
	engineLabels := map[string]string{"app": "engine-cache"}
	engine := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: engineLabels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: engineLabels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}},
	}
	require.NoError(t, suite.K8s.Create(ctx, engine))
	enginePod := chain(t, engine, "engine-7d4b", engineLabels)
	require.Equal(t, key.Namespace+"/"+key.Name, enginePod.Annotations[v1alpha1.AnnotationInjectedBy], "the engine pod is wired")

	// At rest, a reconcile sends nothing and asks for no later one.
	direct := &controller.CacheBackendReconciler{Client: suite.K8s, Applier: apply.New(suite.K8s), Recorder: events.NewFakeRecorder(100), APIReader: suite.K8s, Now: metav1.Now}
	atRest := func() {
		t.Helper()
		testutil.Eventually(t, 15*time.Second, func() error {
			res, err := direct.Reconcile(ctx, ctrl.Request{NamespacedName: key})
			if err != nil {
				return err
			}
			if res.RequeueAfter != 0 {
				return fmt.Errorf("a backend at rest asks to be reconciled again in %s", res.RequeueAfter)
			}
			return nil
		})
	}
	atRest()

	// The server's container restarts: only the watch can notice (no poll).
	setPodStatus(t, serverPod, 1)
	engineKey := client.ObjectKeyFromObject(engine)
	suite.WaitDeployment(t, engineKey, func(d *appsv1.Deployment) error {
		if d.Spec.Template.Annotations[v1alpha1.AnnotationServerInstance] == "" {
			return fmt.Errorf("engine Deployment not rolled")
		}
		return nil
	})
	suite.WaitBackend(t, key, func(got *v1alpha1.CacheBackend) error {
		if got.Status.ObservedServerInstance == cb.Status.ObservedServerInstance {
			return fmt.Errorf("the restart is not recorded yet")
		}
		return nil
	})
	atRest()
	require.NoError(t, suite.K8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(2), engine.Generation, "rolled exactly once")
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.EventEnginesRestarted, 1)
	assert.Equal(t, 1, testutil.CountEvents(t, suite.K8s, ns, "cache", v1alpha1.EventEnginesRestarted))
}

// TestAppliedIntentIsNotSentAgain: the applier remembers the intent it
// applied and the child's resourceVersion; applying the same plan again
// sends no request that writes or dry-runs, until someone changes a child.
func TestAppliedIntentIsNotSentAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	key := testutil.StartBackend(t, suite.K8s, suite.NewBackend(ns, "cache"))
	suite.WaitDeployment(t, key, nil)
	cb := suite.GetBackend(t, key)

	var patches atomic.Int64
	counted := rest.CopyConfig(suite.Cfg)
	counted.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return suite.RoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet {
				patches.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	c, err := client.New(counted, client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)
	a := apply.New(c)
	in, err := plan.Gather(ctx, c, c, cb)
	require.NoError(t, err)
	p, err := plan.Build(in)
	require.NoError(t, err)

	_, err = a.Execute(ctx, p)
	require.NoError(t, err)
	require.Positive(t, patches.Load(), "the first apply dry-runs every child")

	patches.Store(0)
	res, err := a.Execute(ctx, p)
	require.NoError(t, err)
	assert.False(t, res.Changed())
	assert.Zero(t, patches.Load(), "the same intent over unchanged children sends nothing")

	// Someone else changes the Deployment: its resourceVersion moves, and
	// the next apply looks again.
	d := &appsv1.Deployment{}
	require.NoError(t, suite.K8s.Get(ctx, key, d))
	d.Labels["team"] = "ml"
	require.NoError(t, suite.K8s.Update(ctx, d))
	patches.Store(0)
	_, err = a.Execute(ctx, p)
	require.NoError(t, err)
	assert.Positive(t, patches.Load(), "a changed child is compared again")
}
