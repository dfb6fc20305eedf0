package evaluate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/receipt"
)

func TestTallyWiring(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: "uid-1"}}
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	since := t0.Add(10 * time.Second)
	pod := func(name string, created time.Time, a map[string]string) metav1.PartialObjectMetadata {
		return metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, CreationTimestamp: metav1.NewTime(created), Annotations: a}}
	}
	signed := func(k receipt.Key) map[string]string {
		c := receipt.Claim{Backend: "llm/cache", UID: "uid-1", Generation: "1", Digest: "sha256:x"}
		return map[string]string{v1alpha1.AnnotationInjectedBy: c.Backend, v1alpha1.AnnotationInjectedByUID: c.UID,
			v1alpha1.AnnotationInjectedGeneration: c.Generation, v1alpha1.AnnotationInjectedConfigDigest: c.Digest,
			v1alpha1.AnnotationReceiptSignature: receipt.Sign(k, c)}
	}
	terminating := pod("gone", t0, nil)
	terminating.DeletionTimestamp = &metav1.Time{Time: t0}
	skipped := map[string]string{v1alpha1.AnnotationInjectSkipped: "skip-inject-annotation"}
	forged := signed(receipt.NewKey([]byte("not the operator's key, not at all")))

	for _, tc := range []struct {
		name            string
		pods            []metav1.PartialObjectMetadata
		keys            []receipt.Key
		since           *time.Time
		wired, skip     int32
		early, late     int
		keysUnavailable bool
	}{
		{"no pods", nil, []receipt.Key{key}, &since, 0, 0, 0, 0, false},
		{"a wired pod", []metav1.PartialObjectMetadata{pod("a", t0, signed(key))}, []receipt.Key{key}, &since, 1, 0, 0, 0, false},
		{"a pod without a receipt before the endpoint", []metav1.PartialObjectMetadata{pod("a", t0, nil)}, []receipt.Key{key}, &since, 0, 0, 1, 0, false},
		{"a pod without a receipt while no endpoint exists", []metav1.PartialObjectMetadata{pod("a", since.Add(time.Hour), nil)}, []receipt.Key{key}, nil, 0, 0, 1, 0, false},
		{"a pod without a receipt after the endpoint settled", []metav1.PartialObjectMetadata{pod("a", since.Add(time.Second), nil)}, []receipt.Key{key}, &since, 0, 0, 0, 1, false},
		{"a skipped pod is never unwired", []metav1.PartialObjectMetadata{pod("a", t0, skipped)}, []receipt.Key{key}, &since, 0, 1, 0, 0, false},
		{"a pod asking skip-inject without the webhook's stamp is skipped", []metav1.PartialObjectMetadata{pod("a", t0, map[string]string{v1alpha1.AnnotationSkipInject: "true"})}, []receipt.Key{key}, &since, 0, 1, 0, 0, false},
		{"skip-inject=false is no skip", []metav1.PartialObjectMetadata{pod("a", t0, map[string]string{v1alpha1.AnnotationSkipInject: "false"})}, []receipt.Key{key}, &since, 0, 0, 1, 0, false},
		{"a forged receipt is unwired but never early", []metav1.PartialObjectMetadata{pod("a", t0, forged)}, []receipt.Key{key}, &since, 0, 0, 0, 1, false},
		{"a terminating pod is not counted", []metav1.PartialObjectMetadata{terminating}, []receipt.Key{key}, &since, 0, 0, 0, 0, false},
		{"no keys: receipts cannot be counted", []metav1.PartialObjectMetadata{pod("a", t0, signed(key))}, nil, &since, 0, 0, 0, 0, true},
		{"no keys and no receipt to check", []metav1.PartialObjectMetadata{pod("a", t0, nil)}, nil, &since, 0, 0, 1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := TallyWiring(cb, tc.pods, tc.keys, tc.since)
			assert.Equal(t, tc.wired, w.Wired, "wired")
			assert.Equal(t, tc.skip, w.Skipped, "skipped")
			assert.Len(t, w.Early, tc.early, "early")
			assert.Len(t, w.Late, tc.late, "late")
			assert.Equal(t, tc.keysUnavailable, w.KeysUnavailable)
		})
	}
}

func TestReportWiring(t *testing.T) {
	one := []metav1.PartialObjectMetadata{{}}
	for _, tc := range []struct {
		name   string
		f      WiringFacts
		status metav1.ConditionStatus
		reason string
		says   string
	}{
		{"all wired", WiringFacts{Wiring: Wiring{Wired: 2, Skipped: 1}}, metav1.ConditionTrue, v1alpha1.ReasonAllEnginesWired, "2 engine pod(s) wired, 1 skipped"},
		{"nothing matched", WiringFacts{}, metav1.ConditionTrue, v1alpha1.ReasonAllEnginesWired, "0 engine pod(s) wired"},
		{"keys unavailable", WiringFacts{Wiring: Wiring{KeysUnavailable: true}}, metav1.ConditionUnknown, v1alpha1.ReasonReceiptKeysUnavailable, "keys"},
		{"early, healing pending", WiringFacts{Wiring: Wiring{Early: one}, Endpoint: true, Policy: v1alpha1.EngineRestartOnServerChange, EarlyOwner: []string{"Deployment/engine"}},
			metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedBeforeEndpoint, "Deployment/engine; the operator rolls them"},
		{"early, no endpoint yet", WiringFacts{Wiring: Wiring{Early: one}, EarlyOwner: []string{"Deployment/engine"}},
			metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedBeforeEndpoint, "no endpoint is published yet"},
		{"early, policy Never", WiringFacts{Wiring: Wiring{Early: one}, Endpoint: true, Policy: v1alpha1.EngineRestartNever, EarlyOwner: []string{"Deployment/engine"}},
			metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedBeforeEndpoint, "engineRestartPolicy is Never"},
		{"early, rolled", WiringFacts{Wiring: Wiring{Early: one, Wired: 1}, Endpoint: true, Rolling: true, EarlyOwner: []string{"Deployment/engine"}},
			metav1.ConditionFalse, v1alpha1.ReasonEnginesRollingForWiring, "1 of 2 engine pod(s)"},
		{"late", WiringFacts{Wiring: Wiring{Late: one}, Endpoint: true, LateOwner: []string{"StatefulSet/engine"}},
			metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedUnwired, "StatefulSet/engine"},
		{"engine-local reports early pods as unwired, never healing", WiringFacts{Wiring: Wiring{Early: one}, EngineLoc: true, EarlyOwner: []string{"Deployment/sglang"}},
			metav1.ConditionFalse, v1alpha1.ReasonEnginesAdmittedUnwired, "Deployment/sglang"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ReportWiring(tc.f)
			assert.Equal(t, tc.status, r.Status)
			assert.Equal(t, tc.reason, r.Reason)
			assert.Contains(t, r.Message, tc.says)
		})
	}
}

// TestEndpointSettled: whole-workload rolls count the settle time from the
// Ready transition; multiprocess mode's per-node cascade from
// status.endpointPublishedAt, so a node whose server is missing (Ready
// False) holds no other node's evictions.
func TestEndpointSettled(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	const ep = "tcp://mp.llm.svc.cluster.local:5555"
	at := func(ago time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(-ago)); return &t }
	ready := func(s metav1.ConditionStatus, ago time.Duration) []metav1.Condition {
		return []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: s, LastTransitionTime: *at(ago)}}
	}
	for _, tc := range []struct {
		name    string
		st      v1alpha1.CacheBackendStatus
		want    string
		perNode bool
		settled bool
	}{
		{"Ready for the settle time", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionTrue, EndpointSettleTime)}, ep, false, true},
		{"Ready just now", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionTrue, time.Second)}, ep, false, false},
		{"not Ready", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(time.Hour), Conditions: ready(metav1.ConditionFalse, time.Hour)}, ep, false, false},
		{"another endpoint", v1alpha1.CacheBackendStatus{Endpoint: "tcp://other:5555", Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, false, false},
		{"any endpoint (the CLI)", v1alpha1.CacheBackendStatus{Endpoint: "tcp://other:5555", Conditions: ready(metav1.ConditionTrue, time.Hour)}, "", false, true},
		{"no endpoint", v1alpha1.CacheBackendStatus{Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, false, false},
		{"per node: published for the settle time and a second, not Ready", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(EndpointSettleTime + time.Second), Conditions: ready(metav1.ConditionFalse, time.Hour)}, ep, true, true},
		{"per node: published just now", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(time.Second), Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, true, false},
		{"per node: published within the settle time and its second", v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(EndpointSettleTime + 999*time.Millisecond), Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, true, false},
		{"per node: no publication time (an older CRD): Ready for the settle time", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionTrue, time.Hour)}, ep, true, true},
		{"per node: no publication time, not Ready", v1alpha1.CacheBackendStatus{Endpoint: ep, Conditions: ready(metav1.ConditionFalse, time.Hour)}, ep, true, false},
		{"per node: no endpoint", v1alpha1.CacheBackendStatus{EndpointPublishedAt: at(time.Hour)}, ep, true, false},
	} {
		assert.Equal(t, tc.settled, EndpointSettled(&tc.st, tc.want, tc.perNode, now), tc.name)
	}
}

// TestEndpointSinceInMultiprocessMode: in multiprocess mode the webhook
// wires from the endpoint's publication on, Ready or not; otherwise from
// the Ready transition.
func TestEndpointSinceInMultiprocessMode(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	cb := &v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Multiprocess: &v1alpha1.Multiprocess{}},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "tcp://mp.llm.svc.cluster.local:5555", EndpointPublishedAt: &metav1.Time{Time: t0},
			Conditions: []metav1.Condition{{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0)}}}}
	since := EndpointSince(cb)
	require.NotNil(t, since, "published, not Ready")
	assert.Equal(t, t0.Add(EndpointSettleTime+time.Second), *since)
	inProcess := cb.DeepCopy()
	inProcess.Spec.Multiprocess = nil
	assert.Nil(t, EndpointSince(inProcess), "the in-process server: from Ready")
	unpublished := cb.DeepCopy()
	unpublished.Status.Endpoint = ""
	assert.Nil(t, EndpointSince(unpublished))
}

// TestPublishRecordsWhenTheEndpointAppears: status.endpointPublishedAt is
// set when the endpoint appears or changes, kept while it stays, removed
// with it.
func TestPublishRecordsWhenTheEndpointAppears(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	t1 := metav1.NewTime(t0.Add(time.Minute))
	st := &v1alpha1.CacheBackendStatus{}
	Publish(st, 1, Outcome{Endpoint: "tcp://a:5555", Now: t0})
	require.NotNil(t, st.EndpointPublishedAt)
	assert.Equal(t, t0, *st.EndpointPublishedAt)
	Publish(st, 1, Outcome{Endpoint: "tcp://a:5555", Now: t1})
	assert.Equal(t, t0, *st.EndpointPublishedAt, "kept while the endpoint stays")
	Publish(st, 2, Outcome{Endpoint: "tcp://b:5555", Now: t1})
	assert.Equal(t, t1, *st.EndpointPublishedAt, "a new endpoint is published anew")
	Publish(st, 2, Outcome{Now: t1})
	assert.Nil(t, st.EndpointPublishedAt, "removed with the endpoint")
	assert.Empty(t, st.Endpoint)
}

// TestPublication: the endpoint and its publication time, "" without
// either; a new publication of the same endpoint is a new value.
func TestPublication(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ep := "tcp://mp.llm.svc.cluster.local:5555"
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: t0.Add(d)} }
	st := &v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(0)}
	assert.Equal(t, ep+"@2026-12-05T12:00:00Z", Publication(st, ep))
	assert.Equal(t, ep+"@2026-12-05T12:00:00Z", Publication(st, ""), "any endpoint")
	assert.Empty(t, Publication(st, "tcp://other.llm.svc.cluster.local:5555"), "another endpoint than the one wanted")
	assert.Empty(t, Publication(&v1alpha1.CacheBackendStatus{Endpoint: ep}, ep), "no publication time (pruned by an older CRD)")
	assert.Empty(t, Publication(&v1alpha1.CacheBackendStatus{EndpointPublishedAt: at(0)}, ""), "no endpoint")
	assert.NotEqual(t, Publication(st, ep),
		Publication(&v1alpha1.CacheBackendStatus{Endpoint: ep, EndpointPublishedAt: at(time.Minute)}, ep), "published anew")
}
