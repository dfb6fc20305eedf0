package evaluate

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ServerPod is one cache-server pod of the workload, as the server
// observer sees it.
type ServerPod struct {
	UID      string
	Restarts int32
	Ready    bool
}

// ServerChange is the server observer's reading of the cache-server pods
// against the identity recorded before.
type ServerChange struct {
	// Instance is the identity to record: sorted <uid>:<restarts> of the
	// serving pods, keeping a pod that was serving and is only not Ready
	// right now under its recorded entry.
	Instance string
	// Changed reports whether a serving pod of the recorded identity was
	// replaced (its UID is gone) or restarted (its restart count grew): the
	// engines connected to it lost their connection.
	Changed bool
}

// ObserveServer compares the pods of the workload with the recorded
// identity prev. A pod that is merely not Ready (a StatefulSet replica
// failing its readiness probe, for instance) is neither a replacement nor
// a restart: it changes nothing. New pods alone (a scale-up) break no
// connection. The first observation (prev empty) never counts as a change.
func ObserveServer(prev string, pods []ServerPod) ServerChange {
	recorded := map[string]int32{}
	if prev != "" {
		for _, id := range strings.Split(prev, ",") {
			uid, n, _ := strings.Cut(id, ":")
			r, _ := strconv.ParseInt(n, 10, 32)
			recorded[uid] = int32(r)
		}
	}
	live := map[string]ServerPod{}
	for _, p := range pods {
		live[p.UID] = p
	}
	var c ServerChange
	for uid, r := range recorded {
		p, ok := live[uid]
		if !ok || p.Restarts > r {
			c.Changed = true
		}
	}
	var ids []string
	for _, p := range pods {
		r, wasServing := recorded[p.UID]
		switch {
		case p.Ready:
			ids = append(ids, fmt.Sprintf("%s:%d", p.UID, p.Restarts))
		case wasServing && p.Restarts == r:
			ids = append(ids, fmt.Sprintf("%s:%d", p.UID, r))
		}
	}
	sort.Strings(ids)
	c.Instance = strings.Join(ids, ",")
	return c
}

// ServerPods is what the server observer sees of pods: identity, restart
// count, readiness.
func ServerPods(pods []corev1.Pod) []ServerPod {
	out := make([]ServerPod, 0, len(pods))
	for i := range pods {
		p := &pods[i]
		var restarts int32
		for _, c := range p.Status.ContainerStatuses {
			restarts += c.RestartCount
		}
		out = append(out, ServerPod{UID: string(p.UID), Restarts: restarts, Ready: PodReady(p)})
	}
	return out
}
