// Package admission_test measures the Pod webhook as it is served: an
// AdmissionReview's bytes in, the operator's guard in front of the
// handler's one reader, Handler.Review (podmutation.Served, as the manager
// serves it), the response's bytes out, with the CacheBackends of
// the namespace read from a real informer cache of a real API server
// (kube-apiserver and etcd, no manager: nothing else runs while it
// measures). TestServedAdmissionBudget asserts the allocation budget,
// which does not depend on the machine; BenchmarkServedAdmission reports
// time and allocations at 1, 100 and 1,000 CacheBackends in the namespace.
package admission_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/webhook/podmutation"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/testutil"
)

// sizes are the numbers of CacheBackends in a namespace; one namespace each.
var sizes = []int{1, 100, 1000}

var (
	cfg    *rest.Config
	k8s    client.Client
	reader cache.Cache
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	// The manager's logger: zap's production JSON encoder and sampling
	// (cmd/manager), writing nowhere.
	core := zapcore.NewSamplerWithOptions(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.AddSync(io.Discard), zap.InfoLevel), time.Second, 100, 100)
	ctrl.SetLogger(zapr.NewLogger(zap.New(core)))
	dir, err := controlplane.Dir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "the served-admission benchmark needs the local control plane:", err)
		return 1
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "kustomize", "base", "crd")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: dir,
	}
	if cfg, err = env.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "starting kube-apiserver and etcd:", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	cfg.QPS, cfg.Burst = 500, 1000
	if k8s, err = client.New(cfg, client.Options{Scheme: testutil.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := populate(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "creating CacheBackends:", err)
		return 1
	}
	if reader, err = cache.New(cfg, cache.Options{Scheme: testutil.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := reader.GetInformer(ctx, &v1alpha1.CacheBackend{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() { _ = reader.Start(ctx) }()
	if !reader.WaitForCacheSync(ctx) {
		fmt.Fprintln(os.Stderr, "the CacheBackend cache did not sync")
		return 1
	}
	return m.Run()
}

func namespace(n int) string { return fmt.Sprintf("bench-%d", n) }

// populate creates, per size n, a namespace with n CacheBackends: n-1
// select other pods, the last (by name) selects app=qwen and publishes the
// endpoint derived from its spec, as a Ready backend does.
func populate(ctx context.Context) error {
	for _, n := range sizes {
		ns := namespace(n)
		if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
		for i := range n {
			cb := &v1alpha1.CacheBackend{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cache-%04d", i)},
				Spec: v1alpha1.CacheBackendSpec{
					Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
					EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("other-%d", i)}},
				},
			}
			if i == n-1 {
				cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen"}
			}
			if err := k8s.Create(ctx, cb); err != nil {
				return err
			}
			if i == n-1 {
				cb.Status.Endpoint = topology.Endpoint(cb, "")
				if err := k8s.Status().Update(ctx, cb); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// vllmPod is an engine pod as the API server sends it for admission: made
// by a Deployment's ReplicaSet, defaulted, with the volumes, probes and
// resources a vLLM deployment carries.
func vllmPod(ns, app string) *corev1.Pod {
	gpu := resource.MustParse("1")
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "qwen-7d9f8c6b5d-", Namespace: ns,
			Labels:      map[string]string{"app": app, "pod-template-hash": "7d9f8c6b5d", "app.kubernetes.io/name": "vllm"},
			Annotations: map[string]string{"prometheus.io/scrape": "true", "prometheus.io/port": "8000"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "qwen-7d9f8c6b5d",
				UID: types.UID("6b1f1d7e-0d2c-4c39-9f1e-2b4f1c9d8a11"), Controller: ptrTo(true), BlockOwnerDeletion: ptrTo(true)}},
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "vllm", Image: "vllm/vllm-openai:v0.11.0", ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"vllm", "serve"},
				Args:    []string{"Qwen/Qwen2.5-7B-Instruct", "--port", "8000", "--max-model-len", "32768", "--gpu-memory-utilization", "0.9"},
				Env: []corev1.EnvVar{{Name: "HF_HOME", Value: "/models"}, {Name: "VLLM_LOGGING_LEVEL", Value: "INFO"},
					{Name: "HF_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "hf"}, Key: "token"}}}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000, Protocol: corev1.ProtocolTCP}},
				Resources: corev1.ResourceRequirements{
					Limits:   corev1.ResourceList{"nvidia.com/gpu": gpu, corev1.ResourceMemory: resource.MustParse("48Gi")},
					Requests: corev1.ResourceList{"nvidia.com/gpu": gpu, corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("32Gi")},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "models", MountPath: "/models"}, {Name: "shm", MountPath: "/dev/shm"},
					{Name: "kube-api-access-abcde", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstrPort(8000), Scheme: corev1.URISchemeHTTP}},
					PeriodSeconds: 5, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3},
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/health", Port: intstrPort(8000), Scheme: corev1.URISchemeHTTP}},
					InitialDelaySeconds: 120, PeriodSeconds: 10, TimeoutSeconds: 1, SuccessThreshold: 1, FailureThreshold: 3},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}},
			Volumes: []corev1.Volume{
				{Name: "models", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "models"}}},
				{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptrTo(resource.MustParse("16Gi"))}}},
				{Name: "kube-api-access-abcde", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{DefaultMode: ptrTo(int32(420)), Sources: []corev1.VolumeProjection{
					{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptrTo(int64(3607))}},
					{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				}}}},
			},
			RestartPolicy: corev1.RestartPolicyAlways, TerminationGracePeriodSeconds: ptrTo(int64(30)), DNSPolicy: corev1.DNSClusterFirst,
			ServiceAccountName: "default", SchedulerName: "default-scheduler", SecurityContext: &corev1.PodSecurityContext{},
			NodeSelector: map[string]string{"nvidia.com/gpu.present": "true"},
			Tolerations: []corev1.Toleration{
				{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
				{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrTo(int64(300))},
				{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrTo(int64(300))},
			},
			Priority: ptrTo(int32(0)), EnableServiceLinks: ptrTo(true), PreemptionPolicy: ptrTo(corev1.PreemptLowerPriority),
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// review is the AdmissionReview the API server posts for pod's CREATE.
func review(tb testing.TB, pod *corev1.Pod) []byte {
	raw, err := json.Marshal(pod)
	if err != nil {
		tb.Fatal(err)
	}
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       "0f8b2f4e-3c55-4f0e-9c47-5f5d6f0c1a2b",
			Kind:      metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			Namespace: pod.Namespace, Operation: admissionv1.Create,
			RequestKind:     &metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			RequestResource: &metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
			UserInfo:        authUser(),
			DryRun:          ptrTo(false),
		},
	}
	r.Request.Object.Raw = raw
	b, err := json.Marshal(r)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// served is the pod webhook as the manager serves it (see
// controller.Setup): CacheBackends selected by the index the informer
// keeps, the cache as the fallback reader.
func served(tb testing.TB) http.Handler {
	idx, err := podmutation.IndexBackends(context.Background(), reader)
	if err != nil {
		tb.Fatal(err)
	}
	if !toolscache.WaitForCacheSync(make(chan struct{}), idx.Synced) {
		tb.Fatal("the index did not sync")
	}
	return podmutation.Served(&podmutation.Handler{Backends: idx, Reader: reader}, inject.Limits{})
}

// recorder is a reusable ResponseWriter, so that the measurement counts
// the webhook's allocations, not the recorder's.
type recorder struct {
	h    http.Header
	code int
	body bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.h }
func (r *recorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *recorder) WriteHeader(code int)        { r.code = code }

// SetReadDeadline is there because the server's ResponseWriter has it (the
// guard bounds the body's reading with it); a recorder without it would
// add the allocations of http.ErrNotSupported to every admission.
func (r *recorder) SetReadDeadline(time.Time) error { return nil }

func (r *recorder) reset() {
	clear(r.h)
	r.code = http.StatusOK
	r.body.Reset()
}

// serve posts body to h once and returns the response's body.
func serve(h http.Handler, w *recorder, req *http.Request, body *bytes.Reader) {
	w.reset()
	body.Seek(0, 0) //nolint:errcheck // a bytes.Reader seeks to 0 without error
	req.Body = readCloser{body}
	h.ServeHTTP(w, req)
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// outcome serves body once and returns whether the pod was patched.
func outcome(tb testing.TB, h http.Handler, body []byte) bool {
	w := &recorder{h: http.Header{}}
	req, err := http.NewRequest(http.MethodPost, "https://webhook/mutate-v1-pod?timeout=5s", nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = int64(len(body))
	serve(h, w, req, bytes.NewReader(body))
	if w.code != http.StatusOK {
		tb.Fatalf("status %d: %s", w.code, w.body.String())
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.body.Bytes(), &out); err != nil {
		tb.Fatalf("decoding the response: %v", err)
	}
	if out.Response == nil || !out.Response.Allowed {
		tb.Fatalf("response %s", w.body.String())
	}
	return len(out.Response.Patch) > 0 && strings.Contains(string(out.Response.Patch), "LMCACHE_REMOTE_URL")
}

type pods struct {
	name    string
	app     string
	patched bool
}

var cases = []pods{{"wired", "qwen", true}, {"unmatched", "nothing-selects-this", false}}

// BenchmarkServedAdmission: one pod CREATE served end to end, at each size,
// for a pod the last CacheBackend wires and one no CacheBackend matches.
func BenchmarkServedAdmission(b *testing.B) {
	h := served(b)
	for _, n := range sizes {
		for _, c := range cases {
			body := review(b, vllmPod(namespace(n), c.app))
			if got := outcome(b, h, body); got != c.patched {
				b.Fatalf("%s pod with %d CacheBackends: patched=%v, want %v", c.name, n, got, c.patched)
			}
			b.Run(fmt.Sprintf("pod=%s/backends=%d", c.name, n), func(b *testing.B) {
				w := &recorder{h: http.Header{}}
				req, _ := http.NewRequest(http.MethodPost, "https://webhook/mutate-v1-pod?timeout=5s", nil)
				req.Header.Set("Content-Type", "application/json")
				req.ContentLength = int64(len(body))
				r := bytes.NewReader(body)
				b.ReportAllocs()
				for b.Loop() {
					serve(h, w, req, r)
				}
			})
		}
	}
}

func intstrPort(p int) intstr.IntOrString { return intstr.FromInt(p) }

func authUser() authenticationv1.UserInfo {
	return authenticationv1.UserInfo{Username: "system:serviceaccount:kube-system:replicaset-controller", UID: "f3c1", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"}}
}

// Budgets of one served admission, in allocations, with the manager's
// logger. Issue 12 asks for at most 400 for a wired pod, the same from 1 to
// 1,000 CacheBackends in the namespace; the budgets hold today's figures
// (227–231 and 31 since the numba cache's env, mount and volume; 253–255
// before the patch was trimmed for them) with some slack, so that a
// regression shows here.
const (
	wiredAllocs     = 240
	unmatchedAllocs = 40
)

func TestServedAdmissionBudget(t *testing.T) {
	h := served(t)
	allocs := map[string]float64{}
	for _, n := range sizes {
		for _, c := range cases {
			body := review(t, vllmPod(namespace(n), c.app))
			if got := outcome(t, h, body); got != c.patched {
				t.Fatalf("%s pod with %d CacheBackends: patched=%v, want %v", c.name, n, got, c.patched)
			}
			w := &recorder{h: http.Header{}}
			req, _ := http.NewRequest(http.MethodPost, "https://webhook/mutate-v1-pod?timeout=5s", nil)
			req.Header.Set("Content-Type", "application/json")
			req.ContentLength = int64(len(body))
			r := bytes.NewReader(body)
			a := testing.AllocsPerRun(50, func() { serve(h, w, req, r) })
			t.Logf("%s pod, %d CacheBackends: %.0f allocs", c.name, n, a)
			allocs[fmt.Sprintf("%s/%d", c.name, n)] = a
		}
	}
	for _, c := range cases {
		budget := float64(wiredAllocs)
		if !c.patched {
			budget = unmatchedAllocs
		}
		for _, n := range sizes {
			if a := allocs[fmt.Sprintf("%s/%d", c.name, n)]; a > budget {
				t.Errorf("%s pod with %d CacheBackends: %.0f allocs, budget %.0f", c.name, n, a, budget)
			}
		}
		// Flat: a few allocations of slack for map growth and the like.
		if one, most := allocs[c.name+"/1"], allocs[fmt.Sprintf("%s/%d", c.name, sizes[len(sizes)-1])]; most > one+5 {
			t.Errorf("%s pod: %.0f allocs with 1 CacheBackend, %.0f with %d: selection costs per CacheBackend", c.name, one, most, sizes[len(sizes)-1])
		}
	}
}
