package hygiene

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// operatorPermissions is the reviewed set of what the operator's
// ClusterRole allows, one "group/resource verb" a line (resourceNames
// after a '#'). A permission added to internal/controller/rbac.go (or
// internal/certs) fails this test until it is added here, in the same
// change that says why: the operator's RBAC grows only on purpose.
// Issue 23 (multiprocess mode) added apps/daemonsets (the node-local
// servers) and pods/eviction create (the per-node restart cascade evicts
// the engine pods of one node; a Deployment spans nodes, so rolling it
// would restart every node's engines), the latter in a ClusterRole of its
// own (engine_eviction.yaml) that an install may leave out.
var operatorPermissions = `
/persistentvolumeclaims create
/persistentvolumeclaims get
/persistentvolumeclaims list
/persistentvolumeclaims patch
/persistentvolumeclaims update
/persistentvolumeclaims watch
/pods get
/pods list
/pods watch
/pods/eviction create
/services create
/services delete
/services get
/services list
/services patch
/services update
/services watch
admissionregistration.k8s.io/mutatingwebhookconfigurations get #inferencecache-pod-injector
admissionregistration.k8s.io/mutatingwebhookconfigurations patch #inferencecache-pod-injector
admissionregistration.k8s.io/validatingwebhookconfigurations get #inferencecache-cachebackend-validator
admissionregistration.k8s.io/validatingwebhookconfigurations patch #inferencecache-cachebackend-validator
apps/daemonsets create
apps/daemonsets delete
apps/daemonsets get
apps/daemonsets list
apps/daemonsets patch
apps/daemonsets update
apps/daemonsets watch
apps/deployments create
apps/deployments delete
apps/deployments get
apps/deployments list
apps/deployments patch
apps/deployments update
apps/deployments watch
apps/replicasets get
apps/replicasets list
apps/replicasets watch
apps/statefulsets create
apps/statefulsets delete
apps/statefulsets get
apps/statefulsets list
apps/statefulsets patch
apps/statefulsets update
apps/statefulsets watch
`

// TestOperatorClusterRoleIsTheReviewedSet: the operator's ClusterRoles
// (the generated kustomize/base/rbac/role.yaml and the engine-eviction
// grant beside it) grant the reviewed permissions above among their rules,
// and nothing on the workload, pod and Service resources beyond them; the
// generated one does not grant pods/eviction (an install may leave that
// grant out, and keep every other permission).
func TestOperatorClusterRoleIsTheReviewedSet(t *testing.T) {
	var got []string
	for _, f := range []string{"role.yaml", "engine_eviction.yaml"} {
		raw, err := os.ReadFile("../../kustomize/base/rbac/" + f)
		require.NoError(t, err)
		for _, doc := range strings.Split(string(raw), "\n---") {
			var role rbacv1.ClusterRole
			require.NoError(t, yaml.Unmarshal([]byte(doc), &role))
			if role.Kind != "ClusterRole" || (role.Name != "inferencecache-operator" && role.Name != "inferencecache-operator-engine-eviction") {
				continue
			}
			for _, r := range role.Rules {
				for _, g := range r.APIGroups {
					if g != "" && g != "apps" && g != "admissionregistration.k8s.io" {
						continue // the operator's own API, events, leases, reviews: not in the reviewed set
					}
					for _, res := range r.Resources {
						assert.False(t, res == "pods/eviction" && f == "role.yaml", "pods/eviction is granted by engine_eviction.yaml only")
						for _, v := range r.Verbs {
							line := g + "/" + res + " " + v
							if len(r.ResourceNames) > 0 {
								line += " #" + strings.Join(r.ResourceNames, ",")
							}
							got = append(got, line)
						}
					}
				}
			}
		}
	}
	require.NotEmpty(t, got, "the ClusterRole inferencecache-operator is in role.yaml")
	slices.Sort(got)
	want := strings.Split(strings.TrimSpace(operatorPermissions), "\n")
	slices.Sort(want)
	assert.Equal(t, want, got)
}
