package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
)

// claimTemplateDrift compares the claim templates the spec asks for with a
// live StatefulSet's, on the fields the operator sets only (name, access
// modes, storage request, storage class), so that fields the API server
// defaults (volumeMode, an empty dataSource) never count as drift. It
// returns a description of the first difference, or "".
func claimTemplateDrift(want []corev1ac.PersistentVolumeClaimApplyConfiguration, live []corev1.PersistentVolumeClaim) string {
	if len(want) != len(live) {
		return fmt.Sprintf("the spec asks for %d volumeClaimTemplates, the StatefulSet has %d", len(want), len(live))
	}
	for i := range want {
		w, l := want[i], live[i]
		if w.Name == nil || *w.Name != l.Name {
			return fmt.Sprintf("volumeClaimTemplate %q is not %q", l.Name, deref(w.Name))
		}
		if w.Spec == nil {
			continue
		}
		if !slices.Equal(w.Spec.AccessModes, l.Spec.AccessModes) {
			return fmt.Sprintf("accessModes %v, the StatefulSet has %v", w.Spec.AccessModes, l.Spec.AccessModes)
		}
		if w.Spec.Resources != nil && w.Spec.Resources.Requests != nil {
			ws, ls := (*w.Spec.Resources.Requests)[corev1.ResourceStorage], l.Spec.Resources.Requests[corev1.ResourceStorage]
			if ws.Cmp(ls) != 0 {
				return fmt.Sprintf("size %s, the StatefulSet has %s", ws.String(), ls.String())
			}
		}
		if deref(w.Spec.StorageClassName) != deref(l.Spec.StorageClassName) {
			return fmt.Sprintf("storageClassName %q, the StatefulSet has %q", deref(w.Spec.StorageClassName), deref(l.Spec.StorageClassName))
		}
	}
	return ""
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Storage event reasons.
const (
	// EventSharedPVCRetained: a Deployment backend's shared claim is kept,
	// unmounted, after a switch to StatefulSet with per-replica claims.
	EventSharedPVCRetained = "SharedPVCRetained"
	// EventOrphanedPVCRetained: a claim is kept, unmounted, after storage
	// was removed or the workload kind changed.
	EventOrphanedPVCRetained = "OrphanedPVCRetained"
	// EventStorageChangeRejected: the spec asks for a storage class or a
	// smaller size the existing shared claim cannot take.
	EventStorageChangeRejected = "StorageChangeRejected"
	// ReasonImmutableStatefulSetStorage: the spec's storage differs from the
	// live StatefulSet's volumeClaimTemplates, which cannot change.
	ReasonImmutableStatefulSetStorage = "ImmutableStatefulSetStorage"

	// annotationWarnedPrefix + reason marks a claim once warned for reason.
	annotationWarnedPrefix = "inferencecache.io/warned-"
	// PVCWarningsManager is the field manager of those marks.
	PVCWarningsManager = "inferencecache-operator-pvc-warnings"
)

// reconcileClaims looks at the backend's claims before the apply. It holds
// back a shared-claim change the API server cannot make (another storage
// class, a smaller size) and says so; it warns once per claim and reason
// about claims kept but no longer mounted; and it records the shared claim's
// capacity (Deployment kind only). The claims are never deleted here. The
// returned note, if any, is added to the Ready message.
func (r *CacheBackendReconciler) reconcileClaims(ctx context.Context, cb *v1alpha1.CacheBackend, children *render.Children, st *v1alpha1.CacheBackendStatus) (string, error) {
	var claims corev1.PersistentVolumeClaimList
	if err := r.APIReader.List(ctx, &claims, client.InNamespace(cb.Namespace), client.MatchingLabels{render.LabelCacheBackend: cb.Name}); err != nil {
		return "", fmt.Errorf("listing claims: %w", err)
	}
	st.Capacity = nil
	perReplica := render.DataVolumeName + "-" + cb.Name + "-"
	wantsPerReplica := render.IsStatefulSet(cb) && cb.Spec.Storage != nil && cb.Spec.Storage.PVC != nil
	var note string
	for i := range claims.Items {
		pvc := &claims.Items[i]
		switch {
		case pvc.Name == render.PVCName(cb) && children.PVC != nil:
			if n := r.sharedClaimChange(ctx, cb, children, pvc); n != "" {
				note = n
			}
			if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok && pvc.Status.Phase == corev1.ClaimBound {
				st.Capacity = &q
			}
		case pvc.Name == render.PVCName(cb) && wantsPerReplica:
			if err := r.warnOnce(ctx, cb, pvc, EventSharedPVCRetained, "",
				fmt.Sprintf("claim %s of the Deployment kind is kept but no longer mounted: the StatefulSet uses per-replica claims; copy its data and delete it when done", pvc.Name)); err != nil {
				return "", err
			}
		case pvc.Name == render.PVCName(cb), strings.HasPrefix(pvc.Name, perReplica) && !wantsPerReplica:
			if err := r.warnOnce(ctx, cb, pvc, EventOrphanedPVCRetained, "",
				fmt.Sprintf("claim %s is kept but no longer mounted (storage removed or workload kind changed); delete it when its data is not needed", pvc.Name)); err != nil {
				return "", err
			}
		}
	}
	return note, nil
}

// sharedClaimChange holds back a change of the shared claim that the API
// server would refuse, and warns once per requested value.
func (r *CacheBackendReconciler) sharedClaimChange(ctx context.Context, cb *v1alpha1.CacheBackend, children *render.Children, pvc *corev1.PersistentVolumeClaim) string {
	want := cb.Spec.Storage.PVC
	var msg, value string
	if want.StorageClassName != nil && deref(pvc.Spec.StorageClassName) != *want.StorageClassName {
		value = "class-" + *want.StorageClassName
		msg = fmt.Sprintf("storageClassName %q cannot be applied: claim %s has class %q and a claim's class is immutable; move the data to a new claim to change it", *want.StorageClassName, pvc.Name, deref(pvc.Spec.StorageClassName))
	} else if have := pvc.Spec.Resources.Requests[corev1.ResourceStorage]; want.Size.Cmp(have) < 0 {
		value = "size-" + want.Size.String()
		msg = fmt.Sprintf("size %s cannot be applied: claim %s requests %s and claims never shrink", want.Size.String(), pvc.Name, have.String())
	}
	if msg == "" {
		return ""
	}
	children.PVC = nil
	if err := r.warnOnce(ctx, cb, pvc, EventStorageChangeRejected, value, msg); err != nil {
		log.FromContext(ctx).Error(err, "recording a rejected storage change")
	}
	return msg
}

// warnOnce records a Warning event about pvc for reason unless the claim
// already carries the mark for reason (and value), then marks it.
func (r *CacheBackendReconciler) warnOnce(ctx context.Context, cb *v1alpha1.CacheBackend, pvc *corev1.PersistentVolumeClaim, reason, value, msg string) error {
	key := annotationWarnedPrefix + reason
	if value == "" {
		value = "true"
	}
	if pvc.Annotations[key] == value {
		return nil
	}
	if err := applyAnnotation(ctx, r.Client, "PersistentVolumeClaim", pvc, key, value, PVCWarningsManager); err != nil {
		return fmt.Errorf("marking claim %s: %w", pvc.Name, err)
	}
	r.Recorder.Eventf(cb, pvc, corev1.EventTypeWarning, reason, "Reconcile", "%s", msg)
	return nil
}
