package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// subset reports the first path where want has a value that got lacks or
// differs from: every field the CLI prints must be what the API server holds.
func subset(path string, want, got any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path
		}
		for k, v := range w {
			if p := subset(path+"."+k, v, g[k]); p != "" {
				return p
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path
		}
		for i := range w {
			if p := subset(fmt.Sprintf("%s[%d]", path, i), w[i], g[i]); p != "" {
				return p
			}
		}
		return ""
	default:
		if fmt.Sprint(want) != fmt.Sprint(got) && !reflect.DeepEqual(want, got) {
			return fmt.Sprintf("%s (%v != %v)", path, want, got)
		}
		return ""
	}
}

// TestRenderEqualsWhatTheControllerApplied: for the same CacheBackend, the
// objects `kubectl cachebackend render` prints are, object by object, the
// ones the controller applied on the API server (server-set fields aside).
func TestRenderEqualsWhatTheControllerApplied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("3Gi"), Retention: &v1alpha1.PVCRetention{WhenDeleted: v1alpha1.RetentionDelete}}}
	cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MinReplicas: ptr.To[int32](1), MaxReplicas: 4, TargetMemoryUtilizationPercentage: ptr.To[int32](70)}
	cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Port: 7100}}
	key := testutil.StartBackend(t, suite.K8s, cb)
	// Once the generation is evaluated, every child was applied.
	live := suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("generation %d not reconciled yet", cb.Generation)
		}
		return nil
	}) // with the API server's defaults and UID, as the controller sees it

	var buf bytes.Buffer
	require.NoError(t, cli.RenderYAML(&buf, live))
	docs, err := cli.Documents(buf.Bytes())
	require.NoError(t, err)
	require.Len(t, docs, 4)
	for _, want := range docs {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(want.GroupVersionKind())
		require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(want), got), "%s %s", want.GetKind(), want.GetName())
		assert.Empty(t, subset(want.GetKind(), want.Object, got.Object), "%s differs from the live object", want.GetKind())
	}
}

// TestExplainPodThroughTheAPIServer: explain pod reports each outcome for
// real pods admitted by the webhook (or admitted while it was unreachable).
func TestExplainPodThroughTheAPIServer(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	suite.ServingBackend(t, ns, "cache")
	secret := &corev1.Secret{}
	require.NoError(t, suite.K8s.Get(ctx, client.ObjectKey{Namespace: suite.OperatorNamespace, Name: receipt.DefaultSecretName}, secret))
	keys := []receipt.Key{receipt.NewKey(secret.Data[receipt.SecretKeyCurrent])}

	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "wired", map[string]string{"app": "engine-cache"}, nil)))
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "optout", map[string]string{"app": "engine-cache"}, map[string]string{v1alpha1.AnnotationSkipInject: "true"})))
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "stranger", map[string]string{"app": "other"}, nil)))

	var unwired, forged string
	suite.WithWebhookUnreachable(t, func() {
		testutil.Eventually(t, 15*time.Second, func() error {
			p := suite.Engine(ns, fmt.Sprintf("unwired-%d", time.Now().UnixNano()), map[string]string{"app": "engine-cache"}, nil)
			if err := suite.K8s.Create(ctx, p); err != nil {
				return err
			}
			if suite.IsWired(p) {
				return fmt.Errorf("still wired")
			}
			unwired = p.Name
			return nil
		})
		f := suite.Engine(ns, "forged", map[string]string{"app": "engine-cache"}, map[string]string{
			v1alpha1.AnnotationInjectedBy: ns + "/cache", v1alpha1.AnnotationInjectedByUID: "copied", v1alpha1.AnnotationInjectedGeneration: "1"})
		require.NoError(t, suite.K8s.Create(ctx, f))
		forged = f.Name
	})

	for pod, want := range map[string]string{
		"wired": cli.ExplainInjected, "optout": cli.ExplainSkipped, "stranger": cli.ExplainNoMatch,
		unwired: cli.ExplainFailOpen, forged: cli.ExplainForged,
	} {
		e, err := cli.Explain(ctx, suite.K8s, ns, pod, keys, nil)
		require.NoError(t, err)
		assert.Equal(t, want, e.Outcome, "pod %s: %v", pod, e.Lines)
	}
}

// exampleDirs lists the example kustomizations (and their overlays).
func exampleDirs(t *testing.T) []string {
	t.Helper()
	dirs, err := filepath.Glob("../../../examples/*/kustomization.yaml")
	require.NoError(t, err)
	overlays, err := filepath.Glob("../../../examples/*/overlays/*/kustomization.yaml")
	require.NoError(t, err)
	dirs = append(dirs, overlays...)
	require.GreaterOrEqual(t, len(dirs), 5)
	for i := range dirs {
		dirs[i] = filepath.Dir(dirs[i])
	}
	return dirs
}

// TestExamplesApplyWithServerSideDryRun: every example kustomization under
// examples/ is accepted by the API server (schema, CEL and the validating
// webhook), so a broken example fails the tests.
func TestExamplesApplyWithServerSideDryRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	for _, dir := range exampleDirs(t) {
		t.Run(strings.TrimPrefix(dir, "../../../examples/"), func(t *testing.T) {
			objs, err := cli.ReadFile(dir, true)
			require.NoError(t, err)
			for _, o := range objs {
				o.SetNamespace(ns)
				err := suite.K8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("examples"), client.DryRunAll)
				assert.NoError(t, err, "%s %s", o.GetKind(), o.GetName())
			}
		})
	}
}

// TestDiffShowsWhatAReconcileWouldChange: diff against the live API server
// reports no change for the applied spec, and the exact fields for a
// changed one, without writing anything.
func TestDiffShowsWhatAReconcileWouldChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 3}
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitDeployment(t, key, nil)
	waitNoDiff(t, key)

	edited := suite.GetBackend(t, key)
	edited.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Image: "example.com/lmcache:v9"}}
	edited.Spec.Autoscaling = nil
	before := suite.WaitDeployment(t, key, nil).ResourceVersion
	d, err := cli.Diff(ctx, suite.K8s, edited, nil)
	require.NoError(t, err)
	assert.True(t, d.HasChanges())
	out := d.String()
	assert.Contains(t, out, fmt.Sprintf("Deployment/%s/cache would be changed", ns))
	assert.Contains(t, out, `/spec/template/spec/containers/0/image: "example.com/lmcache:v9"`)
	assert.Contains(t, out, fmt.Sprintf("HorizontalPodAutoscaler/%s/cache would be deleted", ns))
	assert.Equal(t, before, suite.WaitDeployment(t, key, nil).ResourceVersion, "diff writes nothing")
}

// waitNoDiff waits until diff of the live CacheBackend key shows no change:
// the controller's reconcile and the preview agree.
func waitNoDiff(t *testing.T, key client.ObjectKey) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		d, err := cli.Diff(context.Background(), suite.K8s, suite.GetBackend(t, key), nil)
		if err != nil {
			return err
		}
		if d.HasChanges() {
			return fmt.Errorf("%s shows changes after its reconcile:\n%s", key, d)
		}
		return nil
	})
}

// TestDiffReportsAHeldStatefulSet: when the spec's storage no longer
// matches a StatefulSet's claim templates, the controller's plan holds the
// StatefulSet, and diff, built on the same plan, reports the hold (not an
// error from the API server's immutable-field rule) and no change for it.
func TestDiffReportsAHeldStatefulSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	cb := suite.STSBackend(ns, "held", 1, true)
	key := testutil.StartBackend(t, suite.K8s, cb)
	suite.WaitStatefulSet(t, key, nil)
	waitNoDiff(t, key)

	edited := suite.GetBackend(t, key)
	edited.Spec.Storage.PVC.Size = resource.MustParse("9Gi")
	d, err := cli.Diff(ctx, suite.K8s, edited, nil)
	require.NoError(t, err, "a storage change the controller holds is not an error")
	holds := d.Preview.Holds()
	require.Len(t, holds, 1, d.String())
	assert.Equal(t, fmt.Sprintf("StatefulSet/%s/held", ns), holds[0].Subject)
	assert.Contains(t, holds[0].Reason, v1alpha1.ReasonImmutableStatefulSetStorage)
	assert.Contains(t, d.String(), "is held")
	assert.False(t, d.HasChanges(), "a held StatefulSet is left alone: nothing else changes\n%s", d)

	// The controller, given the same spec, holds the StatefulSet too.
	suite.UpdateBackend(t, key, func(cb *v1alpha1.CacheBackend) { cb.Spec.Storage.PVC.Size = resource.MustParse("9Gi") })
	suite.WaitBackend(t, key, testutil.ReadyIs(metav1.ConditionFalse, v1alpha1.ReasonImmutableStatefulSetStorage))
	d, err = cli.Diff(ctx, suite.K8s, suite.GetBackend(t, key), nil)
	require.NoError(t, err)
	assert.False(t, d.HasChanges(), "after the reconcile the plan and the cluster agree\n%s", d)
	assert.Len(t, d.Preview.Holds(), 1)
}

// TestDiffIsEmptyAfterAReconcileOfEveryExample: for every CacheBackend of
// every example, once the controller has reconciled it, diff shows no
// change: the preview and the controller share one plan and one drift rule.
func TestDiffIsEmptyAfterAReconcileOfEveryExample(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, dir := range exampleDirs(t) {
		t.Run(strings.TrimPrefix(dir, "../../../examples/"), func(t *testing.T) {
			ns := suite.NewNamespace(t)
			objs, err := cli.ReadFile(dir, true)
			require.NoError(t, err)
			var backends []client.ObjectKey
			for _, o := range objs {
				if o.GetKind() != "CacheBackend" {
					continue
				}
				o.SetNamespace(ns)
				require.NoError(t, suite.K8s.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("examples")))
				backends = append(backends, client.ObjectKey{Namespace: ns, Name: o.GetName()})
			}
			require.NotEmpty(t, backends)
			for _, key := range backends {
				suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
					if cb.Status.ObservedGeneration != cb.Generation {
						return fmt.Errorf("generation %d not reconciled yet", cb.Generation)
					}
					return nil
				})
				waitNoDiff(t, key)
			}
		})
	}
}

// TestRenderAndDiffOfAMultiprocessBackend: render of a multiprocess
// CacheBackend prints the node-local Service and the DaemonSet the
// controller applied, object by object; diff shows no change after the
// reconcile, the exact fields of an L1 change, and previews no engine
// roll (the per-node cascade), saying so.
func TestRenderAndDiffOfAMultiprocessBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	key := testutil.StartBackend(t, suite.K8s, suite.MPBackend(ns, "mp"))
	live := suite.WaitBackend(t, key, func(cb *v1alpha1.CacheBackend) error {
		if cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("generation %d not reconciled yet", cb.Generation)
		}
		return nil
	})

	var buf bytes.Buffer
	require.NoError(t, cli.RenderYAML(&buf, live))
	docs, err := cli.Documents(buf.Bytes())
	require.NoError(t, err)
	var kinds []string
	for _, want := range docs {
		kinds = append(kinds, want.GetKind())
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(want.GroupVersionKind())
		require.NoError(t, suite.K8s.Get(ctx, client.ObjectKeyFromObject(want), got), "%s %s", want.GetKind(), want.GetName())
		assert.Empty(t, subset(want.GetKind(), want.Object, got.Object), "%s differs from the live object", want.GetKind())
	}
	assert.Equal(t, []string{"Service", "DaemonSet"}, kinds)

	waitNoDiff(t, key)
	d, err := cli.Diff(ctx, suite.K8s, suite.GetBackend(t, key), nil)
	require.NoError(t, err)
	assert.Empty(t, d.RollsNote, "the per-node roll plan is previewed like the others")
	assert.Contains(t, d.String(), "no changes")

	edited := suite.GetBackend(t, key)
	edited.Spec.Multiprocess.L1.Size = resource.MustParse("6Gi")
	d, err = cli.Diff(ctx, suite.K8s, edited, nil)
	require.NoError(t, err)
	assert.True(t, d.HasChanges())
	out := d.String()
	assert.Contains(t, out, fmt.Sprintf("DaemonSet/%s/mp would be changed", ns))
	assert.Contains(t, out, `"6"`, "the --l1-size-gb argument")
	assert.NotContains(t, out, "Service/", "the Service does not change with L1")
}
