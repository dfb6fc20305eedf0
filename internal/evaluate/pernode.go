package evaluate

import (
	"cmp"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/workload"
)

// NodeServers is status.multiprocess of a per-node server workload w
// (a DaemonSet) whose pods are pods: desired and ready servers from the
// DaemonSet controller's counts, and one entry per scheduled pod (the
// unready first, then by node; at most v1alpha1.MaxMultiprocessNodes),
// each with its address on the node, tcp://<pod-ip>:<port>. Nil for a
// workload that is not per node, or absent.
func NodeServers(w workload.Server, pods []corev1.Pod, port int32) *v1alpha1.MultiprocessStatus {
	if w == nil || !w.PerNode() {
		return nil
	}
	st := &v1alpha1.MultiprocessStatus{}
	if r := w.Rollout(); r != nil {
		st.DesiredServers, st.ReadyServers = r.Desired, r.Ready
	}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || slices.ContainsFunc(st.Nodes, func(n v1alpha1.MultiprocessNode) bool { return n.Node == p.Spec.NodeName }) {
			continue // not scheduled yet, or a second pod on the node (the old one, terminating)
		}
		n := v1alpha1.MultiprocessNode{Node: p.Spec.NodeName, Pod: p.Name, Ready: PodReady(p)}
		if p.Status.PodIP != "" {
			n.Endpoint = "tcp://" + p.Status.PodIP + ":" + strconv.Itoa(int(port))
		}
		st.Nodes = append(st.Nodes, n)
	}
	slices.SortFunc(st.Nodes, func(a, b v1alpha1.MultiprocessNode) int {
		if a.Ready != b.Ready {
			if !a.Ready {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Node, b.Node)
	})
	if len(st.Nodes) > v1alpha1.MaxMultiprocessNodes {
		st.Nodes = st.Nodes[:v1alpha1.MaxMultiprocessNodes]
	}
	return st
}
