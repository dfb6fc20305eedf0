package netpolicy

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func policy(name string, podSelector metav1.LabelSelector, types []networkingv1.PolicyType, rules ...networkingv1.NetworkPolicyIngressRule) networkingv1.NetworkPolicy {
	return networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "sys"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: podSelector, PolicyTypes: types, Ingress: rules},
	}
}

func ports(ps ...any) []networkingv1.NetworkPolicyPort {
	var out []networkingv1.NetworkPolicyPort
	for _, p := range ps {
		var v intstr.IntOrString
		switch p := p.(type) {
		case int:
			v = intstr.FromInt32(int32(p))
		case string:
			v = intstr.FromString(p)
		}
		out = append(out, networkingv1.NetworkPolicyPort{Port: &v})
	}
	return out
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

// TestIngressSemantics holds the evaluator to the NetworkPolicy API's
// rules, one case per rule.
func TestIngressSemantics(t *testing.T) {
	app := metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}
	dst := Destination{Namespace: "sys", Labels: map[string]string{"app": "x"}, Ports: []corev1.ContainerPort{
		{Name: "web", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
	}}
	tenant := Source{Pod: true, Namespace: "t", NamespaceLabels: map[string]string{"team": "a"}, PodLabels: map[string]string{"role": "web"}, IP: netip.MustParseAddr("10.244.1.5")}
	local := Source{Pod: true, Namespace: "sys", NamespaceLabels: map[string]string{}, PodLabels: map[string]string{"role": "web"}, IP: netip.MustParseAddr("10.244.2.5")}
	node := Source{IP: netip.MustParseAddr("172.18.0.2")}
	ingress := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	endPort := int32(9000)
	udp := corev1.ProtocolUDP
	for _, tc := range []struct {
		name     string
		policies []networkingv1.NetworkPolicy
		src      Source
		port     int32
		protocol corev1.Protocol
		sem      Semantics
		allowed  bool
	}{
		{"no policy selects the pod: allowed", nil, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"a policy of another namespace does not select it", []networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "other"}}}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"empty podSelector selects every pod; no rules deny all", []networkingv1.NetworkPolicy{policy("deny", metav1.LabelSelector{}, nil)}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"podSelector that does not match leaves the pod open", []networkingv1.NetworkPolicy{policy("deny", metav1.LabelSelector{MatchLabels: map[string]string{"app": "y"}}, nil)}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"an Egress-only policy does not select for ingress", []networkingv1.NetworkPolicy{policy("eg", app, []networkingv1.PolicyType{networkingv1.PolicyTypeEgress})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"a rule without from or ports allows everything", []networkingv1.NetworkPolicy{policy("all", app, ingress, networkingv1.NetworkPolicyIngressRule{})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"a numbered port matches", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports(8080)})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"another numbered port does not", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports(8081)})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"endPort makes a range", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(8000)), EndPort: &endPort}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"a named port resolves to the container's port", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports("web")})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"a named port the pod does not have matches nothing", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports("metrics")})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"a named port of another protocol does not match", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr(intstr.FromString("web"))}}})}, tenant, 8080, corev1.ProtocolUDP, Semantics{}, false},
		{"the protocol defaults to TCP", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{Ports: ports("dns")})}, tenant, 53, corev1.ProtocolUDP, Semantics{}, false},
		{"podSelector alone: the policy's namespace only", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "web")}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"podSelector alone admits its own namespace's pod", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{PodSelector: sel("role", "web")}}})}, local, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"namespaceSelector alone: every pod of those namespaces", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "a")}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"namespaceSelector and podSelector in one peer: AND (pod label missing)", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "a"), PodSelector: sel("role", "db")}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"namespaceSelector and podSelector in two peers: OR", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}, {NamespaceSelector: &metav1.LabelSelector{}, PodSelector: sel("role", "web")}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"rules of two policies add up (OR)", []networkingv1.NetworkPolicy{
			policy("a", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}}}),
			policy("b", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "a")}}}),
		}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"selectors never match a source outside the pod network", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}})}, node, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"ipBlock matches a node's address", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.244.0.0/16"}}}}})}, node, 8080, corev1.ProtocolTCP, Semantics{}, true},
		{"ipBlock except excludes an address", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"172.18.0.0/24"}}}}})}, node, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"an IPv4 block does not match an IPv6 address", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}})}, Source{IP: netip.MustParseAddr("fd00::1")}, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"ipBlock matches a pod's address where the plugin says so", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{IPBlockMatchesPods: true}, true},
		{"ipBlock does not match a pod where the plugin says not", []networkingv1.NetworkPolicy{policy("p", app, ingress, networkingv1.NetworkPolicyIngressRule{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0"}}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
		{"a matching peer on another port's rule does not allow", []networkingv1.NetworkPolicy{policy("p", app, ingress,
			networkingv1.NetworkPolicyIngressRule{Ports: ports(9090)},
			networkingv1.NetworkPolicyIngressRule{Ports: ports(8080), From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", "b")}}})}, tenant, 8080, corev1.ProtocolTCP, Semantics{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := Ingress(tc.policies, tc.src, dst, tc.port, tc.protocol, tc.sem)
			require.NoError(t, err)
			assert.Equal(t, tc.allowed, v.Allowed, v.String())
		})
	}
}

func ptr[T any](v T) *T { return &v }
