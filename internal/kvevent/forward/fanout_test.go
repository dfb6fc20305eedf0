package forward_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/inferencecache/operator/internal/kvevent/forward"
	"github.com/inferencecache/operator/internal/kvevent/subscriber"
	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/memstore"
	"github.com/inferencecache/operator/internal/kvindex/server"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TestDiff: the forwarders to start and stop when the index's name
// resolves to another set of replica addresses.
func TestDiff(t *testing.T) {
	for _, tc := range []struct {
		name              string
		have, want        []string
		wantStart, wantOp []string
	}{
		{name: "first resolution starts every replica", want: []string{"10.0.0.2:9400", "10.0.0.1:9400"},
			wantStart: []string{"10.0.0.1:9400", "10.0.0.2:9400"}},
		{name: "one address, as a ClusterIP or host:port", want: []string{"10.96.0.10:9400"}, wantStart: []string{"10.96.0.10:9400"}},
		{name: "unchanged set, in another order", have: []string{"10.0.0.1:9400", "10.0.0.2:9400"}, want: []string{"10.0.0.2:9400", "10.0.0.1:9400"}},
		{name: "a replica appears", have: []string{"10.0.0.1:9400"}, want: []string{"10.0.0.1:9400", "10.0.0.3:9400"},
			wantStart: []string{"10.0.0.3:9400"}},
		{name: "a replica disappears", have: []string{"10.0.0.1:9400", "10.0.0.2:9400"}, want: []string{"10.0.0.2:9400"},
			wantOp: []string{"10.0.0.1:9400"}},
		{name: "a replica is replaced (new pod IP)", have: []string{"10.0.0.1:9400", "10.0.0.2:9400"}, want: []string{"10.0.0.1:9400", "10.0.0.4:9400"},
			wantStart: []string{"10.0.0.4:9400"}, wantOp: []string{"10.0.0.2:9400"}},
		{name: "nothing resolved keeps every forwarder", have: []string{"10.0.0.1:9400", "10.0.0.2:9400"}},
		{name: "duplicates start once", want: []string{"10.0.0.1:9400", "10.0.0.1:9400"}, wantStart: []string{"10.0.0.1:9400"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, stop := forward.Diff(tc.have, tc.want)
			assert.Equal(t, tc.wantStart, start, "start")
			assert.Equal(t, tc.wantOp, stop, "stop")
		})
	}
}

// TestAddresses: one address per replica, in one family.
func TestAddresses(t *testing.T) {
	ip := func(s ...string) []net.IP {
		var out []net.IP
		for _, x := range s {
			out = append(out, net.ParseIP(x))
		}
		return out
	}
	for _, tc := range []struct {
		name string
		ips  []net.IP
		want []string
	}{
		{name: "IPv4 replicas", ips: ip("10.0.0.1", "10.0.0.2"), want: []string{"10.0.0.1:9400", "10.0.0.2:9400"}},
		{name: "dual stack: each replica once, by IPv4", ips: ip("10.0.0.1", "fd00::1", "10.0.0.2", "fd00::2"), want: []string{"10.0.0.1:9400", "10.0.0.2:9400"}},
		{name: "localhost is one index, not two", ips: ip("::1", "127.0.0.1"), want: []string{"127.0.0.1:9400"}},
		{name: "IPv6 only", ips: ip("fd00::1", "fd00::2"), want: []string{"[fd00::1]:9400", "[fd00::2]:9400"}},
		{name: "IPv4-mapped IPv6 counts as IPv4", ips: ip("::ffff:10.0.0.1"), want: []string{"10.0.0.1:9400"}},
		{name: "nothing", ips: nil, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, forward.Addresses(tc.ips, "9400"))
		})
	}
}

// TestLookupResolver: an IP literal is used as it is; localhost resolves
// to one address.
func TestLookupResolver(t *testing.T) {
	got, err := forward.LookupResolver(context.Background(), "10.1.2.3:9400")
	require.NoError(t, err)
	assert.Equal(t, []string{"10.1.2.3:9400"}, got)
	got, err = forward.LookupResolver(context.Background(), "localhost:9400")
	require.NoError(t, err)
	assert.Len(t, got, 1)
	_, err = forward.LookupResolver(context.Background(), "no-port")
	assert.Error(t, err)
}

// replica is one in-process index (in-memory store) on a loopback address.
type replica struct {
	ix   *kvindex.Index
	addr string
	stop func()
}

func startReplica(t *testing.T, addr string) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	ix := kvindex.New(kvindex.Options{Store: memstore.New(), Heartbeat: time.Hour})
	s := grpc.NewServer()
	server.RegisterGRPC(s, ix)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return &replica{ix: ix, addr: ln.Addr().String(), stop: s.Stop}
}

// pos is the pod's block count and last applied sequence in the replica's
// participation; blocks -1 if the replica does not know the pod.
func (r *replica) pos(t *testing.T) (blocks int64, seq uint64) {
	t.Helper()
	sum, err := r.ix.Participation(context.Background(), kvindex.Caller{Username: "anonymous", Anonymous: true},
		&pb.ParticipationRequest{CacheBackend: &pb.CacheBackendRef{Namespace: "team", Name: "cache"}, MaxPods: 10})
	require.NoError(t, err)
	for _, p := range sum.PodList {
		if p.Uid == "uid-1" {
			return int64(p.Blocks), p.LastSequence
		}
	}
	return -1, 0
}

// at: the replica holds the pod's snapshot block and applied up to seq.
func (r *replica) at(t *testing.T, seq uint64) bool {
	b, s := r.pos(t)
	return b > 0 && s == seq
}

// addrs is the fake resolver's answer, changed by the test.
type addrs struct {
	mu  sync.Mutex
	set []string
}

func (a *addrs) put(s ...string) { a.mu.Lock(); a.set = s; a.mu.Unlock() }
func (a *addrs) resolve(_ context.Context, target string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if target != "inferencecache-index-peers.inferencecache-system.svc.cluster.local:9400" {
		return nil, &net.DNSError{Err: "no such host", Name: target}
	}
	return slices.Clone(a.set), nil
}

type gauge struct {
	mu sync.Mutex
	n  int
}

func (g *gauge) set(n int) { g.mu.Lock(); g.n = n; g.mu.Unlock() }
func (g *gauge) get() int  { g.mu.Lock(); defer g.mu.Unlock(); return g.n }

// TestFanoutEveryReplicaHoldsThePod: one subscriber's pod is visible in
// every index replica its name resolves to; a replica that appears later
// is sent the pod whole without waiting for the engine; a replica restarted
// empty is refilled; a replica that disappears loses its forwarder.
func TestFanoutEveryReplicaHoldsThePod(t *testing.T) {
	a := startReplica(t, "127.0.0.1:0")
	b := startReplica(t, "127.0.0.2:0")
	res := &addrs{}
	res.put(a.addr, b.addr)
	src := &source{epoch: 1}
	in := make(chan *pb.Delta, 16)
	targets, connected := &gauge{}, &gauge{}
	fo := forward.NewFanout(forward.FanoutConfig{
		Forwarder: forward.Config{Target: "inferencecache-index-peers.inferencecache-system.svc.cluster.local:9400", Backoff: 20 * time.Millisecond,
			Hello: &pb.Hello{ProtocolVersion: 1, Pod: &pb.PodIdentity{Namespace: "team", Name: "engine-0", Uid: "uid-1"},
				CacheBackend: &pb.CacheBackendRef{Namespace: "team", Name: "cache"}, Model: "m", Engine: "vllm", DataParallelSize: 1,
				HashScheme: &pb.HashScheme{Algorithm: "sha256_cbor", Seed: "vllm-none-hash", BlockSize: 16}}},
		Resolve: res.resolve, Interval: 20 * time.Millisecond, MinInterval: time.Millisecond,
	}, logr.Discard(), forward.FanoutMetrics{Targets: targets.set, ConnectedReplicas: connected.set}, in, map[uint32]forward.Source{0: src})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = fo.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, "two connected replicas", func() bool { return targets.get() == 2 && connected.get() == 2 })
	// One delta: each forwarder sends the rank's snapshot (block 7 at
	// sequence 0) and the delta to its own replica.
	in <- delta(1, 1)
	waitFor(t, "the pod in both replicas at delta 1", func() bool { return a.at(t, 1) && b.at(t, 1) })

	// A third replica appears after the stream started: it gets the rank
	// as a snapshot at the source's position, with no new delta.
	src.mu.Lock()
	src.seq = 1
	src.mu.Unlock()
	c := startReplica(t, "127.0.0.3:0")
	res.put(a.addr, b.addr, c.addr)
	waitFor(t, "the snapshot in the new replica", func() bool { return c.at(t, 1) })
	assert.Equal(t, 3, targets.get())

	// Replica b restarts empty on its address: the forwarder reconnects,
	// the index asks for the rank it does not know, and the snapshot refills it.
	b.stop()
	b2 := startReplica(t, b.addr)
	blocks, _ := b2.pos(t)
	require.Equal(t, int64(-1), blocks, "restarted empty")
	waitFor(t, "the restarted replica refilled", func() bool { return b2.at(t, 1) })

	// Replica a leaves the set: its forwarder stops, the others go on.
	res.put(b.addr, c.addr)
	waitFor(t, "two targets", func() bool { return targets.get() == 2 && connected.get() == 2 })
	in <- delta(1, 2)
	waitFor(t, "delta 2 in the remaining replicas", func() bool { return b2.at(t, 2) && c.at(t, 2) })
	assert.True(t, a.at(t, 1), "the replica left behind got nothing more")
}

// TestFanoutFullReplicaQueue: a replica whose queue is full misses the
// delta alone; its forwarder resends the rank as a snapshot at the next
// one, and the other replica got every delta.
func TestFanoutFullReplicaQueue(t *testing.T) {
	f1 := &fakeIndex{}
	addr1, stop1 := serve(t, f1, "127.0.0.1:0")
	defer stop1()
	res := &addrs{}
	res.put(addr1)
	src := &gatedSource{source: &source{epoch: 1}, gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	in := make(chan *pb.Delta)
	var dropped []string
	var mu sync.Mutex
	fo := forward.NewFanout(forward.FanoutConfig{
		Forwarder: forward.Config{Target: "inferencecache-index-peers.inferencecache-system.svc.cluster.local:9400", Backoff: 20 * time.Millisecond,
			Hello: &pb.Hello{DataParallelSize: 1}},
		Resolve: res.resolve, Interval: time.Hour, QueueSize: 1,
	}, logr.Discard(), forward.FanoutMetrics{Dropped: func(a string) { mu.Lock(); dropped = append(dropped, a); mu.Unlock() }},
		in, map[uint32]forward.Source{0: src})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = fo.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// Unbuffered input: each send returns once the tee took the delta. The
	// forwarder takes delta 1 and waits on its snapshot; delta 2 fills the
	// queue of one; deltas 3 to 10 are dropped for this replica.
	waitFor(t, "connected", func() bool { h, _, _ := f1.state(); return h == 1 })
	in <- delta(1, 1)
	select {
	case <-src.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the forwarder never asked for the snapshot delta 1 needs")
	}
	for s := uint64(2); s <= 10; s++ {
		in <- delta(1, s)
	}
	// The tee counts a drop after it took the delta from the channel, so
	// the last one may still be on its way when the send returns.
	countDropped := func() int { mu.Lock(); defer mu.Unlock(); return len(dropped) }
	waitFor(t, "eight drops", func() bool { return countDropped() >= 8 })
	mu.Lock()
	assert.Equal(t, slices.Repeat([]string{addr1}, 8), dropped)
	mu.Unlock()
	// The first snapshot goes out at position 1 and covers delta 1; delta
	// 2 follows it; delta 11 reveals the gap and the rank is resent.
	src.mu.Lock()
	src.seq = 1
	src.mu.Unlock()
	close(src.gate)
	waitFor(t, "delta 2", func() bool { _, d, _ := f1.state(); return slices.Contains(d, 2) })
	src.mu.Lock()
	src.seq = 10
	src.mu.Unlock()
	in <- delta(1, 11)
	waitFor(t, "delta 11 after a snapshot", func() bool {
		_, d, _ := f1.state()
		return len(d) > 0 && d[len(d)-1] == 11
	})
	_, d, snaps := f1.state()
	assert.Equal(t, []uint64{2, 11}, d, "deltas 3 to 10 never reached the replica")
	assert.Equal(t, 2, snaps, "the first delta's snapshot and the resend after the drops")
}

// gatedSource answers snapshots once gate is closed.
type gatedSource struct {
	*source
	gate    chan struct{}
	entered chan struct{} // gets a value when a snapshot is asked for
}

func (g *gatedSource) Snapshot(ctx context.Context) (*subscriber.Snapshot, error) {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.source.Snapshot(ctx)
}
