package helm

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/test/netpolicy"
)

// chartCluster renders the chart with vals (in YAML) and reads its policies
// and pods.
func chartCluster(t *testing.T, vals string) netpolicy.Cluster {
	t.Helper()
	v := map[string]any{}
	require.NoError(t, yaml.Unmarshal([]byte(vals), &v))
	var objs []map[string]any
	for _, o := range renderObjects(t, v) {
		objs = append(objs, o)
	}
	c, err := netpolicy.FromObjects(objs)
	require.NoError(t, err)
	return c
}

// TestChartNetworkPolicies reads the chart's policies with NetworkPolicy
// semantics: at the defaults they decide every case of the bundle's
// (test/netpolicy.BundleCases) as kustomize's do; each from value changes
// who may connect; networkPolicy.enabled=false renders none, so what the
// defaults deny is open again.
func TestChartNetworkPolicies(t *testing.T) {
	for semName, sem := range netpolicy.AllSemantics {
		c := chartCluster(t, `{}`)
		require.Len(t, c.Policies, 4)
		for _, tc := range netpolicy.BundleCases(namespace) {
			t.Run("defaults/"+semName+"/"+tc.Name, func(t *testing.T) {
				_, err := c.Check(tc, sem)
				assert.NoError(t, err)
			})
		}
	}

	eksControlPlane := netpolicy.Source{IP: netip.MustParseAddr("10.0.0.7")}
	openshiftMonitoring := netpolicy.Prometheus
	openshiftMonitoring.Namespace = "openshift-monitoring"
	openshiftMonitoring.NamespaceLabels = map[string]string{"kubernetes.io/metadata.name": "openshift-monitoring"}
	engineOtherLabel := netpolicy.EnginePod
	engineOtherLabel.NamespaceLabels = map[string]string{"kubernetes.io/metadata.name": "llm", "team": "inference"}
	routerInGateway := netpolicy.Router
	routerInGateway.NamespaceLabels = map[string]string{"kubernetes.io/metadata.name": "gateway", "routers": "true"}
	for _, tc := range []struct {
		name  string
		vals  string
		cases []netpolicy.Case
	}{
		{"webhook.from: the control plane's subnet only",
			`{networkPolicy: {webhook: {from: [{ipBlock: {cidr: 10.0.0.0/28}}]}}}`,
			[]netpolicy.Case{
				{Name: "the control plane's subnet reaches the webhook", From: eksControlPlane, To: "inferencecache-operator", Port: 9443, Allowed: true, By: "inferencecache-webhook"},
				{Name: "kind's node address no longer does", From: netpolicy.KindAPIServer, To: "inferencecache-operator", Port: 9443},
				{Name: "nor the konnectivity agent", From: netpolicy.AKSTunnel, To: "inferencecache-operator", Port: 9443},
			}},
		{"metrics.from: openshift-monitoring",
			`{networkPolicy: {metrics: {from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: openshift-monitoring}}}]}}}`,
			[]netpolicy.Case{
				{Name: "openshift-monitoring reaches the operator's metrics", From: openshiftMonitoring, To: "inferencecache-operator", Port: 8443, Allowed: true, By: "inferencecache-metrics"},
				{Name: "openshift-monitoring reaches the index's metrics", From: openshiftMonitoring, To: "inferencecache-index", Port: 8081, Allowed: true, By: "inferencecache-metrics"},
				{Name: "the monitoring namespace no longer does", From: netpolicy.Prometheus, To: "inferencecache-operator", Port: 8443},
			}},
		{"indexIngest.from: another namespace label",
			`{networkPolicy: {indexIngest: {from: [{namespaceSelector: {matchLabels: {team: inference}}}]}}}`,
			[]netpolicy.Case{
				{Name: "an engine of a team=inference namespace reaches the ingest", From: engineOtherLabel, To: "inferencecache-index", Port: 9400, Allowed: true, By: "inferencecache-index-ingest"},
				{Name: "one of an inject=enabled namespace no longer does", From: netpolicy.EnginePod, To: "inferencecache-index", Port: 9400},
			}},
		{"indexQuery.from: routers of labelled namespaces only",
			`{networkPolicy: {indexQuery: {from: [{namespaceSelector: {matchLabels: {routers: "true"}}, podSelector: {matchLabels: {inferencecache.io/index-reader: "true"}}}]}}}`,
			[]netpolicy.Case{
				{Name: "a router of a routers=true namespace reaches the query API", From: routerInGateway, To: "inferencecache-index", Port: 9401, Allowed: true, By: "inferencecache-index-query"},
				{Name: "a labelled pod elsewhere no longer does", From: netpolicy.Router, To: "inferencecache-index", Port: 9401},
				{Name: "nor the operator, left out of the value", From: netpolicy.Operator(namespace), To: "inferencecache-index", Port: 9401},
			}},
	} {
		c := chartCluster(t, tc.vals)
		for semName, sem := range netpolicy.AllSemantics {
			for _, cs := range tc.cases {
				t.Run(tc.name+"/"+semName+"/"+cs.Name, func(t *testing.T) {
					_, err := c.Check(cs, sem)
					assert.NoError(t, err)
				})
			}
		}
	}

	t.Run("networkPolicy.enabled=false renders none", func(t *testing.T) {
		c := chartCluster(t, `{networkPolicy: {enabled: false}}`)
		assert.Empty(t, c.Policies)
		v, err := netpolicy.Ingress(c.Policies, netpolicy.TenantPod, c.Pods["inferencecache-index"], 9400, "TCP", netpolicy.Semantics{})
		require.NoError(t, err)
		assert.True(t, v.Allowed, "without policies a tenant pod reaches the ingest")
	})
}
