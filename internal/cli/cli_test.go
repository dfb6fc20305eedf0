package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
)

func TestBadInput(t *testing.T) {
	cases := map[string]struct{ input, want string }{
		"unknown field": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: LMCache, replicas: 3}`, `CacheBackend a: error unmarshaling JSON: while decoding JSON: json: unknown field "replicas"`},
		"not a CacheBackend": {`apiVersion: apps/v1
kind: Deployment
metadata: {name: a}`, "no CacheBackend"},
		"invalid enum": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: Redis}`, `spec.type: Unsupported value "Redis"`},
		"type/runtime": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: SGLangHiCache}`, "needs runtime SGLang"},
		"webhook rule": {`apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {name: a}
spec: {type: LMCache, integration: {engineOverrides: {args: ["--kv-transfer-config={}"]}}}`, "spec.integration.engineOverrides.args[0]"},
		"wrong version": {`apiVersion: inferencecache.io/v1
kind: CacheBackend
metadata: {name: a}`, `apiVersion "inferencecache.io/v1"`},
		"not YAML": {"{{{", "document 1"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs, err := Documents([]byte(tc.input))
			if err == nil {
				_, err = Backends(objs)
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestRenderQuickstart(t *testing.T) {
	objs, err := ReadFile("../../examples/quickstart", true)
	require.NoError(t, err)
	cbs, err := Backends(objs)
	require.NoError(t, err)
	require.Len(t, cbs, 1)
	var buf bytes.Buffer
	require.NoError(t, RenderYAML(&buf, cbs[0]))
	docs, err := Documents(buf.Bytes())
	require.NoError(t, err)
	var kinds []string
	for _, d := range docs {
		kinds = append(kinds, d.GetKind())
	}
	assert.Equal(t, []string{"Service", "Deployment"}, kinds)

	engines, err := Engines(objs)
	require.NoError(t, err)
	wired, d := WireEngine(cbs[0], engines[0])
	assert.Equal(t, inject.Injected, d.Outcome)
	assert.Contains(t, wired.Spec.Template.Spec.Containers[0].Args, inject.KVTransferConfigFlag)
	assert.Equal(t, "lm://qwen-demo-cache.default.svc.cluster.local:65432", wired.Spec.Template.Spec.Containers[0].Env[0].Value)
	assert.Empty(t, wired.Spec.Template.Annotations[inject.AnnotationInjectedBy], "receipts belong to pods, not templates")
}

func TestExplainOutcomes(t *testing.T) {
	key := receipt.NewKey([]byte("0123456789abcdef0123456789abcdef"))
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: types.UID("uid-1"), Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}}},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "lm://cache.llm.svc.cluster.local:65432"},
	}
	pod := func(labels, ann map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "p", Labels: labels, Annotations: ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "v"}}}}
	}
	injected := inject.Decide(pod(map[string]string{"app": "qwen"}, nil), []v1alpha1.CacheBackend{cb}, inject.Options{Key: &key}).Pod
	tampered := injected.DeepCopy()
	tampered.Spec.Containers[0].Args = nil
	cases := map[string]struct {
		pod     *corev1.Pod
		outcome string
		line    string
	}{
		"injected":   {injected, ExplainInjected, "receipt verifies"},
		"skipped":    {pod(map[string]string{"app": "qwen"}, map[string]string{inject.AnnotationSkip: "true", inject.AnnotationSkipped: inject.SkippedByAnnotation}), ExplainSkipped, "opts out"},
		"fail-open":  {pod(map[string]string{"app": "qwen"}, nil), ExplainFailOpen, "admitted unwired"},
		"no match":   {pod(map[string]string{"app": "other"}, nil), ExplainNoMatch, "CacheBackend cache selects {app=qwen}"},
		"forged uid": {pod(map[string]string{"app": "qwen"}, map[string]string{inject.AnnotationInjectedBy: "llm/cache", inject.AnnotationInjectedByUID: "copied"}), ExplainForged, "not written by the webhook"},
		"tampered":   {tampered, ExplainForged, "differ from the configuration"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := explain(tc.pod, []v1alpha1.CacheBackend{cb}, []receipt.Key{key}, nil)
			assert.Equal(t, tc.outcome, e.Outcome)
			var buf bytes.Buffer
			e.Print(&buf)
			assert.Contains(t, buf.String(), tc.line)
		})
	}
}
