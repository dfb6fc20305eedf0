package evaluate

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ServerPod is one cache-server pod of the workload, as the server
// observer sees it.
type ServerPod struct {
	UID      string
	Restarts int32
	Ready    bool
	// Node is the pod's node for a per-node workload (a DaemonSet: the
	// engines of that node reach this pod only), "" otherwise.
	Node string
	// Since is when the pod's server last started: the pod's creation, or
	// a container's later (re)start.
	Since time.Time
}

// ServerChange is the server observer's reading of the cache-server pods
// against the identity recorded before.
type ServerChange struct {
	// Instance is the identity to record: sorted <uid>:<restarts> of the
	// serving pods (<uid>:<restarts>@<node> for a per-node workload),
	// keeping a pod that was serving and is only not Ready right now under
	// its recorded entry.
	Instance string
	// Changed reports whether a serving pod of the recorded identity was
	// replaced (its UID is gone) or restarted (its restart count grew): the
	// engines connected to it lost their connection.
	Changed bool
	// ChangedNodes are the nodes of the recorded pods that were replaced
	// or restarted (per-node workloads only), sorted.
	ChangedNodes []string
	// ChangedUnplaced: a recorded pod without a node (a Deployment's or
	// StatefulSet's) was replaced or restarted, e.g. a backend that moved
	// from the in-process server to per-node servers: every wired engine
	// lost its server.
	ChangedUnplaced bool
}

// ObserveServer compares the pods of the workload with the recorded
// identity prev. A pod that is merely not Ready (a StatefulSet replica
// failing its readiness probe, for instance) is neither a replacement nor
// a restart: it changes nothing. New pods alone (a scale-up, a new node)
// break no connection. The first observation (prev empty) never counts as
// a change.
func ObserveServer(prev string, pods []ServerPod) ServerChange {
	type entry struct {
		restarts int32
		node     string
	}
	recorded := map[string]entry{}
	if prev != "" {
		for _, id := range strings.Split(prev, ",") {
			id, node, _ := strings.Cut(id, "@")
			uid, n, _ := strings.Cut(id, ":")
			r, _ := strconv.ParseInt(n, 10, 32)
			recorded[uid] = entry{int32(r), node}
		}
	}
	live := map[string]ServerPod{}
	for _, p := range pods {
		live[p.UID] = p
	}
	var c ServerChange
	for uid, e := range recorded {
		p, ok := live[uid]
		if !ok || p.Restarts > e.restarts {
			c.Changed = true
			switch {
			case e.node == "":
				c.ChangedUnplaced = true
			case !slices.Contains(c.ChangedNodes, e.node):
				c.ChangedNodes = append(c.ChangedNodes, e.node)
			}
		}
	}
	slices.Sort(c.ChangedNodes)
	var ids []string
	for _, p := range pods {
		e, wasServing := recorded[p.UID]
		at := ""
		if p.Node != "" {
			at = "@" + p.Node
		}
		switch {
		case p.Ready:
			ids = append(ids, fmt.Sprintf("%s:%d%s", p.UID, p.Restarts, at))
		case wasServing && p.Restarts == e.restarts:
			ids = append(ids, fmt.Sprintf("%s:%d%s", p.UID, e.restarts, at))
		}
	}
	sort.Strings(ids)
	c.Instance = strings.Join(ids, ",")
	return c
}

// ServerPods is what the server observer sees of pods: identity, restart
// count, readiness, the time the server last started and, for a per-node
// workload (perNode), the node: the one it runs on, or for a pod not
// scheduled yet the one its DaemonSet made it for (DaemonSetNode).
func ServerPods(pods []corev1.Pod, perNode bool) []ServerPod {
	out := make([]ServerPod, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		sp := ServerPod{UID: string(p.UID), Ready: PodReady(p), Since: p.CreationTimestamp.Time}
		for _, c := range p.Status.ContainerStatuses {
			sp.Restarts += c.RestartCount
			if r := c.State.Running; r != nil && r.StartedAt.After(sp.Since) {
				sp.Since = r.StartedAt.Time
			}
		}
		if perNode {
			sp.Node = cmp.Or(p.Spec.NodeName, DaemonSetNode(p))
		}
		out = append(out, sp)
	}
	return out
}

// DaemonSetNode is the node a DaemonSet's pod is made for, read from the
// node affinity the DaemonSet controller gives each pod (a required term
// matching the field metadata.name to the one node); "" for another pod.
// It names the node of a pod not scheduled yet: a replacement being
// scheduled, or one Pending on a node too small for it.
func DaemonSetNode(p *corev1.Pod) string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}
