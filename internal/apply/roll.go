package apply

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/workload"
)

// InstanceHash is the value of AnnotationServerInstance for a server
// instance identity: a short hash, so the annotation does not grow with the
// replica count.
func InstanceHash(inst string) string {
	sum := sha256.Sum256([]byte(inst))
	return hex.EncodeToString(sum[:8])
}

// Workload is an engine workload the operator may roll: a Deployment or a
// StatefulSet of the backend's namespace.
type Workload struct {
	Kind string
	Name string
}

func (w Workload) String() string { return w.Kind + "/" + w.Name }

// EngineWorkload resolves the workload that controls pod
// (workload.ControllerOf: a Deployment through its ReplicaSet, read with r,
// or a StatefulSet). ok is false for a pod of neither (a bare pod, a
// Job's), or whose ReplicaSet is gone or is not the one its owner
// reference names (by UID).
func EngineWorkload(ctx context.Context, r client.Reader, pod metav1.Object) (Workload, bool, error) {
	kind, name, ok, err := workload.ControllerOf(ctx, r, pod)
	return Workload{Kind: kind, Name: name}, ok, err
}

// RollEngines is the restart cascade: it rolls, once, every Deployment or
// StatefulSet with a pod wired to cb, by Roll with InstanceHash(inst). A
// pod counts as wired only when receipt.Judge verifies its receipt against
// cb and keys (HMAC and the digest of its containers, on the full pod read
// through r): a pod carrying a forged or copied receipt never causes a
// roll. Pods are listed as metadata through the applier's client;
// candidates whose metadata already fails the signature are not read in
// full. It returns the rolled workloads, sorted.
func (a *Applier) RollEngines(ctx context.Context, r client.Reader, cb *v1alpha1.CacheBackend, keys []receipt.Key, inst string) ([]Workload, error) {
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := a.client.List(ctx, pods, client.InNamespace(cb.Namespace)); err != nil {
		return nil, fmt.Errorf("listing engine pods: %w", err)
	}
	set := map[Workload]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if !p.DeletionTimestamp.IsZero() || receipt.JudgeMetadata(p.Namespace, p.Annotations, cb, keys).Verdict != receipt.Valid {
			continue
		}
		w, ok, err := EngineWorkload(ctx, r, p)
		if err != nil {
			return nil, err
		}
		if !ok || set[w] {
			continue
		}
		full := &corev1.Pod{}
		if err := r.Get(ctx, client.ObjectKeyFromObject(p), full); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("reading engine pod %s: %w", p.Name, err)
		}
		if receipt.Judge(full, cb, keys).Verdict == receipt.Valid {
			set[w] = true
		}
	}
	ws := make([]Workload, 0, len(set))
	for w := range set {
		ws = append(ws, w)
	}
	rolled, _, err := a.Roll(ctx, r, cb.Namespace, ws, InstanceHash(inst))
	return rolled, err
}

// Roll writes AnnotationServerInstance=value on the pod template of each
// workload, with the rollout field manager, as kubectl rollout restart
// does with its own annotation. A workload that already carries value is
// not written again (it is returned in carrying): a roll happens once per
// value and survives manager restarts. Workloads are read through r. It
// returns the rolled and the already-carrying workloads, each sorted.
func (a *Applier) Roll(ctx context.Context, r client.Reader, namespace string, ws []Workload, value string) (rolled, carrying []Workload, err error) {
	ws = append([]Workload(nil), ws...)
	sort.Slice(ws, func(i, j int) bool { return ws[i].String() < ws[j].String() })
	for _, w := range ws {
		live, ok, err := workload.ReadNamed(ctx, r, w.Kind, namespace, w.Name)
		if err != nil || !ok {
			continue
		}
		if live.PodTemplate().Annotations[v1alpha1.AnnotationServerInstance] == value {
			carrying = append(carrying, w)
			continue
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apps/v1", "kind": w.Kind,
			"metadata": map[string]any{"name": w.Name, "namespace": namespace},
			"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{
				"annotations": map[string]any{v1alpha1.AnnotationServerInstance: value},
			}}},
		}}
		if err := a.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(v1alpha1.FieldManagerRollout), client.ForceOwnership); err != nil {
			return rolled, carrying, fmt.Errorf("rolling engine %s: %w", w, err)
		}
		rolled = append(rolled, w)
	}
	return rolled, carrying, nil
}
