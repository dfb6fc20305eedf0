// Package netpolicy decides, with the semantics of networking.k8s.io/v1
// NetworkPolicy, whether a connection reaches a pod: a reading of the
// install bundle's policies that tests can assert on without a CNI. The
// maintained matchers (cyclonus, policy-assistant) do not build with this
// project's k8s.io modules, hence this small evaluator, tested on its own.
//
// It reads ingress only: the bundle leaves egress open, so a connection is
// decided by the policies selecting its destination. Where the API leaves
// the behaviour to the network plugin (whether an ipBlock matches a pod's
// address), Semantics says which reading to take.
package netpolicy

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Source is where a connection comes from: a pod (Pod true, with its
// namespace's labels and its own) or an address outside the pod network
// (a node, a managed control plane), which only ipBlocks can match.
type Source struct {
	Pod             bool
	Namespace       string
	NamespaceLabels map[string]string
	PodLabels       map[string]string
	IP              netip.Addr
}

// Destination is the pod a connection goes to, with its containers' ports
// (named ports of a policy resolve against them).
type Destination struct {
	Namespace string
	Labels    map[string]string
	Ports     []corev1.ContainerPort
}

// Semantics are the choices the API leaves to the network plugin.
type Semantics struct {
	// IPBlockMatchesPods: an ipBlock also matches a pod's own address
	// (Calico, the EKS and kind/kube-network-policies agents); false: it
	// matches only addresses outside the cluster (Cilium).
	IPBlockMatchesPods bool
}

// Verdict is the decision on one connection and, when it is allowed by a
// policy, which one.
type Verdict struct {
	Allowed bool
	// By names the policy and rule that allowed it ("" when no policy
	// selects the destination, so everything is allowed).
	By string
	// Selected: some policy selects the destination for ingress.
	Selected bool
}

func (v Verdict) String() string {
	switch {
	case !v.Selected:
		return "allowed (no policy selects the pod)"
	case v.Allowed:
		return "allowed by " + v.By
	}
	return "denied"
}

// Ingress decides whether src reaches dst on port/protocol under policies.
func Ingress(policies []networkingv1.NetworkPolicy, src Source, dst Destination, port int32, protocol corev1.Protocol, sem Semantics) (Verdict, error) {
	var v Verdict
	for _, p := range policies {
		selects, err := selectsForIngress(p, dst)
		if err != nil {
			return Verdict{}, err
		}
		if !selects {
			continue
		}
		v.Selected = true
		for i, rule := range p.Spec.Ingress {
			portOK := portMatches(rule.Ports, dst, port, protocol)
			if !portOK {
				continue
			}
			peerOK, err := peersMatch(rule.From, p.Namespace, src, sem)
			if err != nil {
				return Verdict{}, fmt.Errorf("policy %s/%s: %w", p.Namespace, p.Name, err)
			}
			if peerOK {
				return Verdict{Allowed: true, Selected: true, By: fmt.Sprintf("%s/%s ingress[%d]", p.Namespace, p.Name, i)}, nil
			}
		}
	}
	v.Allowed = !v.Selected
	return v, nil
}

// selectsForIngress: the policy is in the pod's namespace, its podSelector
// (empty: every pod) matches, and it is an Ingress policy (policyTypes
// empty means Ingress, plus Egress when it has egress rules).
func selectsForIngress(p networkingv1.NetworkPolicy, dst Destination) (bool, error) {
	if p.Namespace != dst.Namespace {
		return false, nil
	}
	ok, err := selectorMatches(&p.Spec.PodSelector, dst.Labels)
	if err != nil || !ok {
		return false, err
	}
	if len(p.Spec.PolicyTypes) == 0 {
		return true, nil
	}
	for _, t := range p.Spec.PolicyTypes {
		if t == networkingv1.PolicyTypeIngress {
			return true, nil
		}
	}
	return false, nil
}

// portMatches: no ports allow every port; otherwise one entry's protocol
// (default TCP) and port (absent: all; a number, with endPort a range; a
// name, resolved against the destination's container ports of that
// protocol).
func portMatches(ports []networkingv1.NetworkPolicyPort, dst Destination, port int32, protocol corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		proto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			proto = *pp.Protocol
		}
		if proto != protocol {
			continue
		}
		if pp.Port == nil {
			return true
		}
		if pp.Port.Type == intstr.String {
			for _, cp := range dst.Ports {
				cproto := cp.Protocol
				if cproto == "" {
					cproto = corev1.ProtocolTCP
				}
				if cp.Name == pp.Port.StrVal && cproto == protocol && cp.ContainerPort == port {
					return true
				}
			}
			continue
		}
		lo, hi := pp.Port.IntVal, pp.Port.IntVal
		if pp.EndPort != nil {
			hi = *pp.EndPort
		}
		if port >= lo && port <= hi {
			return true
		}
	}
	return false
}

// peersMatch: no peers allow every source; otherwise any one peer (OR).
func peersMatch(peers []networkingv1.NetworkPolicyPeer, policyNamespace string, src Source, sem Semantics) (bool, error) {
	if len(peers) == 0 {
		return true, nil
	}
	for _, peer := range peers {
		ok, err := peerMatches(peer, policyNamespace, src, sem)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// peerMatches: an ipBlock matches by address (cidr, not any except); a
// peer with selectors matches pods only: namespaceSelector and podSelector
// together must both match (AND); podSelector alone means the policy's
// namespace; namespaceSelector alone means every pod of those namespaces.
func peerMatches(peer networkingv1.NetworkPolicyPeer, policyNamespace string, src Source, sem Semantics) (bool, error) {
	if peer.IPBlock != nil {
		if src.Pod && !sem.IPBlockMatchesPods {
			return false, nil
		}
		return ipBlockMatches(*peer.IPBlock, src.IP)
	}
	if !src.Pod {
		return false, nil
	}
	if peer.NamespaceSelector == nil && peer.PodSelector == nil {
		return false, fmt.Errorf("a peer with neither ipBlock nor selectors")
	}
	if peer.NamespaceSelector != nil {
		ok, err := selectorMatches(peer.NamespaceSelector, src.NamespaceLabels)
		if err != nil || !ok {
			return false, err
		}
	} else if src.Namespace != policyNamespace {
		return false, nil
	}
	if peer.PodSelector != nil {
		return selectorMatches(peer.PodSelector, src.PodLabels)
	}
	return true, nil
}

func ipBlockMatches(b networkingv1.IPBlock, ip netip.Addr) (bool, error) {
	if !ip.IsValid() {
		return false, nil
	}
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return false, fmt.Errorf("ipBlock cidr: %w", err)
	}
	if !cidr.Contains(ip) {
		return false, nil
	}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			return false, fmt.Errorf("ipBlock except: %w", err)
		}
		if ex.Contains(ip) {
			return false, nil
		}
	}
	return true, nil
}

func selectorMatches(sel *metav1.LabelSelector, set map[string]string) (bool, error) {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false, err
	}
	return s.Matches(labels.Set(set)), nil
}
