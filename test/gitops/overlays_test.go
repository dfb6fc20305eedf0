package gitops

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/ociimage"
)

const operatorNamespace = "inferencecache-system"

// TestOverlays builds every overlay with krusty (sigs.k8s.io/kustomize/api)
// and checks what an operator of a cluster must be able to trust.
func TestOverlays(t *testing.T) {
	overlays, err := filepath.Glob("../../kustomize/overlays/*")
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(overlays), 2)
	for _, dir := range overlays {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs, err := cli.ReadFile(dir, true)
			require.NoError(t, err)
			var mwcs, vwcs, roles, bindings int
			for _, o := range objs {
				switch o.GetKind() {
				case "MutatingWebhookConfiguration":
					mwcs++
					c := &admissionregistrationv1.MutatingWebhookConfiguration{}
					require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, c))
					for _, w := range c.Webhooks {
						assert.Equal(t, admissionregistrationv1.Ignore, *w.FailurePolicy, "the pod webhook fails open")
						assert.Equal(t, admissionregistrationv1.SideEffectClassNone, *w.SideEffects)
						assert.Empty(t, w.ClientConfig.CABundle, "no caBundle committed")
						require.NotNil(t, w.NamespaceSelector)
						var excluded []string
						for _, e := range w.NamespaceSelector.MatchExpressions {
							if e.Key == "kubernetes.io/metadata.name" && e.Operator == "NotIn" {
								excluded = e.Values
							}
						}
						for _, ns := range []string{"kube-system", "kube-node-lease", operatorNamespace} {
							assert.Contains(t, excluded, ns, "namespaceSelector leaves out %s", ns)
						}
						for _, r := range w.Rules {
							assert.Equal(t, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}, r.Operations, "pods on CREATE only")
						}
					}
				case "ValidatingWebhookConfiguration":
					vwcs++
					c := &admissionregistrationv1.ValidatingWebhookConfiguration{}
					require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, c))
					for _, w := range c.Webhooks {
						assert.Equal(t, admissionregistrationv1.SideEffectClassNone, *w.SideEffects)
						assert.Empty(t, w.ClientConfig.CABundle, "no caBundle committed")
					}
				case "ClusterRole", "Role":
					roles++
					r := &rbacv1.ClusterRole{}
					require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, r))
					for _, rule := range r.Rules {
						for _, field := range [][]string{rule.Verbs, rule.Resources, rule.APIGroups} {
							assert.NotContains(t, field, "*", "%s %s: no wildcards", o.GetKind(), o.GetName())
						}
						if slices.Contains(rule.Resources, "secrets") {
							assert.Equal(t, "Role", o.GetKind(), "Secrets are never granted cluster-wide")
							assert.Equal(t, operatorNamespace, o.GetNamespace())
							assert.NotContains(t, rule.Verbs, "list", "no listing of Secrets")
							assert.NotContains(t, rule.Verbs, "watch", "no watching of Secrets")
						}
					}
				case "RoleBinding", "ClusterRoleBinding":
					bindings++
				}
			}
			kinds := map[string]bool{}
			var managerArgs []any
			var managerImage string
			annotated := 0
			for _, o := range objs {
				kinds[o.GetKind()] = true
				if o.GetKind() == "Deployment" && o.GetName() == "inferencecache-operator" {
					containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
					require.NotEmpty(t, containers)
					managerArgs, _, _ = unstructured.NestedSlice(containers[0].(map[string]any), "args")
					managerImage, _ = containers[0].(map[string]any)["image"].(string)
				}
				if o.GetAnnotations()["cert-manager.io/inject-ca-from"] != "" {
					annotated++
				}
			}
			switch filepath.Base(dir) {
			case "dev":
				assert.False(t, kinds["Certificate"] || kinds["Issuer"], "dev needs no cert-manager")
				assert.Zero(t, annotated, "no CA injection without cert-manager")
				assert.Contains(t, managerArgs, "--self-signed-webhook-cert")
			case "production":
				assert.True(t, kinds["Certificate"] && kinds["Issuer"], "production uses cert-manager")
				assert.Equal(t, 2, annotated, "cert-manager injects the CA into both webhook configurations")
				assert.NotContains(t, managerArgs, "--self-signed-webhook-cert")
			}
			// One naming scheme (issue 24): what make image builds and make
			// push publishes, under the default registry, and the KV-event
			// sidecar of the same release on in every bundle.
			names := map[string]string{}
			for _, i := range ociimage.Images {
				names[i.Cmd] = "ghcr.io/inferencecache/" + i.Name
			}
			name, tag, _ := strings.Cut(managerImage, ":")
			assert.Equal(t, names["manager"], name)
			assert.Contains(t, managerArgs, "--kvevent-subscriber-image="+names["kvevent-subscriber"]+":"+tag,
				"the subscriber's image, tagged as the manager's")
			assert.True(t, kinds["PodDisruptionBudget"])
			assert.Equal(t, 1, mwcs)
			assert.Equal(t, 1, vwcs)
			assert.Equal(t, 8, roles, "the operator's ClusterRole and Role, its engine-eviction grant, three aggregated roles, the metrics reader, the index's CacheBackend reader")
			assert.Equal(t, 5, bindings, "the operator's three, the index's auth-delegator and CacheBackend reader")
		})
	}
}
