// Package apply is the only package that writes a CacheBackend's children to
// the cluster. It server-side applies the rendered set with one fixed field
// manager through fluxcd/pkg/ssa, whose dry-run comparison makes a reconcile
// without changes write nothing, and prunes the children a CacheBackend no
// longer wants. It never deletes a PersistentVolumeClaim.
package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/fluxcd/pkg/ssa"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
)

// Field managers are API: renaming one strands the fields it owns on every
// existing object.
const (
	// FieldManager owns every field the operator applies to children.
	FieldManager = "inferencecache-operator"
	// ReplicasHandoffManager holds a workload's replica count for the moment
	// the operator stops applying it because an HPA takes over, so that
	// releasing the field does not reset it to the API server's default of 1.
	ReplicasHandoffManager = "inferencecache-operator-replicas-handoff"
)

// Applier writes children. Reader should be the manager's cached client for
// the prunable kinds; Client performs the writes.
type Applier struct {
	client client.Client
	reader client.Reader
	rm     *ssa.ResourceManager
}

// New returns an Applier that writes through c and lists children through r.
func New(c client.Client, r client.Reader) *Applier {
	return &Applier{
		client: c,
		reader: r,
		rm:     ssa.NewResourceManager(c, nil, ssa.Owner{Field: FieldManager, Group: v1alpha1.GroupVersion.Group}),
	}
}

// Action is what happened to one child.
type Action string

// Actions reported in a Result.
const (
	Created    Action = "created"
	Configured Action = "configured"
	Unchanged  Action = "unchanged"
	Deleted    Action = "deleted"
)

// Change is one child and what happened to it, e.g. "Deployment/ns/name".
type Change struct {
	Subject string
	Action  Action
}

// Result lists what one Apply did to each child.
type Result struct {
	Changes []Change
}

// Changed reports whether any child was written or deleted.
func (r Result) Changed() bool {
	for _, c := range r.Changes {
		if c.Action != Unchanged {
			return true
		}
	}
	return false
}

// String summarises the written and deleted children, e.g.
// "Deployment/ns/a created, HorizontalPodAutoscaler/ns/a deleted".
func (r Result) String() string {
	var parts []string
	for _, c := range r.Changes {
		if c.Action != Unchanged {
			parts = append(parts, c.Subject+" "+string(c.Action))
		}
	}
	return strings.Join(parts, ", ")
}

// Objects converts rendered children into the unstructured objects that are
// applied, in a stable order. It is exported so that previews (the CLI)
// print exactly what the controller applies.
func Objects(c render.Children) ([]*unstructured.Unstructured, error) {
	var acs []any
	if c.PVC != nil {
		acs = append(acs, c.PVC)
	}
	if c.Service != nil {
		acs = append(acs, c.Service)
	}
	if c.Deployment != nil {
		acs = append(acs, c.Deployment)
	}
	if c.StatefulSet != nil {
		acs = append(acs, c.StatefulSet)
	}
	if c.HPA != nil {
		acs = append(acs, c.HPA)
	}
	objs := make([]*unstructured.Unstructured, 0, len(acs))
	for _, ac := range acs {
		u, err := toUnstructured(ac)
		if err != nil {
			return nil, err
		}
		objs = append(objs, u)
	}
	return objs, nil
}

func toUnstructured(ac any) (*unstructured.Unstructured, error) {
	raw, err := json.Marshal(ac)
	if err != nil {
		return nil, fmt.Errorf("encoding apply configuration: %w", err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, fmt.Errorf("decoding apply configuration: %w", err)
	}
	return u, nil
}

// Options adjust one Apply.
type Options struct {
	// Hold lists children, as "Kind/name", that are left exactly as they
	// are: neither applied nor pruned (a StatefulSet whose immutable
	// storage the spec can no longer describe, a claim whose class cannot
	// change).
	Hold []string
}

// Apply server-side applies children for owner and prunes owned children of
// the prunable kinds that are not among them. A child whose live state
// already matches is not written.
func (a *Applier) Apply(ctx context.Context, owner *v1alpha1.CacheBackend, children render.Children, opts Options) (Result, error) {
	var res Result
	objs, err := Objects(children)
	if err != nil {
		return res, err
	}
	if d := children.Deployment; d != nil && d.Spec != nil && d.Spec.Replicas == nil {
		if err := a.handOffReplicas(ctx, owner, &appsv1.Deployment{}); err != nil {
			return res, err
		}
	}
	if s := children.StatefulSet; s != nil && s.Spec != nil && s.Spec.Replicas == nil {
		if err := a.handOffReplicas(ctx, owner, &appsv1.StatefulSet{}); err != nil {
			return res, err
		}
	}
	if len(objs) > 0 {
		cs, err := a.rm.ApplyAll(ctx, objs, ssa.DefaultApplyOptions())
		if cs != nil {
			for _, e := range cs.Entries {
				res.Changes = append(res.Changes, Change{Subject: e.Subject, Action: action(e.Action)})
			}
		}
		if err != nil {
			return res, fmt.Errorf("applying children: %w", err)
		}
	}
	pruned, err := a.prune(ctx, owner, objs, opts.Hold)
	res.Changes = append(res.Changes, pruned...)
	return res, err
}

func action(a ssa.Action) Action {
	switch a {
	case ssa.CreatedAction:
		return Created
	case ssa.ConfiguredAction:
		return Configured
	case ssa.DeletedAction:
		return Deleted
	default:
		return Unchanged
	}
}

// prunable lists the kinds whose unwanted owned objects are deleted. PVCs
// are deliberately absent: cached data goes only through the retention
// setting (an owner reference the garbage collector follows).
func prunable() []client.ObjectList {
	return []client.ObjectList{
		&appsv1.DeploymentList{},
		&appsv1.StatefulSetList{},
		&corev1.ServiceList{},
		&autoscalingv2.HorizontalPodAutoscalerList{},
	}
}

func (a *Applier) prune(ctx context.Context, owner *v1alpha1.CacheBackend, want []*unstructured.Unstructured, hold []string) ([]Change, error) {
	wanted := map[string]bool{}
	for _, h := range hold {
		wanted[h] = true
	}
	for _, o := range want {
		wanted[o.GetKind()+"/"+o.GetName()] = true
	}
	var changes []Change
	var errs []error
	for _, list := range prunable() {
		if err := a.reader.List(ctx, list, client.InNamespace(owner.Namespace),
			client.MatchingLabels{render.LabelCacheBackend: owner.Name}); err != nil {
			errs = append(errs, fmt.Errorf("listing children: %w", err))
			continue
		}
		items, err := metaItems(list)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, obj := range items {
			kind := kindOf(obj, a.client.Scheme())
			if wanted[kind+"/"+obj.GetName()] || !ownedBy(obj, owner) {
				continue
			}
			if err := a.client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground),
				client.Preconditions{UID: ptrUID(obj)}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("pruning %s/%s: %w", kind, obj.GetName(), err))
				continue
			}
			changes = append(changes, Change{Subject: fmt.Sprintf("%s/%s/%s", kind, obj.GetNamespace(), obj.GetName()), Action: Deleted})
		}
	}
	sort.Slice(changes, func(i, j int) bool { return changes[i].Subject < changes[j].Subject })
	return changes, errors.Join(errs...)
}

func metaItems(list client.ObjectList) ([]client.Object, error) {
	var out []client.Object
	switch l := list.(type) {
	case *appsv1.DeploymentList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *appsv1.StatefulSetList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *corev1.ServiceList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	case *autoscalingv2.HorizontalPodAutoscalerList:
		for i := range l.Items {
			out = append(out, &l.Items[i])
		}
	default:
		return nil, fmt.Errorf("unexpected list type %T", list)
	}
	return out, nil
}

func kindOf(obj client.Object, s *runtime.Scheme) string {
	gvks, _, err := s.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return fmt.Sprintf("%T", obj)
	}
	return gvks[0].Kind
}

// ownedBy reports whether owner is obj's controller. Objects that merely
// carry the label (copied by hand, or adopted by another controller) are
// never pruned.
func ownedBy(obj client.Object, owner *v1alpha1.CacheBackend) bool {
	ref := metav1.GetControllerOf(obj)
	return ref != nil && ref.UID == owner.UID && ref.Kind == "CacheBackend"
}

func ptrUID(obj client.Object) *types.UID {
	u := obj.GetUID()
	return &u
}

// handOffReplicas runs before an apply that no longer carries the workload's
// replica count (an HPA now owns it). If the operator's manager owns
// spec.replicas on the live Deployment, a separate manager first applies the
// current value, so the field keeps its value when the operator releases it
// instead of being removed and defaulted back to 1.
func (a *Applier) handOffReplicas(ctx context.Context, owner *v1alpha1.CacheBackend, live client.Object) error {
	if err := a.reader.Get(ctx, client.ObjectKey{Namespace: owner.Namespace, Name: owner.Name}, live); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading workload for replica hand-off: %w", err)
	}
	var replicas *int32
	switch w := live.(type) {
	case *appsv1.Deployment:
		replicas = w.Spec.Replicas
	case *appsv1.StatefulSet:
		replicas = w.Spec.Replicas
	}
	if replicas == nil || !ownsReplicas(live.GetManagedFields(), FieldManager) || ownsReplicas(live.GetManagedFields(), ReplicasHandoffManager) {
		return nil
	}
	patch := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1",
		"kind":       kindOf(live, a.client.Scheme()),
		"metadata":   map[string]any{"name": live.GetName(), "namespace": live.GetNamespace()},
		"spec":       map[string]any{"replicas": int64(*replicas)},
	}}
	if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(patch),
		client.FieldOwner(ReplicasHandoffManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("handing replica count to the autoscaler: %w", err)
	}
	return nil
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
		if err := json.Unmarshal(e.FieldsV1.Raw, &fields); err != nil {
			continue
		}
		if _, ok := fields.Spec["f:replicas"]; ok {
			return true
		}
	}
	return false
}
