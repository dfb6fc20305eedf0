package indexclient

import (
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// DefaultPoll is how often observed backends' participation is read.
const DefaultPoll = 30 * time.Second

// Poller reads the index for every observed CacheBackend once per Period
// and wakes the backend's reconcile (an event on Events) only when Changed
// says the result differs meaningfully from the published status. A poll
// costs one HTTP GET per observed backend whose KV-event gate is open
// (through Changed) and nothing of the API server when Backends reads the
// manager's cache. It is a manager.Runnable (it runs on the leader only).
type Poller struct {
	// Period between polls (DefaultPoll when zero).
	Period time.Duration
	// Backends lists the CacheBackends.
	Backends func(ctx context.Context) ([]v1alpha1.CacheBackend, error)
	// Changed reads the index for cb and reports whether what the status
	// would publish of it (participation, IndexSynced) differs from what
	// cb's status publishes.
	Changed func(ctx context.Context, cb *v1alpha1.CacheBackend) (bool, error)
	// Events receives the backends to reconcile.
	Events chan event.GenericEvent
}

// Start polls until ctx ends.
func (p *Poller) Start(ctx context.Context) error {
	period := p.Period
	if period <= 0 {
		period = DefaultPoll
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			p.Poll(ctx)
		}
	}
}

// Poll reads every observed, live backend once.
func (p *Poller) Poll(ctx context.Context) {
	backends, err := p.Backends(ctx)
	if err != nil {
		log.FromContext(ctx).Error(err, "listing CacheBackends for the index poll")
		return
	}
	for i := range backends {
		cb := &backends[i]
		if cb.Spec.Observation == nil || !cb.DeletionTimestamp.IsZero() {
			continue
		}
		changed, err := p.Changed(ctx, cb)
		if err != nil {
			log.FromContext(ctx).Error(err, "reading the index for the poll", "cachebackend", client.ObjectKeyFromObject(cb))
			continue
		}
		if !changed {
			continue
		}
		select {
		case p.Events <- event.GenericEvent{Object: cb}:
		case <-ctx.Done():
			return
		}
	}
}
