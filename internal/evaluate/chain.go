package evaluate

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/workload"
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
	// Workload is the cache-server workload of the kind the spec asks for,
	// as observed after the apply (absent when it does not exist yet).
	Workload workload.Server
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

// serverChain is the precedence of a server-backed backend's reasons: a
// name conflict (nothing was applied), a failed apply, then held storage,
// then the workload's own state, then the functional probe.
var serverChain = Chain[Facts]{
	nameConflict,
	applyFailed,
	storageHeld,
	workloadNotReady,
	probeFailed,
	workloadReady,
}

func nameConflict(f Facts) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonNameConflict, Message: f.NameConflict, Degraded: true, Stalled: true}, f.NameConflict != ""
}

func applyFailed(f Facts) (Verdict, bool) {
	if f.ApplyErr == nil {
		return Verdict{}, false
	}
	return Verdict{Reason: v1alpha1.ReasonApplyFailed, Message: f.ApplyErr.Error(), Degraded: true, Stalled: true}, true
}

func storageHeld(f Facts) (Verdict, bool) {
	return Verdict{Reason: v1alpha1.ReasonImmutableStatefulSetStorage, Message: f.StorageHold, Degraded: true, Stalled: true}, f.StorageHold != ""
}

func workloadNotReady(f Facts) (Verdict, bool) {
	v := Health(f.Workload)
	return withNote(v, f.StorageNote), !v.Ready
}

func probeFailed(f Facts) (Verdict, bool) {
	if !f.Probed || f.ProbeErr == nil {
		return Verdict{}, false
	}
	v := Health(f.Workload)
	v.Ready, v.Reason, v.Degraded, v.Message = false, v1alpha1.ReasonFunctionalProbeFailed, true, f.ProbeErr.Error()
	return withNote(v, f.StorageNote), true
}

func workloadReady(f Facts) (Verdict, bool) {
	return withNote(Health(f.Workload), f.StorageNote), true
}

func withNote(v Verdict, note string) Verdict {
	if note != "" {
		v.Message += "; " + note
	}
	return v
}

// Server evaluates a server-backed backend.
func Server(f Facts) Verdict {
	return serverChain.Evaluate(f)
}
