package indexclient

import (
	"context"
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// TestPollWakesOnlyChangedObservedBackends: a poll asks Changed of every
// observed, live backend and wakes those it says changed; backends without
// spec.observation, being deleted, or whose read failed are left alone.
func TestPollWakesOnlyChangedObservedBackends(t *testing.T) {
	observed := &v1alpha1.Observation{ModelID: "m"}
	now := metav1.Now()
	backends := []v1alpha1.CacheBackend{
		{ObjectMeta: metav1.ObjectMeta{Name: "changed"}, Spec: v1alpha1.CacheBackendSpec{Observation: observed}},
		{ObjectMeta: metav1.ObjectMeta{Name: "same"}, Spec: v1alpha1.CacheBackendSpec{Observation: observed}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unobserved"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "deleting", DeletionTimestamp: &now, Finalizers: []string{"x"}}, Spec: v1alpha1.CacheBackendSpec{Observation: observed}},
		{ObjectMeta: metav1.ObjectMeta{Name: "unreadable"}, Spec: v1alpha1.CacheBackendSpec{Observation: observed}},
	}
	var asked []string
	events := make(chan event.GenericEvent, len(backends))
	p := &Poller{
		Backends: func(context.Context) ([]v1alpha1.CacheBackend, error) { return backends, nil },
		Changed: func(_ context.Context, cb *v1alpha1.CacheBackend) (bool, error) {
			asked = append(asked, cb.Name)
			if cb.Name == "unreadable" {
				return true, errors.New("index down")
			}
			return cb.Name == "changed", nil
		},
		Events: events,
	}
	p.Poll(context.Background())
	close(events)
	var woken []string
	for e := range events {
		woken = append(woken, e.Object.GetName())
	}
	if want := []string{"changed", "same", "unreadable"}; !slices.Equal(asked, want) {
		t.Errorf("asked %v, want %v", asked, want)
	}
	if want := []string{"changed"}; !slices.Equal(woken, want) {
		t.Errorf("woke %v, want %v", woken, want)
	}
}
