package controller

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/topology"
)

// ProbeResults counts functional probes by result.
var ProbeResults = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "inferencecache_functional_probes_total",
	Help: "Functional probes of cache servers (LMCache's HEALTH request to the Service, answered with code 200), by result (success, failure).",
}, []string{"result"})

func init() { metrics.Registry.MustRegister(ProbeResults) }

// Prober checks that a cache server answers before a backend is Ready: it
// sends LMCache's HEALTH request to the Service (lmcacheproto.Health) and
// requires a full reply with code 200 within Timeout, at most once per
// Interval per backend; a port that accepts connections and says nothing
// fails. Its per-backend slot holds the last result; every path on which
// a backend leaves the ready state clears the slot (Forget), so that coming
// back always probes afresh instead of trusting a stale success.
type Prober struct {
	// Dial opens the connection; tests point it at a local listener.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Interval between two probes of one backend.
	Interval time.Duration
	// Timeout of one probe: the dial and the HEALTH exchange.
	Timeout time.Duration
	// ClusterDomain is the DNS domain of the probed Service's fully
	// qualified name (topology.Host); empty is cluster.local.
	ClusterDomain string

	mu    sync.Mutex
	slots map[types.NamespacedName]probeSlot
}

type probeSlot struct {
	uid types.UID
	at  time.Time
	err error
}

// NewProber returns a Prober that dials with net.Dialer.
func NewProber(interval time.Duration) *Prober {
	d := &net.Dialer{}
	return &Prober{Dial: d.DialContext, Interval: interval, Timeout: 3 * time.Second}
}

// Check returns the probe result for cb: the slot's while it is younger than
// Interval, a fresh probe otherwise. The bool is true when it probed now.
func (p *Prober) Check(ctx context.Context, cb *v1alpha1.CacheBackend) (error, bool) {
	key := types.NamespacedName{Namespace: cb.Namespace, Name: cb.Name}
	p.mu.Lock()
	if s, ok := p.slots[key]; ok && s.uid == cb.UID && time.Since(s.at) < p.Interval {
		p.mu.Unlock()
		return s.err, false
	}
	p.mu.Unlock()

	addr := net.JoinHostPort(topology.Host(cb, p.ClusterDomain), strconv.Itoa(int(topology.Port(cb))))
	dctx, cancel := context.WithTimeout(ctx, p.Timeout)
	defer cancel()
	err := probe(dctx, p.Dial, addr)
	if err == nil {
		ProbeResults.WithLabelValues("success").Inc()
	} else {
		ProbeResults.WithLabelValues("failure").Inc()
	}
	p.mu.Lock()
	if p.slots == nil {
		p.slots = map[types.NamespacedName]probeSlot{}
	}
	p.slots[key] = probeSlot{uid: cb.UID, at: time.Now(), err: err}
	p.mu.Unlock()
	return err, true
}

// probe dials addr and sends LMCache's HEALTH request on the connection.
func probe(ctx context.Context, dial func(ctx context.Context, network, address string) (net.Conn, error), addr string) error {
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("cache server at %s does not accept connections: %w", addr, err)
	}
	defer func() { _ = conn.Close() }()
	if err := lmcacheproto.Health(ctx, conn); err != nil {
		return fmt.Errorf("cache server at %s does not answer LMCache's HEALTH request: %w", addr, err)
	}
	return nil
}

// Forget clears the slot of the backend key.
func (p *Prober) Forget(key types.NamespacedName) {
	p.mu.Lock()
	delete(p.slots, key)
	p.mu.Unlock()
}

// HasSlot reports whether a result is held for the backend key.
func (p *Prober) HasSlot(key types.NamespacedName) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.slots[key]
	return ok
}
