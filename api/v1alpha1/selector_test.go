package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestEngineSelectorMatches(t *testing.T) {
	pod := map[string]string{"app": "qwen", "tier": "gpu"}
	for _, tc := range []struct {
		name string
		sel  map[string]string
		pod  map[string]string
		want bool
	}{
		{"one label", map[string]string{"app": "qwen"}, pod, true},
		{"every label", pod, pod, true},
		{"another value", map[string]string{"app": "llama"}, pod, false},
		{"a label the pod lacks", map[string]string{"app": "qwen", "zone": "a"}, pod, false},
		{"an empty value must be present", map[string]string{"app": ""}, pod, false},
		{"an empty value present", map[string]string{"app": ""}, map[string]string{"app": ""}, true},
		{"nil selector matches nothing", nil, pod, false},
		{"empty selector matches nothing", map[string]string{}, pod, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (EngineSelector{MatchLabels: tc.sel}).Matches(tc.pod); got != tc.want {
				t.Fatalf("Matches = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestClaimant(t *testing.T) {
	backend := func(name string, sel map[string]string, deleting bool) CacheBackend {
		cb := CacheBackend{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: CacheBackendSpec{EngineSelector: EngineSelector{MatchLabels: sel}}}
		if deleting {
			now := metav1.Now()
			cb.DeletionTimestamp = &now
		}
		return cb
	}
	pod := map[string]string{"app": "qwen"}
	for _, tc := range []struct {
		name     string
		backends []CacheBackend
		want     string // "" for none
	}{
		{"none", nil, ""},
		{"the only match", []CacheBackend{backend("a", map[string]string{"app": "qwen"}, false)}, "a"},
		{"the first by name, whatever the order", []CacheBackend{backend("b", map[string]string{"app": "qwen"}, false), backend("a", map[string]string{"app": "qwen"}, false)}, "a"},
		{"a backend being deleted claims nothing", []CacheBackend{backend("a", map[string]string{"app": "qwen"}, true), backend("b", map[string]string{"app": "qwen"}, false)}, "b"},
		{"an empty selector claims nothing", []CacheBackend{backend("a", nil, false)}, ""},
		{"a selector that does not match", []CacheBackend{backend("a", map[string]string{"app": "llama"}, false)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Claimant(pod, tc.backends)
			name := ""
			if got != nil {
				name = got.Name
			}
			if name != tc.want {
				t.Fatalf("Claimant = %q, want %q", name, tc.want)
			}
		})
	}
}
