package forward

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// Resolver turns the index's address (host:port) into the addresses of
// its replicas, each host:port.
type Resolver func(ctx context.Context, target string) ([]string, error)

// LookupResolver resolves target's host with the system resolver: a
// headless Service name yields one address per ready index replica, a
// ClusterIP Service name or an IP literal exactly one.
func LookupResolver(ctx context.Context, target string) ([]string, error) {
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return nil, fmt.Errorf("index address %q: %w", target, err)
	}
	if net.ParseIP(host) != nil {
		return []string{target}, nil
	}
	ips, err := net.DefaultResolver.LookupIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("resolve index address %q: %w", host, err)
	}
	return Addresses(ips, port), nil
}

// Addresses are host:port of the IPv4 addresses, or of the IPv6 ones when
// there is no IPv4 address. One family only: a dual-stack headless Service
// (or localhost) names each replica once per family, and two streams of
// one pod to one replica would replace each other there forever.
func Addresses(ips []net.IP, port string) []string {
	var v4, v6 []string
	for _, ip := range ips {
		if ip.To4() != nil {
			v4 = append(v4, net.JoinHostPort(ip.String(), port))
		} else {
			v6 = append(v6, net.JoinHostPort(ip.String(), port))
		}
	}
	if len(v4) > 0 {
		return v4
	}
	return v6
}

// FanoutConfig configures a Fanout.
type FanoutConfig struct {
	// Forwarder is the configuration of every per-replica forwarder; its
	// Target is the name the Resolver resolves.
	Forwarder Config
	// Resolve defaults to LookupResolver.
	Resolve Resolver
	// Interval between resolutions (default 20s); a forwarder whose
	// stream fails asks for an earlier one, at most every MinInterval
	// (default 2s).
	Interval    time.Duration
	MinInterval time.Duration
	// QueueSize bounds each replica's delta channel; a delta that does not
	// fit is dropped for that replica only, whose forwarder then resends
	// the rank as a snapshot.
	QueueSize int
}

// FanoutMetrics are the fan-out's own metrics (all optional); the
// forwarders' journal depth and connection state are summed over replicas.
type FanoutMetrics struct {
	Metrics
	// Targets is the number of replica addresses being forwarded to.
	Targets func(int)
	// Connected counts replicas with an open stream.
	ConnectedReplicas func(int)
	// Dropped counts deltas a full replica channel did not take.
	Dropped func(target string)
}

// Fanout forwards one subscriber's deltas to every replica of the index:
// one Forwarder per resolved address, each with its own journal and rank
// state, fed by a tee that never blocks.
type Fanout struct {
	cfg     FanoutConfig
	log     logr.Logger
	m       FanoutMetrics
	in      <-chan *pb.Delta
	sources map[uint32]Source

	members map[string]*member
	seen    bool // a delta went through: later replicas join with snapshots

	mu        sync.Mutex
	depth     map[string]int
	connected map[string]bool
	trigger   chan struct{}
}

type member struct {
	ch     chan *pb.Delta
	cancel context.CancelFunc
	done   chan struct{}
}

// NewFanout returns a fan-out reading deltas from in.
func NewFanout(cfg FanoutConfig, log logr.Logger, m FanoutMetrics, in <-chan *pb.Delta, sources map[uint32]Source) *Fanout {
	if cfg.Resolve == nil {
		cfg.Resolve = LookupResolver
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 20 * time.Second
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = 2 * time.Second
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 4096
	}
	if m.Targets == nil {
		m.Targets = func(int) {}
	}
	if m.ConnectedReplicas == nil {
		m.ConnectedReplicas = func(int) {}
	}
	if m.Dropped == nil {
		m.Dropped = func(string) {}
	}
	if m.JournalDepth == nil {
		m.JournalDepth = func(int) {}
	}
	return &Fanout{cfg: cfg, log: log, m: m, in: in, sources: sources, members: map[string]*member{},
		depth: map[string]int{}, connected: map[string]bool{}, trigger: make(chan struct{}, 1)}
}

// Diff is the change from the addresses forwarded to now (have) to the
// ones just resolved (want): the addresses to start and to stop, sorted.
// An empty want keeps everything: a replica set that resolves to nothing
// is a DNS hiccup or an index being replaced, and the forwarders keep
// journaling until it returns.
func Diff(have, want []string) (start, stop []string) {
	if len(want) == 0 {
		return nil, nil
	}
	for _, w := range want {
		if !slices.Contains(have, w) && !slices.Contains(start, w) {
			start = append(start, w)
		}
	}
	for _, h := range have {
		if !slices.Contains(want, h) {
			stop = append(stop, h)
		}
	}
	slices.Sort(start)
	slices.Sort(stop)
	return start, stop
}

// Run resolves, tees and supervises the forwarders until ctx ends.
func (f *Fanout) Run(ctx context.Context) error {
	resolved := make(chan []string, 1)
	go f.resolveLoop(ctx, resolved)
	defer func() {
		for addr := range f.members {
			f.stop(addr)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case want := <-resolved:
			start, stop := Diff(f.addresses(), want)
			for _, a := range stop {
				f.log.Info("index replica gone; stopping its forwarder", "target", a)
				f.stop(a)
			}
			for _, a := range start {
				f.log.Info("index replica found; forwarding to it", "target", a, "join", f.seen)
				f.start(ctx, a)
			}
			f.m.Targets(len(f.members))
		case d := <-f.in:
			f.seen = true
			for addr, mb := range f.members {
				select {
				case mb.ch <- d:
				default:
					f.m.Dropped(addr)
				}
			}
		}
	}
}

func (f *Fanout) addresses() []string {
	out := make([]string, 0, len(f.members))
	for a := range f.members {
		out = append(out, a)
	}
	return out
}

// resolveLoop resolves every Interval, and earlier when a forwarder's
// stream failed, sending each non-empty result to out.
func (f *Fanout) resolveLoop(ctx context.Context, out chan<- []string) {
	t := time.NewTimer(0)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.trigger:
			if time.Since(last) < f.cfg.MinInterval {
				continue
			}
			t.Stop()
		}
		last = time.Now()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		addrs, err := f.cfg.Resolve(rctx, f.cfg.Forwarder.Target)
		cancel()
		switch {
		case err != nil:
			f.log.Info("resolving the index failed; keeping the replicas known", "target", f.cfg.Forwarder.Target, "error", err.Error())
		case len(addrs) == 0:
			f.log.Info("the index resolved to no address; keeping the replicas known", "target", f.cfg.Forwarder.Target)
		default:
			select {
			case out <- addrs:
			case <-ctx.Done():
				return
			}
		}
		t.Reset(f.cfg.Interval)
	}
}

func (f *Fanout) start(ctx context.Context, addr string) {
	mctx, cancel := context.WithCancel(ctx)
	mb := &member{ch: make(chan *pb.Delta, f.cfg.QueueSize), cancel: cancel, done: make(chan struct{})}
	f.members[addr] = mb
	cfg := f.cfg.Forwarder
	cfg.Target = addr
	cfg.Join = f.seen
	cfg.Disconnected = func() {
		select {
		case f.trigger <- struct{}{}:
		default:
		}
	}
	m := Metrics{
		Snapshot:     f.m.Snapshot,
		JournalDepth: func(n int) { f.setDepth(addr, n, true) },
		Connected:    func(c bool) { f.setConnected(addr, c, true) },
	}
	fw := New(cfg, f.log.WithValues("target", addr), m, mb.ch, f.sources)
	go func() {
		defer close(mb.done)
		if err := fw.Run(mctx); err != nil {
			f.log.Error(err, "forwarder stopped", "target", addr)
		}
	}()
}

func (f *Fanout) stop(addr string) {
	mb := f.members[addr]
	if mb == nil {
		return
	}
	delete(f.members, addr)
	mb.cancel()
	<-mb.done
	f.setDepth(addr, 0, false)
	f.setConnected(addr, false, false)
}

func (f *Fanout) setDepth(addr string, n int, keep bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if keep {
		f.depth[addr] = n
	} else {
		delete(f.depth, addr)
	}
	total := 0
	for _, d := range f.depth {
		total += d
	}
	f.m.JournalDepth(total)
}

func (f *Fanout) setConnected(addr string, c, keep bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if keep && c {
		f.connected[addr] = true
	} else {
		delete(f.connected, addr)
	}
	f.m.ConnectedReplicas(len(f.connected))
	if f.m.Connected != nil {
		f.m.Connected(len(f.connected) > 0)
	}
}
