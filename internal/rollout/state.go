package rollout

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/workload"
)

// Facts are what the engine rolls of one reconcile are decided from. The
// controller fills them from its pass (its fresh verdict, its cache); the
// CLI's diff from the live cluster and the live status. Both then call
// State, Gather and Decide: the same plan from the same facts.
type Facts struct {
	Backend *v1alpha1.CacheBackend
	// EngineLocal: the backend runs no server; ApplyFailed: writing its
	// children failed. Nothing rolls then.
	EngineLocal, ApplyFailed bool
	// Workload is the server workload read (nil: none), ServerPods its
	// serving pods, Change what they are against the recorded identity
	// (evaluate.ObserveServer).
	Workload   workload.Server
	ServerPods []corev1.Pod
	Change     evaluate.ServerChange
	// StorageHeld: the server's storage cannot change (the plan's
	// StatefulSet hold); the server does not count as available.
	StorageHeld bool
	// Ready and Available are the backend's verdict: Ready opens the
	// heal, Available the multiprocess publication.
	Ready, Available bool
	// Wiring is the tally of the matched engine pods by their receipts.
	Wiring evaluate.Wiring
	// Status is the status the endpoint's publication is read from; Live
	// says it was read from the API server (not a cache that may lag a
	// status write), which alone can say the endpoint has settled. Want
	// is the endpoint the backend publishes ("": whichever it shows).
	Status *v1alpha1.CacheBackendStatus
	Live   bool
	Want   string
	Now    time.Time
}

// State is the roll state of f.
func State(f Facts) RollState {
	cb := f.Backend
	s := RollState{
		EngineLocal: f.EngineLocal, Policy: cb.Spec.EngineRestartPolicy, ApplyFailed: f.ApplyFailed,
		Instance: f.Change.Instance, Changed: f.Change.Changed,
		ServerAvailable: !f.StorageHeld && evaluate.Health(f.Workload).Available,
		Ready:           f.Ready, Multiprocess: topology.Of(cb) == topology.Multiprocess,
		Early: len(f.Wiring.Early) > 0, KeysUnavailable: f.Wiring.KeysUnavailable,
	}
	s.SetPerNode(f.Workload, evaluate.ServerPods(f.ServerPods, true), f.Change, f.Now)
	if f.Status != nil {
		if s.Multiprocess && f.Available {
			s.Published = topology.Publication(f.Status, f.Want)
		}
		if f.Live {
			s.Settled = topology.Settled(f.Status, f.Want, s.Multiprocess, f.Now)
		}
	}
	return s
}

// Candidates are what a roll plan may roll: the cascade's wired
// workloads (or, per node, pods) and the heal's workloads.
type Candidates struct {
	Wired, Early []Candidate
	Pods         []EnginePod
}

// Gather reads the candidates s needs now, and only those: the cascade's
// when s.Cascade() (the workloads with a pod wired to cb, or per node the
// wired pods; receipts verified with keys, which is asked only then), the
// heal's when s.Heal() and the endpoint has settled (the workloads of the
// pods admitted before it, early). pods lists pods' metadata (the
// controller's cache); live reads what must not lag (the API server).
func Gather(ctx context.Context, pods, live client.Reader, cb *v1alpha1.CacheBackend, s RollState, keys func() ([]receipt.Key, error), early []metav1.PartialObjectMetadata) (Candidates, error) {
	var c Candidates
	if s.Cascade() {
		ks, err := keys()
		if err != nil {
			return c, fmt.Errorf("reading receipt keys to verify the wired engines: %w", err)
		}
		if s.PerNode {
			if c.Pods, err = WiredPods(ctx, pods, live, cb, ks); err != nil {
				return c, err
			}
		} else if c.Wired, err = WiredWorkloads(ctx, pods, live, cb, ks); err != nil {
			return c, err
		}
	}
	if s.Heal() && s.Settled {
		var err error
		if c.Early, err = EarlyWorkloads(ctx, live, cb.Namespace, early); err != nil {
			return c, err
		}
	}
	return c, nil
}

// Decide is the roll plan of s over the candidates Gather read.
func Decide(s RollState, c Candidates) RollPlan {
	return RollsPerNode(s, c.Wired, c.Early, c.Pods)
}
