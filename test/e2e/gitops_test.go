package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli/cmd"
	"github.com/inferencecache/operator/test/testutil"
)

// These tests apply a CacheBackend and its engines in one sync, the way
// Argo CD and Flux do (issue 15): engine pods are admitted before the
// endpoint exists, and the operator heals them (or, where it must not,
// only reports them).

// overlay writes a kustomization over examples/<example> with the given
// strategic-merge patches and returns its directory.
func overlay(t *testing.T, example string, patches ...string) string {
	t.Helper()
	base, err := filepath.Abs(filepath.Join("..", "..", "examples", example))
	require.NoError(t, err)
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, base) // kustomize takes relative bases only
	require.NoError(t, err)
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " + rel + "\npatches:\n"
	for i, p := range patches {
		name := fmt.Sprintf("patch-%d.yaml", i)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(p), 0o600))
		k += "  - path: " + name + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600))
	return dir
}

// explainPod runs kubectl cachebackend explain pod as a user would.
func explainPod(t *testing.T, ns, name string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cmd.Main([]string{"explain", "pod", name, "-n", ns, "--kubeconfig", cluster.Kubeconfig},
		genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	return code, out.String() + errOut.String()
}

// enginePods lists the non-terminating pods labelled app=<app>.
func enginePods(t *testing.T, ns, app string) []corev1.Pod {
	t.Helper()
	var list corev1.PodList
	require.NoError(t, k8s.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{"app": app}))
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp.IsZero() {
			out = append(out, p)
		}
	}
	return out
}

// readyBackend waits until the CacheBackend key is Ready and returns it
// with the time Ready turned True.
func readyBackend(t *testing.T, key client.ObjectKey) (*v1alpha1.CacheBackend, time.Time) {
	t.Helper()
	kubectlRun(t, "wait", "-n", key.Namespace, "--for=condition=Ready", "cachebackend/"+key.Name, "--timeout=90s")
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, k8s.Get(context.Background(), key, cb))
	ready := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, ready)
	return cb, ready.LastTransitionTime.Time
}

// reconcileAfter makes the operator reconcile key once more after at
// least d has passed since since, and returns the status that reconcile
// published: once the published matched count equals the live one (no pod
// terminating), a new skipped pod matching the selector raises it by one,
// which only a reconcile that listed the pod publishes. Whatever the
// operator would have done by then (a heal roll) it has done.
func reconcileAfter(t *testing.T, key client.ObjectKey, labels map[string]string, since time.Time, d time.Duration) *v1alpha1.CacheBackend {
	t.Helper()
	ctx := context.Background()
	cb := &v1alpha1.CacheBackend{}
	var before int32
	testutil.Eventually(t, 60*time.Second, func() error {
		var list corev1.PodList
		if err := k8s.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels(labels)); err != nil {
			return err
		}
		for _, p := range list.Items {
			if !p.DeletionTimestamp.IsZero() {
				return fmt.Errorf("pod %s still terminating", p.Name)
			}
		}
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if int(cb.Status.MatchedEnginePods) != len(list.Items) {
			return fmt.Errorf("matched %d published, %d live", cb.Status.MatchedEnginePods, len(list.Items))
		}
		before = cb.Status.MatchedEnginePods
		return nil
	})
	time.Sleep(time.Until(since.Add(d)))
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, GenerateName: "nudge-", Labels: labels,
			Annotations: map[string]string{v1alpha1.AnnotationSkipInject: "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	require.NoError(t, k8s.Create(ctx, p))
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.MatchedEnginePods != before+1 {
			return fmt.Errorf("matched %d, want %d", cb.Status.MatchedEnginePods, before+1)
		}
		return nil
	})
	return cb
}

// TestOneSyncWiresEnginesWithoutManualStep: examples/quickstart applied in
// one kubectl apply --server-side -k (CacheBackend and engine together, the
// engine pod admitted before the endpoint exists) ends, within 60 s of the
// CacheBackend becoming Ready and with no manual step, with every engine
// pod carrying a receipt that kubectl cachebackend explain pod verifies;
// the engine Deployment rolled exactly once.
func TestOneSyncWiresEnginesWithoutManualStep(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "onesync")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-k", "../../examples/quickstart")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	engineKey := client.ObjectKey{Namespace: ns, Name: "qwen-engine"}

	var first corev1.Pod
	testutil.Eventually(t, 30*time.Second, func() error {
		pods := enginePods(t, ns, "qwen-demo")
		if len(pods) == 0 {
			return fmt.Errorf("no engine pod yet")
		}
		first = pods[0]
		return nil
	})
	require.Empty(t, first.Annotations[v1alpha1.AnnotationInjectedBy], "the first engine pod was admitted before the endpoint existed")

	_, readyAt := readyBackend(t, key)
	deadline := readyAt.Add(60 * time.Second)
	var pods []corev1.Pod
	testutil.Eventually(t, time.Until(deadline), func() error {
		pods = enginePods(t, ns, "qwen-demo")
		if len(pods) == 0 {
			return fmt.Errorf("no engine pod")
		}
		for _, p := range pods {
			if p.Annotations[v1alpha1.AnnotationInjectedBy] == "" {
				return fmt.Errorf("engine pod %s has no receipt", p.Name)
			}
			if code, out := explainPod(t, ns, p.Name); code != 0 || !strings.Contains(out, "receipt verifies") {
				return fmt.Errorf("explain pod %s (exit %d):\n%s", p.Name, code, out)
			}
		}
		return nil
	})
	assert.NotContains(t, podNames(pods), first.Name, "the pod admitted unwired was replaced")

	engine := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(2), engine.Generation, "the engine Deployment rolled exactly once")
	assert.NotEmpty(t, engine.Spec.Template.Annotations[v1alpha1.AnnotationServerInstance])

	cb := reconcileAfter(t, key, map[string]string{"app": "qwen-demo"}, time.Now(), 0)
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonAllEnginesWired {
			return fmt.Errorf("EnginesWired is %+v", c)
		}
		if cb.Status.WiredEnginePods != 1 || cb.Status.UnwiredEnginePods != 0 {
			return fmt.Errorf("wired %d, unwired %d", cb.Status.WiredEnginePods, cb.Status.UnwiredEnginePods)
		}
		return nil
	})
	assertWiringRolls(t, engineKey, "qwen-demo-cache", 1, "a later reconcile rolls nothing more")
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesUnwired))
	assert.Zero(t, testutil.CountEvents(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesRestarted), "no server change: no cascade")
	table := kubectlRun(t, "get", "cachebackend", "-n", ns, "-o", "wide")
	for _, col := range []string{"WIRED", "UNWIRED"} {
		assert.Contains(t, table, col)
	}
}

func podNames(pods []corev1.Pod) []string {
	out := make([]string, len(pods))
	for i := range pods {
		out[i] = pods[i].Name
	}
	return out
}

// TestOneSyncWithRestartPolicyNeverOnlyReports: the same sync with
// engineRestartPolicy Never rolls nothing; EnginesWired is False with
// reason EnginesAdmittedBeforeEndpoint and the unwired count, and the
// event names the engine Deployment.
func TestOneSyncWithRestartPolicyNeverOnlyReports(t *testing.T) {
	ns := namespace(t, "onesync-never")
	dir := overlay(t, "quickstart", `apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata:
  name: qwen-demo-cache
spec:
  engineRestartPolicy: Never
`)
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-k", dir)
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	engineKey := client.ObjectKey{Namespace: ns, Name: "qwen-engine"}
	testutil.Eventually(t, 30*time.Second, func() error {
		if len(enginePods(t, ns, "qwen-demo")) == 0 {
			return fmt.Errorf("no engine pod yet")
		}
		return nil
	})
	_, readyAt := readyBackend(t, key)
	// Past the settle time, when OnServerChange would have rolled.
	cb := reconcileAfter(t, key, map[string]string{"app": "qwen-demo"}, readyAt, 5*time.Second)
	c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, v1alpha1.ReasonEnginesAdmittedBeforeEndpoint, c.Reason)
	assert.Contains(t, c.Message, "Deployment/qwen-engine")
	assert.Contains(t, c.Message, "engineRestartPolicy is Never")
	assert.Equal(t, int32(1), cb.Status.UnwiredEnginePods)
	assert.Zero(t, cb.Status.WiredEnginePods)
	assertWiringRolls(t, engineKey, "qwen-demo-cache", 0, "nothing rolled")
	testutil.WaitEvent(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesUnwired, 1)
	out := kubectlRun(t, "get", "cachebackend", "-n", ns, "-o", "wide")
	assert.Regexp(t, `qwen-demo-cache .*\s0\s+1\s`, out, "Wired 0, Unwired 1 in the table")
}

// TestSkippedEnginesNeverRoll: an engine Deployment whose pods opt out
// with skip-inject, applied together with the CacheBackend, is never
// counted unwired nor rolled.
func TestSkippedEnginesNeverRoll(t *testing.T) {
	ns := namespace(t, "onesync-skip")
	dir := overlay(t, "quickstart", `apiVersion: apps/v1
kind: Deployment
metadata:
  name: qwen-engine
spec:
  template:
    metadata:
      annotations:
        inferencecache.io/skip-inject: "true"
`)
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-k", dir)
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	_, readyAt := readyBackend(t, key)
	cb := reconcileAfter(t, key, map[string]string{"app": "qwen-demo"}, readyAt, 5*time.Second)
	c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionTrue, c.Status, c.Message)
	assert.Equal(t, v1alpha1.ReasonAllEnginesWired, c.Reason)
	assert.Zero(t, cb.Status.UnwiredEnginePods)
	assertWiringRolls(t, client.ObjectKey{Namespace: ns, Name: "qwen-engine"}, "qwen-demo-cache", 0, "a skipped pod never triggers a roll")
}

// TestSGLangHiCacheNeverRolls: an SGLangHiCache backend is observation-only:
// engines admitted before it existed are reported unwired, never rolled.
func TestSGLangHiCacheNeverRolls(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "onesync-hicache")
	// The engines first: their pods match no CacheBackend at admission.
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/sglang-hicache/engine.yaml")
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := len(enginePods(t, ns, "qwen-sglang")); n != 2 {
			return fmt.Errorf("%d engine pods", n)
		}
		return nil
	})
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/sglang-hicache/cachebackend.yaml")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-hicache"}
	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired); c == nil || c.Reason != v1alpha1.ReasonEnginesAdmittedUnwired {
			return fmt.Errorf("EnginesWired is %+v", c)
		}
		return nil
	})
	cb = reconcileAfter(t, key, map[string]string{"app": "qwen-sglang"}, time.Now(), 5*time.Second)
	c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionEnginesWired)
	require.NotNil(t, c)
	assert.Equal(t, metav1.ConditionFalse, c.Status)
	assert.Equal(t, v1alpha1.ReasonEnginesAdmittedUnwired, c.Reason)
	assert.Contains(t, c.Message, "Deployment/qwen-sglang")
	assert.Equal(t, int32(2), cb.Status.UnwiredEnginePods)
	assertWiringRolls(t, client.ObjectKey{Namespace: ns, Name: "qwen-sglang"}, "qwen-hicache", 0, "an SGLangHiCache backend never rolls")
}

// assertWiringRolls: the engine Deployment was rolled for wiring exactly
// rolls times, by its generation (1 at creation, one more per roll) and by
// the backend's EnginesRestartedForWiring events.
func assertWiringRolls(t *testing.T, engine client.ObjectKey, backend string, rolls int, why string) {
	t.Helper()
	d := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(context.Background(), engine, d))
	assert.Equal(t, int64(1+rolls), d.Generation, why)
	assert.Equal(t, rolls, testutil.CountEvents(t, k8s, engine.Namespace, backend, v1alpha1.EventEnginesRestartedForWiring), why)
}

// TestCascadeIgnoresCopiedReceipts (issue 13 item 6): a pod of another
// Deployment carrying a receipt copied from a wired engine pod (written
// after admission, which the webhook cannot strip) does not make the
// restart cascade roll that Deployment; the wired engine rolls once.
func TestCascadeIgnoresCopiedReceipts(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "cascade-copied")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/cachebackend.yaml")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	readyBackend(t, key)
	cb := observedBackend(t, key)
	first := cb.Status.ObservedServerInstance
	time.Sleep(time.Until(meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady).LastTransitionTime.Add(5 * time.Second)))
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/engine.yaml")
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/qwen-engine", "--timeout=60s")
	var wired corev1.Pod
	testutil.Eventually(t, 30*time.Second, func() error {
		for _, p := range enginePods(t, ns, "qwen-demo") {
			if p.Annotations[v1alpha1.AnnotationInjectedBy] != "" {
				wired = p
				return nil
			}
		}
		return fmt.Errorf("no wired engine pod")
	})
	// The other Deployment's pods opt out at admission, then get the copy.
	victim := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "victim"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "qwen-demo", "role": "victim"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "qwen-demo", "role": "victim"},
					Annotations: map[string]string{v1alpha1.AnnotationSkipInject: "true"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "example.com/other-engine"}}},
			},
		},
	}
	require.NoError(t, k8s.Create(ctx, victim))
	var copied corev1.Pod
	testutil.Eventually(t, 30*time.Second, func() error {
		pods := enginePods(t, ns, "qwen-demo")
		for _, p := range pods {
			if p.Labels["role"] == "victim" {
				copied = p
				return nil
			}
		}
		return fmt.Errorf("no victim pod yet")
	})
	patch := client.MergeFrom(copied.DeepCopy())
	for _, k := range []string{v1alpha1.AnnotationInjectedBy, v1alpha1.AnnotationInjectedByUID, v1alpha1.AnnotationInjectedGeneration,
		v1alpha1.AnnotationInjectedConfigDigest, v1alpha1.AnnotationReceiptSignature} {
		copied.Annotations[k] = wired.Annotations[k]
	}
	require.NoError(t, k8s.Patch(ctx, &copied, patch))

	var server corev1.PodList
	require.NoError(t, k8s.List(ctx, &server, client.InNamespace(ns), client.MatchingLabels{"inferencecache.io/cachebackend": "qwen-demo-cache"}))
	require.Len(t, server.Items, 1)
	require.NoError(t, k8s.Delete(ctx, &server.Items[0]))
	engine := &appsv1.Deployment{}
	waitGeneration(t, client.ObjectKey{Namespace: ns, Name: "qwen-engine"}, engine, 2, 60*time.Second)
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == first {
			return fmt.Errorf("the new server instance is not recorded yet")
		}
		return nil
	})
	require.NoError(t, k8s.Get(ctx, client.ObjectKeyFromObject(victim), victim))
	assert.Equal(t, int64(1), victim.Generation, "a copied receipt never causes a roll")
	assert.Empty(t, victim.Spec.Template.Annotations[v1alpha1.AnnotationServerInstance])
}
