package inject

import (
	"encoding/json"
	"fmt"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	sigsjson "sigs.k8s.io/json"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
)

// FuzzAdmit: arbitrary pods never panic the webhook; every patch it
// returns applies cleanly to the pod it was computed for; and the
// webhook's reader (ReadObject, the spec decoded only as far as a decision
// reads it) decides as a full decode of the same bytes with the API
// server's own decoder (sigs.k8s.io/json, case-sensitive) does: same
// outcome, reason, annotations (the receipt, whose digest covers the
// containers) and containers. Stripping a forged receipt thus rests on
// the library reader, not on a hand-written one.
func FuzzAdmit(f *testing.F) {
	for _, p := range []*corev1.Pod{
		enginePod(), enginePod(forgedReceipt), enginePod(withAnnotations(v1alpha1.AnnotationSkipInject, "true")),
		enginePod(func(p *corev1.Pod) { p.Spec.Containers = nil }),
		enginePod(func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"bash", "-c", "vllm serve"} }),
		enginePod(func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{KVTransferConfigFlag} }),
		// Pods the multiprocess-mode backend selects.
		enginePod(withMPLabel),
		enginePod(withMPLabel, func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "shm", MountPath: DevShm}}
		}),
		enginePod(withMPLabel, func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{{Name: v1alpha1.VolumeEngineSharedMemory}} }),
		enginePod(withMPLabel, func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"--enable-sleep-mode"} }),
		// Pod-level fields the receipt's digest covers (issue 35).
		enginePod(withHostAliases, withDNSConfig),
		enginePod(withMPLabel, withDNSConfig),
	} {
		raw, _ := json.Marshal(p)
		f.Add(raw, "qwen", false)
		f.Add(raw, "qwen", true)
	}
	f.Add([]byte(`{"metadata":{"labels":{"app":"qwen"},"annotations":null},"spec":{"containers":[{"name":"a","env":[{"name":"LMCACHE_REMOTE_URL"}]}]}}`), "qwen", false)
	f.Add([]byte(`{"metadata":{"labels":{"app":"qwen"}},"spec":{"containers":[{}],"initContainers":[{}]}}`), "qwen", true)
	f.Fuzz(func(t *testing.T, raw []byte, app string, hicache bool) {
		cbs := []v1alpha1.CacheBackend{backend("b", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": app}
			cb.Spec.Observation = &v1alpha1.Observation{ModelID: "m"}
			if hicache {
				cb.Spec.Type, cb.Spec.Runtime = v1alpha1.BackendTypeSGLangHiCache, v1alpha1.RuntimeSGLang
			}
		}), backend("a", func(cb *v1alpha1.CacheBackend) { cb.Status.Endpoint = "" }),
			// Sorted first: it claims the pods labelled mode=mp.
			mpBackend("0-mp", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": app, "mode": "mp"}
			})}
		opts := Options{KVEventSubscriberImage: "sub:v1", Key: &receipt.Key{ID: "k", Secret: []byte("fuzz")}}
		d, ops, err := Admit(raw, cbs, opts)
		var full corev1.Pod
		if ferr := sigsjson.UnmarshalCaseSensitivePreserveInts(raw, &full); ferr == nil && err == nil {
			want := Decide(&full, cbs, opts)
			require.Equal(t, want.Outcome, d.Outcome, "outcome")
			require.Equal(t, want.Reason, d.Reason, "reason")
			require.Equal(t, want.Pod.Annotations, d.Pod.Annotations, "annotations")
			require.Equal(t, len(want.Pod.Spec.Containers), len(d.Pod.Spec.Containers), "containers")
			for i, c := range want.Pod.Spec.Containers {
				require.Equal(t, c.Args, d.Pod.Spec.Containers[i].Args, "containers[%d].args", i)
				require.Equal(t, c.Env, d.Pod.Spec.Containers[i].Env, "containers[%d].env", i)
				require.Equal(t, c.VolumeMounts, d.Pod.Spec.Containers[i].VolumeMounts, "containers[%d].volumeMounts", i)
			}
		}
		if err != nil {
			return // not a pod as the API server sends one: the handler admits it unchanged
		}
		if len(ops) == 0 {
			return
		}
		assertPatchApplies(t, raw, ops, d.Pod)
	})
}

func withMPLabel(p *corev1.Pod) { p.Labels["mode"] = "mp" }

func withHostAliases(p *corev1.Pod) {
	p.Spec.HostAliases = []corev1.HostAlias{{IP: "10.0.0.7", Hostnames: []string{"models.internal"}}}
}

func withDNSConfig(p *corev1.Pod) {
	p.Spec.DNSConfig = &corev1.PodDNSConfig{Searches: []string{"models.svc.cluster.local"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("2")}}}
}

// TestWebhookReceiptVerifiesOnTheStoredPod (issue 35): the receipt the
// webhook signs, from the part of the pod its reader decodes, verifies
// against the pod the API server stores, for pods that set the pod-level
// fields the digest covers (hostAliases, dnsConfig). Before, the reader
// did not decode them: such pods were wired with a receipt the operator's
// own checks rejected (ErrConfigMismatch), so the restart cascade never
// restarted them.
func TestWebhookReceiptVerifiesOnTheStoredPod(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	opts := Options{Key: &key}
	for name, mut := range map[string][]func(*corev1.Pod){
		"plain":                 nil,
		"hostAliases":           {withHostAliases},
		"dnsConfig":             {withDNSConfig},
		"both":                  {withHostAliases, withDNSConfig},
		"multiprocess, both":    {withMPLabel, withHostAliases, withDNSConfig},
		"multiprocess, aliases": {withMPLabel, withHostAliases},
	} {
		t.Run(name, func(t *testing.T) {
			backends := []v1alpha1.CacheBackend{backend("cache"), mpBackend("0-mp", func(cb *v1alpha1.CacheBackend) {
				cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen", "mode": "mp"}
			})}
			pod := enginePod(mut...)
			raw, err := json.Marshal(pod)
			require.NoError(t, err)
			d, ops, err := Admit(raw, backends, opts)
			require.NoError(t, err)
			require.Equal(t, Injected, d.Outcome, d.Message)
			// The pod as the API server stores it: the bytes it was sent,
			// patched with the webhook's operations, decoded whole.
			patched, err := jsonpatch.DecodePatch(mustJSON(t, ops))
			require.NoError(t, err)
			stored, err := patched.Apply(raw)
			require.NoError(t, err)
			full := &corev1.Pod{}
			require.NoError(t, json.Unmarshal(stored, full))
			require.NoError(t, receipt.Verify([]receipt.Key{key}, full, ClaimOf(full)), "the webhook's receipt verifies on the stored pod")
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	require.NoError(t, err)
	return raw
}

// BenchmarkAdmit measures one admission (decode, decide, patch) with 1,
// 100 and 1,000 CacheBackends in the namespace, the last of which selects
// the wired pod and none the unmatched one.
func BenchmarkAdmit(b *testing.B) {
	for _, c := range []struct {
		name string
		app  string
		want Outcome
	}{{"wired", "qwen", Injected}, {"unmatched", "nothing-selects-this", NoMatch}} {
		raw, err := json.Marshal(enginePod(func(p *corev1.Pod) { p.Labels["app"] = c.app }))
		require.NoError(b, err)
		for _, n := range []int{1, 100, 1000} {
			cbs := make([]v1alpha1.CacheBackend, n)
			for i := range cbs {
				cbs[i] = backend(fmt.Sprintf("cache-%04d", i), func(cb *v1alpha1.CacheBackend) {
					cb.Spec.EngineSelector.MatchLabels = map[string]string{"app": fmt.Sprintf("other-%d", i)}
				})
			}
			cbs[n-1].Spec.EngineSelector.MatchLabels = map[string]string{"app": "qwen"}
			b.Run(fmt.Sprintf("pod=%s/backends=%d", c.name, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					d, _, err := Admit(raw, cbs, Options{})
					if err != nil || d.Outcome != c.want {
						b.Fatalf("outcome %s, want %s: %v", d.Outcome, c.want, err)
					}
				}
			})
		}
	}
}
