package kvstatus_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/netns"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// score asks the index's HTTP /v1/score, as the operator, how many leading
// blocks of tokens the pod holds in GPU.
func (s *stack) score(tokens []int) (uint32, error) {
	ids := make([]uint32, len(tokens))
	for i, v := range tokens {
		ids[i] = uint32(v)
	}
	body, err := protojson.Marshal(&pb.ScoreRequest{CacheBackend: &pb.CacheBackendRef{Namespace: s.key.Namespace, Name: s.key.Name},
		Model: modelID, TokenIds: ids})
	if err != nil {
		return 0, err
	}
	tok, err := os.ReadFile(s.readerToken)
	if err != nil {
		return 0, err
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+s.httpAddr+"/v1/score", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("score: %s: %s", resp.Status, b)
	}
	var r pb.ScoreResponse
	if err := protojson.Unmarshal(b, &r); err != nil {
		return 0, fmt.Errorf("score %s: %w", b, err)
	}
	for _, p := range r.GetPods() {
		if p.GetPodName() == s.pod.Name {
			return p.GetTiers().GetGpu(), nil
		}
	}
	return 0, nil
}

// TestIndexParticipationWithVLLMsPublisher is the happy path of
// TestIndexParticipationWithTheRealBinaries with vLLM 0.33's own
// ZmqEventPublisher, fed by vLLM's own BlockPool (test/kvevents/py), built
// from the --kv-events-config and --prefix-caching-hash-algo the webhook
// gave the admitted pod; it and the kvevent-subscriber (the sidecar's
// args and env) run in a network namespace of their own, the index's
// gRPC address forwarded into it. The pod is counted Live with vLLM's
// blocks, hashes Verified, IndexSynced True, and the index finds vLLM's
// blocks from the prompts' token IDs.
func TestIndexParticipationWithVLLMsPublisher(t *testing.T) {
	python := pyenv.Python(t, pyenv.VLLM) // builds the environment if needed
	s := startStack(t)
	c, pod := s.c, s.pod
	side := sidecar(t, pod)
	ns := netns.New(t)
	ns.ForwardInto(t, s.grpcAddr) // the sidecar's INDEX_ENDPOINT, unchanged

	// vLLM's publisher, from exactly what the webhook gave the engine.
	cmdline := append(append([]string{}, pod.Spec.Containers[0].Command...), pod.Spec.Containers[0].Args...)
	kv := inject.FlagUses(cmdline, inject.KVEventsConfigFlag, inject.Abbreviates(v1alpha1.RuntimeVLLM))
	algo := inject.FlagUses(cmdline, inject.HashAlgoFlag, false)
	if len(kv) != 1 || len(algo) != 1 {
		t.Fatalf("the engine's command line %q has %d %s and %d %s", cmdline, len(kv), inject.KVEventsConfigFlag, len(algo), inject.HashAlgoFlag)
	}
	enginePub, engineReplay := engineKVEventsConfig(t, pod)
	cmd := ns.Command(t, python, filepath.Join(fixture.RepoRoot(), "test", "kvevents", "py", "vllm_publisher.py"))
	cmd.Env = pyenv.Env()
	vllm := fixture.Drive(t, cmd, "vLLM's publisher (test/kvevents/py/vllm_publisher.py)")
	const bs = 16 // vLLM's default --block-size; the webhook sets none
	do := func(c map[string]any) fixture.Reply {
		t.Helper()
		c["pub"] = "engine"
		r := vllm.Do(c)
		if !r.OK {
			t.Fatalf("vLLM's publisher refused %v", c)
		}
		return r
	}
	open := do(map[string]any{"op": "open", "kv_events_config": kv[0].Value, "hash_algo": algo[0].Value, "block_size": bs})
	if open.Endpoint != enginePub || open.ReplayEndpoint != engineReplay {
		t.Fatalf("vLLM bound %s and %s, the webhook told it %s and %s", open.Endpoint, open.ReplayEndpoint, enginePub, engineReplay)
	}
	prompt := func(base, blocks int) []int {
		toks := make([]int, bs*blocks)
		for i := range toks {
			toks[i] = base + i
		}
		return toks
	}
	first := prompt(1000, 5)
	do(map[string]any{"op": "store", "tokens": first}) // served before the sidecar started

	// The sidecar: its command and args as the container's, its env as the
	// kubelet resolves it, in the pod's namespace (its probe port is the
	// container's own there).
	env := subscriberEnv(t, side, pod, func(ep string) string { return ep }, func(path string) string {
		aud, exp := projectedAudience(t, pod, side, path)
		return c.token(t, pod.Namespace, pod.Spec.ServiceAccountName, aud, exp, pod)
	})
	args := append([]string{}, side.Args...)
	if len(side.Command) > 1 {
		args = append(append([]string{}, side.Command[1:]...), args...)
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "kvevent-subscriber.log"))
	if err != nil {
		t.Fatal(err)
	}
	sub := ns.Command(t, s.subscriberBin, args...)
	sub.Env, sub.Stdout, sub.Stderr = env, f, f
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Process.Kill(); _ = sub.Wait() })
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(f.Name())
			t.Logf("kvevent-subscriber logs:\n%s\ncache-index logs:\n%s", b, s.index.logs())
		}
	}()

	// The subscriber reached the index; a second request sharing the
	// first's prefix (3 blocks hit, 2 stored) shows it the gap, and it
	// replays the first from vLLM's ROUTER.
	c.waitBackend(t, s.key, indexSynced(metav1.ConditionTrue, v1alpha1.ReasonAllPodsLive))
	second := append(prompt(1000, 3), prompt(50000, 2)...)
	do(map[string]any{"op": "store", "tokens": second})
	held := do(map[string]any{"op": "state"}).Held
	if len(held) != 7 {
		t.Fatalf("vLLM's block pool holds %d blocks, want 7 (5 + 2 after a 3-block prefix hit): %v", len(held), held)
	}
	for _, h := range held {
		if _, err := strconv.ParseUint(h, 10, 64); err != nil {
			t.Fatalf("vLLM's block hash %q: %v", h, err)
		}
	}
	got := c.waitBackend(t, s.key, func(cb *v1alpha1.CacheBackend) error {
		if err := indexSynced(metav1.ConditionTrue, v1alpha1.ReasonAllPodsLive)(cb); err != nil {
			return err
		}
		p := cb.Status.IndexParticipation
		if p.Indexed != "1/1" || p.LivePods != 1 || len(p.Pods) != 1 || p.Pods[0].Name != pod.Name ||
			p.Pods[0].State != v1alpha1.IndexPodLive || p.Pods[0].Blocks != int64(len(held)) || p.Blocks.GPU != int64(len(held)) ||
			p.HashCompatibility != v1alpha1.HashVerified || p.LastEventTime == nil {
			return fmt.Errorf("indexParticipation %+v", p)
		}
		return nil
	})
	t.Logf("indexParticipation %+v", got.Status.IndexParticipation)

	// The index hashes the prompts' token IDs with the pod's Verified
	// scheme and finds every block vLLM's hasher named.
	for _, toks := range [][]int{first, second} {
		n, err := s.score(toks)
		if err != nil {
			t.Fatal(err)
		}
		if want := uint32(len(toks) / bs); n != want {
			t.Errorf("the index matches %d leading blocks of a prompt vLLM holds %d of", n, want)
		}
	}

	// LMCache's multiprocess connector stores two 256-token chunks in its
	// CPU tier and publishes them through vLLM's publisher (LMCache's own
	// event builders, issue 36): the sidecar verifies them as LMCache's
	// blake3 chunks, and status.indexParticipation carries their scheme
	// through the real API server (a field the CRD schema lacked would be
	// pruned) with the chunks in the CPU tier.
	do(map[string]any{"op": "lmcache_store", "tokens": prompt(90000, 512/bs)})
	got = c.waitBackend(t, s.key, func(cb *v1alpha1.CacheBackend) error {
		if p := cb.Status.IndexParticipation; p == nil || p.TierScheme != "lmcache_blake3/256/" || p.Blocks.CPU != 2 {
			return fmt.Errorf("indexParticipation %+v, want tierScheme lmcache_blake3/256/ and 2 CPU blocks", p)
		}
		return nil
	})
	t.Logf("indexParticipation after LMCache's chunks %+v", got.Status.IndexParticipation)
}
