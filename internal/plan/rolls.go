package plan

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// This file is the engine-roll plan: which engine workloads a reconcile
// rolls (the restart cascade after a cache-server change, and the heal of
// engines admitted before the endpoint existed), or how long it waits
// first. It is pure: the reconcile's observe reads the candidates
// (GatherRolls), internal/apply writes the rolls (Applier.Roll), and the
// CLI's diff previews the same plan.

// Workload is an engine workload the operator may roll: a Deployment or a
// StatefulSet of the backend's namespace.
type Workload struct {
	Kind string
	Name string
}

func (w Workload) String() string { return w.Kind + "/" + w.Name }

// RollCause is why a workload is rolled.
type RollCause string

const (
	// CauseServerChange: a serving cache-server pod was replaced or
	// restarted, and the workload has a pod wired to it (the cascade).
	CauseServerChange RollCause = "ServerChange"
	// CauseAdmittedBeforeEndpoint: the workload has pods admitted before
	// the endpoint existed, unwired (the heal).
	CauseAdmittedBeforeEndpoint RollCause = "AdmittedBeforeEndpoint"
)

// Roll is one engine workload to roll: AnnotationServerInstance=Value on
// its pod template.
type Roll struct {
	Workload Workload
	Value    string
	Cause    RollCause
}

// Candidate is an engine workload that may be rolled, as read: Carries is
// the value of AnnotationServerInstance its pod template carries now;
// Found is false when it could not be read (gone).
type Candidate struct {
	Workload Workload
	Carries  string
	Found    bool
}

// RollState is what of one reconcile decides whether engines roll.
type RollState struct {
	// EngineLocal: the backend runs no server (SGLangHiCache): nothing
	// rolls.
	EngineLocal bool
	Policy      v1alpha1.EngineRestartPolicy
	// ApplyFailed: executing the children's plan failed.
	ApplyFailed bool
	// Instance is the identity of the serving cache-server pods
	// (evaluate.ObserveServer), "" while none serves; Changed reports that
	// a pod of the recorded identity was replaced or restarted.
	Instance string
	Changed  bool
	// ServerAvailable: the server workload is available and its storage
	// not held.
	ServerAvailable bool
	// Ready is the backend's Ready verdict.
	Ready bool
	// Settled: the live status publishes the endpoint and has been Ready
	// long enough for the webhook's cache to hold it (engines rolled now
	// are wired).
	Settled bool
	// Early: some matched pods were admitted before the endpoint existed;
	// KeysUnavailable: some receipts could not be verified for want of
	// keys (the tally is not trustworthy).
	Early           bool
	KeysUnavailable bool
}

// Cascade reports whether the cascade's candidates (the workloads with a
// pod wired to the backend) are needed: a server change to follow, now.
func (s RollState) Cascade() bool {
	return !s.EngineLocal && !s.ApplyFailed && s.Instance != "" && s.Policy != v1alpha1.EngineRestartNever &&
		s.Changed && s.ServerAvailable && s.Settled
}

// Heal reports whether the heal applies: engines admitted before the
// endpoint, a Ready backend whose server serves, rolls allowed.
func (s RollState) Heal() bool {
	return !s.EngineLocal && !s.ApplyFailed && s.Instance != "" && s.Policy != v1alpha1.EngineRestartNever &&
		s.Early && !s.KeysUnavailable && s.Ready
}

// RollPlan is the engine rolls of one reconcile, or the wait before them.
type RollPlan struct {
	// Rolls are the workloads to roll, sorted, each once.
	Rolls []Roll
	// Wait is how soon to look again (0: not needed): a server change or
	// a heal waits for the endpoint to settle.
	Wait time.Duration
	// Record: status.observedServerInstance becomes the current instance
	// once the rolls are written (a server change not followed yet keeps
	// the recorded one, so that it is followed later).
	Record bool
	// Healing: every workload of the early pods is rolled by this plan or
	// carries the current instance already: their pods are being replaced.
	Healing bool
}

// Workloads lists the workloads rolled for cause, sorted.
func (p RollPlan) Workloads(cause RollCause) []Workload {
	var out []Workload
	for _, r := range p.Rolls {
		if r.Cause == cause {
			out = append(out, r.Workload)
		}
	}
	return out
}

// SettleWait is how soon a reconcile looks again while a server change or
// a heal waits for the endpoint to settle.
const SettleWait = 2 * time.Second

// InstanceHash is the value of AnnotationServerInstance for a server
// instance identity: a short hash, so the annotation does not grow with the
// replica count.
func InstanceHash(inst string) string {
	sum := sha256.Sum256([]byte(inst))
	return hex.EncodeToString(sum[:8])
}

// Rolls plans the engine rolls of one reconcile. wired are the cascade's
// candidates (read only when s.Cascade()), early the heal's (read only
// when s.Heal()). Both roll with InstanceHash(s.Instance), so a workload
// rolled by either is not rolled again for the same server instance, nor
// after a manager restart.
func Rolls(s RollState, wired, early []Candidate) RollPlan {
	var p RollPlan
	if s.EngineLocal || s.ApplyFailed || s.Instance == "" {
		return p
	}
	value := InstanceHash(s.Instance)
	planned := map[Workload]bool{}
	add := func(c Candidate, cause RollCause) {
		if c.Found && c.Carries != value && !planned[c.Workload] {
			planned[c.Workload] = true
			p.Rolls = append(p.Rolls, Roll{Workload: c.Workload, Value: value, Cause: cause})
		}
	}
	p.Record = true
	if s.Policy != v1alpha1.EngineRestartNever && s.Changed {
		if !s.Cascade() {
			// Followed once the server is available and the endpoint has
			// settled; until then the recorded identity stays.
			p.Record, p.Wait = false, SettleWait
		}
		for _, c := range wired {
			add(c, CauseServerChange)
		}
	}
	if s.Heal() {
		if !s.Settled {
			p.Wait = SettleWait // the webhook may not see the endpoint yet
		} else {
			all := len(early) > 0
			for _, c := range early {
				add(c, CauseAdmittedBeforeEndpoint)
				all = all && c.Found
			}
			p.Healing = all
		}
	}
	slices.SortFunc(p.Rolls, func(a, b Roll) int { return strings.Compare(a.Workload.String(), b.Workload.String()) })
	return p
}
