package kvevents_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/internal/sglangpb"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/freeport"
	"github.com/inferencecache/operator/test/testutil/netns"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// The engines' own publishers as peers: vLLM 0.33's and SGLang 0.5.23's
// ZmqEventPublisher, fed by the engines' own block pool / radix cache
// (test/kvevents/py), bound on exactly the endpoints the webhook gives an
// engine pod, followed by the real kvevent-subscriber binary started with
// exactly the environment the webhook gives the sidecar, into the real
// cache-index. The index must end equal to the engine's cached blocks, with
// the hashes Verified, also after the subscriber joined late and after it
// restarted (both recovered by replay through the engine's own ROUTER).

// The test pod's identity: what the downward API gives the sidecar.
const (
	enginePodName = "qwen-0"
	enginePodNS   = "llm"
	enginePodUID  = "uid-qwen-0"
	engineNode    = "node-a"
	enginePodIP   = "10.0.3.7"
)

// wiring is what the webhook gave one engine pod.
type wiring struct {
	runtime      v1alpha1.Runtime
	backend      *v1alpha1.CacheBackend
	kvEvents     string // the engine's --kv-events-config value
	hashAlgo     string // vLLM's --prefix-caching-hash-algo ("" for SGLang)
	blockSize    *int   // --block-size / --page-size on the rendered command line
	env          string // the engine's Python environment ("" for the runtime's default)
	dp           int
	sidecar      corev1.Container
	engineConfig map[string]any
}

// wire runs the webhook's decision (inject.Decide, which calls PlanKVEvents)
// on an engine pod with args, claimed by cb.
func wire(t *testing.T, cb v1alpha1.CacheBackend, image string, args ...string) wiring {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: enginePodNS, Name: enginePodName, UID: enginePodUID, Labels: map[string]string{"app": "qwen"}},
		Spec:       corev1.PodSpec{NodeName: engineNode, Containers: []corev1.Container{{Name: "engine", Image: image, Args: args}}},
	}
	opts := inject.Options{KVEventSubscriberImage: "example.com/kvevent-subscriber:test",
		IndexEndpoint: inject.DefaultIndexEndpoint("inferencecache-system", "")}
	d := inject.Decide(pod, []v1alpha1.CacheBackend{cb}, opts)
	if d.Outcome != inject.Injected {
		t.Fatalf("webhook: %s %s: %s", d.Outcome, d.Reason, d.Message)
	}
	w := wiring{runtime: cb.Spec.Runtime, backend: &cb}
	if len(d.Pod.Spec.InitContainers) == 0 || d.Pod.Spec.InitContainers[len(d.Pod.Spec.InitContainers)-1].Name != inject.SubscriberContainer {
		t.Fatalf("webhook added no %s sidecar: annotations %v", inject.SubscriberContainer, d.Pod.Annotations)
	}
	w.sidecar = d.Pod.Spec.InitContainers[len(d.Pod.Spec.InitContainers)-1]
	c := d.Pod.Spec.Containers[0]
	cmdline := append(append([]string{}, c.Command...), c.Args...)
	abbrev := inject.Abbreviates(cb.Spec.Runtime)
	uses := inject.FlagUses(cmdline, inject.KVEventsConfigFlag, abbrev)
	if len(uses) != 1 {
		t.Fatalf("rendered command line %q has %d %s", cmdline, len(uses), inject.KVEventsConfigFlag)
	}
	w.kvEvents = uses[0].Value
	if err := json.Unmarshal([]byte(w.kvEvents), &w.engineConfig); err != nil {
		t.Fatal(err)
	}
	size := "--block-size"
	if cb.Spec.Runtime == v1alpha1.RuntimeSGLang {
		size = "--page-size"
	} else {
		h := inject.FlagUses(cmdline, inject.HashAlgoFlag, false)
		if len(h) != 1 {
			t.Fatalf("rendered command line %q has %d %s", cmdline, len(h), inject.HashAlgoFlag)
		}
		w.hashAlgo = h[0].Value
	}
	if u := inject.FlagUses(cmdline, size, abbrev); len(u) > 0 {
		n, err := strconv.Atoi(u[len(u)-1].Value)
		if err != nil {
			t.Fatal(err)
		}
		w.blockSize = &n
	}
	n, ok := inject.DataParallelSize(cmdline, cb.Spec.Runtime)
	if !ok {
		t.Fatalf("data-parallel size of %q unreadable", cmdline)
	}
	w.dp = n
	t.Logf("webhook: engine %s %s; sidecar env %s", inject.KVEventsConfigFlag, w.kvEvents, envString(w.sidecar.Env))
	return w
}

func envString(env []corev1.EnvVar) string {
	var parts []string
	for _, e := range env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			v = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		}
		parts = append(parts, e.Name+"="+v)
	}
	return strings.Join(parts, " ")
}

// sidecarProcessEnv is the sidecar container's environment as the kubelet
// would resolve it in the test pod. Two values are what a pod provides and
// a test on one host cannot: INDEX_ENDPOINT (the index's cluster DNS name)
// is the test's cache-index on 127.0.0.1, and INDEX_TOKEN_FILE (a projected
// ServiceAccount token, which cache-index checks with a TokenReview) is
// left out, with the index's --auth none. Every other variable is the
// webhook's, byte for byte.
func sidecarProcessEnv(t *testing.T, c corev1.Container, indexAddr string) []string {
	t.Helper()
	fields := map[string]string{"metadata.name": enginePodName, "metadata.namespace": enginePodNS,
		"metadata.uid": enginePodUID, "spec.nodeName": engineNode, "status.podIP": enginePodIP}
	env := []string{"PATH=" + os.Getenv("PATH")}
	sawIndex := false
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			var ok bool
			if v, ok = fields[e.ValueFrom.FieldRef.FieldPath]; !ok {
				t.Fatalf("sidecar env %s from unknown field %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom != nil:
			t.Fatalf("sidecar env %s from %v: not resolvable here", e.Name, e.ValueFrom)
		case e.Name == "INDEX_ENDPOINT":
			v, sawIndex = indexAddr, true
		case e.Name == "INDEX_TOKEN_FILE":
			continue
		}
		env = append(env, e.Name+"="+v)
	}
	if !sawIndex {
		t.Fatal("the webhook gave the sidecar no INDEX_ENDPOINT")
	}
	return env
}

// The pod: the engine, the sidecar and the index run in one network
// namespace of their own (netns.Shared), as a pod's containers share one,
// so the webhook's fixed endpoints never collide with another test's
// engine on this host; the test reaches them through it (netns.DialShared).
// podHTTP is an HTTP client whose connections are made in the pod.
var podHTTP = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: netns.DialShared}}

// podIndex is where the test's cache-index answers in the pod's namespace.
type podIndex struct {
	grpc, http string
	// sglang serves SGLang's router query for the engine's CacheBackend
	// (--sglang-kv-indexer).
	sglang string
}

// startPodIndex runs the cache-index binary in the pod's namespace (memory
// store, --auth none) with its APIs on 127.0.0.1 ports there; backend is
// the CacheBackend its SGLang router listener serves.
func startPodIndex(t *testing.T, backend *v1alpha1.CacheBackend) podIndex {
	t.Helper()
	bin, _ := binaries(t)
	port := func() string { return fmt.Sprintf("127.0.0.1:%d", freeport.MustTake(t)) } // any port: the namespace is empty
	addrs := podIndex{grpc: port(), http: port(), sglang: port()}
	probe := port()
	logs := filepath.Join(t.TempDir(), "cache-index.log")
	f, err := os.Create(logs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--grpc-bind-address", addrs.grpc, "--http-bind-address", addrs.http,
		"--sglang-kv-indexer", backend.Namespace+"/"+backend.Name+"="+addrs.sglang,
		"--health-probe-bind-address", probe, "--auth", "none", "--heartbeat", "1s")
	netns.Shared(t).Enter(t, cmd)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("start cache-index: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		resp, err := podHTTP.Get("http://" + probe + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return addrs
			}
		}
		if i == 300 {
			b, _ := os.ReadFile(logs)
			t.Fatalf("cache-index did not become healthy: %v\n%s", err, b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// enginePeer is one engine's driver process (py/*_publisher.py): the
// engine imported once, publishers opened and closed by name. It ends with
// the test binary (its stdin closes).
type enginePeer struct {
	mu    sync.Mutex
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	ready chan error
	took  time.Duration
	n     int
}

var (
	peersMu sync.Mutex
	peers   = map[string]*enginePeer{}
)

// launchPeer starts the runtime's driver process once per test binary
// without waiting for it: the engines take seconds to import, so both
// are started together.
func launchPeer(t *testing.T, rt v1alpha1.Runtime) *enginePeer {
	t.Helper()
	env := pyenv.VLLM
	if rt == v1alpha1.RuntimeSGLang {
		env = pyenv.SGLang
	}
	return launchPeerIn(t, rt, env)
}

// launchPeerIn is launchPeer with the engine of the Python environment
// env (a supported-version cell).
func launchPeerIn(t *testing.T, rt v1alpha1.Runtime, env string) *enginePeer {
	t.Helper()
	script := "vllm_publisher.py"
	if rt == v1alpha1.RuntimeSGLang {
		script = "sglang_publisher.py"
	}
	python := pyenv.Python(t, env) // builds the environment if needed
	peersMu.Lock()
	defer peersMu.Unlock()
	if p := peers[env]; p != nil {
		return p
	}
	start := time.Now()
	cmd := exec.Command(python, filepath.Join(fixture.RepoRoot(), "test", "kvevents", "py", script))
	cmd.Env = pyenv.Env()
	netns.Shared(t).Enter(t, cmd)
	cmd.Stderr = &prefixWriter{prefix: "[" + env + "] ", w: os.Stderr}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &enginePeer{name: script, cmd: cmd, in: in, out: bufio.NewScanner(out), ready: make(chan error, 1)}
	p.out.Buffer(make([]byte, 1<<20), 64<<20)
	go func() {
		if !p.out.Scan() || !strings.Contains(p.out.Text(), `"ready"`) {
			p.ready <- fmt.Errorf("%s did not start (stderr above): %q", script, p.out.Text())
			return
		}
		p.took = time.Since(start)
		close(p.ready)
	}()
	peers[env] = p
	return p
}

// peerFor is the runtime's driver process (in the Python environment
// env; the runtime's default one when env is ""), ready.
func peerFor(t *testing.T, rt v1alpha1.Runtime, env string) *enginePeer {
	t.Helper()
	var p *enginePeer
	if env == "" {
		p = launchPeer(t, rt)
	} else {
		p = launchPeerIn(t, rt, env)
	}
	if err, failed := <-p.ready; failed {
		p.ready <- err
		t.Fatal(err)
	}
	return p
}

func (p *enginePeer) do(t *testing.T, c map[string]any) map[string]any {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal(c)
	if _, err := fmt.Fprintf(p.in, "%s\n", b); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	if !p.out.Scan() {
		t.Fatalf("%s exited: %v", p.name, p.out.Err())
	}
	var r map[string]any
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil || r["ok"] != true {
		t.Fatalf("%s: %v -> %q", p.name, c, p.out.Text())
	}
	return r
}

// enginePublisher is one data-parallel rank's publisher in a peer.
type enginePublisher struct {
	t     *testing.T
	peer  *enginePeer
	id    string
	rank  int
	ready map[string]any
}

func startEnginePublisher(t *testing.T, w wiring, rank int) *enginePublisher {
	t.Helper()
	peer := peerFor(t, w.runtime, w.env)
	peer.mu.Lock()
	peer.n++
	id := fmt.Sprintf("p%d", peer.n)
	peer.mu.Unlock()
	spec := map[string]any{"op": "open", "pub": id, "kv_events_config": w.kvEvents, "dp_rank": rank}
	if w.runtime == v1alpha1.RuntimeSGLang {
		if w.blockSize == nil {
			t.Fatal("the rendered SGLang command line has no --page-size; the test needs one")
		}
		spec["page_size"] = *w.blockSize
	} else {
		spec["hash_algo"] = w.hashAlgo
		spec["num_blocks"] = 48
		if w.blockSize != nil {
			spec["block_size"] = *w.blockSize
		} // else vLLM's own default (CacheConfig.DEFAULT_BLOCK_SIZE), which the driver uses
	}
	p := &enginePublisher{t: t, peer: peer, id: id, rank: rank}
	p.ready = peer.do(t, spec)
	t.Cleanup(func() { peer.do(t, map[string]any{"op": "close", "pub": id}) })
	return p
}

func (p *enginePublisher) do(c map[string]any) map[string]any {
	p.t.Helper()
	c["pub"] = p.id
	return p.peer.do(p.t, c)
}

type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	for _, line := range strings.SplitAfter(string(b), "\n") {
		if line != "" {
			_, _ = io.WriteString(p.w, p.prefix+line)
		}
	}
	return len(b), nil
}

func (p *enginePublisher) store(tokens []int) []string {
	p.t.Helper()
	r := p.do(map[string]any{"op": "store", "tokens": tokens})
	var kinds []string
	for _, k := range r["events"].([]any) {
		kinds = append(kinds, k.(string))
	}
	return kinds
}

func (p *enginePublisher) held() map[uint64]bool {
	p.t.Helper()
	out := map[uint64]bool{}
	for _, s := range p.do(map[string]any{"op": "state"})["held"].([]any) {
		h, err := strconv.ParseUint(s.(string), 10, 64)
		if err != nil {
			p.t.Fatal(err)
		}
		out[h] = true
	}
	return out
}

// engineIndex reads cache-index through its Query API for the test pod.
type engineIndex struct {
	q       pb.QueryClient
	backend *pb.CacheBackendRef
	model   string
}

func newEngineIndex(t *testing.T, addr string, w wiring) *engineIndex {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return netns.DialShared(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &engineIndex{q: pb.NewQueryClient(conn), backend: &pb.CacheBackendRef{Namespace: w.backend.Namespace, Name: w.backend.Name},
		model: w.backend.Spec.Observation.ModelID}
}

// rankOf is the rank of the test pod that holds block h in GPU, or -1.
func (ix *engineIndex) rankOf(h uint64) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := ix.q.Score(ctx, &pb.ScoreRequest{CacheBackend: ix.backend, Model: ix.model, BlockHashes: []uint64{h}})
	if err != nil {
		return -1, fmt.Errorf("score: %w", err)
	}
	for _, p := range r.GetPods() {
		if p.GetPodName() == enginePodName && p.GetTiers().GetGpu() >= 1 {
			return int(p.GetRank()), nil
		}
	}
	return -1, nil
}

func (ix *engineIndex) pod() (*pb.ParticipationSummary, *pb.PodParticipation, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := ix.q.Participation(ctx, &pb.ParticipationRequest{CacheBackend: ix.backend})
	if err != nil {
		return nil, nil, fmt.Errorf("participation: %w", err)
	}
	for _, p := range s.GetPodList() {
		if p.GetName() == enginePodName {
			return s, p, nil
		}
	}
	return s, &pb.PodParticipation{}, nil
}

// differs says how the index differs from the engine: want[r] is what rank
// r's publisher holds, gone the blocks the engine published and no longer
// holds; "" when the index holds exactly want.
func (ix *engineIndex) differs(want []map[uint64]bool, gone map[uint64]bool) string {
	var bad []string
	total := 0
	for r, held := range want {
		total += len(held)
		for h := range held {
			got, err := ix.rankOf(h)
			if err != nil {
				return err.Error()
			}
			if got != r {
				bad = append(bad, fmt.Sprintf("%x: rank %d, want %d", h, got, r))
			}
		}
	}
	for h := range gone {
		if want := slicesAnyHas(want, h); want {
			continue
		}
		got, err := ix.rankOf(h)
		if err != nil {
			return err.Error()
		}
		if got >= 0 {
			bad = append(bad, fmt.Sprintf("%x: held by rank %d, evicted by the engine", h, got))
		}
	}
	_, p, err := ix.pod()
	if err != nil {
		return err.Error()
	}
	if len(bad) == 0 && int(p.GetBlocks()) == total {
		return ""
	}
	sort.Strings(bad)
	if len(bad) > 8 {
		bad = append(bad[:8], fmt.Sprintf("... %d more", len(bad)-8))
	}
	return fmt.Sprintf("index counts %d blocks for the pod, the engine holds %d; %v", p.GetBlocks(), total, bad)
}

func slicesAnyHas(sets []map[uint64]bool, h uint64) bool {
	for _, s := range sets {
		if s[h] {
			return true
		}
	}
	return false
}

// sidecar is the kvevent-subscriber process as the pod would run it.
type sidecar struct {
	cmd      *exec.Cmd
	logs     string
	httpAddr string
}

func startSidecar(t *testing.T, w wiring, indexAddr string) *sidecar {
	t.Helper()
	_, bin := binaries(t)
	logs := filepath.Join(t.TempDir(), "subscriber.log")
	f, err := os.Create(logs)
	if err != nil {
		t.Fatal(err)
	}
	// The container's own command and args (the image's entrypoint is the
	// binary; the webhook adds none) and environment, in the pod's
	// namespace: its probe port is the container's.
	cmd := exec.Command(bin, append(append([]string{}, w.sidecar.Command...), w.sidecar.Args...)...)
	netns.Shared(t).Enter(t, cmd)
	cmd.Env = sidecarProcessEnv(t, w.sidecar, indexAddr)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &sidecar{cmd: cmd, logs: logs}
	t.Cleanup(s.stop)
	if len(w.sidecar.Ports) != 1 || w.sidecar.StartupProbe == nil || w.sidecar.StartupProbe.HTTPGet == nil {
		t.Fatalf("sidecar ports %v, startup probe %v", w.sidecar.Ports, w.sidecar.StartupProbe)
	}
	s.httpAddr = fmt.Sprintf("127.0.0.1:%d", w.sidecar.Ports[0].ContainerPort)
	// The kubelet's startup probe: the engine starts once it passes.
	for i := 0; ; i++ {
		resp, err := podHTTP.Get("http://" + s.httpAddr + w.sidecar.StartupProbe.HTTPGet.Path)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		if i == 300 {
			t.Fatalf("the subscriber's startup probe did not pass: %v\n%s", err, s.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *sidecar) stop() {
	if s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

func (s *sidecar) tail() string {
	b, _ := os.ReadFile(s.logs)
	if len(b) > 20000 {
		b = b[len(b)-20000:]
	}
	return string(b)
}

// engineCase is one engine pod shape.
type engineCase struct {
	name    string
	runtime v1alpha1.Runtime
	image   string
	args    []string
	mut     func(*v1alpha1.CacheBackend)
	// env is the Python environment of the engine ("" for the runtime's
	// default one): each supported vLLM is a case.
	env string
	// pubs and replays are the endpoints the engine's publisher of each
	// rank must report having bound: the webhook's, offset by the engine.
	pubs, replays []string
}

func engineBackend(rt v1alpha1.Runtime, mut func(*v1alpha1.CacheBackend)) v1alpha1.CacheBackend {
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: enginePodNS, Name: "cache", UID: "uid-cache"},
		Spec: v1alpha1.CacheBackendSpec{Runtime: rt, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
			Observation:    &v1alpha1.Observation{ModelID: "Qwen/Qwen2.5-0.5B-Instruct"}},
	}
	if rt == v1alpha1.RuntimeSGLang {
		cb.Spec.Type = v1alpha1.BackendTypeSGLangHiCache
		cb.Spec.HiCache = &v1alpha1.HiCache{Ratio: ptr.To("2")}
	} else {
		cb.Status.Endpoint = topology.Endpoint(&cb, "")
	}
	if mut != nil {
		mut(&cb)
	}
	return cb
}

// TestEnginePublishers: the scenario for vLLM and SGLang, with data
// parallelism 1 (abstract ipc:// sockets) and 2 (tcp://, one publisher per
// rank on the engine's own offset ports).
func TestEnginePublishers(t *testing.T) {
	pub0, rep0 := inject.KVEventsPubIPC, inject.KVEventsReplayIPC
	tcp := func(host string, port int) string { return fmt.Sprintf("tcp://%s:%d", host, port) }
	p := inject.KVEventsPort
	// Both engines import at once, while the first case runs.
	launchPeer(t, v1alpha1.RuntimeVLLM)
	launchPeer(t, v1alpha1.RuntimeSGLang)
	launchPeerIn(t, v1alpha1.RuntimeVLLM, "vllm-0.34")
	for _, tc := range []engineCase{
		{name: "vLLM", runtime: v1alpha1.RuntimeVLLM, image: "vllm/vllm-openai:v0.33.0",
			args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"}, pubs: []string{pub0}, replays: []string{rep0}},
		{name: "vLLM data-parallel 2", runtime: v1alpha1.RuntimeVLLM, image: "vllm/vllm-openai:v0.33.0",
			args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct", "--data-parallel-size", "2", "--block-size", "16"},
			pubs: []string{tcp("*", p), tcp("*", p+1)}, replays: []string{tcp("127.0.0.1", p+2), tcp("127.0.0.1", p+3)}},
		// vLLM 0.34's default block size is 64 (CacheConfig.DEFAULT_BLOCK_SIZE);
		// the command line names none, so the sidecar learns it from the
		// events (every BlockStored carries it) and the index scores token
		// IDs with it.
		{name: "vLLM 0.34", runtime: v1alpha1.RuntimeVLLM, image: "vllm/vllm-openai:v0.34.0", env: "vllm-0.34",
			args: []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"}, pubs: []string{pub0}, replays: []string{rep0}},
		{name: "SGLang", runtime: v1alpha1.RuntimeSGLang, image: "lmsysorg/sglang:v0.5.23",
			args: []string{"python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-0.5B-Instruct"},
			mut:  func(cb *v1alpha1.CacheBackend) { cb.Spec.HiCache.PageSize = ptr.To[int32](16) }, pubs: []string{pub0}, replays: []string{rep0}},
		{name: "SGLang data-parallel 2", runtime: v1alpha1.RuntimeSGLang, image: "lmsysorg/sglang:v0.5.23",
			args: []string{"python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-0.5B-Instruct", "--dp-size", "2", "--page-size", "8"},
			pubs: []string{tcp("127.0.0.1", p), tcp("127.0.0.1", p+1)}, replays: []string{tcp("127.0.0.1", p+2), tcp("127.0.0.1", p+3)}},
	} {
		t.Run(tc.name, func(t *testing.T) { engineScenario(t, tc) })
	}
}

func engineScenario(t *testing.T, tc engineCase) {
	w := wire(t, engineBackend(tc.runtime, tc.mut), tc.image, tc.args...)
	w.env = tc.env
	if w.dp != len(tc.pubs) {
		t.Fatalf("webhook wired %d ranks, want %d", w.dp, len(tc.pubs))
	}
	index := startPodIndex(t, w.backend)
	indexAddr := index.grpc
	ix := newEngineIndex(t, indexAddr, w)

	// One engine publisher per data-parallel rank, each built by the
	// engine's factory from the webhook's --kv-events-config.
	pubs := make([]*enginePublisher, w.dp)
	for r := range pubs {
		pubs[r] = startEnginePublisher(t, w, r)
	}
	t.Logf("%s imported in %s", pubs[0].peer.name, pubs[0].peer.took.Round(100*time.Millisecond))
	// The block size the engine really uses: the command line's, else
	// the engine's own default (the driver reports it).
	bs := 0
	if w.blockSize != nil {
		bs = *w.blockSize
	}
	if tc.runtime == v1alpha1.RuntimeVLLM {
		bs = int(pubs[0].ready["block_size"].(float64))
		t.Logf("vLLM %v, block size %d", pubs[0].ready["vllm"], bs)
	}
	for r, p := range pubs {
		// What the engine bound: the webhook's endpoints, offset for the
		// rank by the engine itself; the subscriber's endpoint for the rank
		// (offset by the subscriber) must reach it.
		if got := p.ready["endpoint"]; tc.runtime == v1alpha1.RuntimeVLLM && got != tc.pubs[r] {
			t.Errorf("rank %d: vLLM bound PUB %v, want %s", r, got, tc.pubs[r])
		}
		if got := p.ready["replay_endpoint"]; got != tc.replays[r] {
			t.Errorf("rank %d: the engine bound replay %v, want %s", r, got, tc.replays[r])
		}
		if tc.runtime == v1alpha1.RuntimeSGLang && p.ready["endpoint"] != tc.pubs[r] {
			t.Errorf("rank %d: SGLang bound PUB %v (describe_local_source), want %s", r, p.ready["endpoint"], tc.pubs[r])
		}
	}

	// Prompts: id's n blocks, distinct per rank; a prompt continued by
	// another shares its blocks (a prefix hit in the engine).
	prompt := func(rank, id, blocks int) []int {
		toks := make([]int, bs*blocks)
		for i := range toks {
			toks[i] = (rank*100000 + id*1000 + i) % 150000
		}
		return toks
	}
	everHeld := map[uint64]bool{}
	held := func() []map[uint64]bool {
		out := make([]map[uint64]bool, len(pubs))
		for r, p := range pubs {
			out[r] = p.held()
			for h := range out[r] {
				everHeld[h] = true
			}
		}
		return out
	}
	var sc *sidecar
	converge := func(what string, nudge bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		last := ""
		for i := 0; time.Now().Before(deadline); i++ {
			if last = ix.differs(held(), everHeld); last == "" {
				return
			}
			if nudge && i%10 == 5 {
				// Traffic: a live batch on every rank reveals a gap.
				for r, p := range pubs {
					p.store(prompt(r, 900+i, 1))
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: %s\nsubscriber log:\n%s", what, last, sc.tail())
	}

	// The engine serves before the subscriber runs: nothing subscribed, so
	// these batches exist only in the engine's replay ring.
	for r, p := range pubs {
		p.store(prompt(r, 1, 3))
		p.store(append(prompt(r, 1, 3), prompt(r, 2, 2)...)) // a prefix hit, two new blocks
		p.store(prompt(r, 3, 2))
		p.do(map[string]any{"op": "evict", "n": 1})
	}
	sc = startSidecar(t, w, indexAddr)
	converge("late join, recovered through the engine's replay ROUTER", true)

	// Live: stores, evictions (also the engine's own LRU ones once a vLLM
	// pool is full), a cleared cache on rank 0, stores after it.
	for i := 0; i < 12; i++ {
		for r, p := range pubs {
			p.store(append(prompt(r, 1, 3), prompt(r, 10+i, 2)...))
		}
	}
	for r, p := range pubs {
		p.do(map[string]any{"op": "evict", "n": 2})
		if r == 0 {
			p.do(map[string]any{"op": "clear"})
		}
		p.store(prompt(r, 40, 3))
	}
	converge("live events", false)

	// The sidecar restarts (a crash, an OOM kill); the engine goes on.
	sc.stop()
	for r, p := range pubs {
		p.store(prompt(r, 50, 2))
		p.do(map[string]any{"op": "evict", "n": 1})
		p.store(append(prompt(r, 40, 3), prompt(r, 51, 1)...))
	}
	sc = startSidecar(t, w, indexAddr)
	converge("subscriber restarted, recovered through the engine's replay ROUTER", true)

	final := held()
	n := 0
	for _, h := range final {
		n += len(h)
	}
	if n == 0 {
		t.Fatal("the engine holds nothing; the comparison proves nothing")
	}
	m := fixture.SubscriberMetrics(podHTTP, sc.httpAddr)
	for r := range pubs {
		if m[fmt.Sprintf(`replay_requests_total{rank="%d",result="ok"}`, r)] < 1 {
			t.Errorf("rank %d: no replay through the engine's ROUTER succeeded after the restart: %v", r, m)
		}
		if m[fmt.Sprintf(`decode_errors_total{rank="%d"}`, r)] > 0 {
			t.Errorf("rank %d: decode errors: %v", r, m)
		}
	}
	if m[`hash_verify_total{result="Verified"}`] < 1 || m[`hash_verify_total{result="Mismatch"}`] > 0 || m[`hash_verify_total{result="Unverifiable"}`] > 0 {
		t.Errorf("the engine's hashes are not Verified from its token IDs: %v", m)
	}
	// The index learns the verdict from the sidecar's heartbeats.
	var s *pb.ParticipationSummary
	var p *pb.PodParticipation
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if s, p, err = ix.pod(); err != nil {
			t.Fatal(err)
		}
		if p.GetHashCompatibility() == pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED && p.GetDataParallelSize() == uint32(w.dp) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("index: pod %v, summary %s/%v; want Verified, %d ranks", p, s.GetHashScheme(), s.GetHashCompatibility(), w.dp)
		}
	}
	if tc.runtime == v1alpha1.RuntimeVLLM {
		// The index hashes a prompt's token IDs itself with the pod's
		// Verified scheme: it finds the blocks vLLM's own hasher named.
		toks := append(prompt(0, 40, 3), prompt(0, 51, 1)...)
		ids := make([]uint32, len(toks))
		for i, v := range toks {
			ids[i] = uint32(v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := ix.q.Score(ctx, &pb.ScoreRequest{CacheBackend: ix.backend, Model: ix.model, TokenIds: ids})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		var got uint32
		for _, p := range r.GetPods() {
			if p.GetPodName() == enginePodName && p.GetRank() == 0 {
				got = p.GetTiers().GetGpu()
			}
		}
		if want := uint32(len(toks) / bs); got != want {
			t.Errorf("Score by token IDs: rank 0 matches %d leading blocks, want %d (the engine holds them): %v", got, want, r)
		}
	}
	if tc.runtime == v1alpha1.RuntimeVLLM && w.dp == 1 {
		lmcacheCPUChunks(t, pubs[0], ix, sc)
	}
	if tc.runtime == v1alpha1.RuntimeSGLang {
		// The prompt rank 0 holds whole (four pages) and half a page more.
		toks := append(append(prompt(0, 40, 3), prompt(0, 51, 1)...), prompt(0, 52, 1)[:bs/2]...)
		sglangRouterQuery(t, w, pubs[0], index, toks, 4)
	}
	t.Logf("final: %d blocks over %d ranks equal; index scheme %s %v; subscriber %v", n, w.dp, s.GetHashScheme(), p.GetHashCompatibility(), m)
}

// lmcacheCPUChunks (issue 36): LMCache's multiprocess connector publishes
// its CPU chunks through the engine's publisher, built by LMCache's own
// code (py/vllm_publisher.py lmcache_store): 256-token chunks, blake3
// chunk hashes, medium CPU. The index holds them under the CPU tier, the
// sidecar does not check them against vLLM's block hash (before, the
// first chunk was a hash Mismatch and the pod's GPU blocks were no longer
// scored by token IDs), and the block size it announces stays the
// engine's. The sidecar verifies them as LMCache's chunks and the index
// scores them by token IDs in their own scheme.
func lmcacheCPUChunks(t *testing.T, pub *enginePublisher, ix *engineIndex, sc *sidecar) {
	t.Helper()
	toks := make([]int, 512)
	for i := range toks {
		toks[i] = 70000 + i
	}
	r := pub.do(map[string]any{"op": "lmcache_store", "tokens": toks})
	if got := fmt.Sprint(r["block_sizes"], r["media"]); got != "[256 256] [CPU CPU]" {
		t.Fatalf("LMCache's events: block sizes and media %s, want two 256-token CPU chunks", got)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s, _, err := ix.pod()
		if err != nil {
			t.Fatal(err)
		}
		var cpu uint64
		for _, b := range s.GetBlocks() {
			if b.GetTier() == pb.Tier_TIER_CPU {
				cpu = b.GetBlocks()
			}
		}
		if cpu == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index holds %d CPU-tier blocks, want LMCache's 2 chunks: %v\nsubscriber log:\n%s", cpu, s.GetBlocks(), sc.tail())
		}
	}
	m := fixture.SubscriberMetrics(podHTTP, sc.httpAddr)
	if m[`hash_verify_total{result="Mismatch"}`] > 0 {
		t.Errorf("LMCache's CPU chunks were checked against vLLM's block hash: %v", m)
	}
	if bs, want := m[`block_size{rank="0"}`], float64(pub.ready["block_size"].(float64)); bs != want {
		t.Errorf("the sidecar's block size is %v after LMCache's chunks, want the engine's %v", bs, want)
	}
	// The index scores the chunks by token IDs: the sidecar verified them
	// as LMCache's blake3 chunks and announced their scheme, the index
	// hashes the prompt again with it. Before, the prompt (held only in
	// LMCache's CPU tier) matched nothing.
	ids := make([]uint32, len(toks))
	for i, v := range toks {
		ids[i] = uint32(v)
	}
	want := uint32(len(toks)) / uint32(pub.ready["block_size"].(float64))
	var got *pb.PodScore
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := ix.q.Score(ctx, &pb.ScoreRequest{CacheBackend: ix.backend, Model: ix.model, TokenIds: ids})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.GetPods() {
			if p.GetPodName() == enginePodName && p.GetRank() == 0 {
				got = p
			}
		}
		if got.GetTiers().GetCpu() == want {
			break
		}
		if time.Now().After(deadline) {
			m := fixture.SubscriberMetrics(podHTTP, sc.httpAddr)
			t.Fatalf("Score by the token IDs of LMCache's two chunks: %v, want %d leading blocks in the CPU tier (tier_hash_verify %v)\nsubscriber log:\n%s",
				got, want, m[`tier_hash_verify_total{result="Verified"}`], sc.tail())
		}
	}
	if s, _, err := ix.pod(); err != nil || s.GetTierScheme() != "lmcache_blake3/256/" {
		t.Errorf("participation tier scheme %q (%v), want lmcache_blake3/256/", s.GetTierScheme(), err)
	}
	if v := fixture.SubscriberMetrics(podHTTP, sc.httpAddr)[`tier_hash_verify_total{result="Verified"}`]; v < 2 {
		t.Errorf("tier_hash_verify_total{result=\"Verified\"} = %v, want LMCache's 2 chunks", v)
	}
}

// sglangRouterQuery (issue 38): SGLang's router asks an external index
// which workers hold a prompt's leading pages (kv_indexer.v1.KVIndexer/
// MatchExternalKvPrefix at its --kv-indexer-endpoint), and cache-index
// answers it on the --sglang-kv-indexer listener of the pod's backend. No
// package registry ships the router's client (docs/design/router-
// protocols.md); the client here is generated from proto/kv_indexer/v1,
// which follows the proto SGLang publishes. The hashes are SGLang's own
// (get_hash_str, a partial last page included, as the router hashes a
// prompt), the worker address the one the webhook gave the sidecar (the
// pod's IP, SGLang's port). The answer must name the pod with want leading
// pages, as /query by the prompt's token IDs does; a prompt the engine
// never saw matches nothing.
func sglangRouterQuery(t *testing.T, w wiring, pub *enginePublisher, index podIndex, toks []int, want uint32) {
	t.Helper()
	pageHashes := func(toks []int) []int64 {
		var out []int64
		for _, s := range pub.do(map[string]any{"op": "page_hashes", "tokens": toks})["hashes"].([]any) {
			h, err := strconv.ParseInt(s.(string), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, h)
		}
		return out
	}
	conn, err := grpc.NewClient("passthrough:///"+index.sglang, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return netns.DialShared(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	router := sglangpb.NewKVIndexerClient(conn)
	match := func(hashes []int64) *sglangpb.MatchExternalKvPrefixResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := router.MatchExternalKvPrefix(ctx, &sglangpb.MatchExternalKvPrefixRequest{Hashes: hashes})
		if err != nil {
			t.Fatalf("MatchExternalKvPrefix: %v", err)
		}
		return r
	}

	hashes := pageHashes(toks)
	if len(hashes) != int(want)+1 {
		t.Fatalf("SGLang hashed the prompt into %d pages, want %d whole and a partial one", len(hashes), want)
	}
	r := match(hashes)
	addr := "http://" + enginePodIP + ":30000" // the test's command line sets no --port: SGLang's own default
	if len(r.GetMatches()) != 1 || r.GetMatches()[0].GetWorkerAddress() != addr || r.GetMatches()[0].GetMatchedPrefixBlocks() != want ||
		r.GetBestPrefixBlocks() != want || r.GetBlocksRead() != uint32(len(hashes)) {
		t.Errorf("MatchExternalKvPrefix of the prompt: %v; want one match, %s with %d leading pages, best %d, %d read", r, addr, want, want, len(hashes))
	}
	if got := r.GetMatches(); len(got) == 1 && got[0].GetWorkerId() != enginePodNS+"/"+enginePodName {
		t.Errorf("worker_id %q, want %s/%s", got[0].GetWorkerId(), enginePodNS, enginePodName)
	}

	// /query by the same prompt's token IDs: the index hashes them with
	// the pod's Verified scheme; the same pod, the same pages.
	ids := make([]uint32, len(toks))
	for i, v := range toks {
		ids[i] = uint32(v)
	}
	body, _ := json.Marshal(map[string]any{"tenant_id": w.backend.Namespace + "/" + w.backend.Name, "model": w.backend.Spec.Observation.ModelID, "token_ids": ids})
	resp, err := podHTTP.Post("http://"+index.http+"/query", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var q map[string]map[string]struct {
		LongestMatched uint64 `json:"longest_matched"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/query: %d %v", resp.StatusCode, err)
	}
	inst := q[w.backend.Namespace+"/"+w.backend.Name]
	if len(inst) != 1 || inst[enginePodName].LongestMatched != uint64(want)*uint64(*w.blockSize) {
		t.Errorf("/query by token IDs: %v; want %s with %d tokens, as MatchExternalKvPrefix answered", inst, enginePodName, uint64(want)*uint64(*w.blockSize))
	}

	// A prompt no page of which the engine holds.
	if r := match(pageHashes(unseenPrompt(len(toks)))); len(r.GetMatches()) != 0 || r.GetBestPrefixBlocks() != 0 {
		t.Errorf("MatchExternalKvPrefix of an unseen prompt: %v, want no match", r)
	}
	t.Logf("SGLang router query: %v; /query %v", r, inst)
}

// unseenPrompt is n tokens no scenario stores (its prompts' tokens are
// below 150,000).
func unseenPrompt(n int) []int {
	toks := make([]int, n)
	for i := range toks {
		toks[i] = 150000 + i
	}
	return toks
}
