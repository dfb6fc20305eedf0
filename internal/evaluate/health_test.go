package evaluate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/workload"
)

func dep(gen, observed int64, replicas, updated, available int32, conds ...appsv1.DeploymentCondition) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Generation: gen},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(replicas)},
		Status: appsv1.DeploymentStatus{
			ObservedGeneration: observed, Replicas: updated, UpdatedReplicas: updated,
			ReadyReplicas: available, AvailableReplicas: available, Conditions: conds,
		},
	}
}

// deployment is the workload of a Deployment-kind backend holding d (absent
// when d is nil).
func deployment(d *appsv1.Deployment) workload.Server {
	return workload.Observed(&v1alpha1.CacheBackend{}, d)
}

var (
	availableTrue  = appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionTrue}
	availableFalse = appsv1.DeploymentCondition{Type: appsv1.DeploymentAvailable, Status: corev1.ConditionFalse}
	progressDone   = appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "NewReplicaSetAvailable"}
	progressing    = appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionTrue, Reason: "ReplicaSetUpdated"}
	deadline       = appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded"}
)

func TestDeploymentHealth(t *testing.T) {
	cases := []struct {
		name                                             string
		dep                                              *appsv1.Deployment
		reason                                           string
		ready, available, progressing, degraded, stalled bool
	}{
		{"not created yet", nil, v1alpha1.ReasonRolloutInProgress, false, false, true, false, false},
		{"spec not observed", dep(2, 1, 1, 1, 1, availableTrue, progressDone), v1alpha1.ReasonRolloutInProgress, false, true, true, false, false},
		{"first rollout", dep(1, 1, 1, 1, 0, availableFalse, progressing), v1alpha1.ReasonRolloutInProgress, false, false, true, false, false},
		{"rolling with replicas available", dep(3, 3, 2, 1, 2, availableTrue, progressing), v1alpha1.ReasonRolloutInProgress, false, true, true, false, false},
		{"deadline exceeded", dep(1, 1, 1, 1, 0, availableFalse, deadline), v1alpha1.ReasonProgressDeadlineExceeded, false, false, false, true, true},
		{"replica lost after rollout", dep(1, 1, 2, 2, 1, availableTrue, progressDone), v1alpha1.ReasonReplicasUnavailable, false, true, false, true, false},
		{"all available", dep(1, 1, 2, 2, 2, availableTrue, progressDone), v1alpha1.ReasonBackendReady, true, true, false, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := Health(deployment(tc.dep))
			assert.Equal(t, tc.reason, h.Reason)
			assert.Equal(t, tc.ready, h.Ready, "ready")
			assert.Equal(t, tc.available, h.Available, "available")
			assert.Equal(t, tc.progressing, h.Progressing, "progressing")
			assert.Equal(t, tc.degraded, h.Degraded, "degraded")
			assert.Equal(t, tc.stalled, h.Stalled, "stalled")
		})
	}
}

// TestObserveServer: only a replacement (a recorded serving pod is gone) or
// a container restart of a serving pod is a change. A replica that is
// merely not Ready (one of a StatefulSet's replicas failing its probe) is
// not, and keeps its recorded identity.
func TestObserveServer(t *testing.T) {
	ready := func(uid string, restarts int32) ServerPod {
		return ServerPod{UID: uid, Restarts: restarts, Ready: true}
	}
	unready := func(uid string, restarts int32) ServerPod { return ServerPod{UID: uid, Restarts: restarts} }
	cases := []struct {
		name    string
		prev    string
		pods    []ServerPod
		changed bool
		next    string
	}{
		{"first observation", "", []ServerPod{ready("a", 0)}, false, "a:0"},
		{"first observation, nothing serves yet", "", []ServerPod{unready("a", 0)}, false, ""},
		{"nothing happened", "a:0", []ServerPod{ready("a", 0)}, false, "a:0"},
		{"replaced", "a:0", []ServerPod{ready("b", 0)}, true, "b:0"},
		{"replaced, the new pod not serving yet", "a:0", []ServerPod{unready("b", 0)}, true, ""},
		{"container restarted", "a:0", []ServerPod{ready("a", 1)}, true, "a:1"},
		{"container restarted, not Ready again yet", "a:0,b:0", []ServerPod{unready("a", 1), ready("b", 0)}, true, "b:0"},
		{"scaled up", "a:0", []ServerPod{ready("a", 0), ready("b", 0)}, false, "a:0,b:0"},
		{"scaled down: b's engines lost their connection", "a:0,b:0", []ServerPod{ready("a", 0)}, true, "a:0"},
		{"one of two replicas not Ready: no change, identity kept", "a:0,b:0", []ServerPod{ready("a", 0), unready("b", 0)}, false, "a:0,b:0"},
		{"the only replica not Ready: no change", "a:0", []ServerPod{unready("a", 0)}, false, "a:0"},
		{"restart counts kept", "a:0,b:2", []ServerPod{ready("a", 0), ready("b", 2)}, false, "a:0,b:2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ObserveServer(tc.prev, tc.pods)
			assert.Equal(t, tc.changed, c.Changed, "changed")
			assert.Equal(t, tc.next, c.Instance, "instance")
		})
	}
}

// TestStatefulSetHealth: the one Health over a StatefulSet: replicas
// created one by one are still rolling out, a lost replica after that is
// unavailable, an older revision left is a rollout.
func TestStatefulSetHealth(t *testing.T) {
	sts := func(replicas, current, ready int32, cur, upd string) *appsv1.StatefulSet {
		return &appsv1.StatefulSet{Spec: appsv1.StatefulSetSpec{Replicas: ptr.To(int32(2))},
			Status: appsv1.StatefulSetStatus{Replicas: replicas, CurrentReplicas: current, UpdatedReplicas: replicas, ReadyReplicas: ready, CurrentRevision: cur, UpdateRevision: upd}}
	}
	cb := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{DeploymentKind: v1alpha1.DeploymentKindStatefulSet}}
	for _, tc := range []struct {
		name   string
		sts    *appsv1.StatefulSet
		reason string
		ready  bool
	}{
		{"not created yet", nil, v1alpha1.ReasonRolloutInProgress, false},
		{"second replica starting", sts(1, 1, 1, "a", "a"), v1alpha1.ReasonRolloutInProgress, false},
		{"replica lost after start", sts(2, 2, 1, "a", "a"), v1alpha1.ReasonReplicasUnavailable, false},
		{"older revision left", sts(2, 2, 2, "a", "b"), v1alpha1.ReasonRolloutInProgress, false},
		{"all ready", sts(2, 2, 2, "a", "a"), v1alpha1.ReasonBackendReady, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := workload.Observed(cb, tc.sts)
			assert.Equal(t, "StatefulSet", w.Kind())
			h := Health(w)
			assert.Equal(t, tc.reason, h.Reason, h.Message)
			assert.Equal(t, tc.ready, h.Ready)
		})
	}
}

// TestObserveServerPerNode: a per-node workload's identity names each
// pod's node, and a change says which nodes' servers were replaced or
// restarted; an identity recorded without nodes (a Deployment's) reads as
// before.
func TestObserveServerPerNode(t *testing.T) {
	on := func(uid, node string, restarts int32) ServerPod {
		return ServerPod{UID: uid, Node: node, Restarts: restarts, Ready: true}
	}
	c := ObserveServer("", []ServerPod{on("b", "y", 0), on("a", "x", 0)})
	assert.Equal(t, "a:0@x,b:0@y", c.Instance)
	assert.False(t, c.Changed)

	c = ObserveServer("a:0@x,b:0@y", []ServerPod{on("a2", "x", 0), on("b", "y", 0)})
	assert.True(t, c.Changed)
	assert.Equal(t, []string{"x"}, c.ChangedNodes, "only x's server was replaced")
	assert.Equal(t, "a2:0@x,b:0@y", c.Instance)

	c = ObserveServer("a:0@x,b:0@y,z1:0@z", []ServerPod{on("a", "x", 1), on("b", "y", 0), on("c", "w", 0)})
	assert.Equal(t, []string{"x", "z"}, c.ChangedNodes, "x restarted, z's server gone; a new node w changes nothing")

	c = ObserveServer("a:0,b:0", []ServerPod{{UID: "a", Ready: true}, {UID: "b", Ready: true}})
	assert.False(t, c.Changed)
	assert.Empty(t, c.ChangedNodes)
	assert.Equal(t, "a:0,b:0", c.Instance)
}

// TestObserveServerMovedToPerNode: a backend whose recorded servers had no
// node (the in-process Deployment) and now runs per-node servers: the
// change concerns every engine, not a node.
func TestObserveServerMovedToPerNode(t *testing.T) {
	c := ObserveServer("dep-pod:0", []ServerPod{{UID: "ds-a", Node: "x", Ready: true}})
	assert.True(t, c.Changed)
	assert.True(t, c.ChangedUnplaced)
	assert.Empty(t, c.ChangedNodes)
	assert.Equal(t, "ds-a:0@x", c.Instance)
}

// TestPerNodeHealthWithNoNode: a multiprocess backend whose DaemonSet
// selects no node is Ready (a GPU pool scaled to zero must not hold the
// engines of a later sync wave), not Available, and says that nothing
// serves yet instead of "0 of 0 replicas available".
func TestPerNodeHealthWithNoNode(t *testing.T) {
	cb := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Multiprocess: &v1alpha1.Multiprocess{}}}
	ds := func(desired, available int32) workload.Server {
		return workload.Observed(cb, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Generation: 1}, Status: appsv1.DaemonSetStatus{ObservedGeneration: 1,
			DesiredNumberScheduled: desired, CurrentNumberScheduled: desired, UpdatedNumberScheduled: desired, NumberReady: available, NumberAvailable: available}})
	}
	h := Health(ds(0, 0))
	assert.True(t, h.Ready)
	assert.False(t, h.Available)
	assert.Equal(t, v1alpha1.ReasonBackendReady, h.Reason)
	assert.Contains(t, h.Message, "no node selected for a server yet")
	assert.Contains(t, h.Message, "no endpoint")

	h = Health(ds(2, 2))
	assert.True(t, h.Ready)
	assert.True(t, h.Available)
	assert.Equal(t, "2 of 2 replicas available", h.Message)
}
