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
)

// TestStaleReplayEnds: a replay peer that answers with batches the rank
// already applied, again and again, no longer holds the rank in its
// replay (issue 25: each stale batch re-armed the idle timer, so the
// replay never ended and the live stream waited behind it). Only a batch
// that applies pushes the idle deadline back; the stale ones are counted
// as dropped.
func TestStaleReplayEnds(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("tcp://%s", l.Addr())
	_ = l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router := zmq4.NewRouter(ctx)
	defer func() { _ = router.Close() }()
	if err := router.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
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
