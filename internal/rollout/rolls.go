// Package rollout decides the engine rolls of a reconcile, and reads what
// they are decided from: the roll state of a backend's facts (State), the
// engine workloads or pods a roll may write (Gather), the plan (Decide,
// pure). The controller and the CLI's diff both call these three, so the
// diff previews exactly the controller's plan.
package rollout

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/evaluate"
	"github.com/inferencecache/operator/internal/workload"
)

// This file is the engine-roll plan: which engine workloads a reconcile
// rolls (the restart cascade after a cache-server change, and the heal of
// engines admitted before the endpoint existed), or how long it waits
// first. It is pure: State and Gather (state.go) give it its inputs,
// internal/apply writes the rolls (apply.Roll, apply.Evict).

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

// RollTarget is what apply.Roll writes: the workload and the value.
func (r Roll) RollTarget() (kind, name, value string) {
	return r.Workload.Kind, r.Workload.Name, r.Value
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
	// Multiprocess: the backend runs per-node servers (multiprocess mode),
	// whose endpoint the webhook wires while any node's server serves:
	// the heal waits for the endpoint to settle, not for Ready (every
	// node's server).
	// Published is, in that mode, the endpoint the status publishes and
	// when (topology.Publication), while this reconcile publishes it too;
	// "" otherwise. It opens the heal (without it, only Ready does), and
	// its hash is the value of every whole-workload roll (the heal, and
	// the cascade of a move from the in-process server): unlike the
	// instance, which grows as each node's server becomes ready, it stays
	// while servers come and go, so a workload being healed is not rolled
	// again when another node's server comes up.
	Multiprocess bool
	Published    string
	// Settled: the live status publishes the endpoint, long enough for
	// the webhook's cache to hold it (engines rolled now are wired):
	// counted from the Ready transition, or in multiprocess mode from
	// status.endpointPublishedAt (topology.Settled), so a node
	// without a server holds neither the other nodes' evictions nor the
	// heal.
	Settled bool
	// PerNode: the server runs one pod per node (multiprocess mode) and
	// each engine reaches its own node's server only: a server change
	// evicts the wired engine pods of its node (Evictions) instead of
	// rolling whole engine workloads, which span nodes. ChangedNodes are
	// the nodes whose recorded server was replaced or restarted, and
	// NodeServers the serving pod of each node now.
	// ServersMissing: fewer nodes have a server pod than the workload
	// wants (a replacement not created yet), so a changed node without one
	// is waited for rather than taken as gone.
	// Now is the reconcile's clock (the per-node cascade waits a second
	// past a server's start: API times have a resolution of a second).
	PerNode        bool
	ChangedNodes   []string
	NodeServers    map[string]NodeServer
	ServersMissing bool
	Now            time.Time
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
// endpoint, a Ready backend (or, in multiprocess mode, one that publishes
// its endpoint: Published) whose server serves, rolls allowed.
func (s RollState) Heal() bool {
	return !s.EngineLocal && !s.ApplyFailed && s.Instance != "" && s.Policy != v1alpha1.EngineRestartNever &&
		s.Early && !s.KeysUnavailable && (s.Ready || (s.Multiprocess && s.Published != ""))
}

// value is what the whole-workload rolls of s write: the hash of the
// publication in multiprocess mode, of the server instance otherwise.
func (s RollState) value() string {
	if s.Multiprocess && s.Published != "" {
		return InstanceHash(s.Published)
	}
	return InstanceHash(s.Instance)
}

// SetPerNode fills s's per-node fields when w runs one server per node
// and the change concerns per-node servers only (nothing otherwise: a
// backend that moved from the in-process server to per-node servers rolls
// its engine workloads, whose pods were wired to a server that is gone):
// the nodes whose recorded server changed (change.ChangedNodes), each node's serving pod from pods
// (evaluate.ServerPods of w's serving pods, with nodes), whether some node
// still waits for its server pod to be created (fewer nodes have a server
// pod, scheduled or made for them, than the DaemonSet wants), and the
// clock. The controller and the CLI's
// diff set them alike.
func (s *RollState) SetPerNode(w workload.Server, pods []evaluate.ServerPod, change evaluate.ServerChange, now time.Time) {
	if w == nil || !w.PerNode() || change.ChangedUnplaced {
		// Not per node, or the servers the engines were wired to were not
		// (a move from the in-process server): the whole-workload cascade.
		return
	}
	s.PerNode, s.ChangedNodes, s.Now = true, change.ChangedNodes, now
	s.NodeServers = map[string]NodeServer{}
	for _, p := range pods {
		// A pod not scheduled yet has its node too (evaluate.ServerPods),
		// not ready: a replacement being scheduled is waited for, and one
		// that stays Pending (a node too small for it) counts for its
		// node, so a changed node gone for good is not taken for one
		// waiting while another node's server stays Pending.
		if p.Node != "" {
			s.NodeServers[p.Node] = NodeServer{Ready: p.Ready, Since: p.Since}
		}
	}
	if r := w.Rollout(); r != nil {
		s.ServersMissing = int32(len(s.NodeServers)) < r.Desired
	}
}

// NodeServer is the server pod of one node: whether it is ready, and
// since when its server runs (its creation, or its container's last
// start).
type NodeServer struct {
	Ready bool
	Since time.Time
}

// EnginePod is a wired engine pod of a per-node backend, as read: its
// node and creation time.
type EnginePod struct {
	Name    string
	UID     types.UID
	Node    string
	Created time.Time
}

// Eviction is an engine pod to evict: its node's server was replaced or
// restarted after the pod was created (or in the same second).
type Eviction struct {
	Pod string
	// UID is the pod's, a precondition of the eviction: a pod re-created
	// under the same name (a StatefulSet's) is not evicted for its
	// predecessor.
	UID  types.UID
	Node string
	// Since is when the node's server started (NodeServer.Since): the
	// server change the eviction follows.
	Since time.Time
}

// EvictTarget is what apply.Evict evicts: the pod, its UID, its node.
func (e Eviction) EvictTarget() (pod string, uid types.UID, node string) { return e.Pod, e.UID, e.Node }

// RollPlan is the engine rolls of one reconcile, or the wait before them.
type RollPlan struct {
	// Rolls are the workloads to roll, sorted, each once.
	Rolls []Roll
	// Evictions are the engine pods to evict (per-node servers), sorted
	// by node and pod.
	Evictions []Eviction
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
// when s.Heal()). Both roll with the same value (the hash of the server
// instance; in multiprocess mode of the endpoint's publication), so a
// workload rolled by either is not rolled again for the same server
// instance (publication), nor after a manager restart. For a per-node server the cascade is
// PerNodeEvictions of pods instead (their candidates are in the
// EnginePods argument of RollsPerNode).
func Rolls(s RollState, wired, early []Candidate) RollPlan {
	return RollsPerNode(s, wired, early, nil)
}

// RollsPerNode is Rolls with the wired engine pods of a per-node server
// (read only when s.Cascade() and s.PerNode): a server replaced or
// restarted on node X evicts the wired engine pods on X created before
// X's server started (at the API's resolution of a second: in the same
// second too), once X's new server is ready and a second has passed since
// it started, and nothing else. A pod created after that (a replacement,
// or one evicted already and re-created) is not evicted again, so the cascade happens once per node
// and server, also across manager restarts and failed evictions.
func RollsPerNode(s RollState, wired, early []Candidate, pods []EnginePod) RollPlan {
	var p RollPlan
	if s.EngineLocal || s.ApplyFailed || s.Instance == "" {
		return p
	}
	value := s.value()
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
		if s.PerNode {
			p.perNode(s, pods)
		} else {
			for _, c := range wired {
				add(c, CauseServerChange)
			}
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

// perNode plans the evictions of a per-node cascade (s.Changed). A node
// whose new server is not ready yet, or not created yet while the
// workload misses servers, makes the plan wait (the recorded identity
// stays, so the node is followed later); a node without a server while
// none is missing (deleted, or no longer selected) has nothing to
// reconnect to.
func (p *RollPlan) perNode(s RollState, pods []EnginePod) {
	if !s.Cascade() {
		return
	}
	for _, node := range s.ChangedNodes {
		srv, ok := s.NodeServers[node]
		switch {
		case !ok && !s.ServersMissing:
			continue
		case !ok, !srv.Ready, s.Now.Before(srv.Since.Add(time.Second)):
			// API times are whole seconds: once a second has passed since
			// the server started, every pod created from now on reads as
			// created after it, and is never evicted for it.
			p.Record, p.Wait = false, SettleWait
			continue
		}
		for _, e := range pods {
			if e.Node == node && !e.Created.After(srv.Since) {
				p.Evictions = append(p.Evictions, Eviction{Pod: e.Name, UID: e.UID, Node: node, Since: srv.Since})
			}
		}
	}
	slices.SortFunc(p.Evictions, func(a, b Eviction) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Pod, b.Pod))
	})
}
