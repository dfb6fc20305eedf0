// Package plan decides, without touching a cluster, what one reconcile of a
// CacheBackend does to its children: render the objects it wants, then
// apply the rules the API server imposes on them (a StatefulSet's claim
// templates and a claim's class never change, a claim never shrinks, an
// autoscaler takes over a workload's replica count). The result is a value
// (Plan) that says what is applied, what is held and why, what is pruned
// and which claims are warned about. The controller executes it
// (internal/apply) and the CLI previews it with server-side dry runs, so the
// two can never disagree.
package plan

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/workload"
)

// Input is the cluster state a plan is built from, as Gather reads it.
type Input struct {
	// Backend is the CacheBackend with the UID of the live object, so that
	// owner references name it.
	Backend *v1alpha1.CacheBackend
	// Workload is the cache-server workload of the kind the spec asks for:
	// live when Backend controls it, absent otherwise (nil reads as absent).
	Workload workload.Server
	// Rendered are the children Backend wants (render.RenderWith, with the
	// Options of Workload), rendered once per reconcile by Gather; Build
	// renders them when unset.
	Rendered *render.Children
	// Claims are the PersistentVolumeClaims labelled with Backend's name.
	Claims []corev1.PersistentVolumeClaim
	// Children are the live objects of the prunable kinds labelled with
	// Backend's name, whoever controls them.
	Children []Child
	// Existing are the live objects under the names the plan writes (every
	// child it renders, and the StatefulSet's per-replica claims), whoever
	// controls them and whatever their labels.
	Existing []Child
}

// Child is one live object of a prunable kind.
type Child struct {
	Kind      string
	Namespace string
	Name      string
	UID       types.UID
	// Controller is the object's controller reference, nil without one.
	Controller *metav1.OwnerReference
	// Labels are the object's labels (Existing only).
	Labels map[string]string
}

// Conflict is an object under a child's name that the backend does not
// own: the plan writes nothing while there is one.
type Conflict struct {
	Kind    string
	Name    string
	Message string
}

// Subject names a child for people, e.g. "Deployment/ns/name".
func (c Child) Subject() string { return c.Kind + "/" + c.Namespace + "/" + c.Name }

// Hold is a child left exactly as it is (neither applied nor pruned) and why.
type Hold struct {
	Kind    string
	Name    string
	Reason  string
	Message string
}

// Handoff is a workload whose replica count an autoscaler takes over: before
// the apply that stops carrying spec.replicas, a separate field manager
// applies the current value so that releasing the field does not reset it
// to the API server's default of 1.
type Handoff struct {
	Kind      string
	Namespace string
	Name      string
	Replicas  int32
}

// ClaimWarning is a Warning event to record once about a claim: the claim is
// marked with AnnotationWarnedPrefix+Reason=Value, and a claim already
// carrying the mark is not warned again.
type ClaimWarning struct {
	Claim   types.NamespacedName
	UID     types.UID
	Reason  string
	Value   string
	Message string
}

// MarkKey is the annotation that records the warning on the claim.
func (w ClaimWarning) MarkKey() string { return v1alpha1.AnnotationWarnedPrefix + w.Reason }

// Plan is what one reconcile does to a CacheBackend's children.
type Plan struct {
	Backend *v1alpha1.CacheBackend
	// EngineLocal is true for a backend that runs no server (SGLangHiCache):
	// it has no children and nothing is applied or pruned.
	EngineLocal bool
	// Apply are the objects server-side applied, in order.
	Apply []*unstructured.Unstructured
	// Handoffs run before Apply.
	Handoffs []Handoff
	// Holds are children left as they are, with the reason.
	Holds []Hold
	// Prune are owned children no longer wanted; they are deleted.
	Prune []Child
	// ClaimWarnings are recorded after the apply.
	ClaimWarnings []ClaimWarning
	// StorageNote says why a change of the shared claim was held back; it
	// is added to the Ready message.
	StorageNote string
	// Capacity is the bound shared claim's capacity (Deployment kind only).
	Capacity *resource.Quantity
	// Conflicts are the objects under the children's names that the
	// backend does not own. With any, the plan applies, prunes and warns
	// about nothing.
	Conflicts []Conflict
}

// ConflictMessage describes the conflicts for the Ready condition, "" when
// there are none.
func (p Plan) ConflictMessage() string {
	if len(p.Conflicts) == 0 {
		return ""
	}
	msgs := make([]string, len(p.Conflicts))
	for i, c := range p.Conflicts {
		msgs[i] = c.Message
	}
	return strings.Join(msgs, "; ") + "; the operator does not adopt objects it did not create: rename the CacheBackend, or delete or rename the object"
}

// WorkloadHold returns the hold of the server workload (its storage
// drifted from the spec's and cannot change), or nil.
func (p Plan) WorkloadHold() *Hold {
	if p.Backend == nil {
		return nil
	}
	kind := workload.For(p.Backend).Kind()
	for i := range p.Holds {
		if h := &p.Holds[i]; h.Kind == kind && h.Name == p.Backend.Name {
			return h
		}
	}
	return nil
}

// Build decides the plan for in. It reads nothing and writes nothing.
func Build(in Input) (Plan, error) {
	cb := in.Backend
	p := Plan{Backend: cb}
	if topology.Of(cb) == topology.EngineLocal {
		p.EngineLocal = true
		return p, nil
	}
	if p.Conflicts = Conflicts(cb, in.Existing); len(p.Conflicts) > 0 {
		return p, nil
	}
	if in.Workload == nil {
		in.Workload = workload.For(cb)
	}
	var children render.Children
	if in.Rendered != nil {
		children = *in.Rendered // a copy: holds below drop children from it
	} else {
		children = render.RenderWith(cb, render.OptionsFor(in.Workload.Object()))
	}

	// Claim templates cannot change: when the spec's storage no longer
	// matches the live workload's, the workload is held and the backend
	// reports it; the rest is still applied.
	if w := in.Workload; w.ClaimsPerReplica() && w.Object() != nil && children.HasWorkload() {
		if drift := ClaimTemplateDrift(children.WorkloadClaimTemplates(), w.ClaimTemplates()); drift != "" {
			children = children.WithoutWorkload()
			p.Holds = append(p.Holds, Hold{Kind: w.Kind(), Name: cb.Name, Reason: v1alpha1.ReasonImmutableStatefulSetStorage,
				Message: fmt.Sprintf("storage of %s %s cannot change (%s); restore spec.storage, or delete the %s (its claims are kept) to recreate it", w.Kind(), cb.Name, drift, w.Kind())})
		}
	}
	p.planClaims(in, &children)

	if children.WorkloadReplicasUnset() {
		p.handoff(in.Workload)
	}

	objs, err := render.Objects(children)
	if err != nil {
		return p, err
	}
	p.Apply = objs
	p.Prune = Prunable(cb, in.Children, objs, p.Holds)
	return p, nil
}

// Prunable returns the children that are deleted: those cb controls (by
// UID) that are neither wanted nor held. Objects that merely carry the
// label (copied by hand, or adopted by another controller) are never
// pruned.
func Prunable(cb *v1alpha1.CacheBackend, live []Child, want []*unstructured.Unstructured, holds []Hold) []Child {
	wanted := map[string]bool{}
	for _, h := range holds {
		wanted[h.Kind+"/"+h.Name] = true
	}
	for _, o := range want {
		wanted[o.GetKind()+"/"+o.GetName()] = true
	}
	var out []Child
	for _, c := range live {
		if wanted[c.Kind+"/"+c.Name] || !controlledBy(c, cb) {
			continue
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Child) int { return strings.Compare(a.Subject(), b.Subject()) })
	return out
}

// Conflicts returns the objects of existing, found under the names of cb's
// children, that cb does not own. An object is cb's when cb controls it
// (controller owner reference with cb's UID). Claims outlive their
// CacheBackend (retention Retain) and the StatefulSet controller, not the
// operator, creates the per-replica ones, so a claim is also cb's when it
// carries the operator's labels for cb's name and no controller other than
// cb (or, for a per-replica claim, the StatefulSet of cb's name): a
// re-created CacheBackend takes back the claims its predecessor retained.
// A claim with another controller, or without those labels, is a conflict.
func Conflicts(cb *v1alpha1.CacheBackend, existing []Child) []Conflict {
	var out []Conflict
	for _, c := range existing {
		ref := c.Controller
		var owned bool
		switch {
		case c.Kind != "PersistentVolumeClaim":
			owned = controlledBy(c, cb)
		case controlledBy(c, cb):
			owned = true
		case !render.LabelledFor(cb, c.Labels):
			owned = false
		case ref == nil:
			owned = true
		default:
			owned = c.Name != render.PVCName(cb) && workload.ClaimOwner(ref, cb.Name)
		}
		if owned {
			continue
		}
		by := "no controller"
		if ref != nil {
			by = fmt.Sprintf("controlled by %s %s", ref.Kind, ref.Name)
		}
		out = append(out, Conflict{Kind: c.Kind, Name: c.Name,
			Message: fmt.Sprintf("%s %s exists and is not owned by this CacheBackend (%s)", c.Kind, c.Name, by)})
	}
	slices.SortFunc(out, func(a, b Conflict) int { return strings.Compare(a.Kind+"/"+a.Name, b.Kind+"/"+b.Name) })
	return out
}

// IsReplicaClaim reports whether name is a per-replica claim of cb's
// StatefulSet: <DataVolumeName>-<name>-<ordinal>.
func IsReplicaClaim(cb *v1alpha1.CacheBackend, name string) bool {
	ordinal, ok := strings.CutPrefix(name, render.DataVolumeName+"-"+cb.Name+"-")
	if !ok || ordinal == "" {
		return false
	}
	for _, r := range ordinal {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

func controlledBy(c Child, cb *v1alpha1.CacheBackend) bool {
	ref := c.Controller
	return ref != nil && ref.UID == cb.UID && ref.Kind == "CacheBackend"
}

// handoff adds the replica hand-off of the live workload w when the
// operator's field manager owns its spec.replicas and the hand-off manager
// does not hold it yet.
func (p *Plan) handoff(w workload.Server) {
	o := w.Object()
	if o == nil {
		return
	}
	if replicas := w.Replicas(); NeedsHandoff(o.GetManagedFields(), replicas) {
		p.Handoffs = append(p.Handoffs, Handoff{Kind: w.Kind(), Namespace: o.GetNamespace(), Name: o.GetName(), Replicas: *replicas})
	}
}

// NeedsHandoff reports whether a workload whose managed fields are entries
// and whose replica count is replicas needs the hand-off: the operator's
// field manager applied spec.replicas, and the hand-off manager does not
// hold it yet.
func NeedsHandoff(entries []metav1.ManagedFieldsEntry, replicas *int32) bool {
	return replicas != nil && ownsReplicas(entries, v1alpha1.FieldManagerChildren) && !ownsReplicas(entries, v1alpha1.FieldManagerReplicasHandoff)
}

// ownsReplicas reports whether manager holds spec.replicas through an apply.
func ownsReplicas(entries []metav1.ManagedFieldsEntry, manager string) bool {
	for _, e := range entries {
		if e.Manager != manager || e.Operation != metav1.ManagedFieldsOperationApply || e.FieldsV1 == nil || e.Subresource != "" {
			continue
		}
		var fields struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
			continue
		}
		if _, ok := fields.Spec["f:replicas"]; ok {
			return true
		}
	}
	return false
}

// ClaimTemplateDrift compares the claim templates the spec asks for with a
// live StatefulSet's, on the fields the operator sets only (name, access
// modes, storage request, storage class), so that fields the API server
// defaults (volumeMode, an empty dataSource) never count as drift. It
// returns a description of the first difference, or "".
func ClaimTemplateDrift(want []corev1ac.PersistentVolumeClaimApplyConfiguration, live []corev1.PersistentVolumeClaim) string {
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

// planClaims looks at the backend's claims. It holds back a shared-claim
// change the API server cannot make (another storage class, a smaller size)
// and says so; it warns once per claim and reason about claims kept but no
// longer mounted; and it records the shared claim's capacity. Claims are
// never deleted.
func (p *Plan) planClaims(in Input, children *render.Children) {
	cb := in.Backend
	perReplica := render.DataVolumeName + "-" + cb.Name + "-"
	wantsPerReplica := workload.For(cb).ClaimsPerReplica() && cb.Spec.Storage != nil && cb.Spec.Storage.PVC != nil
	// A held workload keeps its claim templates, so its per-replica
	// claims are still mounted, whatever the spec now says.
	heldMounts := false
	if h := p.WorkloadHold(); h != nil {
		heldMounts = slices.ContainsFunc(in.Workload.ClaimTemplates(), func(t corev1.PersistentVolumeClaim) bool { return t.Name == render.DataVolumeName })
	}
	for i := range in.Claims {
		pvc := &in.Claims[i]
		switch {
		case pvc.Name == render.PVCName(cb) && children.PVC != nil:
			p.sharedClaimChange(cb, children, pvc)
			if q, ok := pvc.Status.Capacity[corev1.ResourceStorage]; ok && pvc.Status.Phase == corev1.ClaimBound {
				p.Capacity = &q
			}
		case pvc.Name == render.PVCName(cb) && wantsPerReplica:
			p.warn(pvc, v1alpha1.EventSharedPVCRetained, "",
				fmt.Sprintf("claim %s of the Deployment kind is kept but no longer mounted: the StatefulSet uses per-replica claims; copy its data and delete it when done", pvc.Name))
		case strings.HasPrefix(pvc.Name, perReplica) && heldMounts:
			// Still mounted by the held StatefulSet: not orphaned.
		case pvc.Name == render.PVCName(cb), strings.HasPrefix(pvc.Name, perReplica) && !wantsPerReplica:
			p.warn(pvc, v1alpha1.EventOrphanedPVCRetained, "",
				fmt.Sprintf("claim %s is kept but no longer mounted (storage removed or workload kind changed); delete it when its data is not needed", pvc.Name))
		}
	}
}

// sharedClaimChange holds back a change of the shared claim that the API
// server would refuse, and warns once per requested value.
func (p *Plan) sharedClaimChange(cb *v1alpha1.CacheBackend, children *render.Children, pvc *corev1.PersistentVolumeClaim) {
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
		return
	}
	children.PVC = nil
	p.StorageNote = msg
	p.Holds = append(p.Holds, Hold{Kind: "PersistentVolumeClaim", Name: pvc.Name, Reason: v1alpha1.EventStorageChangeRejected, Message: msg})
	p.warn(pvc, v1alpha1.EventStorageChangeRejected, value, msg)
}

// warn adds a claim warning unless the claim already carries its mark.
func (p *Plan) warn(pvc *corev1.PersistentVolumeClaim, reason, value, msg string) {
	if value == "" {
		value = "true"
	}
	w := ClaimWarning{Claim: types.NamespacedName{Namespace: pvc.Namespace, Name: pvc.Name}, UID: pvc.UID, Reason: reason, Value: value, Message: msg}
	if pvc.Annotations[w.MarkKey()] == value {
		return
	}
	p.ClaimWarnings = append(p.ClaimWarnings, w)
}
