package plan

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/workload"
)

func backend(kind v1alpha1.DeploymentKind, storage string) *v1alpha1.CacheBackend {
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-cache", Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{
			Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM, DeploymentKind: kind,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "engine"}},
		},
	}
	if storage != "" {
		cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse(storage)}}
	}
	return cb
}

func controller(cb *v1alpha1.CacheBackend) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend", Name: cb.Name, UID: cb.UID, Controller: ptr.To(true)}
}

// liveStatefulSet is the StatefulSet as the API server holds it after
// applying cb: its claim templates with the server's defaults.
func liveStatefulSet(cb *v1alpha1.CacheBackend, storage string) *appsv1.StatefulSet {
	sts := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: cb.Namespace, Name: cb.Name, UID: "uid-sts",
		OwnerReferences: []metav1.OwnerReference{*controller(cb)}}}
	sts.Spec.Replicas = ptr.To[int32](2)
	if storage != "" {
		sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{{
			ObjectMeta: metav1.ObjectMeta{Name: render.DataVolumeName},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(storage)}},
				VolumeMode:  ptr.To(corev1.PersistentVolumeFilesystem),
			},
		}}
	}
	return sts
}

func claim(name string, annotations map[string]string) corev1.PersistentVolumeClaim {
	return corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, UID: types.UID("uid-" + name), Annotations: annotations},
		Spec: corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
}

func kinds(p Plan) []string {
	var out []string
	for _, o := range p.Apply {
		out = append(out, o.GetKind())
	}
	return out
}

func reasons(ws []ClaimWarning) map[string]string {
	out := map[string]string{}
	for _, w := range ws {
		out[w.Claim.Name] = w.Reason
	}
	return out
}

func TestStatefulSetStorageHold(t *testing.T) {
	cases := []struct {
		name     string
		spec     string // the spec's storage size, "" for none
		live     string // the live StatefulSet's claim template size
		held     bool
		warnings map[string]string
		applySts bool
	}{
		{"API server defaults are not drift", "1Gi", "1Gi", false, map[string]string{}, true},
		{"a new size cannot be applied: held", "2Gi", "1Gi", true, map[string]string{}, false},
		{"storage added: held", "1Gi", "", true, map[string]string{}, false},
		{"storage removed: held, and its mounted claims are not orphans", "", "1Gi", true, map[string]string{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cb := backend(v1alpha1.DeploymentKindStatefulSet, tc.spec)
			in := Input{Backend: cb, Workload: workload.Observed(cb, liveStatefulSet(cb, tc.live)),
				Claims: []corev1.PersistentVolumeClaim{claim("cache-data-cache-0", nil), claim("cache-data-cache-1", nil)}}
			p, err := Build(in)
			require.NoError(t, err)
			hold := p.WorkloadHold()
			assert.Equal(t, tc.held, hold != nil, "held")
			if tc.held {
				assert.Equal(t, v1alpha1.ReasonImmutableStatefulSetStorage, hold.Reason)
				assert.Contains(t, hold.Message, "cannot change")
			}
			assert.Equal(t, tc.applySts, containsKind(kinds(p), "StatefulSet"), "StatefulSet applied")
			assert.Contains(t, kinds(p), "Service", "the rest is still applied")
			assert.Equal(t, tc.warnings, reasons(p.ClaimWarnings))
		})
	}
}

func containsKind(kinds []string, k string) bool {
	for _, have := range kinds {
		if have == k {
			return true
		}
	}
	return false
}

func TestClaimWarnings(t *testing.T) {
	warned := map[string]string{v1alpha1.AnnotationWarnedPrefix + v1alpha1.EventOrphanedPVCRetained: "true"}
	cases := []struct {
		name   string
		cb     *v1alpha1.CacheBackend
		live   *appsv1.StatefulSet
		claims []corev1.PersistentVolumeClaim
		want   map[string]string
	}{
		{"storage removed from a Deployment: the shared claim is orphaned", backend("", ""), nil,
			[]corev1.PersistentVolumeClaim{claim("cache-data", nil)}, map[string]string{"cache-data": v1alpha1.EventOrphanedPVCRetained}},
		{"warned once", backend("", ""), nil,
			[]corev1.PersistentVolumeClaim{claim("cache-data", warned)}, map[string]string{}},
		{"switched to a StatefulSet with storage: the shared claim is retained", backend(v1alpha1.DeploymentKindStatefulSet, "1Gi"), nil,
			[]corev1.PersistentVolumeClaim{claim("cache-data", nil)}, map[string]string{"cache-data": v1alpha1.EventSharedPVCRetained}},
		{"switched to a Deployment: per-replica claims are orphaned", backend("", "1Gi"), nil,
			[]corev1.PersistentVolumeClaim{claim("cache-data-cache-0", nil)}, map[string]string{"cache-data-cache-0": v1alpha1.EventOrphanedPVCRetained}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Backend: tc.cb, Claims: tc.claims}
			if tc.live != nil {
				in.Workload = workload.Observed(tc.cb, tc.live)
			}
			p, err := Build(in)
			require.NoError(t, err)
			assert.Equal(t, tc.want, reasons(p.ClaimWarnings))
		})
	}
}

func TestSharedClaimChangesAreHeldBack(t *testing.T) {
	live := claim("cache-data", nil)
	live.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("5Gi")
	live.Spec.StorageClassName = ptr.To("fast")

	smaller := backend("", "1Gi")
	p, err := Build(Input{Backend: smaller, Claims: []corev1.PersistentVolumeClaim{live}})
	require.NoError(t, err)
	assert.NotContains(t, kinds(p), "PersistentVolumeClaim", "a claim never shrinks: not applied")
	assert.Contains(t, p.StorageNote, "claims never shrink")
	require.Len(t, p.ClaimWarnings, 1)
	assert.Equal(t, "size-1Gi", p.ClaimWarnings[0].Value)

	otherClass := backend("", "5Gi")
	otherClass.Spec.Storage.PVC.StorageClassName = ptr.To("slow")
	p, err = Build(Input{Backend: otherClass, Claims: []corev1.PersistentVolumeClaim{live}})
	require.NoError(t, err)
	assert.NotContains(t, kinds(p), "PersistentVolumeClaim")
	assert.Contains(t, p.StorageNote, "immutable")

	larger := backend("", "9Gi")
	larger.Spec.Storage.PVC.StorageClassName = ptr.To("fast")
	p, err = Build(Input{Backend: larger, Claims: []corev1.PersistentVolumeClaim{live}})
	require.NoError(t, err)
	assert.Contains(t, kinds(p), "PersistentVolumeClaim", "a claim grows")
	assert.Empty(t, p.StorageNote)
}

// TestPruneOwnership: only children the backend controls (by UID) and no
// longer wants are pruned; held, wanted, foreign-controlled and unowned
// objects are never deleted.
func TestPruneOwnership(t *testing.T) {
	cb := backend("", "")
	cb.Spec.Autoscaling = nil
	mine := controller(cb)
	other := &metav1.OwnerReference{Kind: "CacheBackend", Name: cb.Name, UID: "uid-of-a-deleted-backend", Controller: ptr.To(true)}
	notABackend := &metav1.OwnerReference{Kind: "Rollout", Name: cb.Name, UID: cb.UID, Controller: ptr.To(true)}
	live := []Child{
		{Kind: "Deployment", Namespace: "llm", Name: "cache", UID: "1", Controller: mine},              // wanted
		{Kind: "Service", Namespace: "llm", Name: "cache", UID: "2", Controller: mine},                 // wanted
		{Kind: "HorizontalPodAutoscaler", Namespace: "llm", Name: "cache", UID: "3", Controller: mine}, // no longer wanted
		{Kind: "StatefulSet", Namespace: "llm", Name: "cache", UID: "4", Controller: mine},             // kind switched
		{Kind: "Service", Namespace: "llm", Name: "copied", UID: "5"},                                  // label copied by hand
		{Kind: "Service", Namespace: "llm", Name: "foreign", UID: "6", Controller: other},              // another backend's uid
		{Kind: "Service", Namespace: "llm", Name: "adopted", UID: "7", Controller: notABackend},        // another controller
	}
	p, err := Build(Input{Backend: cb, Children: live})
	require.NoError(t, err)
	var pruned []string
	for _, c := range p.Prune {
		pruned = append(pruned, c.Subject())
	}
	assert.Equal(t, []string{"HorizontalPodAutoscaler/llm/cache", "StatefulSet/llm/cache"}, pruned)

	// A held StatefulSet is never pruned.
	sts := backend(v1alpha1.DeploymentKindStatefulSet, "2Gi")
	sts.UID = cb.UID
	p, err = Build(Input{Backend: sts, Workload: workload.Observed(sts, liveStatefulSet(sts, "1Gi")), Children: live})
	require.NoError(t, err)
	require.NotNil(t, p.WorkloadHold())
	for _, c := range p.Prune {
		assert.NotEqual(t, "StatefulSet", c.Kind, "the held StatefulSet is pruned")
	}
}

// TestReplicaHandoff: the hand-off runs once, when the operator's field
// manager applied spec.replicas and an HPA now owns them.
func TestReplicaHandoff(t *testing.T) {
	owns := func(manager string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationApply,
			FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:replicas":{}}}`)}
	}
	update := metav1.ManagedFieldsEntry{Manager: v1alpha1.FieldManagerChildren, Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:replicas":{}}}`)}
	cases := []struct {
		name    string
		entries []metav1.ManagedFieldsEntry
		want    bool
	}{
		{"the operator applied replicas", []metav1.ManagedFieldsEntry{owns(v1alpha1.FieldManagerChildren)}, true},
		{"already handed off", []metav1.ManagedFieldsEntry{owns(v1alpha1.FieldManagerChildren), owns(v1alpha1.FieldManagerReplicasHandoff)}, false},
		{"another manager owns them", []metav1.ManagedFieldsEntry{owns("kubectl")}, false},
		{"an update, not an apply", []metav1.ManagedFieldsEntry{update}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cb := backend("", "")
			cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 4}
			dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", ManagedFields: tc.entries}}
			dep.Spec.Replicas = ptr.To[int32](3)
			p, err := Build(Input{Backend: cb, Workload: workload.Observed(cb, dep)})
			require.NoError(t, err)
			if !tc.want {
				assert.Empty(t, p.Handoffs)
				return
			}
			require.Len(t, p.Handoffs, 1)
			assert.Equal(t, Handoff{Kind: "Deployment", Namespace: "llm", Name: "cache", Replicas: 3}, p.Handoffs[0])
		})
	}
	// Without an HPA the operator keeps applying replicas: no hand-off.
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", ManagedFields: []metav1.ManagedFieldsEntry{owns(v1alpha1.FieldManagerChildren)}}}
	dep.Spec.Replicas = ptr.To[int32](3)
	b := backend("", "")
	p, err := Build(Input{Backend: b, Workload: workload.Observed(b, dep)})
	require.NoError(t, err)
	assert.Empty(t, p.Handoffs)
}

func TestEngineLocalPlansNothing(t *testing.T) {
	cb := backend("", "")
	cb.Spec.Type, cb.Spec.Runtime = v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang
	p, err := Build(Input{Backend: cb, Children: []Child{{Kind: "Service", Name: "cache", Controller: controller(cb)}}})
	require.NoError(t, err)
	assert.True(t, p.EngineLocal)
	assert.Empty(t, p.Apply)
	assert.Empty(t, p.Prune)
}

// TestConflicts: which objects under a child's name the backend owns. It
// never adopts: only what it controls (by UID), and claims carrying its
// name's label without a foreign controller (retained by an earlier
// CacheBackend of the same name, or created by its StatefulSet).
func TestConflicts(t *testing.T) {
	cb := backend(v1alpha1.DeploymentKindDeployment, "1Gi")
	mine := controller(cb)
	other := &metav1.OwnerReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend", Name: "cache", UID: "uid-previous", Controller: ptr.To(true)}
	sts := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "cache", UID: "uid-sts", Controller: ptr.To(true)}
	otherSts := &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db", UID: "uid-db", Controller: ptr.To(true)}
	labelled := map[string]string{render.LabelCacheBackend: "cache"}
	cases := []struct {
		name     string
		existing Child
		conflict bool
	}{
		{"our Service", Child{Kind: "Service", Name: "cache", Controller: mine}, false},
		{"a Service without owner", Child{Kind: "Service", Name: "cache"}, true},
		{"a Service with our labels but no owner", Child{Kind: "Service", Name: "cache", Labels: labelled}, true},
		{"a Service of a CacheBackend of the same name, deleted", Child{Kind: "Service", Name: "cache", Controller: other}, true},
		{"a Deployment of someone else", Child{Kind: "Deployment", Name: "cache", Controller: otherSts}, true},
		{"our HPA", Child{Kind: "HorizontalPodAutoscaler", Name: "cache", Controller: mine}, false},
		{"our shared claim (retention Delete)", Child{Kind: "PersistentVolumeClaim", Name: "cache-data", Controller: mine}, false},
		{"a shared claim retained earlier", Child{Kind: "PersistentVolumeClaim", Name: "cache-data", Labels: labelled}, false},
		{"a shared claim without our label", Child{Kind: "PersistentVolumeClaim", Name: "cache-data"}, true},
		{"a shared claim labelled for another name", Child{Kind: "PersistentVolumeClaim", Name: "cache-data", Labels: map[string]string{render.LabelCacheBackend: "other"}}, true},
		{"a shared claim of a previous backend, not yet collected", Child{Kind: "PersistentVolumeClaim", Name: "cache-data", Labels: labelled, Controller: other}, true},
		{"a shared claim controlled by a StatefulSet", Child{Kind: "PersistentVolumeClaim", Name: "cache-data", Labels: labelled, Controller: sts}, true},
		{"a replica claim of our StatefulSet", Child{Kind: "PersistentVolumeClaim", Name: "cache-data-cache-0", Labels: labelled, Controller: sts}, false},
		{"a replica claim retained earlier", Child{Kind: "PersistentVolumeClaim", Name: "cache-data-cache-1", Labels: labelled}, false},
		{"a replica claim of another StatefulSet", Child{Kind: "PersistentVolumeClaim", Name: "cache-data-cache-0", Labels: labelled, Controller: otherSts}, true},
		{"a replica claim without our label", Child{Kind: "PersistentVolumeClaim", Name: "cache-data-cache-0"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Conflicts(cb, []Child{c.existing})
			if !c.conflict {
				assert.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			assert.Contains(t, got[0].Message, c.existing.Kind+" "+c.existing.Name)
		})
	}
}

// TestBuildStopsAtAConflict: with a conflict the plan writes nothing: no
// apply, no prune, no claim warning.
func TestBuildStopsAtAConflict(t *testing.T) {
	cb := backend(v1alpha1.DeploymentKindDeployment, "1Gi")
	p, err := Build(Input{Backend: cb,
		Existing: []Child{{Kind: "Service", Namespace: "llm", Name: "cache"}},
		Children: []Child{{Kind: "StatefulSet", Namespace: "llm", Name: "cache", Controller: controller(cb)}},
	})
	require.NoError(t, err)
	assert.Empty(t, p.Apply)
	assert.Empty(t, p.Prune)
	assert.Empty(t, p.ClaimWarnings)
	assert.Contains(t, p.ConflictMessage(), "Service cache exists and is not owned by this CacheBackend (no controller)")
}

func TestIsReplicaClaim(t *testing.T) {
	cb := backend(v1alpha1.DeploymentKindStatefulSet, "1Gi")
	for name, want := range map[string]bool{
		"cache-data-cache-0": true, "cache-data-cache-12": true, "cache-data-cache-": false,
		"cache-data-cache-x-0": false, "cache-data": false, "data-cache-0": false,
	} {
		assert.Equal(t, want, IsReplicaClaim(cb, name), name)
	}
}
