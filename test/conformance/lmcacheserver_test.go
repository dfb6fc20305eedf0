package conformance_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/controller"
	"github.com/inferencecache/operator/internal/engineversion"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/test/testutil/freeport"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// The managed server, run for real: every server shape the CRD admits is
// rendered by render.Render, the code the controller applies with, and the
// server container's exact command and arguments are started as a process
// of the installed LMCache (pyenv's vllm environment, the lmcache version
// of tested-versions.txt). The controller's functional probe and the
// container's exec probe (the script render puts in the pod) must pass
// against it and fail against a port that accepts and says nothing.

// serverShape is one CacheBackend whose server the operator runs.
type serverShape struct {
	name string
	cb   *v1alpha1.CacheBackend
}

// serverShapes are the server shapes the CRD admits, crossed over every
// field that reaches the server container or its workload: the workload
// kind, storage (none, a ReadWriteOnce and a ReadWriteMany claim), the port
// (default and another), and the replica shapes (spec replicas, an HPA).
// Image and resources change no argument.
func serverShapes() []serverShape {
	var shapes []serverShape
	for _, kind := range []v1alpha1.DeploymentKind{v1alpha1.DeploymentKindDeployment, v1alpha1.DeploymentKindStatefulSet} {
		for _, storage := range []string{"no-storage", "pvc-rwo", "pvc-rwx"} {
			for _, port := range []int32{0, 7000} {
				for _, scale := range []string{"one", "replicas-3", "hpa"} {
					cb := &v1alpha1.CacheBackend{
						ObjectMeta: metav1.ObjectMeta{Namespace: caseNamespace, Name: "cache", UID: types.UID("uid-cache")},
						Spec: v1alpha1.CacheBackendSpec{
							Runtime: v1alpha1.RuntimeVLLM, Type: v1alpha1.BackendTypeLMCache, DeploymentKind: kind,
							EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": caseLabel}},
							RemoteStorage:  &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Port: port}},
						},
					}
					switch storage {
					case "pvc-rwo":
						cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("10Gi")}}
					case "pvc-rwx":
						cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("10Gi"),
							AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}}}
					}
					switch scale {
					case "replicas-3":
						cb.Spec.RemoteStorage.LMCacheServer.Replicas = ptr.To[int32](3)
					case "hpa":
						cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 4}
					}
					shapes = append(shapes, serverShape{fmt.Sprintf("%s/%s/port-%d/%s", kind, storage, topology.Port(cb), scale), cb})
				}
			}
		}
	}
	return shapes
}

// serverContainer is the cache-server container of the rendered workload.
func serverContainer(t *testing.T, cb *v1alpha1.CacheBackend) *corev1ac.ContainerApplyConfiguration {
	t.Helper()
	c := render.Render(cb)
	var spec *corev1ac.PodSpecApplyConfiguration
	switch {
	case c.Deployment != nil:
		spec = c.Deployment.Spec.Template.Spec
	case c.StatefulSet != nil:
		spec = c.StatefulSet.Spec.Template.Spec
	default:
		t.Fatalf("%s renders no workload", cb.Name)
	}
	require.Len(t, spec.Containers, 1)
	return &spec.Containers[0]
}

// commandLine is what a container runs: command then args.
func commandLine(c *corev1ac.ContainerApplyConfiguration) []string {
	return append(append([]string{}, c.Command...), c.Args...)
}

// localArgs are a rendered lmcache_server command line as the test runs it:
// the command resolved in the environment, the listen host 0.0.0.0 replaced
// by 127.0.0.1 (tests reach only the loopback) and the rendered port by a
// free one; every other argument exactly as rendered.
func localArgs(t *testing.T, line []string, renderedPort int32, port int) (string, []string) {
	t.Helper()
	require.GreaterOrEqual(t, len(line), 3, "lmcache_server <host> <port> ...: %q", line)
	require.Equal(t, render.ServerCommand, line[0])
	require.Equal(t, "0.0.0.0", line[1], "the server listens on every address of the pod")
	require.Equal(t, strconv.Itoa(int(renderedPort)), line[2], "the server listens on the spec's port")
	args := append([]string{"127.0.0.1", strconv.Itoa(port)}, line[3:]...)
	return pyenv.Bin(t, pyenv.VLLM, line[0]), args
}

// server is a running lmcache_server process.
type server struct {
	port int
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer starts bin args; Stop (also at cleanup) kills it.
func startServer(t *testing.T, port int, bin string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = pyenv.Env()
	return startCmd(t, port, cmd)
}

// startCmd starts cmd, a server that listens on port; Stop (also at
// cleanup) kills it.
func startCmd(t *testing.T, port int, cmd *exec.Cmd) *server {
	t.Helper()
	s := &server{port: port, out: &syncBuffer{}, done: make(chan struct{}), cmd: cmd}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	require.NoError(t, s.cmd.Start())
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *server) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	<-s.done
}

func (s *server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// serverStartTimeout bounds an lmcache_server start (it imports torch; on
// two busy cores a cold start took about a minute).
const serverStartTimeout = 3 * time.Minute

// goProbe runs the controller's functional probe for cb, its connection
// sent to 127.0.0.1:port instead of the Service's name.
func goProbe(cb *v1alpha1.CacheBackend, port int, timeout time.Duration) error {
	p := &controller.Prober{Interval: 0, Timeout: timeout,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		}}
	err, _ := p.Check(context.Background(), cb)
	return err
}

// waitServing waits until the Go probe passes against s; a server that
// exits first fails the test with its output.
func waitServing(t *testing.T, cb *v1alpha1.CacheBackend, s *server) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if s.exited() {
			t.Fatalf("lmcache_server %q exited before it answered HEALTH (%v):\n%s", s.cmd.Args, s.err, tail(s.out.String(), 4000))
		}
		if goProbe(cb, s.port, time.Second) == nil {
			return time.Since(start)
		}
		if time.Since(start) > serverStartTimeout {
			t.Fatalf("lmcache_server %q did not answer HEALTH within %s:\n%s", s.cmd.Args, serverStartTimeout, tail(s.out.String(), 4000))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// execProbe runs the container's exec probe as the kubelet would, with the
// environment's python standing for the image's python3 and the rendered
// port replaced by port; it returns the output and the exit error (nil for
// exit 0), within the probe's timeoutSeconds.
func execProbe(t *testing.T, probe *corev1ac.ProbeApplyConfiguration, renderedPort int32, port int) (string, error) {
	t.Helper()
	require.NotNil(t, probe.Exec, "an exec probe")
	argv := append([]string{}, probe.Exec.Command...)
	require.Equal(t, "python3", argv[0], "the image's own python3")
	require.Equal(t, strconv.Itoa(int(renderedPort)), argv[len(argv)-1], "the port is the last argument")
	argv[0] = pyenv.Python(t, pyenv.VLLM)
	argv[len(argv)-1] = strconv.Itoa(port)
	require.NotNil(t, probe.TimeoutSeconds)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*probe.TimeoutSeconds)*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = pyenv.Env()
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return string(out), fmt.Errorf("the probe outlived its timeoutSeconds (%d): %w", *probe.TimeoutSeconds, ctx.Err())
	}
	return string(out), err
}

// silentListener accepts connections on 127.0.0.1 and never answers.
func silentListener(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// TestManagedServerStartsAndAnswersHealth: every server shape the CRD
// admits passes the validating webhook's rules, renders a command line the
// real lmcache_server starts with, and is then Ready by both probes: the
// controller's (Go, lmcacheproto.Health) and the container's (the exec
// probe's script under the environment's python). Against a listener that
// accepts and says nothing both fail. Shapes that render the same command
// line and probe share one server process (the rendered strings are the
// key; each shape's own controller probe still runs); before the device fix
// every shape with storage rendered `... /data`, and its server exited with
// "Unsupported device: /data".
func TestManagedServerStartsAndAnswersHealth(t *testing.T) {
	type group struct {
		line   []string
		probe  *corev1ac.ProbeApplyConfiguration
		shapes []serverShape
	}
	groups := map[string]*group{}
	var order []string
	shapes := serverShapes()
	for _, s := range shapes {
		require.Empty(t, validation.Validate(s.cb), "%s is admitted", s.name)
		c := serverContainer(t, s.cb)
		require.NotNil(t, c.ReadinessProbe, s.name)
		require.NotNil(t, c.LivenessProbe, s.name)
		require.NotNil(t, c.ReadinessProbe.Exec, "%s: an exec probe", s.name)
		assert.Equal(t, c.ReadinessProbe.Exec, c.LivenessProbe.Exec, "%s: readiness and liveness make the same exchange", s.name)
		line := commandLine(c)
		key := strings.Join(line, "\x00") + "\x00\x00" + strings.Join(c.ReadinessProbe.Exec.Command, "\x00")
		if groups[key] == nil {
			groups[key] = &group{line: line, probe: c.ReadinessProbe}
			order = append(order, key)
		}
		groups[key].shapes = append(groups[key].shapes, s)
	}
	t.Logf("%d shapes render %d distinct command lines and probes", len(shapes), len(groups))

	for _, key := range order {
		g := groups[key]
		cb := g.shapes[0].cb
		t.Run(strings.Join(g.line, " "), func(t *testing.T) {
			port := freeport.MustTake(t)
			bin, args := localArgs(t, g.line, topology.Port(cb), port)
			srv := startServer(t, port, bin, args...)
			took := waitServing(t, cb, srv)
			t.Logf("lmcache_server %s answered HEALTH after %s (shapes: %s)", strings.Join(args, " "), took.Round(100*time.Millisecond), shapeNames(g.shapes))
			for _, s := range g.shapes {
				require.NoError(t, goProbe(s.cb, port, 3*time.Second), "%s: the controller's probe", s.name)
			}
			out, err := execProbe(t, g.probe, topology.Port(cb), port)
			require.NoError(t, err, "the container's exec probe: %s", out)

			silent := silentListener(t)
			err = goProbe(cb, silent, time.Second)
			require.Error(t, err, "the controller's probe passes a port that says nothing")
			assert.Contains(t, err.Error(), "i/o timeout")
			out, err = execProbe(t, g.probe, topology.Port(cb), silent)
			require.Error(t, err, "the container's exec probe passes a port that says nothing")
			assert.Contains(t, out, "lmcache_server HEALTH: TimeoutError")
			require.False(t, srv.exited(), "the server keeps running:\n%s", srv.out.String())
		})
	}
}

func shapeNames(shapes []serverShape) string {
	names := make([]string, len(shapes))
	for i, s := range shapes {
		names[i] = s.name
	}
	return strings.Join(names, ", ")
}

// TestLMCacheServerRefusesWhatTheWebhookRefuses: the real server exits
// non-zero on what the operator rendered before (device /data for
// storage, or extraArgs after the device), which is why render passes
// device cpu and the webhook refuses extraArgs with its field path.
func TestLMCacheServerRefusesWhatTheWebhookRefuses(t *testing.T) {
	cb := serverShapes()[0].cb.DeepCopy()
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	line := commandLine(serverContainer(t, cb))

	withExtra := cb.DeepCopy()
	withExtra.Spec.RemoteStorage.LMCacheServer.ExtraArgs = []string{"--verbose"}
	errs := validation.Validate(withExtra)
	require.Len(t, errs, 1)
	assert.Equal(t, "spec.remoteStorage.lmCacheServer.extraArgs", errs[0].Field)
	assert.Equal(t, line, commandLine(serverContainer(t, withExtra)), "a stored extraArgs is not rendered")

	for _, tc := range []struct {
		name string
		// old turns the rendered command line into what was rendered before.
		old  func([]string) []string
		want string
	}{
		{"storage rendered device /data", func(l []string) []string { return append(l[:3:3], "/data") }, "Unsupported device: /data"},
		{"extraArgs appended after the device", func(l []string) []string { return append(append([]string{}, l...), "--verbose") }, "Usage:"},
		{"extraArgs with storage", func(l []string) []string { return append(l[:3:3], "/data", "--verbose") }, "Usage:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freeport.MustTake(t)
			bin, args := localArgs(t, tc.old(line), topology.Port(cb), port)
			srv := startServer(t, port, bin, args...)
			select {
			case <-srv.done:
			case <-time.After(serverStartTimeout):
				t.Fatalf("lmcache_server %q still runs", args)
			}
			var exit *exec.ExitError
			require.ErrorAs(t, srv.err, &exit, "lmcache_server %q must fail:\n%s", args, srv.out.String())
			assert.NotZero(t, exit.ExitCode())
			assert.Contains(t, srv.out.String(), tc.want)
		})
	}
}

// TestLMCacheServerKeepsKVInMemoryOnly: a chunk PUT through LMCache's own
// protocol classes is stored and read back from the running server, with
// the rendered command line of a shape with storage; after the process
// restarts (the same command line, as the kubelet restarts a container) the
// chunk is gone. lmcache_server 0.5 does not persist: the claim mounted at
// /data is not written, which the API, the examples and the docs say.
func TestLMCacheServerKeepsKVInMemoryOnly(t *testing.T) {
	cb := serverShapes()[0].cb.DeepCopy()
	cb.Spec.DeploymentKind = v1alpha1.DeploymentKindStatefulSet
	cb.Spec.Storage = &v1alpha1.Storage{PVC: &v1alpha1.PVCStorage{Size: resource.MustParse("1Gi")}}
	require.Empty(t, validation.Validate(cb))
	assert.Contains(t, validation.Warnings(nil, cb), validation.StorageInMemoryOnly, "the webhook says so")
	line := commandLine(serverContainer(t, cb))
	port := freeport.MustTake(t)
	bin, args := localArgs(t, line, topology.Port(cb), port)
	// The server runs in a folder of its own: it writes nothing there either.
	dir := t.TempDir()
	start := func() *server {
		s := &server{port: port, out: &syncBuffer{}, done: make(chan struct{})}
		s.cmd = exec.Command(bin, args...)
		s.cmd.Env, s.cmd.Dir = pyenv.Env(), dir
		s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
		require.NoError(t, s.cmd.Start())
		go func() { s.err = s.cmd.Wait(); close(s.done) }()
		t.Cleanup(s.stop)
		waitServing(t, cb, s)
		return s
	}
	script := filepath.Join(pyenv.Root(t), "test", "conformance", "py", "lmcache_server.py")
	type answer struct {
		Exist   bool `json:"exist"`
		GetCode int  `json:"get_code"`
		Equal   bool `json:"equal"`
		Length  int  `json:"length"`
	}

	srv := start()
	var got answer
	pyenv.RunJSON(t, pyenv.VLLM, script, map[string]any{"op": "put_get", "port": port}, &got)
	assert.Equal(t, answer{Exist: true, GetCode: int(lmcacheproto.CodeSuccess), Equal: true, Length: 4096}, got, "the running server stores the chunk")
	got = answer{}
	pyenv.RunJSON(t, pyenv.VLLM, script, map[string]any{"op": "get", "port": port}, &got)
	assert.Equal(t, answer{Exist: true, GetCode: int(lmcacheproto.CodeSuccess), Equal: true, Length: 4096}, got, "and serves it on another connection")

	srv.stop()
	start()
	got = answer{}
	pyenv.RunJSON(t, pyenv.VLLM, script, map[string]any{"op": "get", "port": port}, &got)
	assert.Equal(t, answer{Exist: false, GetCode: int(lmcacheproto.CodeFail)}, got, "a restarted lmcache_server starts empty")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, entries, "the server wrote nothing to its folder")
}

// TestHealthBytesAreLMCaches: the header the probes send is the one
// LMCache's own ClientMetaMessage serializes for HEALTH with ProbeKey, and
// LMCache's deserializer (what the server runs on it) reads command HEALTH
// and the key back; the sizes and codes are LMCache's.
func TestHealthBytesAreLMCaches(t *testing.T) {
	var got struct {
		Command    string `json:"command"`
		Key        string `json:"key"`
		Length     int    `json:"length"`
		OwnHex     string `json:"own_hex"`
		HeaderSize int    `json:"header_size"`
		ReplySize  int    `json:"reply_size"`
		Health     int32  `json:"health"`
		Success    int32  `json:"success"`
		Fail       int32  `json:"fail"`
	}
	script := filepath.Join(pyenv.Root(t), "test", "conformance", "py", "lmcache_server.py")
	pyenv.RunJSON(t, pyenv.VLLM, script, map[string]any{"op": "protocol", "health_hex": hex.EncodeToString(lmcacheproto.HealthRequest()), "key": lmcacheproto.ProbeKey}, &got)
	assert.Equal(t, "HEALTH", got.Command)
	assert.Equal(t, lmcacheproto.ProbeKey, got.Key)
	assert.Zero(t, got.Length)
	assert.Equal(t, hex.EncodeToString(lmcacheproto.HealthRequest()), got.OwnHex, "LMCache's own serialization of the request")
	assert.Equal(t, lmcacheproto.HeaderSize, got.HeaderSize)
	assert.Equal(t, lmcacheproto.ReplySize, got.ReplySize)
	assert.Equal(t, lmcacheproto.CommandHealth, got.Health)
	assert.Equal(t, lmcacheproto.CodeSuccess, got.Success)
	assert.Equal(t, lmcacheproto.CodeFail, got.Fail)
}

// TestDefaultImageIsTheTestedLMCache: the server image the CRD defaults to
// (and render, for a spec without one) is lmcache/vllm-openai tagged with
// the newest LMCache of the supported-version cells (tested-versions.txt)
// that still ships lmcache_server: the default shape is the in-process
// server, which LMCache 0.5.7 removed.
func TestDefaultImageIsTheTestedLMCache(t *testing.T) {
	root := pyenv.Root(t)
	var lmcache string
	var newest engineversion.Version
	for _, cell := range pyenv.Cells(t, "lmcache") {
		v := engineversion.MustParse(cell.LMCache())
		if v.AtLeast(validation.InProcessServerSince) {
			continue // multiprocess mode only
		}
		if lmcache == "" || v.AtLeast(newest) {
			lmcache, newest = cell.LMCache(), v
		}
	}
	require.Regexp(t, regexp.MustCompile(`^\d+\.\d+\.\d+$`), lmcache, "a tested LMCache with lmcache_server")
	want := "lmcache/vllm-openai:v" + lmcache

	raw, err := os.ReadFile(filepath.Join(root, "kustomize", "base", "crd", "inferencecache.io_cachebackends.yaml"))
	require.NoError(t, err)
	var crd struct {
		Spec struct {
			Versions []struct {
				Name   string `json:"name"`
				Schema struct {
					OpenAPIV3Schema schemaNode `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &crd))
	require.NotEmpty(t, crd.Spec.Versions)
	for _, v := range crd.Spec.Versions {
		image := v.Schema.OpenAPIV3Schema.at(t, "spec", "remoteStorage", "lmCacheServer", "image")
		assert.Equal(t, want, image.Default, "the CRD's default image (%s)", v.Name)
	}
	assert.Equal(t, want, render.DefaultImage, "render's default image")
}

type schemaNode struct {
	Default    any                   `json:"default"`
	Properties map[string]schemaNode `json:"properties"`
}

func (n schemaNode) at(t *testing.T, path ...string) schemaNode {
	t.Helper()
	for i, p := range path {
		next, ok := n.Properties[p]
		require.True(t, ok, "the CRD schema has %s", strings.Join(path[:i+1], "."))
		n = next
	}
	return n
}
