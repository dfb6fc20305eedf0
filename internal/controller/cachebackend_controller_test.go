package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/apply"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// TestChildrenAreOwnedByTheOperatorsFieldManager: the workload and Service
// are applied server-side by the fixed field manager, are controlled by the
// CacheBackend, and the Service port and container port carry a protocol.
func TestChildrenAreOwnedByTheOperatorsFieldManager(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)

	dep := suite.WaitDeployment(t, key, nil)
	assert.Contains(t, suite.Managers(dep), v1alpha1.FieldManagerChildren+"/Apply")
	assert.True(t, metav1.IsControlledBy(dep, cb), "Deployment controlled by the CacheBackend")
	c := dep.Spec.Template.Spec.Containers[0]
	assert.Equal(t, []string{"lmcache_server"}, c.Command)
	assert.Equal(t, []string{"0.0.0.0", "65432", "cpu"}, c.Args)
	assert.Equal(t, corev1.ProtocolTCP, c.Ports[0].Protocol)
	require.NotNil(t, c.ReadinessProbe.Exec, "readiness sends LMCache's HEALTH request from the image's python3")
	assert.Equal(t, render.ProbeCommand(cb), c.ReadinessProbe.Exec.Command)

	svc := &corev1.Service{}
	require.NoError(t, suite.K8s.Get(ctx, key, svc))
	assert.Contains(t, suite.Managers(svc), v1alpha1.FieldManagerChildren+"/Apply")
	assert.True(t, metav1.IsControlledBy(svc, cb))
	assert.Equal(t, corev1.ProtocolTCP, svc.Spec.Ports[0].Protocol)

	// The status has its own field manager.
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	assert.Contains(t, suite.Managers(got), v1alpha1.FieldManagerStatus+"/Apply")
	for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionProgressing, v1alpha1.ConditionDegraded} {
		assert.NotNil(t, meta.FindStatusCondition(got.Status.Conditions, typ), "condition %s published from the first reconcile", typ)
	}
	assert.Empty(t, got.Status.Endpoint, "no endpoint before the workload is available")
}

// TestEndpointPublishedOnlyWhileAvailable: the endpoint appears when the
// workload becomes available, firstAvailableAt is recorded once, and the
// endpoint is cleared when no replica is available.
func TestEndpointPublishedOnlyWhileAvailable(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)

	suite.MarkDeploymentAvailable(t, key)
	got := suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.Equal(t, fmt.Sprintf("lm://cache.%s.svc.cluster.local:65432", ns), got.Status.Endpoint)
	require.NotNil(t, got.Status.FirstAvailableAt)
	first := *got.Status.FirstAvailableAt
	assert.Equal(t, int32(1), got.Status.ReadyReplicas)

	suite.MarkDeploymentRolling(t, key)
	got = suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	assert.Empty(t, got.Status.Endpoint, "endpoint cleared while no replica is available")
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionProgressing))

	// The status holds times at one-second resolution: let the clock pass
	// the first time by more than a second, so that a firstAvailableAt
	// rewritten on the second availability would differ from the first.
	testutil.Eventually(t, 5*time.Second, func() error {
		if now := metav1.Now(); now.Unix() <= first.Unix()+1 {
			return fmt.Errorf("clock at %s, first available at %s", now, first)
		}
		return nil
	})
	suite.MarkDeploymentAvailable(t, key)
	got = suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.Equal(t, first.Unix(), got.Status.FirstAvailableAt.Unix(), "firstAvailableAt keeps the first time")
	ready := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
	assert.Equal(t, got.Generation, ready.ObservedGeneration)
}

// TestNoOpReconcileSendsNoWrite: once the children exist, reconciles without
// a spec change send no mutating request (dry runs aside) for any child, and
// no child's resourceVersion moves.
func TestNoOpReconcileSendsNoWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 3}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))

	children := []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &autoscalingv2.HorizontalPodAutoscaler{}, &corev1.PersistentVolumeClaim{}}
	keys := map[client.Object]client.ObjectKey{}
	for _, o := range children {
		keys[o] = key
	}
	keys[children[3]] = client.ObjectKey{Namespace: ns, Name: "cache-data"}
	versions := func() []string {
		var out []string
		for _, o := range children {
			require.NoError(t, suite.K8s.Get(ctx, keys[o], o))
			out = append(out, fmt.Sprintf("%T=%s", o, o.GetResourceVersion()))
		}
		return out
	}
	before := versions()

	r, counter := countingReconciler(t)
	for range 3 {
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		require.NoError(t, err)
	}
	assert.Empty(t, counter.Snapshot(), "no mutating request in three reconciles without a spec change")
	assert.Equal(t, before, versions(), "no child's resourceVersion changed")
}

// countingReconciler is a reconciler of its own (a memo of its own too)
// whose every mutating request to the API server counter counts.
func countingReconciler(t *testing.T) (*controller.CacheBackendReconciler, *suite.WriteCounter) {
	t.Helper()
	counter := suite.NewWriteCounter()
	c, err := client.New(counter.Wrap(suite.Cfg), client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)
	return &controller.CacheBackendReconciler{
		Client: c, Applier: apply.New(c), APIReader: c, Prober: suite.Prober,
		Recorder: events.NewFakeRecorder(100), Now: metav1.Now,
	}, counter
}

// TestStatusItWroteIsNotWrittenAgain: a reconciler that wrote the status
// itself (here restoring a changed status.endpoint, which publishes it
// anew with a new endpointPublishedAt) sends no further status write once
// the API server shows its write: what it remembers of the write compares
// equal to what the API server stored (times in whole seconds). It
// remembered the write's nanoseconds, and wrote the status on every
// reconcile of a backend with an endpoint.
func TestStatusItWroteIsNotWrittenAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.ServingBackend(t, ns, "cache")
	key := client.ObjectKeyFromObject(cb)
	want := cb.Status.Endpoint

	r, counter := countingReconciler(t)
	statusWrites := func() int { return counter.Snapshot()["PATCH cachebackends/cache/status"] }
	patch := client.RawPatch(types.MergePatchType, []byte(`{"status":{"endpoint":"lm://elsewhere.example:65432"}}`))
	// This reconciler restores the endpoint (so does the manager's, which
	// may come first: then the status is changed again); whichever writes
	// last, one more write of this reconciler's settles it.
	testutil.Eventually(t, 15*time.Second, func() error {
		if statusWrites() == 0 {
			if err := suite.K8s.Status().Patch(ctx, &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cache"}}, patch); err != nil {
				return err
			}
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
				return err
			}
			if statusWrites() == 0 {
				return fmt.Errorf("the manager restored the endpoint first")
			}
		}
		before := statusWrites()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
			return err
		}
		if got := suite.GetBackend(t, key); got.Status.Endpoint != want {
			return fmt.Errorf("status.endpoint %q, want %q", got.Status.Endpoint, want)
		}
		if statusWrites() != before {
			return fmt.Errorf("%d status writes so far, the last reconcile wrote", statusWrites())
		}
		return nil
	})
	settled := statusWrites()
	for range 3 {
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		require.NoError(t, err)
	}
	assert.Equal(t, settled, statusWrites(), "no status write in three reconciles of a status the API server shows (%v)", counter.Snapshot())
}

// TestForeignLabelSurvivesReconciles: a label another field manager puts on
// the Deployment is not removed by the operator's applies.
func TestForeignLabelSurvivesReconciles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)

	foreign := &unstructured.Unstructured{}
	foreign.SetAPIVersion("apps/v1")
	foreign.SetKind("Deployment")
	foreign.SetNamespace(ns)
	foreign.SetName("cache")
	foreign.SetLabels(map[string]string{"team": "platform"})
	require.NoError(t, suite.K8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(foreign), client.FieldOwner("platform-team")))

	// A spec change makes the operator apply the Deployment for real.
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Image: "example.com/lmcache:v2"}}
	})
	dep := suite.WaitDeployment(t, key, func(d *appsv1.Deployment) error {
		if img := d.Spec.Template.Spec.Containers[0].Image; img != "example.com/lmcache:v2" {
			return fmt.Errorf("image is %s", img)
		}
		return nil
	})
	assert.Equal(t, "platform", dep.Labels["team"], "label of another field manager survives")
	assert.Contains(t, suite.Managers(dep), "platform-team/Apply")
}

// TestSpecChangeUpdatesChildren: port, replicas and resources flow from the
// spec into the Deployment (arguments and probes) and Service.
func TestSpecChangeUpdatesChildren(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{
			Port: 7000, Replicas: ptr.To[int32](3),
			Resources: &corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}},
		}}
	})
	dep := suite.WaitDeployment(t, key, func(d *appsv1.Deployment) error {
		if *d.Spec.Replicas != 3 {
			return fmt.Errorf("replicas %d", *d.Spec.Replicas)
		}
		return nil
	})
	c := dep.Spec.Template.Spec.Containers[0]
	assert.Equal(t, []string{"0.0.0.0", "7000", "cpu"}, c.Args)
	assert.Equal(t, "7000", c.ReadinessProbe.Exec.Command[len(c.ReadinessProbe.Exec.Command)-1], "the probe follows the port")
	assert.Equal(t, int32(7000), c.Ports[0].ContainerPort)
	assert.Equal(t, "2Gi", ptr.To(c.Resources.Requests[corev1.ResourceMemory]).String())
	testutil.Eventually(t, 10*time.Second, func() error {
		svc := &corev1.Service{}
		if err := suite.K8s.Get(ctx, key, svc); err != nil {
			return err
		}
		if svc.Spec.Ports[0].Port != 7000 {
			return fmt.Errorf("service port %d", svc.Spec.Ports[0].Port)
		}
		return nil
	})
}

// TestAutoscalingToggleKeepsReplicaCount: turning autoscaling on creates the
// HPA and hands the replica count over without resetting it to 1; turning
// it off prunes the HPA and applies the spec's count again. Every replica
// value the Deployment takes is recorded through a watch.
func TestAutoscalingToggleKeepsReplicaCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To[int32](2)}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)

	wc, err := client.NewWithWatch(suite.Cfg, client.Options{Scheme: suite.Scheme})
	require.NoError(t, err)
	w, err := wc.Watch(ctx, &appsv1.DeploymentList{}, client.InNamespace(ns))
	require.NoError(t, err)
	defer w.Stop()
	var seen []int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if d, ok := ev.Object.(*appsv1.Deployment); ok && ev.Type != watch.Deleted && d.Spec.Replicas != nil {
				seen = append(seen, *d.Spec.Replicas)
			}
		}
	}()

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MinReplicas: ptr.To[int32](1), MaxReplicas: 5, TargetCPUUtilizationPercentage: ptr.To[int32](70)}
	})
	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	testutil.Eventually(t, 15*time.Second, func() error { return suite.K8s.Get(ctx, key, hpa) })
	assert.Equal(t, int32(5), hpa.Spec.MaxReplicas)
	assert.Equal(t, "Deployment", hpa.Spec.ScaleTargetRef.Kind)
	dep := suite.WaitDeployment(t, key, func(d *appsv1.Deployment) error {
		if slices.Contains(suite.Managers(d), v1alpha1.FieldManagerReplicasHandoff+"/Apply") {
			return nil
		}
		return fmt.Errorf("replicas not handed off yet: %v", suite.Managers(d))
	})
	assert.Equal(t, int32(2), *dep.Spec.Replicas, "replica count kept when the HPA takes over")

	// The HPA scales the workload (as the HPA controller would, through the
	// scale subresource); the operator must not take the count back.
	require.NoError(t, scaleDeployment(ctx, key, 4))
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.RemoteStorage.LMCacheServer.Image = "example.com/lmcache:v3"
	})
	dep = suite.WaitDeployment(t, key, func(d *appsv1.Deployment) error {
		if d.Spec.Template.Spec.Containers[0].Image != "example.com/lmcache:v3" {
			return fmt.Errorf("not applied yet")
		}
		return nil
	})
	assert.Equal(t, int32(4), *dep.Spec.Replicas, "the HPA's count survives an apply")

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Autoscaling = nil
	})
	testutil.Eventually(t, 15*time.Second, func() error {
		err := suite.K8s.Get(ctx, key, &autoscalingv2.HorizontalPodAutoscaler{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("HPA still there: %w", err)
	})
	suite.WaitDeployment(t, key, func(d *appsv1.Deployment) error {
		if *d.Spec.Replicas != 2 {
			return fmt.Errorf("replicas %d, want the spec's 2", *d.Spec.Replicas)
		}
		return nil
	})
	w.Stop()
	<-done
	assert.NotContains(t, seen, int32(1), "replica count never reset to 1; values seen: %v", seen)
}

// TestPVCRetentionIsAnOwnerReference: the shared PVC has no owner by
// default, so deleting the CacheBackend keeps it; whenDeleted=Delete makes
// the CacheBackend its owner, and switching back removes the reference.
// The operator itself never deletes the claim, even when storage is removed.
func TestPVCRetentionIsAnOwnerReference(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	pvcKey := client.ObjectKey{Namespace: ns, Name: "cache-data"}

	pvc := &corev1.PersistentVolumeClaim{}
	testutil.Eventually(t, 15*time.Second, func() error { return suite.K8s.Get(ctx, pvcKey, pvc) })
	assert.Empty(t, pvc.OwnerReferences, "retained by default: no owner")
	assert.Equal(t, "Retain", pvc.Annotations["inferencecache.io/retention-when-deleted"])
	dep := suite.WaitDeployment(t, key, nil)
	assert.Equal(t, appsv1.RecreateDeploymentStrategyType, dep.Spec.Strategy.Type, "ReadWriteOnce claim: one pod at a time")
	assert.Equal(t, "cache-data", dep.Spec.Template.Spec.Volumes[0].PersistentVolumeClaim.ClaimName)

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Storage.PVC.Retention = &v1alpha1.PVCRetention{WhenDeleted: v1alpha1.RetentionDelete}
	})
	testutil.Eventually(t, 15*time.Second, func() error {
		if err := suite.K8s.Get(ctx, pvcKey, pvc); err != nil {
			return err
		}
		if !metav1.IsControlledBy(pvc, cb) {
			return fmt.Errorf("owner references %v", pvc.OwnerReferences)
		}
		return nil
	})

	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) {
		cb.Spec.Storage = nil
	})
	suite.WaitDeployment(t, key, func(d *appsv1.Deployment) error {
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.PersistentVolumeClaim != nil {
				return fmt.Errorf("claim still mounted")
			}
		}
		if d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType {
			return fmt.Errorf("strategy %s", d.Spec.Strategy.Type)
		}
		return nil
	})
	require.NoError(t, suite.K8s.Get(ctx, pvcKey, pvc), "the operator never deletes a claim")
	assert.Nil(t, pvc.DeletionTimestamp)
}

// TestEngineSelectorMatching: matchedEnginePods follows pod creation,
// relabelling and deletion; engineSelectorMessage and the
// EngineSelectorUnmatched event appear when nothing matches.
func TestEngineSelectorMatching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)

	got := suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.EngineSelectorMessage == "" {
			return fmt.Errorf("no selector message yet")
		}
		return nil
	})
	assert.Contains(t, got.Status.EngineSelectorMessage, "app=engine-cache")
	assert.Equal(t, int32(0), got.Status.MatchedEnginePods)
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.EventEngineSelectorUnmatched, 1)
	// Reconciles that still match nothing report nothing new.
	suite.Reconciled(t, key)
	assert.Equal(t, 1, testutil.CountEvents(t, suite.K8s, ns, "cache", v1alpha1.EventEngineSelectorUnmatched), "the first observation is reported once")

	pod := func(name string, labels map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}
	}
	match := map[string]string{"app": "engine-cache", "tier": "gpu"}
	require.NoError(t, suite.K8s.Create(ctx, pod("a", match)))
	require.NoError(t, suite.K8s.Create(ctx, pod("b", match)))
	require.NoError(t, suite.K8s.Create(ctx, pod("other", map[string]string{"app": "other"})))
	matched := func(n int32) func(*v1alpha1.CacheBackend) error {
		return func(cb *v1alpha1.CacheBackend) error {
			if cb.Status.MatchedEnginePods != n {
				return fmt.Errorf("matched %d, want %d", cb.Status.MatchedEnginePods, n)
			}
			return nil
		}
	}
	got = suite.WaitBackend(t, key, matched(2))
	assert.Empty(t, got.Status.EngineSelectorMessage)

	b := &corev1.Pod{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, b))
	b.Labels = map[string]string{"app": "renamed"}
	require.NoError(t, suite.K8s.Update(ctx, b))
	suite.WaitBackend(t, key, matched(1))

	require.NoError(t, suite.K8s.Delete(ctx, pod("a", nil), client.GracePeriodSeconds(0)))
	got = suite.WaitBackend(t, key, matched(0))
	assert.NotEmpty(t, got.Status.EngineSelectorMessage)
	testutil.WaitEvent(t, suite.K8s, ns, "cache", v1alpha1.EventEngineSelectorUnmatched, 2)
	suite.Reconciled(t, key)
	assert.Equal(t, 2, testutil.CountEvents(t, suite.K8s, ns, "cache", v1alpha1.EventEngineSelectorUnmatched), "the drop to zero is reported once")
}

// TestEnginesClaimedByAnotherBackend: two backends whose selectors match
// the same pod (the persistent-statefulset example beside the
// quickstart): the webhook's claimant, the first by name, counts it; the
// other matches no engine of its own and says which backend claims it,
// instead of counting it as its own unwired engine.
func TestEnginesClaimedByAnotherBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	first, second := suite.NewBackend(ns, "a-cache"), suite.NewBackend(ns, "b-cache")
	second.Spec.EngineSelector = first.Spec.EngineSelector
	firstKey := testutil.StartBackend(t, suite.K8s, first)
	secondKey := testutil.StartBackend(t, suite.K8s, second)
	require.NoError(t, suite.K8s.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine", Labels: first.Spec.EngineSelector.MatchLabels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}))
	suite.WaitBackend(t, firstKey, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.MatchedEnginePods != 1 {
			return fmt.Errorf("matched %d, want 1", cb.Status.MatchedEnginePods)
		}
		return nil
	})
	got := suite.WaitBackend(t, secondKey, func(cb *v1alpha1.CacheBackend) error {
		if !strings.Contains(cb.Status.EngineSelectorMessage, "claimed by another CacheBackend") {
			return fmt.Errorf("selector message %q", cb.Status.EngineSelectorMessage)
		}
		return nil
	})
	assert.Equal(t, int32(0), got.Status.MatchedEnginePods)
	assert.Equal(t, int32(0), got.Status.UnwiredEnginePods)
	assert.Contains(t, got.Status.EngineSelectorMessage, "matches 1 pod(s) in namespace "+ns+", each claimed by another CacheBackend (1 by CacheBackend a-cache)")
}

// TestKstatus: kstatus (what Flux and kubectl wait read) computes
// InProgress while the cache server rolls out and Current once it is Ready.
func TestKstatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)

	kstatus := func() status.Status {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("CacheBackend"))
		require.NoError(t, suite.K8s.Get(ctx, key, u))
		res, err := status.Compute(u)
		require.NoError(t, err)
		return res.Status
	}
	suite.MarkDeploymentRolling(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonRolloutInProgress))
	assert.Equal(t, status.InProgressStatus, kstatus())

	suite.MarkDeploymentAvailable(t, key)
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady))
	assert.Equal(t, status.CurrentStatus, kstatus())
}

// scaleDeployment sets the replica count through the scale subresource,
// as the HPA controller does.
func scaleDeployment(ctx context.Context, key client.ObjectKey, n int32) error {
	dep := &appsv1.Deployment{}
	if err := suite.K8s.Get(ctx, key, dep); err != nil {
		return err
	}
	scale := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, ResourceVersion: dep.ResourceVersion},
		Spec:       autoscalingv1.ScaleSpec{Replicas: n},
	}
	return suite.K8s.SubResource("scale").Update(ctx, dep, client.WithSubResourceBody(scale), client.FieldOwner("horizontal-pod-autoscaler"))
}
