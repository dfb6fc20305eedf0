package netpolicy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inferencecache/operator/test/manifests"
	"github.com/inferencecache/operator/test/netpolicy"
)

const namespace = "inferencecache-system"

func bundle(t *testing.T, overlay string) netpolicy.Cluster {
	t.Helper()
	objs, err := manifests.Build("../../kustomize/overlays/" + overlay)
	require.NoError(t, err)
	var maps []map[string]any
	for _, o := range objs {
		maps = append(maps, o.Object)
	}
	c, err := netpolicy.FromObjects(maps)
	require.NoError(t, err)
	return c
}

// TestBundleNetworkPolicies reads the policies both overlays render with
// NetworkPolicy semantics, under either reading of ipBlock: who reaches
// the webhook, the index's ingest and query API, and the metrics.
func TestBundleNetworkPolicies(t *testing.T) {
	for _, overlay := range []string{"production", "dev"} {
		c := bundle(t, overlay)
		require.Len(t, c.Policies, 4, overlay)
		for semName, sem := range netpolicy.AllSemantics {
			for _, tc := range netpolicy.BundleCases(namespace) {
				t.Run(overlay+"/"+semName+"/"+tc.Name, func(t *testing.T) {
					_, err := c.Check(tc, sem)
					assert.NoError(t, err)
				})
			}
		}
	}
}

// TestEveryBundlePolicyDecidesACase: removing any one policy flips at least
// one case of TestBundleNetworkPolicies, and removing them all flips every
// denied case, so no case passes without the policies it is about.
func TestEveryBundlePolicyDecidesACase(t *testing.T) {
	c := bundle(t, "production")
	sem := netpolicy.AllSemantics["ipBlock outside the cluster (Cilium)"]
	for _, p := range c.Policies {
		without := c.Without(p.Name)
		flipped := 0
		for _, tc := range netpolicy.BundleCases(namespace) {
			if _, err := without.Check(tc, sem); err != nil {
				flipped++
			}
		}
		assert.Positive(t, flipped, "removing %s flips no case", p.Name)
		t.Logf("removing %s flips %d cases", p.Name, flipped)
	}
	none := netpolicy.Cluster{Pods: c.Pods}
	for _, tc := range netpolicy.BundleCases(namespace) {
		if tc.Allowed {
			continue
		}
		v, err := netpolicy.Ingress(none.Policies, tc.From, c.Pods[tc.To], tc.Port, "TCP", sem)
		require.NoError(t, err)
		assert.True(t, v.Allowed, "%s: denied even without policies", tc.Name)
	}
}
