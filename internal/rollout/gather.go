package rollout

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/workload"
)

// WiredWorkloads reads the restart cascade's candidates: every Deployment
// or StatefulSet of cb's namespace with a pod wired to cb. A pod counts as
// wired only when receipt.Judge verifies its receipt against cb and keys
// (HMAC and the digest of its containers, on the full pod read through
// live): a pod carrying a forged or copied receipt never causes a roll.
// Pods are listed as metadata through pods (the controller's cache);
// candidates whose metadata already fails the signature are not read in
// full.
func WiredWorkloads(ctx context.Context, pods, live client.Reader, cb *v1alpha1.CacheBackend, keys []receipt.Key) ([]Candidate, error) {
	set := map[Workload]bool{}
	var cur Workload // the workload of the pod being judged
	err := wiredPods(ctx, pods, live, cb, keys, func(p *metav1.PartialObjectMetadata) (bool, error) {
		w, ok, err := engineWorkload(ctx, live, p)
		if err != nil || !ok || set[w] {
			return false, err
		}
		cur = w
		return true, nil
	}, func(*metav1.PartialObjectMetadata, *corev1.Pod) { set[cur] = true })
	if err != nil {
		return nil, err
	}
	return readCandidates(ctx, live, cb.Namespace, set)
}

// WiredPods reads the per-node cascade's candidates: the pods of cb's
// namespace wired to cb (receipts verified as WiredWorkloads does), with
// their nodes. Only the pods of an engine workload are candidates: a
// Deployment's (through its ReplicaSet, read with live) or a
// StatefulSet's, which re-create an evicted pod as it was. A pod without
// a controller (a bare pod) would be gone for good once evicted, a Job's
// would count a failed or restarted run, a DaemonSet's or another
// controller's is not an engine the operator restarts (issue 35): all are
// left out, and so are pods not scheduled yet, which have no server to
// lose.
func WiredPods(ctx context.Context, pods, live client.Reader, cb *v1alpha1.CacheBackend, keys []receipt.Key) ([]EnginePod, error) {
	var out []EnginePod
	err := wiredPods(ctx, pods, live, cb, keys,
		func(p *metav1.PartialObjectMetadata) (bool, error) {
			if metav1.GetControllerOf(p) == nil {
				return false, nil
			}
			w, ok, err := engineWorkload(ctx, live, p)
			return ok && (w.Kind == string(v1alpha1.DeploymentKindDeployment) || w.Kind == string(v1alpha1.DeploymentKindStatefulSet)), err
		},
		func(_ *metav1.PartialObjectMetadata, full *corev1.Pod) {
			if full.Spec.NodeName != "" {
				out = append(out, EnginePod{Name: full.Name, UID: full.UID, Node: full.Spec.NodeName, Created: full.CreationTimestamp.Time})
			}
		})
	return out, err
}

// wiredPods calls found with each non-terminating pod of cb's namespace
// whose receipt verifies against cb and keys: first on its metadata (from
// pods), then, when want says the pod is worth it, on the full pod read
// through live.
func wiredPods(ctx context.Context, pods, live client.Reader, cb *v1alpha1.CacheBackend, keys []receipt.Key,
	want func(*metav1.PartialObjectMetadata) (bool, error), found func(*metav1.PartialObjectMetadata, *corev1.Pod)) error {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := pods.List(ctx, list, client.InNamespace(cb.Namespace)); err != nil {
		return fmt.Errorf("listing engine pods: %w", err)
	}
	for i := range list.Items {
		p := &list.Items[i]
		if !p.DeletionTimestamp.IsZero() || receipt.JudgeMetadata(p.Namespace, p.Annotations, cb, keys).Verdict != receipt.Valid {
			continue
		}
		if ok, err := want(p); err != nil || !ok {
			if err != nil {
				return err
			}
			continue
		}
		full := &corev1.Pod{}
		if err := live.Get(ctx, client.ObjectKeyFromObject(p), full); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("reading engine pod %s: %w", p.Name, err)
		}
		if full.DeletionTimestamp.IsZero() && receipt.Judge(full, cb, keys).Verdict == receipt.Valid {
			found(p, full)
		}
	}
	return nil
}

// EarlyWorkloads reads the heal's candidates: the workloads (resolved
// through live) of the pods admitted before the endpoint existed. A pod of
// no Deployment or StatefulSet has none.
func EarlyWorkloads(ctx context.Context, live client.Reader, namespace string, early []metav1.PartialObjectMetadata) ([]Candidate, error) {
	set := map[Workload]bool{}
	for i := range early {
		w, ok, err := engineWorkload(ctx, live, &early[i])
		if err != nil {
			return nil, err
		}
		if ok {
			set[w] = true
		}
	}
	return readCandidates(ctx, live, namespace, set)
}

// engineWorkload resolves the workload that controls pod
// (workload.ControllerOf: a Deployment through its ReplicaSet, read with
// r, or a StatefulSet).
func engineWorkload(ctx context.Context, r client.Reader, pod metav1.Object) (Workload, bool, error) {
	kind, name, ok, err := workload.ControllerOf(ctx, r, pod)
	return Workload{Kind: kind, Name: name}, ok, err
}

// readCandidates reads what each workload's pod template carries, sorted
// by workload.
func readCandidates(ctx context.Context, r client.Reader, namespace string, set map[Workload]bool) ([]Candidate, error) {
	out := make([]Candidate, 0, len(set))
	for w := range set {
		c := Candidate{Workload: w}
		live, ok, err := workload.ReadNamed(ctx, r, w.Kind, namespace, w.Name)
		if err != nil {
			return nil, fmt.Errorf("reading engine %s: %w", w, err)
		}
		if ok {
			c.Found, c.Carries = true, live.PodTemplate().Annotations[v1alpha1.AnnotationServerInstance]
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Candidate) int { return strings.Compare(a.Workload.String(), b.Workload.String()) })
	return out, nil
}
