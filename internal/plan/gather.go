package plan

import (
	"context"
	"fmt"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/workload"
)

// Gather reads the Input of cb's plan: the workload, the prunable children
// and the objects under the children's names through c (the controller's
// cache, which must hold these kinds unfiltered: an object missing from it
// would be applied over; claims are read from it as metadata only), cb's own
// claims in full through claims (the controller's label-selected cache of
// server objects). It is the only place where a plan's input is
// read, for the controller and the CLI alike.
func Gather(ctx context.Context, c, claims client.Reader, cb *v1alpha1.CacheBackend) (Input, error) {
	in := Input{Backend: cb}
	if topology.Of(cb) == topology.EngineLocal {
		return in, nil // runs no server: nothing to apply or prune
	}
	w, err := workload.Read(ctx, c, cb)
	if err != nil {
		return in, err
	}
	in.Workload = w
	rendered := render.RenderWith(cb, render.OptionsFor(w.Object()))
	in.Rendered = &rendered
	// cb's claims, in full, from claims (which may be filtered to the
	// operator's labelled claims).
	var pvcs corev1.PersistentVolumeClaimList
	if err := claims.List(ctx, &pvcs, client.InNamespace(cb.Namespace), client.MatchingLabels{render.LabelCacheBackend: cb.Name}); err != nil {
		return in, fmt.Errorf("listing claims: %w", err)
	}
	in.Claims = pvcs.Items
	// Every claim of the namespace under a child's name, labelled or not,
	// as metadata from c: a claim that is not cb's must be seen to be left
	// alone, and a reader filtered to the operator's labels would hide it.
	names := &metav1.PartialObjectMetadataList{}
	names.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PersistentVolumeClaimList"))
	if err := c.List(ctx, names, client.InNamespace(cb.Namespace)); err != nil {
		return in, fmt.Errorf("listing claims: %w", err)
	}
	for i := range names.Items {
		pvc := &names.Items[i]
		if pvc.Name == render.PVCName(cb) || IsReplicaClaim(cb, pvc.Name) {
			in.Existing = append(in.Existing, existing("PersistentVolumeClaim", pvc))
		}
	}
	if err := gatherExisting(ctx, c, cb, &in); err != nil {
		return in, err
	}
	type prunable struct {
		kind string
		list client.ObjectList
	}
	var kinds []prunable
	for _, w := range workload.Kinds() {
		kinds = append(kinds, prunable{w.Kind(), w.NewList()})
	}
	kinds = append(kinds, prunable{"Service", &corev1.ServiceList{}}, prunable{"HorizontalPodAutoscaler", &autoscalingv2.HorizontalPodAutoscalerList{}})
	for _, k := range kinds {
		if err := c.List(ctx, k.list, client.InNamespace(cb.Namespace), client.MatchingLabels{render.LabelCacheBackend: cb.Name}); err != nil {
			return in, fmt.Errorf("listing %s children: %w", k.kind, err)
		}
		items, err := meta.ExtractList(k.list)
		if err != nil {
			return in, fmt.Errorf("listing %s children: %w", k.kind, err)
		}
		for _, item := range items {
			o, ok := item.(metav1.Object)
			if !ok {
				continue
			}
			in.Children = append(in.Children, Child{Kind: k.kind, Namespace: o.GetNamespace(), Name: o.GetName(), UID: o.GetUID(), Controller: metav1.GetControllerOf(o)})
		}
	}
	return in, nil
}

// gatherExisting reads the objects under the names of the children cb
// renders (claims aside: Gather lists them).
func gatherExisting(ctx context.Context, c client.Reader, cb *v1alpha1.CacheBackend, in *Input) error {
	objs, err := render.Objects(*in.Rendered)
	if err != nil {
		return err
	}
	for _, o := range objs {
		var live client.Object
		if w, ok := workload.ByKind(o.GetKind()); ok {
			live = w.New()
		} else if o.GetKind() == "Service" {
			live = &corev1.Service{}
		} else if o.GetKind() == "HorizontalPodAutoscaler" {
			live = &autoscalingv2.HorizontalPodAutoscaler{}
		} else {
			continue
		}
		switch err := c.Get(ctx, client.ObjectKey{Namespace: cb.Namespace, Name: o.GetName()}, live); {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("reading %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		in.Existing = append(in.Existing, existing(o.GetKind(), live))
	}
	return nil
}

func existing(kind string, o metav1.Object) Child {
	return Child{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), UID: o.GetUID(), Controller: metav1.GetControllerOf(o), Labels: o.GetLabels()}
}
