// Package injecttest holds the fixtures the pod webhook's tests share: the
// pure decision's (internal/inject) and its serving's
// (internal/webhook/podmutation).
package injecttest

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// Backend is an LMCache CacheBackend of namespace llm selecting app=qwen,
// with a published endpoint, changed by mut.
func Backend(name string, mut ...func(*v1alpha1.CacheBackend)) v1alpha1.CacheBackend {
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: name, UID: types.UID("uid-cache-" + name), Generation: 3},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
		},
		Status: v1alpha1.CacheBackendStatus{Endpoint: "lm://" + name + ".llm.svc.cluster.local:65432"},
	}
	for _, m := range mut {
		m(&cb)
	}
	return cb
}

// EnginePod is a vLLM engine pod labelled app=qwen, changed by mut.
func EnginePod(mut ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "engine", Labels: map[string]string{"app": "qwen", "pod-template-hash": "abc"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm/vllm-openai", Args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"},
			Env: []corev1.EnvVar{{Name: "HF_HOME", Value: "/models"}},
		}}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

// WithAnnotations sets the annotations kv (key, value, ...) on a pod.
func WithAnnotations(kv ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Annotations[kv[i]] = kv[i+1]
		}
	}
}

// ForgedReceipt pre-sets receipt annotations of another backend, as a user
// could write them on a pod.
var ForgedReceipt = WithAnnotations(
	v1alpha1.AnnotationInjectedBy, "llm/other", v1alpha1.AnnotationInjectedByUID, "forged", v1alpha1.AnnotationInjectedGeneration, "99")
