package gitops

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/inferencecache/operator/internal/cli"
)

func build(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := cli.ReadFile(dir, true)
	require.NoError(t, err)
	return objs
}

func convert[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out))
	return out
}

// TestLeastPrivilegeRBAC asserts issue 13's RBAC items on the bundle as
// installed (every overlay).
func TestLeastPrivilegeRBAC(t *testing.T) {
	for _, dir := range []string{"../../kustomize/overlays/dev", "../../kustomize/overlays/production"} {
		t.Run(dir, func(t *testing.T) {
			var operator *rbacv1.ClusterRole
			var role *rbacv1.Role
			aggregated := map[string]*rbacv1.ClusterRole{}
			for _, o := range build(t, dir) {
				switch {
				case o.GetKind() == "ClusterRole" && o.GetName() == "inferencecache-operator":
					operator = convert[rbacv1.ClusterRole](t, o)
				case o.GetKind() == "Role" && o.GetName() == "inferencecache-operator":
					role = convert[rbacv1.Role](t, o)
				case o.GetKind() == "ClusterRole":
					aggregated[o.GetName()] = convert[rbacv1.ClusterRole](t, o)
				}
			}
			require.NotNil(t, operator)
			require.NotNil(t, role)
			assert.Equal(t, operatorNamespace, role.Namespace)

			grants := func(rules []rbacv1.PolicyRule, group, resource, verb string) []rbacv1.PolicyRule {
				var out []rbacv1.PolicyRule
				for _, r := range rules {
					if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) {
						out = append(out, r)
					}
				}
				return out
			}
			assert.Empty(t, grants(operator.Rules, "coordination.k8s.io", "leases", "get"), "no cluster-wide leases")
			assert.NotEmpty(t, grants(role.Rules, "coordination.k8s.io", "leases", "update"), "leases in the operator's namespace")
			assert.NotEmpty(t, grants(operator.Rules, "inferencecache.io", "cachebackends/finalizers", "update"))
			assert.NotEmpty(t, grants(operator.Rules, "authentication.k8s.io", "tokenreviews", "create"), "metrics authentication")
			assert.NotEmpty(t, grants(operator.Rules, "authorization.k8s.io", "subjectaccessreviews", "create"), "metrics authorization")
			assert.Empty(t, grants(operator.Rules, "", "secrets", "get"), "no cluster-wide Secrets")
			// The receipt controller records events and never writes to pods.
			for _, verb := range []string{"patch", "update", "create", "delete", "*"} {
				for _, res := range []string{"pods", "*"} {
					assert.Empty(t, grants(operator.Rules, "", res, verb), "no cluster-wide pods %s", verb)
					assert.Empty(t, grants(role.Rules, "", res, verb), "no pods %s in the operator's namespace either", verb)
				}
			}
			assert.NotEmpty(t, grants(operator.Rules, "", "pods", "watch"), "pods are watched (read only)")
			for _, verb := range []string{"get", "update", "patch", "delete", "list", "watch"} {
				for _, r := range grants(role.Rules, "", "secrets", verb) {
					assert.NotEmpty(t, r.ResourceNames, "Secrets %s only by resourceNames", verb)
				}
			}
			assert.NotEmpty(t, grants(role.Rules, "", "secrets", "create"), "create cannot be limited by name")

			for name, label := range map[string]string{
				"cachebackend-admin": "rbac.authorization.k8s.io/aggregate-to-admin",
				"cachebackend-edit":  "rbac.authorization.k8s.io/aggregate-to-edit",
				"cachebackend-view":  "rbac.authorization.k8s.io/aggregate-to-view",
			} {
				r := aggregated[name]
				require.NotNil(t, r, name)
				assert.Equal(t, "true", r.Labels[label], name)
				assert.Empty(t, grants(r.Rules, "inferencecache.io", "cachebackends/status", "update"), "%s: only the operator writes status", name)
				assert.Empty(t, grants(r.Rules, "inferencecache.io", "cachebackends/status", "patch"), name)
			}
			assert.Empty(t, grants(aggregated["cachebackend-view"].Rules, "inferencecache.io", "cachebackends", "create"))
			reader := aggregated["inferencecache-metrics-reader"]
			require.NotNil(t, reader)
			require.Len(t, reader.Rules, 1)
			assert.Equal(t, []string{"/metrics"}, reader.Rules[0].NonResourceURLs)
			assert.Equal(t, []string{"get"}, reader.Rules[0].Verbs)
		})
	}
}

// TestManagerMemoryLimit: the manager's GOMEMLIMIT is its container's
// memory limit (downward API), and metrics are served over HTTPS.
func TestManagerMemoryLimit(t *testing.T) {
	for _, o := range build(t, "../../kustomize/overlays/production") {
		if o.GetKind() != "Deployment" {
			continue
		}
		d := convert[appsv1.Deployment](t, o)
		c := d.Spec.Template.Spec.Containers[0]
		require.NotNil(t, c.Resources.Limits.Memory())
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "GOMEMLIMIT" })
		require.GreaterOrEqual(t, i, 0, "GOMEMLIMIT set")
		ref := c.Env[i].ValueFrom.ResourceFieldRef
		require.NotNil(t, ref)
		assert.Equal(t, "limits.memory", ref.Resource)
		assert.Equal(t, "manager", ref.ContainerName)
		assert.Contains(t, c.Args, "--metrics-bind-address=:8443")
		assert.NotContains(t, c.Args, "--metrics-secure=false")
	}
}

// TestNamespaceOptIn: the optional component narrows the pod webhook to
// opted-in namespaces and keeps the exclusions.
func TestNamespaceOptIn(t *testing.T) {
	for _, o := range build(t, "testdata/opt-in") {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		c := convert[admissionregistrationv1.MutatingWebhookConfiguration](t, o)
		exprs := c.Webhooks[0].NamespaceSelector.MatchExpressions
		require.Len(t, exprs, 2)
		assert.Equal(t, "inferencecache.io/inject", exprs[1].Key)
		assert.Equal(t, []string{"enabled"}, exprs[1].Values)
	}
}

// TestCRDStringsAreBounded: every string of the CacheBackend spec has a
// maxLength or an enum, or is bounded by a CEL size rule of an ancestor
// (fields of Kubernetes types the markers cannot reach), and
// engineOverrides has a CEL bound on its total size.
func TestCRDStringsAreBounded(t *testing.T) {
	var crd *apiextensionsv1.CustomResourceDefinition
	for _, o := range build(t, "../../kustomize/overlays/production") {
		if o.GetKind() == "CustomResourceDefinition" {
			crd = convert[apiextensionsv1.CustomResourceDefinition](t, o)
		}
	}
	require.NotNil(t, crd)
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	var walk func(s apiextensionsv1.JSONSchemaProps, path string, celBound bool)
	walk = func(s apiextensionsv1.JSONSchemaProps, path string, celBound bool) {
		for _, v := range s.XValidations {
			if strings.Contains(v.Rule, "size(") {
				celBound = true
			}
		}
		if s.Type == "string" && s.MaxLength == nil && len(s.Enum) == 0 && s.Format != "date-time" && !celBound && !s.XIntOrString {
			t.Errorf("%s: a string without maxLength", path)
		}
		for k, p := range s.Properties {
			walk(p, path+"."+k, celBound)
		}
		if s.Items != nil && s.Items.Schema != nil {
			walk(*s.Items.Schema, path+"[]", celBound)
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			walk(*s.AdditionalProperties.Schema, path+"{}", celBound)
		}
	}
	walk(spec, "spec", false)
	overrides := spec.Properties["integration"].Properties["engineOverrides"]
	require.NotEmpty(t, overrides.XValidations)
	assert.Contains(t, overrides.XValidations[0].Rule, ".sum() : 0) <= 65536", "a bound on the total size")
}
