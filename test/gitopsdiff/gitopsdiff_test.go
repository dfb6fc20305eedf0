// Package gitopsdiff computes drift the way Argo CD and Flux do, with their
// own diff code, against the live objects of a local cluster where the
// operator runs (issue 15). It is a module of its own so that Argo CD's
// gitops-engine (and the k8s.io/kubernetes it needs) stays out of the
// operator's go.mod.
//
// Argo CD: github.com/argoproj/argo-cd/gitops-engine pkg/diff in
// server-side diff mode (a server-side apply dry run with the field manager
// argocd-controller, mutation webhooks ignored, as Argo CD's default), with
// the ignoreDifferences documented in docs/gitops.md applied by a
// normalizer. Argo CD's own ignoreDifferences normalizer lives in the
// argo-cd/v3 module, which does not build here; the normalizer below
// removes the documented JSON pointers the same way.
//
// Flux: fluxcd/pkg/ssa's ResourceManager with kustomize-controller's field
// manager and apply options: ApplyAllStaged reports every object
// Unchanged (no drift to correct), and Diff agrees.
package gitopsdiff

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/argoproj/argo-cd/gitops-engine/pkg/diff"
	"github.com/fluxcd/pkg/ssa"
	openapi_v2 "github.com/google/gnostic-models/openapiv2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/kube-openapi/pkg/util/proto"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/test/localcluster/operator"
	"github.com/inferencecache/operator/test/testutil"
)

var (
	env    *operator.Env
	scheme = runtime.NewScheme()
)

const repo = "../.."

func TestMain(m *testing.M) {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(testutil.ZapLevel())))
	var err error
	env, err = operator.Start(context.Background(), repo, scheme)
	if err != nil {
		fmt.Fprintln(os.Stderr, "the drift tests need the local cluster and the operator:", err)
		os.Exit(1)
	}
	os.Exit(env.Finish(m.Run()))
}

// ignored is one documented ignoreDifferences entry.
type ignored struct {
	Group, Kind, Name string
	// Pointer is a JSON pointer; JQ a jq path expression.
	Pointer, JQ string
}

// documented reads the ignoreDifferences table of docs/gitops.md.
func documented(t *testing.T) []ignored {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repo, "docs", "gitops.md"))
	require.NoError(t, err)
	s := string(raw)
	begin, end := strings.Index(s, "<!-- ignore-differences:begin -->"), strings.Index(s, "<!-- ignore-differences:end -->")
	require.True(t, begin >= 0 && end > begin, "docs/gitops.md has the ignore-differences table")
	field := regexp.MustCompile("`([^`]+)`( \\(jq\\))?")
	var out []ignored
	for _, line := range strings.Split(s[begin:end], "\n") {
		cols := strings.Split(line, "|")
		if len(cols) < 6 || strings.TrimSpace(cols[1]) == "Group" || strings.HasPrefix(strings.TrimSpace(cols[1]), "---") {
			continue
		}
		m := field.FindStringSubmatch(cols[4])
		require.NotNil(t, m, "field of row %q", line)
		e := ignored{Group: strings.TrimSpace(cols[1]), Kind: strings.TrimSpace(cols[2]), Name: strings.TrimSpace(cols[3])}
		if m[2] != "" {
			e.JQ = m[1]
		} else {
			e.Pointer = m[1]
		}
		out = append(out, e)
	}
	require.NotEmpty(t, out)
	return out
}

// fromApplication reads an Argo CD Application's ignoreDifferences.
func fromApplication(t *testing.T, path string) []ignored {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var app struct {
		Spec struct {
			IgnoreDifferences []struct {
				Group, Kind, Name string
				JSONPointers      []string `json:"jsonPointers"`
				JQPathExpressions []string `json:"jqPathExpressions"`
			} `json:"ignoreDifferences"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &app))
	var out []ignored
	for _, d := range app.Spec.IgnoreDifferences {
		for _, p := range d.JSONPointers {
			out = append(out, ignored{Group: d.Group, Kind: d.Kind, Name: d.Name, Pointer: p})
		}
		for _, q := range d.JQPathExpressions {
			out = append(out, ignored{Group: d.Group, Kind: d.Kind, Name: d.Name, JQ: q})
		}
	}
	return out
}

// normalizer removes the documented JSON pointers from objects of their
// group and kind (and name, when given), as Argo CD's ignoreDifferences
// normalizer does. The jq entries name webhook configurations, which this
// test does not diff; they are compared with the Application only.
type normalizer []ignored

func (n normalizer) Normalize(u *unstructured.Unstructured) error {
	gvk := u.GroupVersionKind()
	for _, e := range n {
		if e.Pointer == "" || e.Group != gvk.Group || e.Kind != gvk.Kind || (e.Name != "" && e.Name != u.GetName()) {
			continue
		}
		var fields []string
		for _, p := range strings.Split(strings.TrimPrefix(e.Pointer, "/"), "/") {
			fields = append(fields, strings.NewReplacer("~1", "/", "~0", "~").Replace(p))
		}
		unstructured.RemoveNestedField(u.Object, fields...)
	}
	return nil
}

// dryRunner is Argo CD's server-side diff dry run: a server-side apply of
// the desired object with the given field manager, dry-run, forced.
type dryRunner struct{ dyn dynamic.Interface }

func (d dryRunner) Run(ctx context.Context, obj *unstructured.Unstructured, manager string) (string, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	res, err := d.dyn.Resource(gvr(obj)).Namespace(obj.GetNamespace()).Patch(ctx, obj.GetName(), types.ApplyPatchType, raw,
		metav1.PatchOptions{FieldManager: manager, Force: ptr(true), DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return "", err
	}
	out, err := json.Marshal(res)
	return string(out), err
}

func ptr[T any](v T) *T { return &v }

func gvr(u *unstructured.Unstructured) schema.GroupVersionResource {
	gvk := u.GroupVersionKind()
	switch gvk.Kind {
	case "CacheBackend":
		return v1alpha1.GroupVersion.WithResource("cachebackends")
	case "Deployment":
		return appsv1.SchemeGroupVersion.WithResource("deployments")
	}
	panic("no resource for " + gvk.String())
}

// desired builds examples/quickstart (what Git holds) for namespace ns,
// with mutate applied to each object.
func desired(t *testing.T, ns string, mutate func(*unstructured.Unstructured)) []*unstructured.Unstructured {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join(repo, "examples", "quickstart"))
	require.NoError(t, err)
	var out []*unstructured.Unstructured
	for _, r := range res.Resources() {
		raw, err := r.MarshalJSON()
		require.NoError(t, err)
		u := &unstructured.Unstructured{}
		require.NoError(t, u.UnmarshalJSON(raw), "integers as int64, as from the API server")
		u.SetNamespace(ns)
		if mutate != nil {
			mutate(u)
		}
		out = append(out, u)
	}
	return out
}

// gvkParser is the schema Argo CD reads from the API server's OpenAPI.
func gvkParser(t *testing.T) *managedfields.GvkParser {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Cluster.Config)
	require.NoError(t, err)
	var doc *openapi_v2.Document
	doc, err = dc.OpenAPISchema()
	require.NoError(t, err)
	models, err := proto.NewOpenAPIData(doc)
	require.NoError(t, err)
	p, err := managedfields.NewGVKParser(models, false)
	require.NoError(t, err)
	return p
}

// The field managers and options of the tools, as they call their code.
const (
	argoManager = "argocd-controller"
	fluxManager = "kustomize-controller"
)

func fluxManagerFor(c client.Client) *ssa.ResourceManager {
	return ssa.NewResourceManager(c, nil, ssa.Owner{Field: fluxManager, Group: "kustomize.toolkit.fluxcd.io"})
}

// fluxApplyOptions are kustomize-controller's (controllers'
// kustomization_controller.go apply()).
func fluxApplyOptions() ssa.ApplyOptions {
	o := ssa.DefaultApplyOptions()
	o.Force = false
	o.ExclusionSelector = map[string]string{"kustomize.toolkit.fluxcd.io/reconcile": "disabled"}
	o.IfNotPresentSelector = map[string]string{"kustomize.toolkit.fluxcd.io/ssa": "IfNotPresent"}
	o.Cleanup = ssa.ApplyCleanupOptions{
		Annotations: []string{corev1.LastAppliedConfigAnnotation},
		FieldManagers: []ssa.FieldManager{
			{Name: "kubectl", OperationType: metav1.ManagedFieldsOperationApply},
			{Name: "kubectl", OperationType: metav1.ManagedFieldsOperationUpdate},
			{Name: "before-first-apply", OperationType: metav1.ManagedFieldsOperationUpdate},
		},
		Exclusions: map[string]string{"kustomize.toolkit.fluxcd.io/ssa": "Merge"},
	}
	return o
}

// fluxLabels are the ownership labels kustomize-controller sets on what it
// applies.
func fluxLabels(u *unstructured.Unstructured) {
	l := u.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l["kustomize.toolkit.fluxcd.io/name"] = "qwen-cache"
	l["kustomize.toolkit.fluxcd.io/namespace"] = "flux-system"
	u.SetLabels(l)
}

// argoSync applies objs as Argo CD's sync with ServerSideApply=true does
// (kubectl apply --server-side --force-conflicts --field-manager=argocd-controller).
func argoSync(t *testing.T, dyn dynamic.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, u := range objs {
		raw, err := json.Marshal(u)
		require.NoError(t, err)
		_, err = dyn.Resource(gvr(u)).Namespace(u.GetNamespace()).Patch(context.Background(), u.GetName(), types.ApplyPatchType, raw,
			metav1.PatchOptions{FieldManager: argoManager, Force: ptr(true)})
		require.NoError(t, err, "argo sync of %s", u.GetKind())
	}
}

// fluxSync applies objs as kustomize-controller does and returns what its
// ChangeSet says happened to each, by kind.
func fluxSync(t *testing.T, objs []*unstructured.Unstructured) map[string]ssa.Action {
	t.Helper()
	cs, err := fluxManagerFor(env.Client).ApplyAllStaged(context.Background(), objs, fluxApplyOptions())
	require.NoError(t, err)
	out := map[string]ssa.Action{}
	for _, e := range cs.Entries {
		out[e.ObjMetadata.GroupKind.Kind] = e.Action
	}
	return out
}

// waitWired waits until the backend of ns is Ready with every engine pod
// wired, and returns the engine Deployment's generation.
func waitWired(t *testing.T, ns string) int64 {
	t.Helper()
	ctx := context.Background()
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	testutil.Eventually(t, 120*time.Second, func() error {
		cb := &v1alpha1.CacheBackend{}
		if err := env.Client.Get(ctx, key, cb); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue || cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("not Ready for generation %d: %+v", cb.Generation, c)
		}
		if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired); c == nil || c.Status != metav1.ConditionTrue || cb.Status.WiredEnginePods < 1 {
			return fmt.Errorf("engines not wired: %+v", c)
		}
		return nil
	})
	d := &appsv1.Deployment{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-engine"}, d))
	return d.Generation
}

// replaceServer deletes the cache-server pod of ns and waits for the
// restart cascade to roll the engine Deployment past generation gen.
func replaceServer(t *testing.T, ns string, gen int64) {
	t.Helper()
	ctx := context.Background()
	var pods corev1.PodList
	require.NoError(t, env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"inferencecache.io/cachebackend": "qwen-demo-cache"}))
	require.NotEmpty(t, pods.Items)
	for i := range pods.Items {
		require.NoError(t, env.Client.Delete(ctx, &pods.Items[i]))
	}
	testutil.Eventually(t, 90*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-engine"}, d); err != nil {
			return err
		}
		if d.Generation <= gen {
			return fmt.Errorf("engine generation %d: not rolled yet", d.Generation)
		}
		return nil
	})
}

// nudge makes the operator reconcile ns's backend a few times: skipped
// engine pods appear and go.
func nudge(t *testing.T, ns string, times int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < times; i++ {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("nudge-%d", i), Labels: map[string]string{"app": "qwen-demo", "nudge": "true"},
				Annotations: map[string]string{v1alpha1.AnnotationSkipInject: "true"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}
		require.NoError(t, env.Client.Create(ctx, p))
		testutil.Eventually(t, 60*time.Second, func() error {
			cb := &v1alpha1.CacheBackend{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}, cb); err != nil {
				return err
			}
			var pods corev1.PodList
			if err := env.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-demo"}); err != nil {
				return err
			}
			live := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp.IsZero() {
					live++
				}
			}
			if int(cb.Status.MatchedEnginePods) != live || cb.Status.MatchedEnginePods < 2 {
				return fmt.Errorf("%s: matched %d published (generation %d observed %d), %d live pods", ns, cb.Status.MatchedEnginePods, cb.Generation, cb.Status.ObservedGeneration, live)
			}
			return nil
		})
		require.NoError(t, env.Client.Delete(ctx, p, client.GracePeriodSeconds(0)))
	}
}

// autoscale turns autoscaling on in the desired CacheBackend.
func autoscale(u *unstructured.Unstructured) {
	if u.GetKind() == "CacheBackend" {
		utilruntime.Must(unstructured.SetNestedField(u.Object, map[string]any{"minReplicas": int64(1), "maxReplicas": int64(3)}, "spec", "autoscaling"))
	}
}

// argoDrift is Argo CD's server-side diff of each desired object against
// its live copy, with norm as the ignoreDifferences: the differing paths
// (empty when in sync), by kind.
func argoDrift(t *testing.T, dyn dynamic.Interface, parser *managedfields.GvkParser, objs []*unstructured.Unstructured, norm diff.Normalizer) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, u := range objs {
		live, err := dyn.Resource(gvr(u)).Namespace(u.GetNamespace()).Get(context.Background(), u.GetName(), metav1.GetOptions{})
		require.NoError(t, err)
		res, err := diff.Diff(u.DeepCopy(), live, diff.WithServerSideDiff(true), diff.WithServerSideDryRunner(dryRunner{dyn}),
			diff.WithManager(argoManager), diff.WithIgnoreMutationWebhook(true), diff.WithGVKParser(parser), diff.WithNormalizer(norm))
		require.NoError(t, err, "argo diff of %s", u.GetKind())
		if res.Modified {
			out[u.GetKind()] = differences(t, res.NormalizedLive, res.PredictedLive)
		}
	}
	return out
}

// fluxDrift is what ssa.ResourceManager.Diff (flux diff kustomization)
// reports for each object, by kind.
func fluxDrift(t *testing.T, objs []*unstructured.Unstructured) map[string]ssa.Action {
	t.Helper()
	out := map[string]ssa.Action{}
	for _, u := range objs {
		e, _, _, err := fluxManagerFor(env.Client).Diff(context.Background(), u.DeepCopy(), ssa.DefaultDiffOptions())
		require.NoError(t, err)
		out[u.GetKind()] = e.Action
	}
	return out
}

// differences lists the JSON paths where a and b differ.
func differences(t *testing.T, a, b []byte) []string {
	t.Helper()
	var x, y any
	require.NoError(t, json.Unmarshal(a, &x))
	require.NoError(t, json.Unmarshal(b, &y))
	var out []string
	var walk func(p string, x, y any)
	walk = func(p string, x, y any) {
		xm, xok := x.(map[string]any)
		ym, yok := y.(map[string]any)
		if xok && yok {
			keys := map[string]bool{}
			for k := range xm {
				keys[k] = true
			}
			for k := range ym {
				keys[k] = true
			}
			for k := range keys {
				walk(p+"/"+strings.NewReplacer("~", "~0", "/", "~1").Replace(k), xm[k], ym[k])
			}
			return
		}
		xb, _ := json.Marshal(x)
		yb, _ := json.Marshal(y)
		if string(xb) != string(yb) {
			out = append(out, p)
		}
	}
	walk("", x, y)
	sort.Strings(out)
	return out
}

// TestDocumentedIgnoreDifferences: the ignoreDifferences of the Argo CD
// examples are exactly the documented list.
func TestDocumentedIgnoreDifferences(t *testing.T) {
	want := documented(t)
	assert.ElementsMatch(t, want, fromApplication(t, filepath.Join(repo, "examples", "gitops", "argocd", "application.yaml")))
	assert.ElementsMatch(t, want, fromApplication(t, filepath.Join(repo, "examples", "argocd", "application.yaml")))
}

// TestNoDriftAfterSyncReconcilesAutoscalingAndCascade: examples/quickstart
// synced in one pass by Argo CD (namespace argo) and by Flux (namespace
// flux); the operator heals the engines, reconciles several times, takes
// an autoscaling change from Git and runs a restart cascade. Argo CD's
// server-side diff with the documented ignoreDifferences, and Flux's diff
// and apply, report the CacheBackend and the engine Deployment in sync;
// without the ignores, Argo CD's drift is within the documented fields.
func TestNoDriftAfterSyncReconcilesAutoscalingAndCascade(t *testing.T) {
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(env.Cluster.Config)
	require.NoError(t, err)
	parser := gvkParser(t)
	docs := documented(t)
	for _, ns := range []string{"argo", "flux"} {
		require.NoError(t, env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	argoObjs := desired(t, "argo", nil)
	fluxObjs := desired(t, "flux", fluxLabels)
	argoSync(t, dyn, argoObjs)
	fluxSync(t, fluxObjs)

	check := func(stage string, argoObjs, fluxObjs []*unstructured.Unstructured) {
		t.Helper()
		assert.Empty(t, argoDrift(t, dyn, parser, argoObjs, normalizer(docs)), "%s: Argo CD server-side diff with the documented ignoreDifferences", stage)
		raw := argoDrift(t, dyn, parser, argoObjs, diff.GetNoopNormalizer())
		for kind, paths := range raw {
			for _, p := range paths {
				assert.Contains(t, pointersOf(docs, kind), p, "%s: Argo CD drift of %s outside the documented fields", stage, kind)
			}
		}
		t.Logf("%s: Argo CD server-side diff without ignoreDifferences: %v", stage, raw)
		for kind, a := range fluxDrift(t, fluxObjs) {
			assert.Equal(t, ssa.UnchangedAction, a, "%s: flux diff of %s", stage, kind)
		}
		for kind, a := range fluxSync(t, fluxObjs) {
			assert.Equal(t, ssa.UnchangedAction, a, "%s: kustomize-controller's apply of %s", stage, kind)
		}
	}

	argoGen, fluxGen := waitWired(t, "argo"), waitWired(t, "flux")
	check("after the sync and the healing roll", argoObjs, fluxObjs)

	for _, ns := range []string{"argo", "flux"} {
		nudge(t, ns, 3)
	}
	argoSync(t, dyn, argoObjs)
	check("after several reconciles and a resync", argoObjs, fluxObjs)

	argoObjs, fluxObjs = desired(t, "argo", autoscale), desired(t, "flux", func(u *unstructured.Unstructured) { fluxLabels(u); autoscale(u) })
	argoSync(t, dyn, argoObjs)
	assert.Equal(t, ssa.ConfiguredAction, fluxSync(t, fluxObjs)["CacheBackend"], "the autoscaling change is applied")
	waitWired(t, "argo")
	waitWired(t, "flux")
	check("after an autoscaling change", argoObjs, fluxObjs)

	replaceServer(t, "argo", argoGen)
	replaceServer(t, "flux", fluxGen)
	waitWired(t, "argo")
	waitWired(t, "flux")
	check("after a restart cascade", argoObjs, fluxObjs)

	// The control: a change in Git (two engine replicas) is drift for both.
	twoReplicas := func(u *unstructured.Unstructured) {
		autoscale(u)
		if u.GetKind() == "Deployment" {
			utilruntime.Must(unstructured.SetNestedField(u.Object, int64(2), "spec", "replicas"))
		}
	}
	changed := argoDrift(t, dyn, parser, desired(t, "argo", twoReplicas), normalizer(docs))
	assert.Contains(t, changed["Deployment"], "/spec/replicas", "Argo CD sees a change in Git")
	assert.NotContains(t, changed, "CacheBackend")
	assert.Equal(t, ssa.ConfiguredAction, fluxDrift(t, desired(t, "flux", func(u *unstructured.Unstructured) { fluxLabels(u); twoReplicas(u) }))["Deployment"], "Flux sees a change in Git")
}

func pointersOf(docs []ignored, kind string) []string {
	var out []string
	for _, d := range docs {
		if d.Kind == kind && d.Pointer != "" {
			out = append(out, d.Pointer)
		}
	}
	return out
}
