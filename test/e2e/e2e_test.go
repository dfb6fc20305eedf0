// Package e2e runs the operator against a whole local cluster: etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler and kwok nodes
// (test/localcluster). The operator runs in this test process through
// controller.Setup, the same wiring as the manager binary; `make demo` runs
// the binary itself. kwok moves pods to Running and Ready without running
// containers, so the cache server's functional behaviour is out of scope:
// the functional probe is off in this suite (controller.Options.Probe nil,
// the manager's --functional-probe=false); internal/controller tests it
// against a local listener.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli/cmd"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/localcluster"
	"github.com/inferencecache/operator/test/localcluster/operator"
	"github.com/inferencecache/operator/test/testutil"
)

var (
	cluster *localcluster.Cluster
	k8s     client.Client
	kubectl string
	scheme  = runtime.NewScheme()
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(testutil.ZapLevel())))
	start := time.Now()
	env, err := operator.Start(context.Background(), filepath.Join("..", ".."), scheme)
	if err != nil {
		fmt.Fprintln(os.Stderr, "end-to-end tests need the local cluster and the operator:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "local cluster and operator up in %s (work dir %s)\n", time.Since(start).Round(time.Millisecond), env.WorkDir)
	cluster, k8s, kubectl = env.Cluster, env.Client, filepath.Join(env.BinDir, "kubectl")
	return env.Finish(m.Run())
}

func namespace(t *testing.T, name string) string {
	t.Helper()
	require.NoError(t, k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}))
	return name
}

func kubectlRun(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.Kubeconfig)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "kubectl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// TestQuickstartBecomesReady: the quickstart, applied as a user would with
// kubectl apply --server-side -k, gets a cache-server Deployment that
// becomes Available on a kwok node; the CacheBackend reaches Ready with its
// endpoint and matched engine count; kubectl wait returns.
func TestQuickstartBecomesReady(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "quickstart")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-k", "../../examples/quickstart")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}

	testutil.Eventually(t, 60*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, key, d); err != nil {
			return err
		}
		for _, c := range d.Status.Conditions {
			if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("cache-server Deployment not Available: %+v", d.Status)
	})
	var pods corev1.PodList
	require.NoError(t, k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"inferencecache.io/cachebackend": "qwen-demo-cache"}))
	require.Len(t, pods.Items, 1)
	assert.Equal(t, "kwok-node-0", pods.Items[0].Spec.NodeName)
	assert.Equal(t, corev1.PodRunning, pods.Items[0].Status.Phase)

	out := kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/qwen-demo-cache", "--timeout=60s")
	assert.Contains(t, out, "condition met")

	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.MatchedEnginePods < 1 {
			return fmt.Errorf("matched %d engine pods", cb.Status.MatchedEnginePods)
		}
		return nil
	})
	assert.Equal(t, "lm://qwen-demo-cache.quickstart.svc.cluster.local:65432", cb.Status.Endpoint)
	assert.Equal(t, cb.Generation, cb.Status.ObservedGeneration)
	ready := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
	require.NotNil(t, ready)
	assert.Equal(t, v1alpha1.ReasonBackendReady, ready.Reason)
	assert.NotNil(t, cb.Status.FirstAvailableAt)

	// Lifecycle step 3 on the whole cluster. The engine Deployment was
	// applied together with the CacheBackend, so its first pod was admitted
	// before the endpoint existed (fail-open). The operator rolls it once
	// the endpoint has settled (TestOneSyncWiresEnginesWithoutManualStep);
	// the new pods are wired by the webhook.
	var engine corev1.Pod
	testutil.Eventually(t, 60*time.Second, func() error {
		var list corev1.PodList
		if err := k8s.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-demo"}); err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp.IsZero() && p.Status.Phase == corev1.PodRunning && p.Annotations[v1alpha1.AnnotationInjectedBy] != "" {
				engine = p
				return nil
			}
		}
		return fmt.Errorf("no Running engine pod with a receipt yet")
	})
	assert.Equal(t, "kwok-node-0", engine.Spec.NodeName)
	assert.Equal(t, ns+"/qwen-demo-cache", engine.Annotations[v1alpha1.AnnotationInjectedBy])
	assert.Equal(t, string(cb.UID), engine.Annotations[v1alpha1.AnnotationInjectedByUID])
	assert.Contains(t, engine.Spec.Containers[0].Args, inject.KVTransferConfigFlag)
	var url string
	for _, e := range engine.Spec.Containers[0].Env {
		if e.Name == "LMCACHE_REMOTE_URL" {
			url = e.Value
		}
	}
	assert.Equal(t, cb.Status.Endpoint, url)
	testutil.Eventually(t, 30*time.Second, func() error {
		out := kubectlRun(t, "describe", "pod", "-n", ns, engine.Name)
		if !strings.Contains(out, v1alpha1.EventInjected) {
			return fmt.Errorf("kubectl describe pod shows no %s event yet", v1alpha1.EventInjected)
		}
		return nil
	})

	table := kubectlRun(t, "get", "cachebackend", "-n", ns)
	for _, col := range []string{"TYPE", "READY", "ENDPOINT", "MATCHED", "AGE", "LMCache", "True", cb.Status.Endpoint} {
		assert.Contains(t, table, col)
	}

	// The kubectl plugin on a cluster shaped as make demo's (the manager
	// outside the cluster, its webhooks called by URL with their own CA):
	// the quickstart's file shows no changes once converged, and every
	// check that applies passes (before, check asked for cert-manager and
	// failed on the missing manager Deployment).
	testutil.Eventually(t, 60*time.Second, func() error {
		if code, out, errOut := plugin("diff", "-n", ns, "-f", "../../examples/quickstart/cachebackend.yaml"); code != 0 {
			return fmt.Errorf("diff exited %d:\n%s%s", code, out, errOut)
		}
		return nil
	})
	code, out, errOut := plugin("check", "-n", ns)
	t.Logf("check on the demo's shape:\n%s%s", out, errOut)
	assert.Equal(t, 0, code, out+errOut)
	assert.NotContains(t, out, "cert-manager", "the demo's webhook configurations carry their own CA")
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "manager Deployment") {
			assert.True(t, strings.HasPrefix(l, "!"), "a warning, not a failure: %s", l)
			assert.Contains(t, l, "not found: the webhooks are called at https://127.0.0.1:")
		}
	}
	assert.Contains(t, out, "a pod matching CacheBackend qwen-demo-cache came back wired by it")
}

// plugin runs the kubectl plugin (kubectl-cachebackend) against the
// cluster, in process, and returns its exit code, stdout and stderr.
func plugin(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := cmd.Main(append(args, "--kubeconfig", cluster.Kubeconfig), genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	return code, out.String(), errOut.String()
}

// TestDeletingBackendCollectsChildrenKeepsData: deleting a CacheBackend lets
// the garbage collector remove its Deployment, Service and HPA while the
// shared PVC stays (default retention); with whenDeleted=Delete the PVC goes
// too.
func TestDeletingBackendCollectsChildrenKeepsData(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "retention")
	mk := func(name string, retention v1alpha1.RetentionAction) *v1alpha1.CacheBackend {
		cb := &v1alpha1.CacheBackend{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.CacheBackendSpec{
				Type:        v1alpha1.BackendTypeLMCache,
				Autoscaling: &v1alpha1.Autoscaling{MaxReplicas: 2},
				Storage: &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{
					Size:      resource.MustParse("1Gi"),
					Retention: &v1alpha1.PVCRetention{WhenDeleted: retention},
				}},
			},
		}
		require.NoError(t, k8s.Create(ctx, cb))
		return cb
	}
	keep := mk("keep", v1alpha1.RetentionRetain)
	drop := mk("drop", v1alpha1.RetentionDelete)

	for _, cb := range []*v1alpha1.CacheBackend{keep, drop} {
		key := client.ObjectKeyFromObject(cb)
		testutil.Eventually(t, 30*time.Second, func() error {
			for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &autoscalingv2.HorizontalPodAutoscaler{}} {
				if err := k8s.Get(ctx, key, o); err != nil {
					return err
				}
			}
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: cb.Name + "-data"}, &corev1.PersistentVolumeClaim{})
		})
		require.NoError(t, k8s.Delete(ctx, cb))
	}
	for _, cb := range []*v1alpha1.CacheBackend{keep, drop} {
		key := client.ObjectKeyFromObject(cb)
		testutil.Eventually(t, 60*time.Second, func() error {
			for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.Service{}, &autoscalingv2.HorizontalPodAutoscaler{}} {
				if err := testutil.Gone(ctx, k8s, key, o); err != nil {
					return err
				}
			}
			return nil
		})
	}
	testutil.Eventually(t, 60*time.Second, func() error {
		return testutil.Gone(ctx, k8s, client.ObjectKey{Namespace: ns, Name: "drop-data"}, &corev1.PersistentVolumeClaim{})
	})
	pvc := &corev1.PersistentVolumeClaim{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "keep-data"}, pvc), "retained claim survives its CacheBackend")
	assert.Nil(t, pvc.DeletionTimestamp)
}

// TestSGLangHiCacheExampleBecomesReady is the HiCache smoke gate of the
// readiness review: the initial Ready=False/AwaitingEnginePods with
// Progressing=True and Degraded=False while no engine pod exists; no
// Deployment, StatefulSet, Service, HPA or endpoint, before and after; real
// admission injects the complete HiCache command line and the full receipt
// (name, UID, generation, configuration digest, a signature that verifies
// with the operator's key); the backend converges to Ready=True/
// EnginePodsReady with Progressing=False, Degraded=False and the matched
// pod count.
func TestSGLangHiCacheExampleBecomesReady(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "hicache")
	// The CacheBackend first: a pod admitted before the operator's cache
	// holds it matches nothing and stays unwired (fail-open), as documented.
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/sglang-hicache/cachebackend.yaml")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-hicache"}
	cb := &v1alpha1.CacheBackend{}
	conditions := func(ready metav1.ConditionStatus, reason string, progressing, degraded metav1.ConditionStatus) func() error {
		return func() error {
			if err := k8s.Get(ctx, key, cb); err != nil {
				return err
			}
			if cb.Status.ObservedGeneration != cb.Generation {
				return fmt.Errorf("generation %d not evaluated", cb.Generation)
			}
			for typ, want := range map[string]metav1.ConditionStatus{
				v1alpha1.ConditionReady: ready, v1alpha1.ConditionProgressing: progressing, v1alpha1.ConditionDegraded: degraded,
			} {
				c := meta.FindStatusCondition(cb.Status.Conditions, typ)
				if c == nil || c.Status != want {
					return fmt.Errorf("%s is %+v, want %s", typ, c, want)
				}
			}
			if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady); c.Reason != reason {
				return fmt.Errorf("Ready reason %s, want %s", c.Reason, reason)
			}
			return nil
		}
	}
	noServer := func() {
		t.Helper()
		assert.Empty(t, cb.Status.Endpoint, "no endpoint")
		for _, obj := range []client.Object{&appsv1.Deployment{}, &appsv1.StatefulSet{}, &corev1.Service{}, &autoscalingv2.HorizontalPodAutoscaler{}} {
			assert.True(t, apierrors.IsNotFound(k8s.Get(ctx, key, obj)), "no %T", obj)
		}
		var svcs corev1.ServiceList
		require.NoError(t, k8s.List(ctx, &svcs, client.InNamespace(ns)))
		assert.Empty(t, svcs.Items, "no Service in the namespace")
	}
	testutil.Eventually(t, 30*time.Second, conditions(metav1.ConditionFalse, v1alpha1.ReasonAwaitingEnginePods, metav1.ConditionTrue, metav1.ConditionFalse))
	assert.Zero(t, cb.Status.MatchedEnginePods)
	noServer()

	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/sglang-hicache/engine.yaml")
	testutil.Eventually(t, 90*time.Second, conditions(metav1.ConditionTrue, v1alpha1.ReasonEnginePodsReady, metav1.ConditionFalse, metav1.ConditionFalse))
	assert.Equal(t, int32(2), cb.Status.MatchedEnginePods)
	noServer()

	secret := &corev1.Secret{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: "inferencecache-system", Name: receipt.DefaultSecretName}, secret))
	keys, err := receipt.KeysFromSecret(secret)
	require.NoError(t, err)
	var pods corev1.PodList
	require.NoError(t, k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-sglang"}))
	require.Len(t, pods.Items, 2)
	for _, p := range pods.Items {
		args := strings.Join(p.Spec.Containers[0].Args, " ")
		for _, flag := range []string{"--enable-hierarchical-cache", "--hicache-ratio 2", "--hicache-write-policy write_through",
			"--hicache-io-backend kernel", "--hicache-mem-layout page_first", "--page-size 64"} {
			assert.Contains(t, args, flag, p.Name)
		}
		a := p.Annotations
		assert.Equal(t, ns+"/qwen-hicache", a[v1alpha1.AnnotationInjectedBy], p.Name)
		assert.Equal(t, string(cb.UID), a[v1alpha1.AnnotationInjectedByUID], p.Name)
		assert.Equal(t, fmt.Sprint(cb.Generation), a[v1alpha1.AnnotationInjectedGeneration], p.Name)
		assert.Equal(t, receipt.Digest(&p), a[v1alpha1.AnnotationInjectedConfigDigest], p.Name)
		j := receipt.Judge(&p, cb, keys)
		assert.Equal(t, receipt.Valid, j.Verdict, "%s: %s", p.Name, j.Message)
	}
	kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/qwen-hicache", "--timeout=30s")
}

// TestServerReplacementRollsEnginesOnce: deleting the running cache-server
// pod makes the controller-manager replace it; the CacheBackend's
// observedServerInstance changes and the wired engine Deployment rolls
// exactly once, its new pods wired again by the webhook. The first
// observation rolled nothing, and a later reconcile rolls nothing more.
func TestServerReplacementRollsEnginesOnce(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "cascade")
	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/cachebackend.yaml")
	kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/qwen-demo-cache", "--timeout=60s")
	key := client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache"}
	cb := observedBackend(t, key)
	first := cb.Status.ObservedServerInstance

	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/engine.yaml")
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/qwen-engine", "--timeout=60s")
	engineKey := client.ObjectKey{Namespace: ns, Name: "qwen-engine"}
	engine := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	require.Equal(t, int64(1), engine.Generation, "the first observation rolled nothing")

	var server corev1.PodList
	require.NoError(t, k8s.List(ctx, &server, client.InNamespace(ns), client.MatchingLabels{"inferencecache.io/cachebackend": "qwen-demo-cache"}))
	require.Len(t, server.Items, 1)
	require.NoError(t, k8s.Delete(ctx, &server.Items[0]))

	testutil.Eventually(t, 60*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == first || cb.Status.ObservedServerInstance == "" {
			return fmt.Errorf("observedServerInstance still %q", cb.Status.ObservedServerInstance)
		}
		return nil
	})
	assert.NotContains(t, cb.Status.ObservedServerInstance, strings.Split(first, ":")[0], "the replacement pod has a new UID")
	waitGeneration(t, engineKey, engine, 2, 30*time.Second)
	assert.NotEmpty(t, engine.Spec.Template.Annotations[v1alpha1.AnnotationServerInstance])
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/qwen-engine", "--timeout=60s")
	testutil.Eventually(t, 30*time.Second, func() error {
		var pods corev1.PodList
		if err := k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "qwen-demo"}); err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp.IsZero() && p.Annotations[v1alpha1.AnnotationServerInstance] == "" {
				if _, ok := p.Labels["pod-template-hash"]; ok {
					return fmt.Errorf("pod %s of the old template still there", p.Name)
				}
			}
			if p.DeletionTimestamp.IsZero() && p.Annotations[v1alpha1.AnnotationInjectedBy] != ns+"/qwen-demo-cache" {
				return fmt.Errorf("pod %s not re-wired", p.Name)
			}
		}
		return nil
	})

	// A manager that crashed after rolling but before recording the new
	// instance (or a new leader with the old status) sees the change again:
	// it must not roll a second time. Put the old instance back, then wake
	// a reconcile with a new matching pod.
	seeChangeAgain(t, key, first, "qwen-demo")
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(2), engine.Generation, "rolled exactly once")
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesRestarted))
}

// seeChangeAgain makes the backend key see its last server change again,
// as a manager that crashed after following it but before recording the
// new instance would (or a new leader with the old status): it puts the
// recorded instance back to first, then wakes a reconcile with a new pod
// labelled app=app (a bare pod, on no GPU node), and waits until the
// reconcile recorded the current instance again.
func seeChangeAgain(t *testing.T, key client.ObjectKey, first, app string) {
	t.Helper()
	ctx := context.Background()
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, k8s.Get(ctx, key, cb))
	stale := cb.DeepCopy()
	stale.Status.ObservedServerInstance = first
	require.NoError(t, k8s.Status().Patch(ctx, stale, client.MergeFrom(cb)))
	bystander := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: "bystander", Labels: map[string]string{"app": app, "role": "bystander"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
	}
	require.NoError(t, k8s.Create(ctx, bystander))
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == first {
			return fmt.Errorf("the change was not seen again")
		}
		return nil
	})
}

// waitGeneration waits until the Deployment key has generation gen.
func waitGeneration(t *testing.T, key client.ObjectKey, d *appsv1.Deployment, gen int64, timeout time.Duration) {
	t.Helper()
	testutil.Eventually(t, timeout, func() error {
		if err := k8s.Get(context.Background(), key, d); err != nil {
			return err
		}
		if d.Generation != gen {
			return fmt.Errorf("Deployment %s generation %d, want %d", key, d.Generation, gen)
		}
		return nil
	})
}

// TestStatefulSetReplacementRollsEnginesOnce is the restart cascade of a
// StatefulSet backend with two replicas: one replica going not Ready is
// not a server replacement and rolls nothing; replacing a replica's pod
// rolls the wired engine Deployment exactly once.
func TestStatefulSetReplacementRollsEnginesOnce(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "cascade-sts")
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-demo-cache"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache, DeploymentKind: v1alpha1.DeploymentKindStatefulSet,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen-demo"}},
			RemoteStorage:  &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To[int32](2)}},
		},
	}
	require.NoError(t, k8s.Create(ctx, cb))
	key := client.ObjectKeyFromObject(cb)
	kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/qwen-demo-cache", "--timeout=90s")
	instance := func() string {
		require.NoError(t, k8s.Get(ctx, key, cb))
		return cb.Status.ObservedServerInstance
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := len(strings.Split(instance(), ",")); n != 2 {
			return fmt.Errorf("observedServerInstance %q, want two pods", cb.Status.ObservedServerInstance)
		}
		return nil
	})
	first := instance()

	kubectlRun(t, "apply", "--server-side", "-n", ns, "-f", "../../examples/quickstart/engine.yaml")
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/qwen-engine", "--timeout=60s")
	engineKey := client.ObjectKey{Namespace: ns, Name: "qwen-engine"}
	engine := &appsv1.Deployment{}
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	require.Equal(t, int64(1), engine.Generation, "the first observation rolled nothing")

	// The backend has been Ready longer than the operator waits before it
	// rolls engines: a server change seen now would roll them at once.
	testutil.Eventually(t, 30*time.Second, func() error {
		require.NoError(t, k8s.Get(ctx, key, cb))
		c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionTrue || time.Since(c.LastTransitionTime.Time) < 5*time.Second {
			return fmt.Errorf("Ready is %+v, want True for 5s", c)
		}
		return nil
	})
	// Replica 1 goes not Ready (as a failing readiness probe makes it),
	// without a restart: the backend sees one ready replica, and rolls
	// nothing.
	setReady := func(name string, ready corev1.ConditionStatus) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, func() error {
			pod := &corev1.Pod{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, pod); err != nil {
				return err
			}
			for i := range pod.Status.Conditions {
				if c := &pod.Status.Conditions[i]; c.Type == corev1.PodReady || c.Type == corev1.ContainersReady {
					c.Status = ready
				}
			}
			for i := range pod.Status.ContainerStatuses {
				pod.Status.ContainerStatuses[i].Ready = ready == corev1.ConditionTrue
			}
			return k8s.Status().Update(ctx, pod)
		})
	}
	setReady("qwen-demo-cache-1", corev1.ConditionFalse)
	testutil.Eventually(t, 30*time.Second, func() error {
		require.NoError(t, k8s.Get(ctx, key, cb))
		if cb.Status.ReadyReplicas != 1 {
			return fmt.Errorf("readyReplicas %d, want 1", cb.Status.ReadyReplicas)
		}
		return nil
	})
	assert.Equal(t, first, cb.Status.ObservedServerInstance, "a replica that is only not Ready keeps its identity")
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(1), engine.Generation, "a not-Ready replica rolls nothing")
	assert.Zero(t, testutil.CountEvents(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesRestarted))

	setReady("qwen-demo-cache-1", corev1.ConditionTrue)
	kubectlRun(t, "wait", "-n", ns, "--for=condition=Ready", "cachebackend/qwen-demo-cache", "--timeout=60s")
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(1), engine.Generation, "a replica back to Ready rolls nothing")

	// Replacing replica 0's pod is a server change: the engines roll once.
	old := &corev1.Pod{}
	require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "qwen-demo-cache-0"}, old))
	require.NoError(t, k8s.Delete(ctx, old))
	waitGeneration(t, engineKey, engine, 2, 90*time.Second)
	testutil.Eventually(t, 30*time.Second, func() error {
		if inst := instance(); strings.Contains(inst, string(old.UID)) || len(strings.Split(inst, ",")) != 2 {
			return fmt.Errorf("observedServerInstance %q still names the replaced pod or lacks one", inst)
		}
		return nil
	})
	kubectlRun(t, "rollout", "status", "-n", ns, "deployment/qwen-engine", "--timeout=60s")
	require.NoError(t, k8s.Get(ctx, engineKey, engine))
	assert.Equal(t, int64(2), engine.Generation, "rolled exactly once")
	assert.Equal(t, 1, testutil.CountEvents(t, k8s, ns, "qwen-demo-cache", v1alpha1.EventEnginesRestarted))
}

// TestStatefulSetWithStorageStaysReady: a StatefulSet backend with
// per-replica claims, bound to PersistentVolumes the test creates, reaches
// Ready and stays Ready across forced reconciles (the API server's defaults
// in the claim templates are not a storage change).
func TestStatefulSetWithStorageStaysReady(t *testing.T) {
	ctx := context.Background()
	ns := namespace(t, "persistent")
	for i := range 2 {
		require.NoError(t, k8s.Create(ctx, &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("e2e-pv-%d", i)},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")},
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName:       "manual",
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fmt.Sprintf("/tmp/e2e-pv-%d", i)}},
			},
		}))
	}
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "persistent"},
		Spec: v1alpha1.CacheBackendSpec{
			Type: v1alpha1.BackendTypeLMCache, DeploymentKind: v1alpha1.DeploymentKindStatefulSet,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "engine"}},
			RemoteStorage:  &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To[int32](2)}},
			Storage: &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{
				Size: resource.MustParse("1Gi"), StorageClassName: ptr.To("manual"),
			}},
		},
	}
	require.NoError(t, k8s.Create(ctx, cb))
	key := client.ObjectKeyFromObject(cb)
	ready := func() error {
		if err := k8s.Get(ctx, key, cb); err != nil {
			return err
		}
		c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionTrue || cb.Status.ObservedGeneration != cb.Generation {
			return fmt.Errorf("Ready is %+v", c)
		}
		return nil
	}
	testutil.Eventually(t, 120*time.Second, ready)
	assert.Equal(t, "lm://persistent.persistent.svc.cluster.local:65432", cb.Status.Endpoint)
	for i := range 2 {
		pvc := &corev1.PersistentVolumeClaim{}
		require.NoError(t, k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: fmt.Sprintf("cache-data-persistent-%d", i)}, pvc))
		assert.Equal(t, corev1.ClaimBound, pvc.Status.Phase)
	}
	// Force reconciles: each new matching pod wakes the backend.
	for i := range 3 {
		require.NoError(t, k8s.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("engine-%d", i), Labels: map[string]string{"app": "engine"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}},
		}))
		testutil.Eventually(t, 15*time.Second, func() error {
			if err := k8s.Get(ctx, key, cb); err != nil {
				return err
			}
			if cb.Status.MatchedEnginePods != int32(i+1) {
				return fmt.Errorf("matched %d", cb.Status.MatchedEnginePods)
			}
			return nil
		})
		require.NoError(t, ready(), "still Ready after forced reconcile %d", i)
	}
}

// observedBackend waits until key's CacheBackend has recorded its serving
// pods (status.observedServerInstance) and returns it.
func observedBackend(t *testing.T, key client.ObjectKey) *v1alpha1.CacheBackend {
	t.Helper()
	cb := &v1alpha1.CacheBackend{}
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := k8s.Get(context.Background(), key, cb); err != nil {
			return err
		}
		if cb.Status.ObservedServerInstance == "" {
			return fmt.Errorf("no server instance observed yet")
		}
		return nil
	})
	return cb
}
