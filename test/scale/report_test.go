package scale_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	opmetrics "github.com/inferencecache/operator/internal/metrics"
	"github.com/inferencecache/operator/test/testutil"
)

func controllerCountRequests(cfg *rest.Config) *rest.Config { return opmetrics.CountRequests(cfg) }

type burstResult struct {
	served         bool
	p50, p99       time.Duration
	wired, created int
}

// runBursts creates sz.alternations pairs of bursts of sz.burst pods with
// sz.creators concurrent creators: first in a namespace the webhook serves
// (a Ready CacheBackend wires every pod), then in one it leaves out.
func runBursts(ctx context.Context, t *testing.T, k8s client.Client, sz size) []burstResult {
	t.Helper()
	served, unserved := "burst-served", "burst-unserved"
	require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: served}}))
	require.NoError(t, k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unserved, Labels: map[string]string{"scale.inferencecache.io/unserved": "true"}}}))
	cb := backendFor(served, 0)
	cb.Name, cb.Spec.EngineSelector.MatchLabels = "burst", map[string]string{"app": "burst"}
	require.NoError(t, k8s.Create(ctx, cb))
	testutil.Eventually(t, 3*time.Minute, func() error {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(cb), cb); err != nil {
			return err
		}
		return testutil.ReadyIs(metav1.ConditionTrue, v1alpha1.ReasonBackendReady)(cb)
	})
	var out []burstResult
	for a := range sz.alternations {
		// ABBA: the served namespace goes first in even alternations,
		// second in odd ones, so that neither side always follows the other.
		order := []string{served, unserved}
		if a%2 == 1 {
			order = []string{unserved, served}
		}
		for _, ns := range order {
			quiesce(ctx, t, k8s, served, unserved)
			objs := make([]client.Object, sz.burst)
			for i := range objs {
				p := enginePod(ns, "", "burst")
				p.GenerateName = fmt.Sprintf("burst-%d-", a)
				objs[i] = p
			}
			lat, err := createAll(ctx, k8s, sz.creators, objs)
			require.NoError(t, err)
			r := burstResult{served: ns == served, p50: percentile(lat, 0.5), p99: percentile(lat, 0.99), created: len(objs)}
			for _, o := range objs {
				if o.GetAnnotations()[v1alpha1.AnnotationInjectedBy] != "" {
					r.wired++
				}
			}
			t.Logf("burst %d in %s: %d pods, %d wired, CREATE p50 %s p99 %s", a, ns, r.created, r.wired, r.p50, r.p99)
			out = append(out, r)
			require.NoError(t, k8s.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(ns), client.MatchingLabels{"app": "burst"}, client.GracePeriodSeconds(0)))
		}
	}
	return out
}

// quiesce waits until the previous bursts are gone and their aftermath is
// over: no burst pod left in the burst namespaces (the served one also
// holds the cache server's pods), no engine pod in the cluster waiting
// for the scheduler, and no request from the operator for two seconds. A
// burst then measures its own pods' CREATE, not the tail of the last one
// (the scheduler binding it, kwok starting it, the garbage of its
// deletion, the operator reporting it).
func quiesce(ctx context.Context, t *testing.T, k8s client.Client, namespaces ...string) {
	t.Helper()
	testutil.Eventually(t, 5*time.Minute, func() error {
		for _, ns := range namespaces {
			var left metav1.PartialObjectMetadataList
			left.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
			if err := k8s.List(ctx, &left, client.InNamespace(ns), client.MatchingLabels{"app": "burst"}, client.Limit(1)); err != nil {
				return err
			}
			if len(left.Items) > 0 {
				return fmt.Errorf("pods of the last burst still in %s", ns)
			}
		}
		var pending metav1.PartialObjectMetadataList
		pending.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
		if err := k8s.List(ctx, &pending, client.HasLabels{engineLabel}, client.MatchingFields{"spec.nodeName": ""}, client.Limit(1)); err != nil {
			return err
		}
		if len(pending.Items) > 0 {
			return fmt.Errorf("pod %s/%s not scheduled yet", pending.Items[0].Namespace, pending.Items[0].Name)
		}
		return nil
	})
	settle(t, 2*time.Second, time.Minute)
}

type result struct {
	size                                     size
	nodes, expectReady, wired                int
	ttr                                      []time.Duration
	heapBase, heapBackends, heapPods         uint64
	rssBase, rssBackends, rssPods            uint64
	softLimit                                int64 // the Go runtime's soft memory limit, as the shipped manager sets it
	idle, perPods                            requestDelta
	idlePerMinute, perPod, writes, podWrites float64
	podGets                                  float64
	bursts                                   []burstResult
	admission, wait, reconcile               *dto.Histogram
	reconcileAfterBackends                   *dto.Histogram
	depth                                    int64
}

func (r result) perBackendHeap() float64 {
	return (float64(r.heapBackends) - float64(r.heapBase)) / float64(r.size.backends)
}

func (r result) perPodHeap() float64 {
	return (float64(r.heapPods) - float64(r.heapBackends)) / float64(r.size.pods)
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "**not met**"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func secs(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	switch {
	case v < 1e-3:
		return fmt.Sprintf("%.0f µs", v*1e6)
	case v < 1:
		return fmt.Sprintf("%.1f ms", v*1e3)
	}
	return fmt.Sprintf("%.2f s", v)
}

func loadavg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// markdown is the report, each figure beside its target.
func (r result) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	host, _ := os.Hostname()
	w("## Scale benchmark: N = %d CacheBackends, M = %d engine pods\n\n", r.size.backends, r.size.pods)
	w("Run %s on %s (%d CPUs, %s/%s), load average at the end %s (the machine is shared: wall-clock figures are inflated by other work); "+
		"local cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and %d kwok nodes; the operator in the benchmark's process "+
		"(controller.Setup with the manager's cache options and request counter; client-go limits QPS %d, burst %d, as the manager binary has them). "+
		"Memory figures are the benchmark process's: its Go heap after a collection, which holds the operator's caches, and its RSS.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, loadavg(), r.nodes,
		controller.DefaultKubeAPIQPS, controller.DefaultKubeAPIBurst)
	w("| Figure | Value | Target | |\n|---|---|---|---|\n")
	w("| Time-to-Ready, per backend, p50 / p99 (%d server-backed backends without storage) | %s / %s | — | |\n", r.expectReady, ms(percentile(r.ttr, 0.5)), ms(percentile(r.ttr, 0.99)))
	rssOK := r.rssPods <= 256<<20
	w("| Process RSS at rest (base / with backends / with pods; Go soft memory limit %s, as the shipped manager sets it) | %s / %s / %s | ≤ 256 MiB at N = 1,000, M = 10,000 | %s |\n", mib(uint64(r.softLimit)), mib(r.rssBase), mib(r.rssBackends), mib(r.rssPods), met(rssOK))
	w("| Go heap at rest (base / with backends / with pods) | %s / %s / %s | — | |\n", mib(r.heapBase), mib(r.heapBackends), mib(r.heapPods))
	w("| Heap per CacheBackend | %.1f KiB | ≤ %d KiB (budget in make test) | %s |\n", r.perBackendHeap()/1024, heapPerBackend>>10, met(r.perBackendHeap() <= heapPerBackend))
	w("| Heap per engine pod | %.2f KiB | ≤ %d KiB (budget in make test) | %s |\n", r.perPodHeap()/1024, heapPerPod>>10, met(r.perPodHeap() <= heapPerPod))
	idleTotalPerSecond := r.idlePerMinute / 60
	w("| API requests while idle (%s window) | %.1f / min in total (%.3f / min per backend): %s | ≤ 1 / s in total for 1,000 backends | %s |\n",
		r.size.idle, r.idlePerMinute, r.idlePerMinute/float64(r.size.backends), orNone(r.idle.String()), met(idleTotalPerSecond <= 1))
	w("| API requests per engine pod created (%d of %d wired) | %.2f in all: %s | — | |\n", r.wired, r.size.pods, r.perPod, r.perPods.String())
	w("| API writes per engine pod (to the pod and its events; CacheBackend status writes apart) | %.2f | ≤ 1 | %s |\n", r.writes, met(r.writes <= 1))
	w("| Pod writes per engine pod | %.2f | 0 | %s |\n", r.podWrites, met(r.podWrites == 0))
	w("| Pod GETs per engine pod | %.2f | 0 | %s |\n", r.podGets, met(r.podGets == 0))
	if len(r.bursts) > 0 {
		var with, without []time.Duration
		for _, x := range r.bursts {
			if x.served {
				with = append(with, x.p50)
			} else {
				without = append(without, x.p50)
			}
		}
		for i := range with {
			ratio := float64(with[i]) / float64(without[i])
			w("| Pod CREATE p50, burst %d of %d pods at %d creators: with webhook / without | %s / %s (×%.2f) | ratio ≤ 1.25 | %s |\n",
				i+1, r.size.burst, r.size.creators, ms(with[i]), ms(without[i]), ratio, met(ratio <= 1.25))
		}
		p99 := quantile(r.admission, 0.99)
		w("| Webhook's own handling p50 / p99 (%d admissions) | %s / %s | p99 ≤ 2 ms | %s |\n", r.admission.GetSampleCount(), secs(quantile(r.admission, 0.5)), secs(p99), met(p99 <= 2e-3))
		w("| of which waiting for a concurrency slot, p50 / p99 | %s / %s | — | |\n", secs(quantile(r.wait, 0.5)), secs(quantile(r.wait, 0.99)))
	} else {
		w("| Pod CREATE bursts | not run (SCALE_BURST=0) | ratio ≤ 1.25 | |\n")
	}
	w("| Reconcile duration p50 / p99 (controller-runtime's buckets; %d reconciles) | %s / %s | — | |\n", r.reconcile.GetSampleCount(), secs(quantile(r.reconcile, 0.5)), secs(quantile(r.reconcile, 0.99)))
	w("| Work queue depth, maximum seen | %d | — | |\n", r.depth)
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
