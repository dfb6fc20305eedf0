package rollout

import (
	"cmp"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/workload"
	"github.com/inferencecache/operator/test/testutil"
)

// TestRolls is the roll plan's table: when the cascade and the heal roll,
// wait, or leave the recorded server instance alone.
func TestRolls(t *testing.T) {
	value := InstanceHash("new:0")
	dep := func(name, carries string) Candidate {
		return Candidate{Workload: Workload{"Deployment", name}, Found: true, Carries: carries}
	}
	ready := RollState{Policy: v1alpha1.EngineRestartOnServerChange, Instance: "new:0", ServerAvailable: true, Ready: true, Settled: true}
	with := func(f func(*RollState)) RollState { s := ready; f(&s); return s }
	// In multiprocess mode the rolls write the publication's hash, which
	// stays while node servers come and go (the instance grows).
	published := "tcp://mp.llm.svc.cluster.local:5555@2026-12-05T12:00:00Z"
	mp := func(s *RollState) { s.Multiprocess, s.Published = true, published }
	for _, tc := range []struct {
		name         string
		state        RollState
		wired, early []Candidate
		cascade      []string
		heal         []string
		wait, record bool
		healing      bool
		// value is what the rolls write when not InstanceHash("new:0").
		value string
	}{
		{name: "at rest: the instance is recorded", state: ready, record: true},
		{name: "no serving pod: nothing recorded", state: with(func(s *RollState) { s.Instance = "" })},
		{name: "engine-local: nothing", state: with(func(s *RollState) { s.EngineLocal, s.Changed = true, true }), wired: []Candidate{dep("a", "")}},
		{name: "apply failed: nothing", state: with(func(s *RollState) { s.ApplyFailed, s.Changed = true, true }), wired: []Candidate{dep("a", "")}},
		{name: "server changed: the wired workloads roll", state: with(func(s *RollState) { s.Changed = true }),
			wired: []Candidate{dep("b", ""), dep("a", "")}, cascade: []string{"Deployment/a", "Deployment/b"}, record: true},
		{name: "server changed, one rolled already", state: with(func(s *RollState) { s.Changed = true }),
			wired: []Candidate{dep("a", value), dep("b", "old")}, cascade: []string{"Deployment/b"}, record: true},
		{name: "server changed, not settled: wait, keep the recorded instance", state: with(func(s *RollState) { s.Changed, s.Settled = true, false }), wait: true},
		{name: "server changed, not available: wait", state: with(func(s *RollState) { s.Changed, s.ServerAvailable = true, false }), wait: true},
		{name: "server changed, policy Never: recorded, nothing rolls", state: with(func(s *RollState) { s.Changed, s.Policy = true, v1alpha1.EngineRestartNever }),
			wired: []Candidate{dep("a", "")}, record: true},
		{name: "early pods: healed", state: with(func(s *RollState) { s.Early = true }),
			early: []Candidate{dep("e", "")}, heal: []string{"Deployment/e"}, record: true, healing: true},
		{name: "early pods, not settled: wait", state: with(func(s *RollState) { s.Early, s.Settled = true, false }),
			early: []Candidate{dep("e", "")}, wait: true, record: true},
		{name: "early pods, not Ready: nothing", state: with(func(s *RollState) { s.Early, s.Ready = true, false }),
			early: []Candidate{dep("e", "")}, record: true},
		{name: "early pods, multiprocess, not Ready (a node without a server): healed once settled", state: with(func(s *RollState) { mp(s); s.Early, s.Ready = true, false }),
			early: []Candidate{dep("e", "")}, heal: []string{"Deployment/e"}, record: true, healing: true, value: InstanceHash(published)},
		{name: "early pods, multiprocess, not settled: wait", state: with(func(s *RollState) { mp(s); s.Early, s.Ready, s.Settled = true, false, false }),
			early: []Candidate{dep("e", "")}, wait: true, record: true},
		{name: "early pods, multiprocess, healed already, another node's server came up since: not rolled again",
			state: with(func(s *RollState) { mp(s); s.Early, s.Ready, s.Instance = true, false, "new:0@x,c:0@z" }),
			early: []Candidate{dep("e", InstanceHash(published))}, record: true, healing: true},
		{name: "early pods, multiprocess, endpoint not published (withdrawn, or no publication time): nothing, no wait",
			state: with(func(s *RollState) { mp(s); s.Early, s.Ready, s.Published, s.Settled = true, false, "", false }),
			early: []Candidate{dep("e", "")}, record: true},
		{name: "early pods, multiprocess, Ready without a publication time: healed with the instance's hash",
			state: with(func(s *RollState) { mp(s); s.Early, s.Published = true, "" }),
			early: []Candidate{dep("e", "")}, heal: []string{"Deployment/e"}, record: true, healing: true},
		{name: "multiprocess, moved from the in-process server: the wired workloads roll with the publication's hash",
			state: with(func(s *RollState) { mp(s); s.Changed = true }),
			wired: []Candidate{dep("a", value)}, cascade: []string{"Deployment/a"}, record: true, value: InstanceHash(published)},
		{name: "early pods, keys unavailable: nothing", state: with(func(s *RollState) { s.Early, s.KeysUnavailable = true, true }),
			early: []Candidate{dep("e", "")}, record: true},
		{name: "early pods, policy Never: nothing", state: with(func(s *RollState) { s.Early, s.Policy = true, v1alpha1.EngineRestartNever }),
			early: []Candidate{dep("e", "")}, record: true},
		{name: "early pods of no workload: not healing", state: with(func(s *RollState) { s.Early = true }), record: true},
		{name: "a workload both wired and early rolls once, for the server change", state: with(func(s *RollState) { s.Changed, s.Early = true, true }),
			wired: []Candidate{dep("a", "")}, early: []Candidate{dep("a", ""), dep("e", value)}, cascade: []string{"Deployment/a"}, record: true, healing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := Rolls(tc.state, tc.wired, tc.early)
			names := func(c RollCause) []string {
				var out []string
				for _, w := range p.Workloads(c) {
					out = append(out, w.String())
				}
				return out
			}
			assert.Equal(t, tc.cascade, names(CauseServerChange), "cascade")
			assert.Equal(t, tc.heal, names(CauseAdmittedBeforeEndpoint), "heal")
			want := cmp.Or(tc.value, value)
			for _, r := range p.Rolls {
				assert.Equal(t, want, r.Value)
			}
			assert.Equal(t, tc.wait, p.Wait > 0, "wait")
			assert.Equal(t, tc.record, p.Record, "record")
			assert.Equal(t, tc.healing, p.Healing, "healing")
		})
	}
}

// TestRollsPerNode is the per-node cascade's table (multiprocess mode): a
// server replaced or restarted on a node evicts the wired engine pods of
// that node created before its new server started, once it is ready;
// engines of other nodes, pods created after, and workloads are left
// alone.
func TestRollsPerNode(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	since := t0.Add(time.Minute)
	ready := RollState{Policy: v1alpha1.EngineRestartOnServerChange, Instance: "new:0@x,b:0@y", ServerAvailable: true, Ready: true, Settled: true,
		PerNode: true, Changed: true, ChangedNodes: []string{"x"}, Now: since.Add(2 * time.Second),
		NodeServers: map[string]NodeServer{"x": {Ready: true, Since: since}, "y": {Ready: true, Since: t0}}}
	with := func(f func(*RollState)) RollState { s := ready; f(&s); return s }
	pods := []EnginePod{
		{Name: "e-2", Node: "x", Created: t0}, {Name: "e-1", Node: "x", Created: t0},
		{Name: "e-y", Node: "y", Created: t0},
		{Name: "e-same-second", Node: "x", Created: since},
		{Name: "e-new", Node: "x", Created: since.Add(time.Second)},
	}
	wired := []Candidate{{Workload: Workload{"Deployment", "engine"}, Found: true}}
	for _, tc := range []struct {
		name         string
		state        RollState
		evict        []string
		wait, record bool
	}{
		{name: "node x replaced: its older engine pods go, sorted", state: ready, evict: []string{"x/e-1", "x/e-2", "x/e-same-second"}, record: true},
		{name: "less than a second since x's server started: wait", state: with(func(s *RollState) { s.Now = since.Add(999 * time.Millisecond) }), wait: true},
		{name: "x's new server not ready: wait, keep the recorded instance", state: with(func(s *RollState) {
			s.NodeServers = map[string]NodeServer{"x": {Since: since}, "y": {Ready: true, Since: t0}}
		}), wait: true},
		{name: "x's new server not created yet: wait", state: with(func(s *RollState) {
			s.NodeServers = map[string]NodeServer{"y": {Ready: true, Since: t0}}
			s.ServersMissing = true
		}), wait: true},
		{name: "x has no server any more: nothing to reconnect to", state: with(func(s *RollState) {
			s.NodeServers = map[string]NodeServer{"y": {Ready: true, Since: t0}}
		}), record: true},
		{name: "not settled: wait", state: with(func(s *RollState) { s.Settled = false }), wait: true},
		{name: "policy Never: recorded, nothing evicted", state: with(func(s *RollState) { s.Policy = v1alpha1.EngineRestartNever }), record: true},
		{name: "no change: nothing", state: with(func(s *RollState) { s.Changed, s.ChangedNodes = false, nil }), record: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := RollsPerNode(tc.state, wired, nil, pods)
			var got []string
			for _, e := range p.Evictions {
				got = append(got, e.Node+"/"+e.Pod)
			}
			assert.Equal(t, tc.evict, got)
			assert.Empty(t, p.Rolls, "per-node servers roll no workload")
			assert.Equal(t, tc.wait, p.Wait > 0, "wait")
			assert.Equal(t, tc.record, p.Record, "record")
		})
	}
}

// TestServersMissingCountsUnscheduledPods: a node waits for its server
// when fewer nodes have a server pod than the DaemonSet wants; a pod not
// scheduled yet counts for the node its DaemonSet made it for: one that
// stays Pending (a node too small for it) keeps no changed node gone for
// good waiting, and a replacement being scheduled on the changed node is
// waited for (not ready), not taken for the node's end.
func TestServersMissingCountsUnscheduledPods(t *testing.T) {
	yes := true
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-cb"},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Multiprocess: &v1alpha1.Multiprocess{}}}
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-ds",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend", Name: "mp", UID: cb.UID, Controller: &yes}}},
		Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 3}}
	w, err := workload.Read(context.Background(), fake.NewClientBuilder().WithScheme(testutil.Scheme()).WithObjects(ds).Build(), cb)
	require.NoError(t, err)
	require.True(t, w.PerNode())
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	pod := func(name, node, madeFor string, ready bool) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name), CreationTimestamp: metav1.NewTime(t0)}, Spec: corev1.PodSpec{NodeName: node}}
		if madeFor != "" {
			p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{madeFor}}}}}}}}
		}
		if ready {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return p
	}
	a, b := pod("a", "gpu-a", "gpu-a", true), pod("b", "gpu-b", "gpu-b", true)
	for _, tc := range []struct {
		name    string
		changed string
		pods    []corev1.Pod
		missing bool
		wait    bool
	}{
		{"gpu-c gone for good, gpu-small's server Pending: recorded", "gpu-c", []corev1.Pod{a, b, pod("small", "", "gpu-small", false)}, false, false},
		{"gpu-b's replacement not scheduled yet: waited for", "gpu-b", []corev1.Pod{a, pod("b2", "", "gpu-b", false), pod("small", "", "gpu-small", false)}, false, true},
		{"gpu-b's replacement not created yet: missing, waited for", "gpu-b", []corev1.Pod{a, pod("small", "", "gpu-small", false)}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := RollState{Policy: v1alpha1.EngineRestartOnServerChange, Instance: "a:0@gpu-a", Changed: true, ServerAvailable: true, Settled: true}
			s.SetPerNode(w, evaluate.ServerPods(tc.pods, true), evaluate.ServerChange{Changed: true, ChangedNodes: []string{tc.changed}}, t0.Add(time.Minute))
			assert.Equal(t, tc.missing, s.ServersMissing, "missing")
			p := RollsPerNode(s, nil, nil, nil)
			assert.Equal(t, tc.wait, p.Wait > 0, "wait")
			assert.Equal(t, !tc.wait, p.Record, "record")
		})
	}
}
