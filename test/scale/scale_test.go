// Package scale_test is the scale benchmark of issue 12: a whole local
// cluster (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// kwok nodes), the operator as shipped (controller.Setup with the
// manager's cache options and its request counter) in this process, N
// CacheBackends and M engine pods. It measures time-to-Ready, memory, API
// requests while idle and per engine pod, pod-CREATE latency with and
// without the webhook, the webhook's own handling time, reconcile
// durations and the work queue's depth.
//
// In `make test` it runs at a small size and fails on budget regressions
// counted in requests and bytes, never on wall-clock time. `make
// bench-scale` runs it at the full size (SCALE_N=1000, SCALE_M=10000) and
// writes the Markdown report to SCALE_REPORT.
package scale_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/localcluster"
	"github.com/inferencecache/operator/test/manifests"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

// Budgets asserted at every size. They count requests and bytes.
const (
	// idlePerBackendPerMinute: issue 12's target, at most 1 request per
	// second in total for 1,000 idle backends.
	idlePerBackendPerMinute = 0.06
	// idleFixedPerMinute: requests of an idle operator that do not grow
	// with backends (the receipt key Secret, re-read every 30 s).
	idleFixedPerMinute = 4
	// Per engine pod: at most one write (its event; the backends' status
	// writes are per backend), no write to the pod, no full pod GET.
	writesPerPod    = 1
	podWritesPerPod = 0
	podGetsPerPod   = 0
	// Heap bytes held per CacheBackend and per engine pod.
	heapPerBackend = 128 << 10
	heapPerPod     = 8 << 10
)

// size is the benchmark's size, from the environment.
type size struct {
	backends, pods int
	// burst is the number of pods of a pod-CREATE burst (0: no bursts).
	burst, alternations, creators int
	idle                          time.Duration
	report                        string
}

func sizeFromEnv(t *testing.T) size {
	// The small size (make test) runs small bursts too, so that the
	// burst code is exercised before a full-size run needs it.
	s := size{backends: 20, pods: 200, burst: 20, idle: 30 * time.Second, creators: 50, alternations: 3}
	num := func(name string, into *int) {
		if v := os.Getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			require.NoError(t, err, name)
			*into = n
		}
	}
	num("SCALE_N", &s.backends)
	num("SCALE_M", &s.pods)
	num("SCALE_BURST", &s.burst)
	if v := os.Getenv("SCALE_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		s.idle = d
	}
	s.report = os.Getenv("SCALE_REPORT")
	return s
}

// counters reads inferencecache_apiserver_requests_total by verb and resource.
func counters(t *testing.T) map[string]float64 {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "inferencecache_apiserver_requests_total" {
			continue
		}
		for _, m := range mf.Metric {
			var verb, res string
			for _, l := range m.Label {
				switch l.GetName() {
				case "verb":
					verb = l.GetValue()
				case "resource":
					res = l.GetValue()
				}
			}
			out[verb+" "+res] += m.GetCounter().GetValue()
		}
	}
	return out
}

type requestDelta map[string]float64

func delta(before, after map[string]float64) requestDelta {
	d := requestDelta{}
	for k, v := range after {
		if n := v - before[k]; n > 0 {
			d[k] = n
		}
	}
	return d
}

func (d requestDelta) total(keep func(verb, resource string) bool) float64 {
	var n float64
	for k, v := range d {
		verb, res, _ := strings.Cut(k, " ")
		if keep(verb, res) {
			n += v
		}
	}
	return n
}

func (d requestDelta) String() string {
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%.0f", k, d[k])
	}
	return strings.Join(parts, ", ")
}

func all(string, string) bool { return true }

func isWrite(verb, _ string) bool {
	return verb != "get" && verb != "list" && verb != "watch" && !strings.HasPrefix(verb, "dryrun-")
}

// heap is the Go heap in use after a collection, and the process's RSS.
func heap() (live, rss uint64) {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	live = s[0].Value.Uint64()
	raw, err := os.ReadFile("/proc/self/status")
	if err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseUint(f[1], 10, 64)
				rss = kb << 10
			}
		}
	}
	return live, rss
}

// histogram reads a histogram of the registry, merged over label sets
// that keep accepts.
func histogram(t *testing.T, name string, keep func(map[string]string) bool) *dto.Histogram {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	require.NoError(t, err)
	var out *dto.Histogram
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if !keep(labels) || m.Histogram == nil {
				continue
			}
			if out == nil {
				out = &dto.Histogram{SampleCount: ptr.To[uint64](0)}
				for _, b := range m.Histogram.Bucket {
					out.Bucket = append(out.Bucket, &dto.Bucket{UpperBound: ptr.To(b.GetUpperBound()), CumulativeCount: ptr.To[uint64](0)})
				}
			}
			*out.SampleCount += m.Histogram.GetSampleCount()
			for i, b := range m.Histogram.Bucket {
				*out.Bucket[i].CumulativeCount += b.GetCumulativeCount()
			}
		}
	}
	return out
}

// quantile interpolates quantile q of h within its buckets (as PromQL's
// histogram_quantile does); NaN without samples.
func quantile(h *dto.Histogram, q float64) float64 {
	if h == nil || h.GetSampleCount() == 0 {
		return math.NaN()
	}
	rank := q * float64(h.GetSampleCount())
	lower, prev := 0.0, uint64(0)
	for _, b := range h.Bucket {
		if float64(b.GetCumulativeCount()) >= rank {
			n := b.GetCumulativeCount() - prev
			if n == 0 {
				return b.GetUpperBound()
			}
			return lower + (b.GetUpperBound()-lower)*(rank-float64(prev))/float64(n)
		}
		lower, prev = b.GetUpperBound(), b.GetCumulativeCount()
	}
	return lower
}

// since returns h minus base, bucket by bucket.
func since(h, base *dto.Histogram) *dto.Histogram {
	if h == nil || base == nil {
		return h
	}
	out := &dto.Histogram{SampleCount: ptr.To(h.GetSampleCount() - base.GetSampleCount())}
	for i, b := range h.Bucket {
		out.Bucket = append(out.Bucket, &dto.Bucket{UpperBound: b.UpperBound, CumulativeCount: ptr.To(b.GetCumulativeCount() - base.Bucket[i].GetCumulativeCount())})
	}
	return out
}

func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(math.Min(float64(len(s)-1), math.Ceil(q*float64(len(s)))-1))]
}

// backendFor is the i-th CacheBackend: a mix of Deployment and
// StatefulSet kinds, some autoscaled, some with storage, some SGLang
// HiCache (engine-local) backends.
func backendFor(ns string, i int) *v1alpha1.CacheBackend {
	cb := &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("cb-%04d", i)},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("engine-%04d", i)}},
		},
	}
	switch i % 10 {
	case 1, 2:
		cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet
		if i%20 == 1 {
			cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
		}
	case 3:
		cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MinReplicas: ptr.To[int32](1), MaxReplicas: 3}
	case 4:
		cb.Spec.Runtime, cb.Spec.Type = v1alpha1.RuntimeSGLang, v1alpha1.BackendTypeSGLangHiCache
		cb.Spec.HiCache = &v1alpha1.HiCache{}
	}
	return cb
}

// engineLabel marks the engine pods the benchmark creates.
const engineLabel = "scale.inferencecache.io/engine"

func enginePod(ns, name, app string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app, engineLabel: "true"}},
		Spec: corev1.PodSpec{
			Containers:  []corev1.Container{{Name: "engine", Image: "vllm/vllm-openai:v0.11.0", Args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"}}},
			Tolerations: []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		},
	}
}

// createAll creates objs with creators concurrent clients and returns each
// create's latency.
func createAll(ctx context.Context, c client.Client, creators int, objs []client.Object) ([]time.Duration, error) {
	lat := make([]time.Duration, len(objs))
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range creators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(objs) {
					return
				}
				start := time.Now()
				err := c.Create(ctx, objs[i])
				lat[i] = time.Since(start)
				if err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return lat, first
}

// settle waits until the operator has sent no request for quiet, or
// until timeout.
func settle(t *testing.T, quiet, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last, lastChange := counters(t), time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		now := counters(t)
		if len(delta(last, now)) > 0 {
			last, lastChange = now, time.Now()
			continue
		}
		if time.Since(lastChange) >= quiet {
			return
		}
	}
}

func TestScale(t *testing.T) {
	sz := sizeFromEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(testutil.ZapLevel())))
	bin, err := controlplane.Dir()
	require.NoError(t, err, "the scale benchmark needs the local control plane")
	work := t.TempDir()
	nodes := sz.pods/100 + 2
	start := time.Now()
	cluster, err := localcluster.Start(ctx, localcluster.Options{BinDir: bin, WorkDir: work, Nodes: nodes, CRDDir: "../../kustomize/base/crd"})
	require.NoError(t, err)
	defer cluster.Stop()
	t.Logf("local cluster with %d kwok nodes up in %s", nodes, time.Since(start).Round(time.Millisecond))

	scheme := testutil.Scheme()
	cfg := cluster.Config
	cfg.QPS, cfg.Burst = 200, 400 // the benchmark's own client
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)

	// Webhooks served by this process; namespaces labelled unserved are
	// left out (the "without webhook" bursts).
	port, err := freeport.Take()
	require.NoError(t, err)
	certDir := filepath.Join(work, "webhook-certs")
	ca, err := localcluster.WebhookServing(certDir)
	require.NoError(t, err)
	mwc, vwc, err := manifests.Webhooks("../../kustomize/base")
	require.NoError(t, err)
	for _, m := range mwc {
		for i := range m.Webhooks {
			if m.Webhooks[i].NamespaceSelector == nil {
				m.Webhooks[i].NamespaceSelector = &metav1.LabelSelector{}
			}
			m.Webhooks[i].NamespaceSelector.MatchExpressions = append(m.Webhooks[i].NamespaceSelector.MatchExpressions,
				metav1.LabelSelectorRequirement{Key: "scale.inferencecache.io/unserved", Operator: metav1.LabelSelectorOpDoesNotExist})
		}
	}
	require.NoError(t, localcluster.InstallWebhooks(ctx, cfg, fmt.Sprintf("https://127.0.0.1:%d", port), ca, mwc, []*admissionregistrationv1.ValidatingWebhookConfiguration(vwc)))
	require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "inferencecache-system"}}))

	// The operator as the manager binary runs it: its cache options, its
	// request counter, the manager's client-go rate limits.
	mcfg := *cfg
	mcfg.QPS, mcfg.Burst = controller.DefaultKubeAPIQPS, controller.DefaultKubeAPIBurst
	mgr, err := ctrl.NewManager(controllerCountRequests(&mcfg), ctrl.Options{
		Scheme: scheme, Cache: controller.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certDir}),
	})
	require.NoError(t, err)
	require.NoError(t, controller.Setup(mgr, controller.Options{Webhooks: true}))
	// The Go runtime's soft memory limit the shipped manager sets from its
	// container's memory limit (GOMEMLIMIT through the downward API, then
	// --memory-limit-ratio).
	limit, err := manifests.ManagerMemoryLimit("../../kustomize/base")
	require.NoError(t, err)
	softLimit := int64(float64(limit) * controller.DefaultMemoryLimitRatio)
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(softLimit))
	t.Logf("Go soft memory limit %d MiB (%.0f%% of the manager container's %d MiB)", softLimit>>20, 100*controller.DefaultMemoryLimitRatio, limit>>20)
	stop := testutil.RunManager(ctx, mgr)
	defer stop()
	require.NoError(t, localcluster.WaitServing(ctx, fmt.Sprintf("127.0.0.1:%d", port), 60*time.Second))
	settle(t, 5*time.Second, 60*time.Second)
	heapBase, rssBase := heap()

	// Phase 1: N CacheBackends, 100 per namespace.
	namespaces := (sz.backends + 99) / 100
	for i := range namespaces {
		require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-%d", i)}}))
	}
	backends := make([]client.Object, sz.backends)
	for i := range backends {
		backends[i] = backendFor(fmt.Sprintf("scale-%d", i/100), i)
	}
	depth := &maxDepth{}
	go depth.sample(ctx, t)
	created := time.Now()
	_, err = createAll(ctx, k8s, 10, backends)
	require.NoError(t, err)
	expectReady := 0
	for _, o := range backends {
		cb := o.(*v1alpha1.CacheBackend)
		if cb.Spec.Storage == nil && cb.Spec.Type == v1alpha1.BackendTypeLMCache {
			expectReady++
		}
	}
	readyAt := map[string]time.Duration{}
	readyTimeout := 90*time.Second + time.Duration(sz.backends)*600*time.Millisecond
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		var list v1alpha1.CacheBackendList
		require.NoError(t, k8s.List(ctx, &list))
		for i := range list.Items {
			cb := &list.Items[i]
			if _, seen := readyAt[cb.Namespace+"/"+cb.Name]; seen {
				continue
			}
			if c := meta.FindStatusCondition(cb.Status.Conditions, v1alpha1.ConditionReady); c != nil && c.Status == metav1.ConditionTrue && cb.Spec.Type == v1alpha1.BackendTypeLMCache {
				readyAt[cb.Namespace+"/"+cb.Name] = time.Since(created)
			}
		}
		if len(readyAt) >= expectReady {
			break
		}
		time.Sleep(time.Second)
	}
	var ttr []time.Duration
	for _, d := range readyAt {
		ttr = append(ttr, d)
	}
	t.Logf("%d/%d server-backed backends without storage Ready; time-to-Ready p50 %s p99 %s", len(readyAt), expectReady, percentile(ttr, 0.5), percentile(ttr, 0.99))
	require.Equal(t, expectReady, len(readyAt), "every server-backed backend without storage becomes Ready")
	reconcileAfterBackends := histogram(t, "controller_runtime_reconcile_time_seconds", func(l map[string]string) bool { return l["controller"] == "cachebackend" })

	// Phase 2: idle.
	settle(t, 5*time.Second, 2*time.Minute)
	heapBackends, rssBackends := heap()
	before := counters(t)
	time.Sleep(sz.idle)
	idle := delta(before, counters(t))
	idlePerMinute := idle.total(all) / sz.idle.Minutes()
	t.Logf("idle for %s: %s (%.1f requests/min)", sz.idle, idle, idlePerMinute)

	// Phase 3: M engine pods, wired to the backends round robin.
	pods := make([]client.Object, sz.pods)
	for j := range pods {
		i := j % sz.backends
		pods[j] = enginePod(fmt.Sprintf("scale-%d", i/100), fmt.Sprintf("engine-%05d", j), fmt.Sprintf("engine-%04d", i))
	}
	before = counters(t)
	_, err = createAll(ctx, k8s, sz.creators, pods)
	require.NoError(t, err)
	wired := 0
	for _, o := range pods {
		if o.GetAnnotations()[v1alpha1.AnnotationInjectedBy] != "" {
			wired++
		}
	}
	// The benchmark's own copies of the pods and backends are dead from
	// here on: the heap figures below are the operator's.
	settle(t, 10*time.Second, 5*time.Minute)
	perPods := delta(before, counters(t))
	heapPods, rssPods := heap()
	t.Logf("%d engine pods (%d wired): %s", sz.pods, wired, perPods)
	require.Positive(t, wired)
	m := float64(sz.pods)
	// Writes caused by each pod: to the pod itself and its event. Status
	// writes of the backends (their matched-pod counts) are per backend and
	// reported apart.
	writes := perPods.total(func(v, r string) bool { return isWrite(v, r) && !strings.HasPrefix(r, "cachebackends") }) / m
	podWrites := perPods.total(func(v, r string) bool { return isWrite(v, r) && (r == "pods" || strings.HasPrefix(r, "pods/")) }) / m
	podGets := perPods.total(func(v, r string) bool { return v == "get" && r == "pods" }) / m
	perPod := perPods.total(all) / m

	// Phase 4: pod-CREATE bursts, alternating between a namespace the
	// webhook serves (a Ready backend wires every pod) and one it leaves out.
	var bursts []burstResult
	admissionBase := histogram(t, "inferencecache_webhook_admission_duration_seconds", func(map[string]string) bool { return true })
	waitBase := histogram(t, "inferencecache_webhook_admission_wait_seconds", func(map[string]string) bool { return true })
	if sz.burst > 0 {
		bursts = runBursts(ctx, t, k8s, sz)
	}
	admission := since(histogram(t, "inferencecache_webhook_admission_duration_seconds", func(map[string]string) bool { return true }), admissionBase)
	wait := since(histogram(t, "inferencecache_webhook_admission_wait_seconds", func(map[string]string) bool { return true }), waitBase)
	reconcile := histogram(t, "controller_runtime_reconcile_time_seconds", func(l map[string]string) bool { return l["controller"] == "cachebackend" })

	r := result{size: sz, nodes: nodes, ttr: ttr, expectReady: expectReady,
		heapBase: heapBase, heapBackends: heapBackends, heapPods: heapPods, rssBase: rssBase, rssBackends: rssBackends, rssPods: rssPods,
		idle: idle, idlePerMinute: idlePerMinute, perPods: perPods, perPod: perPod, writes: writes, podWrites: podWrites, podGets: podGets, wired: wired,
		bursts: bursts, admission: admission, wait: wait, reconcile: reconcile, reconcileAfterBackends: reconcileAfterBackends, depth: depth.max.Load(), softLimit: softLimit}
	if sz.report != "" {
		require.NoError(t, os.WriteFile(sz.report, []byte(r.markdown()), 0o644))
		t.Logf("report written to %s", sz.report)
	}

	// Budgets: requests and bytes only.
	idleBudget := idleFixedPerMinute + idlePerBackendPerMinute*float64(sz.backends)
	require.LessOrEqual(t, idlePerMinute, idleBudget, "idle requests per minute (%s)", idle)
	require.LessOrEqual(t, writes, float64(writesPerPod), "API writes per engine pod (%s)", perPods)
	require.LessOrEqual(t, podWrites, float64(podWritesPerPod), "pod writes per engine pod (%s)", perPods)
	require.LessOrEqual(t, podGets, float64(podGetsPerPod), "pod GETs per engine pod (%s)", perPods)
	require.LessOrEqual(t, r.perBackendHeap(), float64(heapPerBackend), "heap bytes per CacheBackend")
	require.LessOrEqual(t, r.perPodHeap(), float64(heapPerPod), "heap bytes per engine pod")
}

// maxDepth samples the cachebackend work queue's depth.
type maxDepth struct{ max atomic.Int64 }

func (d *maxDepth) sample(ctx context.Context, t *testing.T) {
	for ctx.Err() == nil {
		mfs, err := ctrlmetrics.Registry.Gather()
		if err == nil {
			for _, mf := range mfs {
				if mf.GetName() != "workqueue_depth" {
					continue
				}
				for _, m := range mf.Metric {
					for _, l := range m.Label {
						if l.GetName() == "name" && l.GetValue() == "cachebackend" {
							if v := int64(m.GetGauge().GetValue()); v > d.max.Load() {
								d.max.Store(v)
							}
						}
					}
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
}
