package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/realnode"
)

const operatorNamespace = "inferencecache-system"

// available waits until the Deployment's pods are all available, as the
// kubelet reports them after their readiness probes passed.
func available(t *testing.T, ns, name string, timeout time.Duration) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	testutil.Eventually(t, timeout, func() error {
		if err := node.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, d); err != nil {
			return err
		}
		if d.Status.AvailableReplicas < 1 || d.Status.UnavailableReplicas > 0 || d.Status.ObservedGeneration != d.Generation {
			return fmt.Errorf("deployment %s/%s: %d available, %d unavailable\n%s", ns, name, d.Status.AvailableReplicas, d.Status.UnavailableReplicas, podsOf(ns, d.Spec.Selector.MatchLabels))
		}
		return nil
	})
	return d
}

// podsOf describes the pods of ns with these labels: phase, and each
// container's state, for a failure message.
func podsOf(ns string, labels map[string]string) string {
	var pods corev1.PodList
	if err := node.Client.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabels(labels)); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s %s\n", p.Name, p.Status.Phase, p.Status.Message)
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			fmt.Fprintf(&b, "  %s ready=%v restarts=%d state=%+v last=%+v\n", cs.Name, cs.Ready, cs.RestartCount, cs.State, cs.LastTerminationState)
		}
	}
	return b.String()
}

// TestInstallBundleOnARealNode (issue 37): the dev install bundle, its
// images the project's own, applied with kubectl apply --server-side:
//   - in a namespace enforcing Pod Security restricted, the manager and
//     the index become available through their real readiness probes, run
//     by the kubelet inside their images as the non-root user the images
//     declare;
//   - the manager reaches the API server through the kubernetes Service
//     (kube-proxy), provisions its webhook certificate and publishes the
//     CA: the API server then calls both webhooks through their Service
//     (a CacheBackend the schema admits but the validating webhook
//     refuses is refused with its field path; an engine pod is wired at
//     CREATE by the mutating webhook);
//   - the wired engine pod, in a namespace enforcing restricted too (a
//     stand-in engine container: the pause image,
//     which ignores the arguments the webhook adds; no engine image fits
//     on this machine yet) is started by the kubelet after its
//     kvevent-subscriber native sidecar passed its startup probe, and the
//     sidecar reaches the index by its Service's DNS name (CoreDNS) with
//     its projected token (the index's TokenReview through the API
//     server): the pod is live in the CacheBackend's
//     status.indexParticipation.
func TestInstallBundleOnARealNode(t *testing.T) {
	ctx := context.Background()
	ns := "realnode-engines"
	dumpOnFailure(t, operatorNamespace, ns)
	install(t)
	require.NoError(t, node.Client.Create(ctx, restrictedNamespace(ns)))

	// The validating webhook, through its Service: the schema admits a
	// multiprocess L1 of 1536Mi, LMCache's server refuses anything but
	// whole GiB, and so does the webhook.
	bad := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bad"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "none"}},
			RemoteStorage:  &v1alpha1.RemoteStorage{Provider: v1alpha1.ProviderLMCacheServer, Ownership: v1alpha1.OwnershipManaged, LMCacheServer: &v1alpha1.LMCacheServer{}},
			Multiprocess:   &v1alpha1.Multiprocess{L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1536Mi")}},
		},
	}
	var err error
	testutil.Eventually(t, time.Minute, func() error {
		err = node.Client.Create(ctx, bad)
		if err == nil {
			return fmt.Errorf("the CacheBackend was admitted")
		}
		if !strings.Contains(err.Error(), "admission webhook") {
			return fmt.Errorf("not yet refused by the webhook: %w", err)
		}
		return nil
	})
	assert.Contains(t, err.Error(), "spec.multiprocess.l1.size", "refused with the field path")

	// The mutating webhook and the sidecar: an engine-local backend (no
	// server to wait for) with the KV-event observation on.
	hicache := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hicache"},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeSGLang, Type: v1alpha1.BackendTypeSGLangHiCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "sglang"}},
			HiCache:        &v1alpha1.HiCache{Ratio: ptr.To("2"), WritePolicy: "write_through"},
			Observation:    &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"},
		},
	}
	require.NoError(t, node.Client.Create(ctx, hicache))
	engine := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "engine"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "sglang"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "sglang"}},
				Spec: restrictedPod(corev1.Container{
					Name: "sglang", Image: realnode.PauseImage,
					Args: []string{"--model-path", "Qwen/Qwen2.5-0.5B-Instruct", "--port", "30000"},
				}),
			},
		},
	}
	require.NoError(t, node.Client.Create(ctx, engine))
	available(t, ns, "engine", 3*time.Minute)

	var pods corev1.PodList
	require.NoError(t, node.Client.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{"app": "sglang"}))
	require.Len(t, pods.Items, 1)
	pod := pods.Items[0]
	assert.Equal(t, ns+"/hicache", pod.Annotations[v1alpha1.AnnotationInjectedBy], "wired at CREATE through the webhook's Service")
	if got := receipt.Digest(&pod); got != pod.Annotations[v1alpha1.AnnotationInjectedConfigDigest] {
		raw, _ := json.MarshalIndent(pod.Spec, "", "  ")
		t.Errorf("the stored pod digests %s, its receipt claims %s; spec:\n%s", got, pod.Annotations[v1alpha1.AnnotationInjectedConfigDigest], raw)
	}
	assert.Contains(t, pod.Spec.Containers[0].Args, "--enable-hierarchical-cache")
	i := slices.IndexFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SubscriberContainer })
	require.GreaterOrEqual(t, i, 0, "the webhook added the sidecar")
	require.Len(t, pod.Status.InitContainerStatuses, len(pod.Spec.InitContainers))
	sidecar := pod.Status.InitContainerStatuses[i]
	engineStatus := pod.Status.ContainerStatuses[0]
	require.NotNil(t, sidecar.State.Running, "the sidecar runs: %+v", sidecar.State)
	require.NotNil(t, engineStatus.State.Running, "the engine runs: %+v", engineStatus.State)
	assert.True(t, ptr.Deref(sidecar.Started, false) && sidecar.Ready, "the sidecar's startup probe passed")
	assert.False(t, engineStatus.State.Running.StartedAt.Before(&sidecar.State.Running.StartedAt),
		"the kubelet started the engine (%s) after its sidecar (%s)", engineStatus.State.Running.StartedAt, sidecar.State.Running.StartedAt)

	// The sidecar said hello to the index: the pod is live in status.
	testutil.Eventually(t, 2*time.Minute, func() error {
		cb := &v1alpha1.CacheBackend{}
		if err := node.Client.Get(ctx, client.ObjectKeyFromObject(hicache), cb); err != nil {
			return err
		}
		p := cb.Status.IndexParticipation
		if p == nil || p.LivePods < 1 {
			return fmt.Errorf("status.indexParticipation %+v, conditions %+v", p, cb.Status.Conditions)
		}
		return nil
	})
}

// dumpOnFailure prints, when t fails, the events of the namespaces and the
// logs of the operator's pods (through the API server and the kubelet).
func dumpOnFailure(t *testing.T, namespaces ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, ns := range namespaces {
			out, _ := kubectlErr("get", "events", "-n", ns, "--sort-by=.lastTimestamp")
			t.Logf("events of %s:\n%s", ns, out)
			var pods corev1.PodList
			_ = node.Client.List(context.Background(), &pods, client.InNamespace(ns))
			for _, p := range pods.Items {
				for _, previous := range []string{"--previous=false", "--previous=true"} {
					out, _ := kubectlErr("logs", "-n", ns, p.Name, "--all-containers", "--prefix", "--tail=40", previous)
					t.Logf("logs of %s/%s (%s):\n%s", ns, p.Name, previous, out)
				}
			}
		}
		for _, l := range []string{"app.kubernetes.io/name=inferencecache-operator", "app.kubernetes.io/name=inferencecache-index"} {
			out, _ := kubectlErr("logs", "-n", operatorNamespace, "-l", l, "--tail=60", "--all-containers", "--prefix")
			t.Logf("logs of %s:\n%s", l, out)
		}
	})
}

var (
	installOnce sync.Once
	installErr  error
)

// install applies the dev bundle once for the package, in a namespace
// enforcing Pod Security restricted (the operator's pods claim to meet it:
// a pod that did not would not be created), and waits until the manager
// and the index are available, through their real readiness probes.
func install(t *testing.T) {
	t.Helper()
	installOnce.Do(func() {
		if err := node.Client.Create(context.Background(), restrictedNamespace(operatorNamespace)); err != nil {
			installErr = err
			return
		}
		out, err := kubectlErr("apply", "--server-side", "-f", bundle)
		if err != nil {
			installErr = err
			return
		}
		if !strings.Contains(out, "deployment.apps/inferencecache-operator serverside-applied") {
			installErr = fmt.Errorf("kubectl apply:\n%s", out)
		}
	})
	require.NoError(t, installErr)
	for _, name := range []string{"inferencecache-operator", "inferencecache-index"} {
		d := available(t, operatorNamespace, name, 3*time.Minute)
		image := d.Spec.Template.Spec.Containers[0].Image
		assert.True(t, strings.HasPrefix(image, realnode.Registry+"/"), "%s runs the imported image, pinned by digest: %s", name, image)
		assert.Contains(t, image, "@sha256:", name)
	}
}

// restrictedNamespace is a namespace enforcing Pod Security restricted.
func restrictedNamespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
	}}}
}

// restrictedPod is a pod of one container that meets Pod Security
// restricted (as user 65532, which an image without a user needs).
func restrictedPod(c corev1.Container) corev1.PodSpec {
	c.SecurityContext = &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	return corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), RunAsGroup: ptr.To[int64](65532),
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{c},
	}
}
