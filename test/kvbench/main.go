// Command kvbench measures the kvevent-subscriber sidecar against vLLM's
// own KV-event publisher (docs/performance.md, "KV events: the sidecar
// under vLLM's publisher"): vLLM 0.33's ZmqEventPublisher, fed by vLLM's
// own block pool (test/kvevents/py/vllm_publisher.py), publishes a fixed
// rate of block events on the endpoints the webhook gives a pod; the real
// kvevent-subscriber, started with the webhook's sidecar environment,
// forwards them to the real cache-index on loopback. For each rate and
// repetition it reports the sidecar's CPU (utime+stime from /proc over the
// window), its RSS (VmRSS sampled every 100 ms, VmHWM at the end), and the
// event-to-index latency: for every 5th batch, the time from the batch's
// ts (set when the scheduler makes it, as vLLM's does) until a Score call
// for its first stored block finds the block (each sample polled every
// millisecond). It runs itself in a network namespace of its own, as a
// pod's containers share one (unshare --net; needs root), so the
// webhook's fixed endpoints are its alone. Not part of make test:
//
//	go run ./test/kvbench -rates 1000,10000 -seconds 20 -reps 5
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	pb "github.com/inferencecache/operator/internal/kvindexpb"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/kvevents/fixture"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

const (
	podName = "qwen-0"
	podNS   = "llm"
	podUID  = "uid-qwen-0"
	model   = "Qwen/Qwen2.5-0.5B-Instruct"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		os.Exit(1)
	}
}

// result is one run's figures.
type result struct {
	Rate, Rep                int
	Events                   int     // block events published in the window
	Seconds                  float64 // the window
	CPUPercent               float64 // of one core
	RSSMiB, PeakRSSMiB       float64 // mean VmRSS in the window, VmHWM at its end
	P50, P99, Max            float64 // event-to-index latency, ms
	Samples, Unseen          int
	IndexLagP50, IndexLagP99 uint32 // the index's own lag figures, ms
	Equal                    bool   // the index's block count equals the pool's at the end
	Dropped, Gaps            float64
}

func run() error {
	rates := flag.String("rates", "1000,10000", "block events per second, comma-separated")
	seconds := flag.Float64("seconds", 20, "window per run")
	reps := flag.Int("reps", 3, "runs per rate")
	out := flag.String("json", "", "also write the results as JSON to this file")
	flag.Parse()
	if outer, err := inPodNetns(); outer {
		return err
	}

	root := fixture.RepoRoot()
	envDir, err := exec.Command("bash", filepath.Join(root, "test", "tools", "install-python.sh"), "vllm").Output()
	if err != nil {
		return fmt.Errorf("the vllm environment: %w", err)
	}
	python := filepath.Join(strings.TrimSpace(string(envDir)), "bin", "python")
	bin, err := os.MkdirTemp("", "kvbench-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(bin) }()
	indexBin, subBin, err := fixture.BuildBinaries(bin)
	if err != nil {
		return err
	}
	w, err := wiring()
	if err != nil {
		return err
	}

	peer, err := startPeer(python, filepath.Join(root, "test", "kvevents", "py", "vllm_publisher.py"))
	if err != nil {
		return err
	}
	defer peer.stop()

	var results []result
	for _, rs := range strings.Split(*rates, ",") {
		rate, err := strconv.Atoi(rs)
		if err != nil {
			return fmt.Errorf("-rates: %w", err)
		}
		for rep := 1; rep <= *reps; rep++ {
			r, err := once(peer, w, indexBin, subBin, rate, rep, *seconds)
			if err != nil {
				return fmt.Errorf("rate %d run %d: %w", rate, rep, err)
			}
			fmt.Fprintf(os.Stderr, "rate %d run %d: %+v\n", rate, rep, r)
			results = append(results, r)
		}
	}
	report(results, *seconds)
	if *out != "" {
		b, _ := json.MarshalIndent(results, "", " ")
		return os.WriteFile(*out, b, 0o644)
	}
	return nil
}

// wiring is the webhook's decision for a vLLM engine pod: the engine's
// --kv-events-config and the sidecar container.
type wired struct {
	kvEvents string
	sidecar  corev1.Container
	backend  v1alpha1.CacheBackend
}

func wiring() (wired, error) {
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: "cache", UID: "uid-cache"},
		Spec: v1alpha1.CacheBackendSpec{Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "qwen"}},
			Observation:    &v1alpha1.Observation{ModelID: model}},
	}
	cb.Status.Endpoint = topology.Endpoint(&cb, "")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: podNS, Name: podName, UID: podUID, Labels: map[string]string{"app": "qwen"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai:v0.33.0",
			Args: []string{"--model", model}}}},
	}
	d := inject.Decide(pod, []v1alpha1.CacheBackend{cb}, inject.Options{KVEventSubscriberImage: "kvevent-subscriber:bench",
		IndexEndpoint: inject.DefaultIndexEndpoint("inferencecache-system", "")})
	if d.Outcome != inject.Injected || len(d.Pod.Spec.InitContainers) == 0 {
		return wired{}, fmt.Errorf("webhook: %s %s", d.Outcome, d.Message)
	}
	c := d.Pod.Spec.Containers[0]
	uses := inject.FlagUses(append(slices.Clone(c.Command), c.Args...), inject.KVEventsConfigFlag, false)
	if len(uses) != 1 {
		return wired{}, errors.New("no --kv-events-config on the rendered command line")
	}
	return wired{kvEvents: uses[0].Value, sidecar: d.Pod.Spec.InitContainers[len(d.Pod.Spec.InitContainers)-1], backend: cb}, nil
}

// inPodNetns re-executes this program in a network namespace of its own,
// like a pod's (unshare --net, loopback up; needs root), so the webhook's
// fixed endpoints are its alone; it returns false in the re-executed copy.
func inPodNetns() (bool, error) {
	if os.Getenv("KVBENCH_NETNS") == "1" {
		return false, nil
	}
	self, err := os.Executable()
	if err != nil {
		return false, err
	}
	cmd := exec.Command("unshare", append([]string{"--net", "--", "sh", "-c", `ip link set lo up && exec "$0" "$@"`, self}, os.Args[1:]...)...)
	cmd.Env = append(os.Environ(), "KVBENCH_NETNS=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return true, fmt.Errorf("in a network namespace of its own (unshare --net, needs root): %w", err)
	}
	return true, nil
}

// peer is the vLLM driver process.
type peer struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startPeer(python, script string) (*peer, error) {
	cmd := exec.Command(python, script)
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "CUDA_VISIBLE_DEVICES=", "VLLM_NO_USAGE_STATS=1", "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &peer{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	p.out.Buffer(make([]byte, 1<<20), 64<<20)
	if !p.out.Scan() || !strings.Contains(p.out.Text(), `"ready"`) {
		return nil, fmt.Errorf("vllm_publisher.py did not start: %q", p.out.Text())
	}
	return p, nil
}

func (p *peer) stop() { _ = p.in.Close(); _ = p.cmd.Wait() }

// do sends a command; lines with "sample" before the reply go to samples.
func (p *peer) do(c map[string]any, samples func(hash uint64, ts float64)) (map[string]any, error) {
	b, _ := json.Marshal(c)
	if _, err := fmt.Fprintf(p.in, "%s\n", b); err != nil {
		return nil, err
	}
	for p.out.Scan() {
		var r map[string]any
		if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%q: %w", p.out.Text(), err)
		}
		if s, ok := r["sample"].(string); ok {
			h, _ := strconv.ParseUint(s, 10, 64)
			samples(h, r["ts"].(float64))
			continue
		}
		if r["ok"] != true {
			return nil, fmt.Errorf("%v: %v", c["op"], r)
		}
		return r, nil
	}
	return nil, fmt.Errorf("vllm_publisher.py exited: %w", p.out.Err())
}

// once is one run: a fresh index, sidecar and publisher.
func once(p *peer, w wired, indexBin, subBin string, rate, rep int, seconds float64) (result, error) {
	res := result{Rate: rate, Rep: rep}
	dir, err := os.MkdirTemp("", "kvbench-run-")
	if err != nil {
		return res, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freeport.Take(); err != nil {
			return res, err
		}
	}
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	ix := exec.Command(indexBin, "--grpc-bind-address", grpcAddr, "--http-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--health-probe-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[2]), "--auth", "none", "--heartbeat", "1s")
	ixLog, _ := os.Create(filepath.Join(dir, "index.log"))
	ix.Stdout, ix.Stderr = ixLog, ixLog
	if err := ix.Start(); err != nil {
		return res, err
	}
	defer func() { _ = ix.Process.Kill(); _ = ix.Wait() }()
	if err := waitHTTP(fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[2])); err != nil {
		return res, fmt.Errorf("cache-index: %w", err)
	}

	// The engine: a publisher on the webhook's endpoints, a pool large
	// enough that a sampled block lives for seconds after it is stored.
	id := fmt.Sprintf("r%d-%d", rate, rep)
	if _, err := p.do(map[string]any{"op": "open", "pub": id, "kv_events_config": w.kvEvents, "hash_algo": inject.HashAlgoSHA256CBOR,
		"num_blocks": max(4000, 3*rate)}, nil); err != nil {
		return res, err
	}
	defer func() { _, _ = p.do(map[string]any{"op": "close", "pub": id}, nil) }()
	prep, err := p.do(map[string]any{"op": "bench_prepare", "pub": id, "rate": rate, "seconds": seconds,
		"warm_blocks": max(4000, 3*rate), "steps_per_second": 100, "blocks_per_request": 5, "sample_every": 5}, nil)
	if err != nil {
		return res, err
	}

	// The sidecar, with the webhook's environment (the index on loopback,
	// no token: --auth none) and a free probe port.
	sub := exec.Command(subBin, "--http-bind-address", "127.0.0.1:0")
	sub.Env = sidecarEnv(w.sidecar, grpcAddr)
	subLog := filepath.Join(dir, "subscriber.log")
	sf, _ := os.Create(subLog)
	sub.Stdout, sub.Stderr = sf, sf
	if err := sub.Start(); err != nil {
		return res, err
	}
	defer func() { _ = sub.Process.Kill(); _ = sub.Wait() }()
	httpAddr, err := subscriberHTTP(subLog)
	if err != nil {
		return res, err
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return res, err
	}
	defer func() { _ = conn.Close() }()
	q := pb.NewQueryClient(conn)
	ref := &pb.CacheBackendRef{Namespace: w.backend.Namespace, Name: w.backend.Name}
	time.Sleep(time.Second) // the SUB socket connects (ZeroMQ's slow joiner)

	// Warm-up: fill the engine's pool and the index, then the window.
	if _, err := p.do(map[string]any{"op": "bench_warm", "pub": id}, nil); err != nil {
		return res, err
	}
	held := int(prep["held"].(float64))
	if err := waitCount(q, ref, func(n uint64) bool { return n > 0 && int(n) >= held*9/10 }); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	time.Sleep(time.Second)

	pid := sub.Process.Pid
	cpu0, err := cpuTicks(pid)
	if err != nil {
		return res, err
	}
	var lat []float64
	var latMu sync.Mutex
	var wg sync.WaitGroup
	unseen := 0
	sample := func(h uint64, ts float64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if holds(q, ref, h) {
					d := float64(time.Now().UnixNano())/1e9 - ts
					latMu.Lock()
					lat = append(lat, d*1000)
					latMu.Unlock()
					return
				}
				time.Sleep(time.Millisecond)
			}
			latMu.Lock()
			unseen++
			latMu.Unlock()
		}()
	}
	stopRSS := make(chan struct{})
	rssDone := make(chan []float64)
	go func() {
		var s []float64
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stopRSS:
				rssDone <- s
				return
			case <-t.C:
				if v, err := status(pid, "VmRSS"); err == nil {
					s = append(s, v)
				}
			}
		}
	}()
	start := time.Now()
	done, err := p.do(map[string]any{"op": "bench_run", "pub": id}, sample)
	if err != nil {
		return res, err
	}
	wg.Wait()
	window := time.Since(start).Seconds()
	cpu1, err := cpuTicks(pid)
	if err != nil {
		return res, err
	}
	close(stopRSS)
	rss := <-rssDone
	hwm, _ := status(pid, "VmHWM")

	res.Events = int(done["block_events"].(float64))
	res.Seconds = window
	res.CPUPercent = float64(cpu1-cpu0) / clkTck / window * 100
	res.RSSMiB = mean(rss) / 1024
	res.PeakRSSMiB = hwm / 1024
	sort.Float64s(lat)
	res.Samples, res.Unseen = len(lat), unseen
	res.P50, res.P99 = quantile(lat, 0.50), quantile(lat, 0.99)
	if len(lat) > 0 {
		res.Max = lat[len(lat)-1]
	}
	// The end state: the index holds what the pool holds.
	cnt, err := p.do(map[string]any{"op": "count", "pub": id}, nil)
	if err != nil {
		return res, err
	}
	want := uint64(cnt["held"].(float64))
	res.Equal = waitCount(q, ref, func(n uint64) bool { return n == want }) == nil
	if s, err := q.Participation(context.Background(), &pb.ParticipationRequest{CacheBackend: ref}); err == nil {
		res.IndexLagP50, res.IndexLagP99 = s.GetLagP50Millis(), s.GetLagP99Millis()
	}
	// The subscriber's counters summed over their labels.
	m := map[string]float64{}
	for k, v := range fixture.SubscriberMetrics(http.DefaultClient, httpAddr) {
		name, _, _ := strings.Cut(k, "{")
		m[name] += v
	}
	res.Dropped = m["dropped_total"]
	res.Gaps = m["sequence_gaps_total"]
	return res, nil
}

const clkTck = 100 // USER_HZ on Linux

// cpuTicks is utime+stime of pid, in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command (which may hold spaces) start after ")".
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.ParseUint(f[11], 10, 64) // field 14
	s, _ := strconv.ParseUint(f[12], 10, 64) // field 15
	return u + s, nil
}

// status reads a kB field of /proc/pid/status.
func status(pid int, field string) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`(?m)^` + field + `:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no %s", field)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

func holds(q pb.QueryClient, ref *pb.CacheBackendRef, h uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := q.Score(ctx, &pb.ScoreRequest{CacheBackend: ref, Model: model, BlockHashes: []uint64{h}})
	if err != nil {
		return false
	}
	for _, p := range r.GetPods() {
		if p.GetPodName() == podName && p.GetTiers().GetGpu() >= 1 {
			return true
		}
	}
	return false
}

func waitCount(q pb.QueryClient, ref *pb.CacheBackendRef, ok func(uint64) bool) error {
	var last uint64
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s, err := q.Participation(context.Background(), &pb.ParticipationRequest{CacheBackend: ref})
		if err != nil {
			continue
		}
		for _, p := range s.GetPodList() {
			if p.GetName() == podName {
				if last = p.GetBlocks(); ok(last) {
					return nil
				}
			}
		}
	}
	return fmt.Errorf("the index counts %d blocks", last)
}

func sidecarEnv(c corev1.Container, indexAddr string) []string {
	fields := map[string]string{"metadata.name": podName, "metadata.namespace": podNS, "metadata.uid": podUID, "spec.nodeName": "node-a"}
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			v = fields[e.ValueFrom.FieldRef.FieldPath]
		case e.Name == "INDEX_ENDPOINT":
			v = indexAddr
		case e.Name == "INDEX_TOKEN_FILE":
			continue
		}
		env = append(env, e.Name+"="+v)
	}
	return env
}

func subscriberHTTP(logs string) (string, error) {
	re := regexp.MustCompile(`"http": ?"(127\.0\.0\.1:\d+)"`)
	for i := 0; i < 300; i++ {
		b, _ := os.ReadFile(logs)
		if m := re.FindSubmatch(b); m != nil {
			return string(m[1]), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := os.ReadFile(logs)
	return "", fmt.Errorf("the subscriber did not start:\n%s", b)
}

func waitHTTP(url string) error {
	for i := 0; i < 300; i++ {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("not healthy")
}

func mean(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// report prints the medians per rate as a Markdown table, then every run.
func report(rs []result, seconds float64) {
	byRate := map[int][]result{}
	var rates []int
	for _, r := range rs {
		if _, ok := byRate[r.Rate]; !ok {
			rates = append(rates, r.Rate)
		}
		byRate[r.Rate] = append(byRate[r.Rate], r)
	}
	col := func(rs []result, f func(result) float64) float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, f(r))
		}
		return median(v)
	}
	fmt.Printf("| block events/s (target) | achieved | sidecar CPU (%% of one core) | RSS mean | VmHWM | event→index p50 | p99 | index's own lag p50 / p99 | runs |\n")
	fmt.Printf("|---|---|---|---|---|---|---|---|---|\n")
	for _, rate := range rates {
		g := byRate[rate]
		fmt.Printf("| %d | %.0f | %.1f | %.1f MiB | %.1f MiB | %.1f ms | %.1f ms | %.0f / %.0f ms | %d × %.0f s |\n", rate,
			col(g, func(r result) float64 { return float64(r.Events) / r.Seconds }),
			col(g, func(r result) float64 { return r.CPUPercent }),
			col(g, func(r result) float64 { return r.RSSMiB }),
			col(g, func(r result) float64 { return r.PeakRSSMiB }),
			col(g, func(r result) float64 { return r.P50 }),
			col(g, func(r result) float64 { return r.P99 }),
			col(g, func(r result) float64 { return float64(r.IndexLagP50) }),
			col(g, func(r result) float64 { return float64(r.IndexLagP99) }),
			len(g), seconds)
	}
	fmt.Println()
	fmt.Println("| rate | run | events | CPU % | RSS MiB | HWM MiB | p50 ms | p99 ms | max ms | samples (unseen) | index equal | dropped | gaps |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rs {
		fmt.Printf("| %d | %d | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %d (%d) | %v | %.0f | %.0f |\n", r.Rate, r.Rep, r.Events,
			r.CPUPercent, r.RSSMiB, r.PeakRSSMiB, r.P50, r.P99, r.Max, r.Samples, r.Unseen, r.Equal, r.Dropped, r.Gaps)
	}
}
