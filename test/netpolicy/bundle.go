package netpolicy

import (
	"fmt"
	"net/netip"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Cluster is what a reading needs of rendered objects: the NetworkPolicies
// and, per workload name, the pod its template makes.
type Cluster struct {
	Policies []networkingv1.NetworkPolicy
	Pods     map[string]Destination
}

// FromObjects reads the NetworkPolicies and the Deployments' pods of
// rendered objects (kustomize's or the chart's, decoded).
func FromObjects(objs []map[string]any) (Cluster, error) {
	c := Cluster{Pods: map[string]Destination{}}
	for _, o := range objs {
		switch o["kind"] {
		case "NetworkPolicy":
			var p networkingv1.NetworkPolicy
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o, &p); err != nil {
				return Cluster{}, fmt.Errorf("networkpolicy: %w", err)
			}
			c.Policies = append(c.Policies, p)
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o, &d); err != nil {
				return Cluster{}, fmt.Errorf("deployment: %w", err)
			}
			var ports []corev1.ContainerPort
			for _, ctr := range d.Spec.Template.Spec.Containers {
				ports = append(ports, ctr.Ports...)
			}
			c.Pods[d.Name] = Destination{Namespace: d.Namespace, Labels: d.Spec.Template.Labels, Ports: ports}
		}
	}
	return c, nil
}

// Case is one connection to a workload of the bundle and whether the
// bundle's policies must allow it (By: the policy that must).
type Case struct {
	Name    string
	From    Source
	To      string // the workload's name
	Port    int32
	Allowed bool
	By      string // the allowing policy's name, when Allowed
}

// pod is a pod source; its namespace carries kubernetes.io/metadata.name
// as the API server sets it.
func pod(ns string, nsLabels, podLabels map[string]string, ip string) Source {
	l := map[string]string{"kubernetes.io/metadata.name": ns}
	for k, v := range nsLabels {
		l[k] = v
	}
	return Source{Pod: true, Namespace: ns, NamespaceLabels: l, PodLabels: podLabels, IP: netip.MustParseAddr(ip)}
}

// Well-known sources: kind's control-plane node (its API server runs on
// the host network) and pod addresses in kind's pod network.
var (
	KindAPIServer = Source{IP: netip.MustParseAddr("172.18.0.2")}
	TenantPod     = pod("tenant", nil, map[string]string{"app": "web"}, "10.244.1.7")
	EnginePod     = pod("llm", map[string]string{"inferencecache.io/inject": "enabled"}, map[string]string{"app": "vllm"}, "10.244.2.9")
	Router        = pod("gateway", nil, map[string]string{"inferencecache.io/index-reader": "true"}, "10.244.3.4")
	Prometheus    = pod("monitoring", nil, map[string]string{"app.kubernetes.io/name": "prometheus"}, "10.244.4.2")
	AKSTunnel     = pod("kube-system", nil, map[string]string{"app": "konnectivity-agent"}, "10.244.0.30")
	GKETunnel     = pod("kube-system", nil, map[string]string{"k8s-app": "konnectivity-agent"}, "10.244.0.31")
	KubeSystemPod = pod("kube-system", nil, map[string]string{"k8s-app": "kube-dns"}, "10.244.0.32")
)

// Operator is the operator's pod as a source, in namespace ns.
func Operator(ns string) Source {
	return pod(ns, nil, map[string]string{"app.kubernetes.io/name": "inferencecache-operator", "app.kubernetes.io/part-of": "inferencecache"}, "10.244.0.12")
}

// Index is an index replica as a source, in namespace ns.
func Index(ns string) Source {
	return pod(ns, nil, map[string]string{"app.kubernetes.io/name": "inferencecache-index", "app.kubernetes.io/part-of": "inferencecache"}, "10.244.0.13")
}

const (
	operatorName = "inferencecache-operator"
	indexName    = "inferencecache-index"
)

// BundleCases are the connections the default bundle's policies decide,
// with the operator in namespace ns.
func BundleCases(ns string) []Case {
	return []Case{
		{Name: "a tenant pod cannot reach the webhook", From: TenantPod, To: operatorName, Port: 9443},
		{Name: "a tenant pod cannot reach the operator's metrics", From: TenantPod, To: operatorName, Port: 8443},
		{Name: "a tenant pod cannot reach the ingest", From: TenantPod, To: indexName, Port: 9400},
		{Name: "a tenant pod cannot reach the query API", From: TenantPod, To: indexName, Port: 9401},
		{Name: "a tenant pod cannot reach the index's metrics", From: TenantPod, To: indexName, Port: 8081},
		{Name: "a kube-system pod cannot reach the webhook", From: KubeSystemPod, To: operatorName, Port: 9443},
		{Name: "a router cannot reach the webhook", From: Router, To: operatorName, Port: 9443},
		{Name: "an engine pod cannot reach the webhook", From: EnginePod, To: operatorName, Port: 9443},
		{Name: "the index cannot reach the webhook", From: Index(ns), To: operatorName, Port: 9443},
		{Name: "kind's API server reaches the webhook", From: KindAPIServer, To: operatorName, Port: 9443, Allowed: true, By: "inferencecache-webhook"},
		{Name: "AKS's konnectivity agent reaches the webhook", From: AKSTunnel, To: operatorName, Port: 9443, Allowed: true, By: "inferencecache-webhook"},
		{Name: "GKE's konnectivity agent reaches the webhook", From: GKETunnel, To: operatorName, Port: 9443, Allowed: true, By: "inferencecache-webhook"},
		{Name: "the API server's address reaches only the webhook", From: KindAPIServer, To: indexName, Port: 9400},
		{Name: "an engine pod of a labelled namespace reaches the ingest", From: EnginePod, To: indexName, Port: 9400, Allowed: true, By: "inferencecache-index-ingest"},
		{Name: "an engine pod cannot reach the HTTP query API", From: EnginePod, To: indexName, Port: 9401},
		{Name: "a router reaches the HTTP query API", From: Router, To: indexName, Port: 9401, Allowed: true, By: "inferencecache-index-query"},
		{Name: "a router reaches the gRPC query API", From: Router, To: indexName, Port: 9400, Allowed: true, By: "inferencecache-index-query"},
		{Name: "a router cannot reach the index's metrics", From: Router, To: indexName, Port: 8081},
		{Name: "the operator reaches the HTTP query API", From: Operator(ns), To: indexName, Port: 9401, Allowed: true, By: "inferencecache-index-query"},
		{Name: "the operator cannot reach the index's metrics", From: Operator(ns), To: indexName, Port: 8081},
		{Name: "prometheus reaches the operator's metrics", From: Prometheus, To: operatorName, Port: 8443, Allowed: true, By: "inferencecache-metrics"},
		{Name: "prometheus reaches the index's metrics", From: Prometheus, To: indexName, Port: 8081, Allowed: true, By: "inferencecache-metrics"},
		{Name: "prometheus cannot reach the query API", From: Prometheus, To: indexName, Port: 9401},
		{Name: "prometheus cannot reach the webhook", From: Prometheus, To: operatorName, Port: 9443},
	}
}

// AllSemantics are the plugin readings every case is checked under.
var AllSemantics = map[string]Semantics{
	"ipBlock matches pods (Calico)":        {IPBlockMatchesPods: true},
	"ipBlock outside the cluster (Cilium)": {},
}

// Check decides one case on c; it returns an error when the verdict is not
// the case's.
func (c Cluster) Check(tc Case, sem Semantics) (Verdict, error) {
	dst, ok := c.Pods[tc.To]
	if !ok {
		return Verdict{}, fmt.Errorf("no workload %s", tc.To)
	}
	v, err := Ingress(c.Policies, tc.From, dst, tc.Port, corev1.ProtocolTCP, sem)
	if err != nil {
		return v, err
	}
	if v.Allowed != tc.Allowed {
		return v, fmt.Errorf("%s: %s, want allowed=%v", tc.Name, v, tc.Allowed)
	}
	if tc.Allowed && !v.Selected {
		return v, fmt.Errorf("%s: allowed only because no policy selects %s", tc.Name, tc.To)
	}
	if tc.By != "" && v.By != fmt.Sprintf("%s/%s ingress[0]", dst.Namespace, tc.By) {
		return v, fmt.Errorf("%s: %s, want allowed by %s", tc.Name, v, tc.By)
	}
	return v, nil
}

// Without returns c without the policy named name.
func (c Cluster) Without(name string) Cluster {
	out := Cluster{Pods: c.Pods}
	for _, p := range c.Policies {
		if p.Name != name {
			out.Policies = append(out.Policies, p)
		}
	}
	return out
}
