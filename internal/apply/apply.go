// Package apply is the only package that writes a CacheBackend's children
// and the marks the operator leaves on other objects. It executes a plan
// (internal/plan): the replica hand-offs, a server-side apply of the
// planned objects with one fixed field manager through fluxcd/pkg/ssa (whose
// dry-run comparison makes a reconcile without changes write nothing), and
// the deletion of the children the plan prunes. It never deletes a
// PersistentVolumeClaim. Preview computes the same changes with server-side
// dry runs, writing nothing.
package apply

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fluxcd/pkg/ssa"
	"github.com/fluxcd/pkg/ssa/utils"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/plan"
	"github.com/inferencecache/operator/internal/workload"
)

// Applier writes children through one client.
type Applier struct {
	client  client.Client
	rm      *ssa.ResourceManager
	intents intents
}

// New returns an Applier that writes through c.
func New(c client.Client) *Applier {
	return &Applier{
		client: c,
		rm:     ssa.NewResourceManager(c, nil, ssa.Owner{Field: v1alpha1.FieldManagerChildren, Group: v1alpha1.GroupVersion.Group}),
	}
}

// Action is what happened (or, in a preview, would happen) to one child.
type Action string

// Actions reported in a Result or a Preview.
const (
	Created    Action = "created"
	Configured Action = "configured"
	Unchanged  Action = "unchanged"
	Deleted    Action = "deleted"
	Held       Action = "held"
)

// Change is one child and what happened to it, e.g. "Deployment/ns/name".
type Change struct {
	Subject string
	Action  Action
}

// Result lists what one Execute did to each child.
type Result struct {
	Changes []Change
	// Marked are the claim warnings whose marks were written: their
	// events are due.
	Marked []plan.ClaimWarning
	// MarkErr joins the errors of writing claim marks; they do not fail
	// the apply.
	MarkErr error
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

// WorkloadChanged reports whether the cache-server workload was created or
// configured.
func (r Result) WorkloadChanged() bool {
	for _, c := range r.Changes {
		kind, _, _ := strings.Cut(c.Subject, "/")
		if _, isWorkload := workload.ByKind(kind); isWorkload && (c.Action == Created || c.Action == Configured) {
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

// Execute carries out p: the replica hand-offs, the apply, the prune, then
// the claim marks. A child whose live state already matches is not
// written. An error of the apply stops before the prune; prune errors are
// joined; mark errors are in Result.MarkErr.
func (a *Applier) Execute(ctx context.Context, p plan.Plan) (Result, error) {
	var res Result
	if p.EngineLocal {
		return res, nil
	}
	for _, h := range p.Handoffs {
		if err := a.handOff(ctx, h); err != nil {
			return res, err
		}
	}
	if len(p.Apply) > 0 && a.intents.unchanged(ctx, a.client, p.Apply) {
		// Applied before, and no child changed since: nothing to send.
		for _, o := range p.Apply {
			res.Changes = append(res.Changes, Change{Subject: utils.FmtUnstructured(o), Action: Unchanged})
		}
	} else if len(p.Apply) > 0 {
		objs := make([]*unstructured.Unstructured, len(p.Apply))
		for i, o := range p.Apply {
			objs[i] = o.DeepCopy() // ApplyAll sorts and edits its input
		}
		before := versions(ctx, a.client, p.Apply)
		cs, err := a.rm.ApplyAll(ctx, objs, ssa.DefaultApplyOptions())
		if cs != nil {
			for _, e := range cs.Entries {
				res.Changes = append(res.Changes, Change{Subject: e.Subject, Action: action(e.Action)})
			}
		}
		if err != nil {
			a.intents.forget(p.Apply)
			return res, fmt.Errorf("applying children: %w", err)
		}
		a.intents.record(p.Apply, objs, before)
	}
	var errs []error
	for _, c := range p.Prune {
		obj := &metav1.PartialObjectMetadata{}
		obj.SetGroupVersionKind(gvk(c.Kind))
		obj.SetNamespace(c.Namespace)
		obj.SetName(c.Name)
		uid := c.UID
		if err := a.client.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground),
			client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("pruning %s: %w", c.Subject(), err))
			continue
		}
		res.Changes = append(res.Changes, Change{Subject: c.Subject(), Action: Deleted})
	}
	var markErrs []error
	for _, w := range p.ClaimWarnings {
		claim := annotated{Kind: "PersistentVolumeClaim", Namespace: w.Claim.Namespace, Name: w.Claim.Name, UID: w.UID}
		if err := annotate(ctx, a.client, claim, w.MarkKey(), w.Value, v1alpha1.FieldManagerPVCWarnings); err != nil {
			markErrs = append(markErrs, fmt.Errorf("marking claim %s: %w", w.Claim.Name, err))
			continue
		}
		res.Marked = append(res.Marked, w)
	}
	res.MarkErr = errors.Join(markErrs...)
	return res, errors.Join(errs...)
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

// gvk returns the group, version and kind of a prunable kind.
func gvk(kind string) schema.GroupVersionKind {
	if w, ok := workload.ByKind(kind); ok {
		return w.GroupVersionKind()
	}
	switch kind {
	case "HorizontalPodAutoscaler":
		return schema.GroupVersionKind{Group: "autoscaling", Version: "v2", Kind: kind}
	default:
		return schema.GroupVersionKind{Version: "v1", Kind: kind}
	}
}

// handOff applies the workload's current replica count with the hand-off
// field manager, so that the count keeps its value when the operator's
// manager releases it.
func (a *Applier) handOff(ctx context.Context, h plan.Handoff) error {
	patch := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1",
		"kind":       h.Kind,
		"metadata":   map[string]any{"name": h.Name, "namespace": h.Namespace},
		"spec":       map[string]any{"replicas": int64(h.Replicas)},
	}}
	if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(patch),
		client.FieldOwner(v1alpha1.FieldManagerReplicasHandoff), client.ForceOwnership); err != nil {
		return fmt.Errorf("handing replica count to the autoscaler: %w", err)
	}
	return nil
}

// RecordOnce creates ev, an event whose name is deterministic for what it
// reports (see receipt.EventName). It reports false, without error, when an
// event of that name exists already: whoever created it reported it. The
// create is the only request: no read, no update of an aggregated series.
func RecordOnce(ctx context.Context, c client.Client, ev *eventsv1.Event) (bool, error) {
	if err := c.Create(ctx, ev); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("creating event %s/%s: %w", ev.Namespace, ev.Name, err)
	}
	return true, nil
}

// annotated is the object annotate marks: its kind (of core/v1), key and
// UID.
type annotated struct {
	Kind, Namespace, Name string
	UID                   types.UID
}

// annotate server-side applies one annotation on a core/v1 object with its
// own field manager, guarded by the object's UID so that a recreated object
// of the same name is never marked.
func annotate(ctx context.Context, c client.Client, o annotated, key, value, manager string) error {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind(o.Kind)
	u.SetNamespace(o.Namespace)
	u.SetName(o.Name)
	u.SetUID(o.UID)
	u.SetAnnotations(map[string]string{key: value})
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(manager), client.ForceOwnership)
}
