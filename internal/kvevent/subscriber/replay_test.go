package subscriber

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/inferencecache/operator/internal/kvevent/wire/wiretest"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
)

// TestStaleReplayEnds: a replay peer that answers with batches the rank
// already applied, again and again, no longer holds the rank in its
// replay (issue 25: each stale batch re-armed the idle timer, so the
// replay never ended and the live stream waited behind it). Only a batch
// that applies pushes the idle deadline back; the stale ones are counted
// as dropped.
func TestStaleReplayEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router, endpoint := replayPeer(ctx, t)
	sent := make(chan int, 1)
	go func() {
		req, err := router.Recv()
		if err != nil {
			sent <- 0
			return
		}
		var seq [8]byte
		binary.BigEndian.PutUint64(seq[:], 3) // below the rank's next: stale
		n := 0
		for ctx.Err() == nil {
			if router.Send(zmq4.NewMsgFrom(req.Frames[0], []byte{}, seq[:], []byte{0x90})) != nil {
				break
			}
			n++
			time.Sleep(5 * time.Millisecond)
		}
		sent <- n
	}()

	m := NewMetrics(prometheus.NewRegistry())
	r := NewRank(Config{Rank: 0, Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: endpoint, ReplayIdle: 300 * time.Millisecond}, logr.Discard(), m, make(chan *Delta, 1))
	r.trk.Applied(9) // batches up to 9 applied: the peer's 3 is stale

	done, progressed, expired, err := r.replayOnce(ctx, 10)
	if err != nil {
		t.Fatalf("the replay ended with %v; want it to end on its own, idle, before the test's deadline", err)
	}
	if done || progressed || expired {
		t.Errorf("replay of stale batches: done %v, progressed %v, expired %v; want none", done, progressed, expired)
	}
	stale := testutil.ToFloat64(m.Dropped.WithLabelValues("stale"))
	cancel()
	n := <-sent
	t.Logf("the peer sent %d stale batches; %v counted as dropped", n, stale)
	if stale < 10 {
		t.Errorf("%v stale batches counted; want the peer's stream (at least 10) read and dropped", stale)
	}
}

// TestReplayEndsLiveWithoutItsMessage: a gap replayed in full leaves the
// rank Live with no message. Before, the batch the replay applied set the
// rank Live with the replay's "replaying batches 0 to 0" kept, the end of
// the replay cleared the message only of a rank still Replaying, and a
// Live pod showed that message in the CacheBackend's status for good
// (seen as a status write in test/kvstatus's event-rate jitter case).
func TestReplayEndsLiveWithoutItsMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router, endpoint := replayPeer(ctx, t)
	f := wiretest.Format{Engine: wiretest.VLLM, Gen: wiretest.GenSpec, MapEvents: true}
	payload := f.EncodeBatch(wiretest.Batch{TS: 1, Events: []any{wiretest.Stored{Hashes: []any{uint64(7)}, BlockSize: 16, Medium: "GPU"}}})
	go func() {
		req, err := router.Recv()
		if err != nil {
			return
		}
		var seq [8]byte // batch 0, then the end marker
		_ = router.Send(zmq4.NewMsgFrom(req.Frames[0], []byte{}, seq[:], payload))
		_ = router.Send(zmq4.NewMsgFrom(req.Frames[0], []byte{}, endSeq, []byte{}))
	}()
	m := NewMetrics(prometheus.NewRegistry())
	r := NewRank(Config{Rank: 0, Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: endpoint, ReplayIdle: 5 * time.Second, ReplayAttempts: 1},
		logr.Discard(), m, make(chan *Delta, 4))
	r.replay(ctx, 0, 0)
	r.mu.Lock()
	state, msg := r.health.State, r.health.Message
	r.mu.Unlock()
	if testutil.ToFloat64(m.Replays.WithLabelValues("0", "ok")) != 1 {
		t.Fatalf("the replay did not end ok: %v", testutil.ToFloat64(m.Replays.WithLabelValues("0", "ok")))
	}
	if state != pb.PodState_POD_STATE_LIVE || msg != "" {
		t.Errorf("after the replay: %v %q, want Live and no message", state, msg)
	}
}

// replayPeer is a ROUTER listening on a free loopback port, the engine's
// replay socket for a test; it closes with the test.
func replayPeer(ctx context.Context, t *testing.T) (zmq4.Socket, string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("tcp://%s", l.Addr())
	_ = l.Close()
	router := zmq4.NewRouter(ctx)
	t.Cleanup(func() { _ = router.Close() })
	if err := router.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	return router, endpoint
}
