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
