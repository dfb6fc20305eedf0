package controller

import (
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/inferencecache/operator/internal/apply"
)

// Setup registers every reconciler of the operator with mgr. The manager
// binary and the integration tests call it alike, so tests run the
// controllers exactly as shipped.
func Setup(mgr ctrl.Manager) error {
	r := &CacheBackendReconciler{
		Client:   mgr.GetClient(),
		Applier:  apply.New(mgr.GetClient(), mgr.GetClient()),
		Recorder: mgr.GetEventRecorder("inferencecache-operator"),
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the CacheBackend controller: %w", err)
	}
	return nil
}
