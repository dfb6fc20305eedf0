package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/inferencecache/operator/internal/kvindex"
	"github.com/inferencecache/operator/internal/kvindex/redisstore"
	"github.com/inferencecache/operator/internal/kvindex/storetest"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// With Options.WaitReplicas the store's contract holds on a cluster whose
// masters each have a replica (every script sent with WAIT on its own
// connection, the scripts loaded there on first use); a change whose
// writes a master cannot replicate in time fails with ErrNotReplicated and
// moves nothing, and its resend applies once the replica is back.
func TestWaitReplicas(t *testing.T) {
	c := redisserver.StartClusterWithReplicas(t, 3, 5000)
	var masters []string
	for _, m := range c.Masters {
		masters = append(masters, m.Addr)
	}
	wait := redisstore.Options{WaitReplicas: 1}
	t.Run("contract", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) kvindex.Store { return newClusterStore(t, masters, wait) })
	})

	t.Run("a replica that does not answer", func(t *testing.T) {
		ctx := context.Background()
		s := newClusterStore(t, masters, redisstore.Options{WaitReplicas: 1})
		src := storetest.Src("p", 0)
		pod := kvindex.PodKey{Backend: storetest.BackendA, UID: "p"}
		hashes := storetest.Chain(1, 300) // placements on every master
		if o, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: 1, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, hashes[:100]...)}}); err != nil || o != kvindex.Applied {
			t.Fatalf("sequence 1: %s, %v", o, err)
		}
		if err := c.Replicas[1].Stop(); err != nil {
			t.Fatal(err)
		}
		d := kvindex.Delta{Epoch: 1, Sequence: 2, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, hashes[100:]...)}}
		_, _, err := s.Apply(ctx, src, d)
		if contErr := c.Replicas[1].Continue(); contErr != nil {
			t.Fatal(contErr)
		}
		if !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Fatalf("a change with master 1's replica frozen: %v, want ErrNotReplicated", err)
		}
		t.Logf("with master 1's replica frozen: %v", err)
		if ps, _ := s.Positions(ctx, pod); ps[0].Sequence > 2 {
			t.Fatalf("position %+v", ps[0])
		}
		// The resend, as the subscriber sends it, applies once.
		var o kvindex.Outcome
		for range 50 {
			if o, _, err = s.Apply(ctx, src, d); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil || (o != kvindex.Applied && o != kvindex.Duplicate) {
			t.Fatalf("resend after the replica is back: %s, %v", o, err)
		}
		if ms, _ := s.Score(ctx, storetest.BackendA, storetest.Space, hashes); len(ms) != 1 || ms[0].GPU != 300 {
			t.Fatalf("after the resend: %+v, want the pod's 300 GPU blocks", ms)
		}
	})

	t.Run("one server and its replica (as behind a Sentinel)", func(t *testing.T) {
		ctx := context.Background()
		master := redisserver.Start(t)
		replica := redisserver.StartReplica(t, master)
		rdb := redis.NewClient(&redis.Options{Addr: master})
		s := redisstore.NewWithOptions(rdb, redisstore.Options{WaitReplicas: 1})
		t.Cleanup(func() { _ = s.Close() })
		src := storetest.Src("p", 0)
		apply := func(seq uint64) error {
			_, _, err := s.Apply(ctx, src, kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, seq)}})
			return err
		}
		if err := apply(1); err != nil {
			t.Fatalf("with the replica online: %v", err)
		}
		if err := replica.Stop(); err != nil {
			t.Fatal(err)
		}
		err := apply(2)
		if contErr := replica.Continue(); contErr != nil {
			t.Fatal(contErr)
		}
		if !errors.Is(err, redisstore.ErrNotReplicated) {
			t.Fatalf("with the replica stopped: %v, want ErrNotReplicated", err)
		}
		if err := apply(2); err != nil {
			t.Fatalf("the resend with the replica back: %v", err)
		}
		// What the replica holds is what was acked.
		if ms, _ := redisstore.NewWithOptions(redis.NewClient(&redis.Options{Addr: replica.Addr}), redisstore.Options{}).Score(ctx, storetest.BackendA, storetest.Space, []uint64{1}); len(ms) != 1 {
			t.Fatalf("the replica scores %+v for the first delta's block", ms)
		}
	})

	t.Run("a master without a replica acks alone", func(t *testing.T) {
		// As a replica promoted after its master's crash does: there is
		// nothing to wait for, and it sends no WAIT (which would block for
		// the whole timeout on every write).
		addr := redisserver.Start(t)
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		s := redisstore.NewWithOptions(rdb, redisstore.Options{WaitReplicas: 1})
		t.Cleanup(func() { _ = s.Close() })
		for seq := uint64(1); seq <= 3; seq++ {
			if o, _, err := s.Apply(context.Background(), storetest.Src("p", 0), kvindex.Delta{Epoch: 1, Sequence: seq, Ops: []kvindex.Op{storetest.Store(kvindex.TierGPU, seq)}}); err != nil || o != kvindex.Applied {
				t.Fatalf("delta %d with WaitReplicas 1 on a master with no replica: %s, %v, want applied", seq, o, err)
			}
		}
		admin := redis.NewClient(&redis.Options{Addr: addr})
		defer admin.Close()
		stats, err := admin.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stats, "cmdstat_role:") || strings.Contains(stats, "cmdstat_wait:") {
			t.Fatalf("commands the store sent: ROLE with each write and no WAIT wanted:\n%s", stats)
		}
	})
}
