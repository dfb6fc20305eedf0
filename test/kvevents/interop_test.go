// Package kvevents_test runs the kvevent-subscriber binary against the
// reference ZeroMQ implementation: a libzmq PUB + ROUTER publisher in
// vLLM's wire format (publisher.py on Debian's python3-zmq and
// python3-msgpack), and an index that receives its gRPC stream.
package kvevents_test

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

// prompt returns n blocks of 4 tokens unique to id.
func prompt(id, blocks int) []int {
	toks := make([]int, 4*blocks)
	for i := range toks {
		toks[i] = id*1000 + i
	}
	return toks
}

// metrics scrapes the subscriber's counters: name{labels} -> value.
func metrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil
	}
	defer func() { _ = resp.Body.Close() }()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, "inferencecache_kvevents_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[strings.TrimPrefix(line[:i], "inferencecache_kvevents_")] = v
		}
	}
	return out
}

// index is the KV-block index under test, seen through what it answers
// for the test pod's rank 0 (GPU tier, base model).
type index interface {
	holds(h uint64) (bool, error)
	count() (int, error)     // distinct blocks held
	snapshots() (int, error) // snapshots applied since the index started
	state() (pb.PodState, error)
	stop()
}

// diff says how the index differs from want (the blocks it must hold,
// exactly) and lost (blocks it must not hold); "" when it does not.
func diff(ix index, want, lost map[uint64]bool) string {
	var missing, extra []string
	for h := range want {
		ok, err := ix.holds(h)
		if err != nil {
			return err.Error()
		}
		if !ok {
			missing = append(missing, fmt.Sprintf("%x", h))
		}
	}
	for h := range lost {
		ok, err := ix.holds(h)
		if err != nil {
			return err.Error()
		}
		if ok {
			extra = append(extra, fmt.Sprintf("%x", h))
		}
	}
	n, err := ix.count()
	if err != nil {
		return err.Error()
	}
	if len(missing)+len(extra) == 0 && n == len(want) {
		return ""
	}
	sort.Strings(missing)
	sort.Strings(extra)
	return fmt.Sprintf("index holds %d blocks, want %d; lacks %v; holds lost blocks %v", n, len(want), missing, extra)
}

// eventually waits for cond, nudging the engine with fresh requests (as
// traffic would) so a live batch reveals any gap.
var onFail func()

func eventually(t *testing.T, what string, logs string, nudge func(), cond func() string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	last := ""
	for i := 0; time.Now().Before(deadline); i++ {
		if last = cond(); last == "" {
			return
		}
		if nudge != nil && i > 0 && i%20 == 0 {
			nudge()
		}
		time.Sleep(100 * time.Millisecond)
	}
	if onFail != nil {
		onFail()
	}
	b, _ := os.ReadFile(logs)
	if len(b) > 60000 {
		b = b[len(b)-60000:]
	}
	t.Fatalf("%s: %s\nsubscriber log tail:\n%s", what, last, b)
}

// TestInteroperability runs the scenario with the cache-index binary as
// the index, against both generations of vLLM's publisher: tagged-map
// events with topic-carrying replay replies (vLLM ≥ mid-2026), and
// tagged-array events with the legacy [seq, payload] replies.
func TestInteroperability(t *testing.T) {
	for _, tc := range []struct {
		name, events, gen, replay string
		abstract                  bool
	}{
		{"map events, replies with topic", "map", "spec", "new", false},
		{"array events, legacy replies", "array", "group", "legacy", false},
		// The webhook's endpoints with data-parallel size 1
		// (inject.KVEventsPubIPC): abstract-namespace ipc://@ sockets,
		// libzmq binding, go-zeromq connecting.
		{"abstract ipc sockets, as the webhook wires them", "map", "newest", "new", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoints, coreOnly = tcpEndpoints, false
			if tc.abstract {
				// The transport only: late join, live events and a
				// replay; the rest of the scenario is transport-blind.
				endpoints, coreOnly = abstractEndpoints, true
			}
			interop(t, startCacheIndex, "buffer_steps=8", "block_size=4", "topic=kv", "events="+tc.events, "gen="+tc.gen, "replay="+tc.replay)
		})
	}
	endpoints, coreOnly = tcpEndpoints, false
}

// endpoints are the publisher's PUB and replay endpoints for interop;
// coreOnly stops the scenario after the first replayed gap.
var (
	endpoints = tcpEndpoints
	coreOnly  bool
)

func tcpEndpoints(t *testing.T) (string, string) {
	return fmt.Sprintf("tcp://127.0.0.1:%d", freeport.MustTake(t)), fmt.Sprintf("tcp://127.0.0.1:%d", freeport.MustTake(t))
}

// abstractEndpoints are Linux abstract-namespace Unix sockets, unique to
// this process.
func abstractEndpoints(*testing.T) (string, string) {
	return fmt.Sprintf("ipc://@interop-%d-pub", os.Getpid()), fmt.Sprintf("ipc://@interop-%d-replay", os.Getpid())
}

// TestInteroperabilityContract runs the scenario against an index written
// from the contract alone (recordingIndex), so a failure here and not above
// points at the index service, and the other way round.
func TestInteroperabilityContract(t *testing.T) {
	interop(t, startRecordingIndex, "buffer_steps=8", "block_size=4", "topic=kv", "events=map", "gen=newest", "replay=new")
}

func interop(t *testing.T, newIndex func(*testing.T, string) index, pubOpts ...string) {
	dir := t.TempDir()
	_, bin := binaries(t)

	pubEP, routerEP := endpoints(t)
	indexAddr := fmt.Sprintf("127.0.0.1:%d", freeport.MustTake(t))
	ix := newIndex(t, indexAddr)
	defer func() { ix.stop() }()
	// A replay ring of 8 batches, like vLLM's buffer_steps.
	pub := fixture.StartPublisher(t, pubEP, routerEP, pubOpts...)
	parent := t // processes that outlive a subtest

	// Late join: the engine served requests before the subscriber started.
	base := prompt(1, 3)
	pub.Store(base, false)
	pub.Store(append(append([]int{}, base...), prompt(2, 2)...), false) // continues the first prompt
	pub.Store(prompt(3, 2), false)

	logs := filepath.Join(dir, "subscriber.log")
	logf, err := os.Create(logs)
	if err != nil {
		t.Fatal(err)
	}
	sub := exec.Command(bin, "--endpoint", pubEP, "--replay-endpoint", routerEP, "--topic", "kv", "--index", indexAddr,
		"--http-bind-address", "127.0.0.1:0", "--block-size", "4", "--model", "m", "--cachebackend", "ns/cb",
		"--pod-name", "engine-0", "--pod-namespace", "ns", "--pod-uid", "uid-0", "--replay-idle-timeout", "500ms", "--zap-devel")
	sub.Stdout, sub.Stderr = logf, logf
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Process.Kill(); _ = sub.Wait() }()
	onFail = func() { _ = sub.Process.Signal(syscall.SIGQUIT); time.Sleep(time.Second) }
	// The subscriber binds its HTTP port itself (no port race with other
	// processes on the machine) and logs it.
	var httpAddr string
	for i := 0; httpAddr == ""; i++ {
		b, _ := os.ReadFile(logs)
		if m := regexp.MustCompile(`"http": "(127\.0\.0\.1:\d+)"`).FindSubmatch(b); m != nil {
			httpAddr = string(m[1])
		} else if i == 300 {
			t.Fatalf("the subscriber did not start:\n%s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}

	next := 100
	nudge := func() { next++; pub.Store(prompt(next, 1), false) }
	equal := func(ix index) func() string {
		return func() string { return diff(ix, pub.Held(), nil) }
	}
	counter := func(name string) float64 { return metrics(t, httpAddr)[name] }
	// settles waits for cond: a counter moves just after the state it
	// explains is visible.
	settles := func(t *testing.T, what string, cond func() bool) {
		t.Helper()
		eventually(t, what, logs, nil, func() string {
			if cond() {
				return ""
			}
			return fmt.Sprint(metrics(t, httpAddr))
		})
	}

	eventually(t, "late join: the index holds what the engine cached before the subscriber started", logs, nudge, equal(ix))
	settles(t, "late join recovered by a replay", func() bool {
		return counter(`replay_requests_total{rank="0",result="ok"}`) >= 1 && counter(`sequence_gaps_total{rank="0"}`) >= 1
	})
	settles(t, "hashes verified from the token IDs", func() bool {
		return counter(`hash_verify_total{result="Verified"}`) >= 1 && counter(`hash_verify_total{result="Mismatch"}`) == 0
	})

	t.Run("gap recovered by replay", func(t *testing.T) {
		okBefore := counter(`replay_requests_total{rank="0",result="ok"}`)
		pub.Store(prompt(4, 2), true) // lost on the PUB socket, kept in the ring
		pub.Do(map[string]any{"op": "evict", "n": 1, "drop": true})
		pub.Store(prompt(5, 1), false)
		eventually(t, "gap", logs, nudge, equal(ix))
		settles(t, "a replay recovered the gap", func() bool { return counter(`replay_requests_total{rank="0",result="ok"}`) > okBefore })
	})

	if coreOnly {
		return
	}
	t.Run("publisher restart is a new epoch", func(t *testing.T) {
		epochs := counter(`epoch_resets_total{rank="0"}`)
		// The engine process exits and a new one binds the same endpoints:
		// its sequence starts again at 0 and its cache is empty.
		pub.Stop()
		pub = fixture.StartPublisher(parent, pubEP, routerEP, pubOpts...)
		pub.Store(prompt(6, 2), false)
		pub.Store(prompt(7, 1), false)
		eventually(t, "restart", logs, nudge, equal(ix))
		settles(t, "a new epoch", func() bool { return counter(`epoch_resets_total{rank="0"}`) > epochs })
	})

	t.Run("replay window exceeded resyncs the index from the mirror", func(t *testing.T) {
		snaps, err := ix.snapshots()
		if err != nil {
			t.Fatal(err)
		}
		before := pub.Held()
		pub.Store(prompt(8, 2), true) // these two batches fall out of the 8-batch ring
		pub.Store(prompt(9, 1), true)
		lostBlocks := map[uint64]bool{}
		for h := range pub.Held() {
			if !before[h] {
				lostBlocks[h] = true
			}
		}
		// Seven more lost batches and a live one fill the ring of 8: the
		// two stores above are gone from it.
		for i := 0; i < 7; i++ {
			pub.Store(prompt(10+i, 1), true)
		}
		pub.Store(prompt(20, 1), false)
		// The subscriber cannot know the lost blocks: the index holds the
		// engine's blocks less those, sent as a snapshot of a new epoch, and
		// the pod is Unsynced (not scored: it may also keep blocks the lost
		// batches evicted) until the mirror is exact again.
		eventually(t, "window exceeded", logs, nil, func() string {
			want := pub.Held()
			for h := range lostBlocks {
				delete(want, h)
			}
			if st, err := ix.state(); err != nil || st != pb.PodState_POD_STATE_UNSYNCED {
				return fmt.Sprintf("pod state %v (%v), want Unsynced", st, err)
			}
			for h := range lostBlocks {
				if ok, err := ix.holds(h); err != nil || ok {
					return fmt.Sprintf("index holds lost block %x (%v)", h, err)
				}
			}
			return ""
		})
		eventually(t, "window exceeded: the index holds the mirror", logs, nil, func() string {
			want := pub.Held()
			for h := range lostBlocks {
				delete(want, h)
			}
			if n, err := ix.count(); err != nil || n != len(want) {
				return fmt.Sprintf("index holds %d blocks (%v), want %d", n, err, len(want))
			}
			return ""
		})
		settles(t, "replay reported expired", func() bool { return counter(`replay_requests_total{rank="0",result="expired"}`) >= 1 })
		settles(t, "a snapshot after the replay window was exceeded", func() bool { s, _ := ix.snapshots(); return s > snaps })
		// A reset of the prefix cache makes the mirror exact again.
		pub.Do(map[string]any{"op": "clear"})
		pub.Store(prompt(21, 2), false)
		eventually(t, "after clear", logs, nudge, equal(ix))
		settles(t, "the pod Live again after the clear", func() bool { st, _ := ix.state(); return st == pb.PodState_POD_STATE_LIVE })
	})

	t.Run("index restarted mid-stream", func(t *testing.T) {
		ix.stop()
		pub.Store(prompt(30, 2), false) // journaled while the index is down
		pub.Do(map[string]any{"op": "evict", "n": 2})
		ix = newIndex(parent, indexAddr)
		pub.Store(prompt(31, 1), false)
		eventually(t, "index restart", logs, nudge, equal(ix))
		settles(t, "a snapshot sent to the restarted index", func() bool { s, _ := ix.snapshots(); return s >= 1 })
	})

	// The final index state equals, block for block, what the engine holds.
	pub.Store(prompt(40, 3), false)
	pub.Do(map[string]any{"op": "evict", "n": 1})
	eventually(t, "final state", logs, nudge, equal(ix))
	held := pub.Held()
	if len(held) == 0 {
		t.Fatal("the publisher holds nothing; the comparison proves nothing")
	}
	t.Logf("final: %d blocks equal; subscriber metrics %v", len(held), metrics(t, httpAddr))
}
