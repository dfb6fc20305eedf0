package evaluate

import (
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Chain is an ordered list of policies over facts of type T. Each policy
// returns its verdict and whether it applies; the first that applies wins,
// so the order of the chain is the precedence of the reasons, visible in
// one place. The last policy of a chain always applies.
type Chain[T any] []func(T) (Verdict, bool)

// Evaluate returns the verdict of the first policy that applies.
func (c Chain[T]) Evaluate(facts T) Verdict {
	for _, p := range c {
		if v, ok := p(facts); ok {
			return v
		}
	}
	return Verdict{Reason: v1alpha1.ReasonRolloutInProgress, Progressing: true, Message: "no verdict"}
}

// Facts is what the server-backed (LMCache) evaluation looks at: what the
// reconcile applied and observed, all of it values.
type Facts struct {
	// NameConflict describes the objects under the children's names that
	// the backend does not own (plan.Plan.ConflictMessage), "" when none.
	NameConflict string
	// ApplyErr is the error of executing the plan, if any.
	ApplyErr error
	// StorageHold is the StatefulSet hold's message when the plan held the
	// StatefulSet because its storage cannot change, "" otherwise.
	StorageHold string
	// Workload is the cache-server workload as observed after the apply
	// (nil when it does not exist yet).
	Workload client.Object
	// Probe is the functional probe's result; Probed is false when the
	// backend was not probed (no prober, or the workload is not ready).
	Probed   bool
	ProbeErr error
	// StorageNote is added to the Ready message (a held claim change).
	StorageNote string
	// FirstAvailableAt is the time to record as status.firstAvailableAt
	// when none is recorded yet.
	FirstAvailableAt *metav1.Time
}

// WorkloadVerdict judges the workload alone.
func WorkloadVerdict(w client.Object) Verdict {
	switch w := w.(type) {
	case *appsv1.StatefulSet:
		return StatefulSetHealth(w)
	case *appsv1.Deployment:
		return DeploymentHealth(w)
	}
	return DeploymentHealth(nil)
}

// WorkloadKindVerdict judges a workload of the kind statefulSet says, nil
// when it does not exist.
func WorkloadKindVerdict(w client.Object, statefulSet bool) Verdict {
	if statefulSet {
		sts, _ := w.(*appsv1.StatefulSet)
		return StatefulSetHealth(sts)
	}
	dep, _ := w.(*appsv1.Deployment)
	return DeploymentHealth(dep)
}

// serverChain is the precedence of a server-backed backend's reasons: a
// name conflict (nothing was applied), a failed apply, then held storage, then the workload's own state, then the
// functional probe.
func serverChain(statefulSet bool) Chain[Facts] {
	return Chain[Facts]{
		func(f Facts) (Verdict, bool) {
			return Verdict{Reason: v1alpha1.ReasonNameConflict, Message: f.NameConflict, Degraded: true, Stalled: true}, f.NameConflict != ""
		},
		func(f Facts) (Verdict, bool) {
			if f.ApplyErr == nil {
				return Verdict{}, false
			}
			return Verdict{Reason: v1alpha1.ReasonApplyFailed, Message: f.ApplyErr.Error(), Degraded: true, Stalled: true}, true
		},
		func(f Facts) (Verdict, bool) {
			return Verdict{Reason: v1alpha1.ReasonImmutableStatefulSetStorage, Message: f.StorageHold, Degraded: true, Stalled: true}, f.StorageHold != ""
		},
		func(f Facts) (Verdict, bool) {
			v := WorkloadKindVerdict(f.Workload, statefulSet)
			return withNote(v, f.StorageNote), !v.Ready
		},
		func(f Facts) (Verdict, bool) {
			if !f.Probed || f.ProbeErr == nil {
				return Verdict{}, false
			}
			v := WorkloadKindVerdict(f.Workload, statefulSet)
			v.Ready, v.Reason, v.Degraded, v.Message = false, v1alpha1.ReasonFunctionalProbeFailed, true, f.ProbeErr.Error()
			return withNote(v, f.StorageNote), true
		},
		func(f Facts) (Verdict, bool) {
			return withNote(WorkloadKindVerdict(f.Workload, statefulSet), f.StorageNote), true
		},
	}
}

func withNote(v Verdict, note string) Verdict {
	if note != "" {
		v.Message += "; " + note
	}
	return v
}

// Server evaluates a server-backed backend.
func Server(f Facts, statefulSet bool) Verdict {
	return serverChain(statefulSet).Evaluate(f)
}
