package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/internal/topology"
)

// IndexReader reads a CacheBackend's participation summary from the
// KV-block index (cmd/cache-index). indexclient.HTTP is the shipped one;
// unit tests use a stub.
type IndexReader interface {
	Participation(ctx context.Context, namespace, name string) (*pb.ParticipationSummary, error)
}

// wiredForIndex lists the pods of pods that are wired to cb (they carry
// its receipt), not stamped kv-events-skipped and not terminating: the
// candidates of indexPods, which keeps those that carry the sidecar.
func wiredForIndex(cb *v1alpha1.CacheBackend, pods []metav1.PartialObjectMetadata) []evaluate.IndexPod {
	key := cb.Namespace + "/" + cb.Name
	var out []evaluate.IndexPod
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp.IsZero() && p.Annotations[v1alpha1.AnnotationInjectedBy] == key && p.Annotations[v1alpha1.AnnotationKVEventsSkipped] == "" {
			out = append(out, evaluate.IndexPod{Name: p.Name, UID: string(p.UID)})
		}
	}
	return out
}

// indexFacts are the IndexSynced evaluation's facts for cb, before the
// index is read. available is the gate's "the backend serves".
func (r *CacheBackendReconciler) indexFacts(cb *v1alpha1.CacheBackend, wired []evaluate.IndexPod, available bool) evaluate.IndexFacts {
	f := evaluate.IndexFacts{Observed: cb.Spec.Observation != nil, SubscriberImage: r.Inject.KVEventSubscriberImage != "",
		WorkloadAvailable: available, Expected: wired}
	if cb.Spec.Observation != nil {
		f.ModelID = cb.Spec.Observation.ModelID
	}
	return f
}

// readIndex reads cb's participation summary into f when the KV-event
// gate is open (and only then).
func (r *CacheBackendReconciler) readIndex(ctx context.Context, cb *v1alpha1.CacheBackend, f *evaluate.IndexFacts) {
	if !f.GateOpen() {
		return
	}
	if r.Index == nil {
		f.ReadErr = errors.New("the manager has no index reader")
	} else {
		f.Summary, f.ReadErr = r.Index.Participation(ctx, cb.Namespace, cb.Name)
	}
	if f.ReadErr != nil {
		log.FromContext(ctx).V(1).Info("the KV-block index could not be read", "cachebackend", client.ObjectKeyFromObject(cb), "error", f.ReadErr.Error())
	}
}

// indexView reads the index for cb when the KV-event gate is open and
// evaluates IndexSynced (the poller's view; a reconcile reads in observe
// and evaluates in evaluate). The participation is settled against the
// published one: jitter alone returns the published value, so that the
// status is written only on a meaningful change.
func (r *CacheBackendReconciler) indexView(ctx context.Context, cb *v1alpha1.CacheBackend, wired []evaluate.IndexPod, available bool) (*v1alpha1.IndexParticipation, evaluate.IndexVerdict) {
	f := r.indexFacts(cb, wired, available)
	r.readIndex(ctx, cb, &f)
	p, v := evaluate.Index(f)
	return evaluate.Settle(cb.Status.IndexParticipation, p), v
}

// gateAvailable reads the gate's "backend serves" from a published
// status: the endpoint for server-backed backends, Ready for engine-local
// ones.
func gateAvailable(cb *v1alpha1.CacheBackend) bool {
	if topology.Of(cb) == topology.EngineLocal {
		return meta.IsStatusConditionTrue(cb.Status.Conditions, v1alpha1.ConditionReady)
	}
	return cb.Status.Endpoint != ""
}

// indexChanged reads the index for cb as a reconcile would (the poller's
// view: the gate's "backend serves" from the published status) and
// reports whether the participation or IndexSynced it would publish
// differs meaningfully from cb's status.
func (r *CacheBackendReconciler) indexChanged(ctx context.Context, cb *v1alpha1.CacheBackend) (bool, error) {
	matched, err := r.matchedPods(ctx, cb)
	if err != nil {
		return false, fmt.Errorf("listing engine pods: %w", err)
	}
	wired, err := r.indexPods(ctx, cb, matched)
	if err != nil {
		return false, fmt.Errorf("reading engine pods: %w", err)
	}
	part, v := r.indexView(ctx, cb, wired, gateAvailable(cb))
	cur := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionIndexSynced)
	same := evaluate.ParticipationEqual(part, cb.Status.IndexParticipation) && cur != nil &&
		cur.Status == v.Status && cur.Reason == v.Reason && cur.Message == v.Message
	return !same, nil
}

// listBackends lists the CacheBackends from the manager's cache.
func (r *CacheBackendReconciler) listBackends(ctx context.Context) ([]v1alpha1.CacheBackend, error) {
	var list v1alpha1.CacheBackendList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	return list.Items, nil
}

// matchedPods lists the metadata of the pods cb's engine selector matches
// and cb claims, from the manager's cache; see claimedPods.
func (r *CacheBackendReconciler) matchedPods(ctx context.Context, cb *v1alpha1.CacheBackend) ([]metav1.PartialObjectMetadata, error) {
	c, err := r.claimedPods(ctx, cb)
	return c.mine, err
}

// claims are the pods cb's engine selector matches, split by the
// CacheBackend that claims each.
type claims struct {
	// mine are the pods cb claims.
	mine []metav1.PartialObjectMetadata
	// others counts the rest by their claimant's name (nil when none).
	others map[string]int
	// backends are the namespace's CacheBackends, read from the cache
	// without a copy (read-only); nil when no pod matched.
	backends []v1alpha1.CacheBackend
}

// claimedBy reports whether the backend named name claims a pod with
// these labels among backends: the webhook wires a pod to the first by
// name of the backends whose selectors match it (v1alpha1.Claimant), so a pod
// another backend claims is that backend's engine, never an unwired one
// of name's. A pod none claims (its backend is being deleted) stays
// name's to report.
func claimedBy(name string, labels map[string]string, backends []v1alpha1.CacheBackend) (bool, string) {
	if c := v1alpha1.Claimant(labels, backends); c != nil && c.Name != name {
		return false, c.Name
	}
	return true, ""
}

// claimedPods lists the metadata of the pods cb's engine selector matches,
// from the manager's cache, and splits them by claimant (claimedBy).
func (r *CacheBackendReconciler) claimedPods(ctx context.Context, cb *v1alpha1.CacheBackend) (claims, error) {
	sel := cb.Spec.EngineSelector.MatchLabels
	if len(sel) == 0 {
		return claims{}, nil
	}
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := r.Client.List(ctx, pods, client.InNamespace(cb.Namespace), client.MatchingLabels(sel)); err != nil {
		return claims{}, fmt.Errorf("listing engine pods: %w", err)
	}
	if len(pods.Items) == 0 {
		return claims{}, nil
	}
	var backends v1alpha1.CacheBackendList
	if err := r.Client.List(ctx, &backends, client.InNamespace(cb.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return claims{}, fmt.Errorf("listing the namespace's CacheBackends: %w", err)
	}
	return claimed(pods.Items, backends.Items, cb.Name), nil
}

// claimed splits pods, each matched by the selector of the backend named
// name, by claimant among backends (claimedBy).
func claimed(pods []metav1.PartialObjectMetadata, backends []v1alpha1.CacheBackend, name string) claims {
	c := claims{mine: pods[:0:0], backends: backends}
	for i := range pods {
		if mine, by := claimedBy(name, pods[i].Labels, backends); !mine {
			if c.others == nil {
				c.others = map[string]int{}
			}
			c.others[by]++
			continue
		}
		c.mine = append(c.mine, pods[i])
	}
	return c
}
