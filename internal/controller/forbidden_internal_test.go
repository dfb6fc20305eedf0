package controller

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/plan"
)

// TestForbiddenEvictionsAreReportedOnce: an engine pod whose eviction RBAC
// refused is not tried (nor reported) again for the same start of its
// node's server, also when the backend's identity changed on another node;
// it is when its node's server changes again; the memo keeps only pods
// still planned.
func TestForbiddenEvictionsAreReportedOnce(t *testing.T) {
	r := &CacheBackendReconciler{}
	cb := &v1alpha1.CacheBackend{ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "mp", UID: "uid-mp"}}
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	a := plan.Eviction{Pod: "engine-a", UID: "uid-a", Node: "gpu-a", Since: t0}
	b := plan.Eviction{Pod: "engine-b", UID: "uid-b", Node: "gpu-b", Since: t0.Add(time.Minute)}
	toTry := func(planned ...plan.Eviction) []string {
		var out []string
		for _, e := range unreported(r.memo.get(cb).forbidden, planned) {
			out = append(out, e.Pod)
		}
		return out
	}
	assert.Equal(t, []string{"engine-a"}, toTry(a))
	r.rememberForbidden(cb, []plan.Eviction{a}, []plan.Eviction{a})
	assert.Empty(t, toTry(a), "reported once")
	assert.Equal(t, []string{"engine-b"}, toTry(a, b), "another node's change: only its pod")
	r.rememberForbidden(cb, []plan.Eviction{a, b}, []plan.Eviction{b})
	assert.Empty(t, toTry(a, b))
	again := a
	again.Since = t0.Add(time.Hour)
	assert.Equal(t, []string{"engine-a"}, toTry(again), "gpu-a's server changed again")
	r.rememberForbidden(cb, []plan.Eviction{b}, nil)
	keys := slices.Collect(maps.Keys(r.memo.get(cb).forbidden))
	assert.Equal(t, []types.UID{"uid-b"}, keys, "only pods still planned are kept")
}
