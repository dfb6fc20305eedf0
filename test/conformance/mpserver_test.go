package conformance_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/validation"
	"github.com/inferencecache/operator/test/testutil"
	"github.com/inferencecache/operator/test/testutil/netns"
	"github.com/inferencecache/operator/test/testutil/pyenv"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// TestMPServerStartsWithTheRenderedCommandLine: the multiprocess-mode
// server started as a real process of the installed LMCache with exactly
// the command, arguments and env of the container the reconcile applies
// (render.MPDaemonSet of render.MPServerFor a CacheBackend's
// spec.multiprocess, which the validating webhook admits), in a network
// namespace of its own as its pod has, for each L2 shape: none, RESP
// against a real redis-server that requires a password (an ACL user; the
// credentials come from the env the Secret fills), a bounded local disk
// (fs_native), and both. fs_native takes the rendered eviction block (it
// does not log that the capacity "will NOT bound disk usage"). Each passes
// its rendered probe (run inside the pod, as the kubelet runs it) and
// serves /metrics through its metrics gate to another pod; with RESP,
// redis-server sees the server's connections authenticated as the ACL
// user, and the server's unauthenticated GET /config does not carry the
// password. Nothing of the command line is changed for the test.
func TestMPServerStartsWithTheRenderedCommandLine(t *testing.T) {
	const user, password = "lmcache", "s3cret-for-the-test"
	redisAddr := startRedisWithUser(t, user, password)
	secret := map[string]string{"username": user, "password": password}
	disk := func() *v1alpha1.MultiprocessDisk {
		// Not under /tmp: the webhook keeps the tier out of the server's
		// scratch space.
		dir, err := os.MkdirTemp("/var/tmp", "lmcache-l2-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		return &v1alpha1.MultiprocessDisk{Path: dir, Capacity: resource.MustParse("1Gi")}
	}
	for _, cell := range pyenv.Cells(t, "lmcache") {
		t.Run(cell.Env, func(t *testing.T) { testMPServerStarts(t, cell, redisAddr, secret, disk) })
	}
}

// testMPServerStarts is TestMPServerStartsWithTheRenderedCommandLine with
// the LMCache of one supported-version cell.
func testMPServerStarts(t *testing.T, cell pyenv.Cell, redisAddr string, secret map[string]string, disk func() *v1alpha1.MultiprocessDisk) {
	const user, password = "lmcache", "s3cret-for-the-test"
	for _, tc := range []struct {
		name string
		l2   *v1alpha1.MultiprocessL2
	}{
		{"l1 only", nil},
		{"resp with a password", &v1alpha1.MultiprocessL2{RESP: respTier(t, redisAddr)}},
		{"local disk", &v1alpha1.MultiprocessL2{Disk: disk()}},
		{"resp and local disk", &v1alpha1.MultiprocessL2{RESP: respTier(t, redisAddr), Disk: disk()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := mpBackend(tc.l2)
			require.Empty(t, validation.Validate(cb), "the validating webhook admits the backend")
			pod := startMPPodIn(t, cell.Env, cb, secret, redisAddr, nil, nil)
			pod.requireMetrics(t)

			if pod.s.RESP != nil {
				testutil.Eventually(t, 60*time.Second, func() error {
					n, err := clientsOf(redisAddr, user, password)
					if err != nil {
						return err
					}
					if n == 0 {
						return fmt.Errorf("no connection authenticated as %s yet", user)
					}
					return nil
				})
				code, body := pod.getInside(t, "/config")
				require.Equal(t, http.StatusOK, code, "the admin API answers inside the pod")
				assert.NotContains(t, body, password, "the unauthenticated /config carries no credential")
			}
			if pod.s.Disk != nil {
				// fs_native's own warning when max_capacity_gb has no
				// eviction block to enforce it (fs_native_l2_adapter.py).
				assert.NotContains(t, pod.server.out.String(), "will NOT bound disk usage", "the disk tier is bounded")
			}
			require.False(t, pod.server.exited(), "the server keeps running:\n%s", tail(pod.server.out.String(), 4000))
		})
	}
}

// TestMPServerAdminAPIIsPodLocal (issue 35, high): LMCache's HTTP port is
// its unauthenticated admin API. GET /env returns the whole process
// environment, LMCACHE_RESP_PASSWORD included (LMCache reads the RESP
// password from the adapter's JSON, which GET /config echoes, or from that
// env var, and from nowhere else), and other routes clear, reconfigure or
// set quotas on the cache. The rendered pod, run in a network namespace
// of its own with exactly its containers' command lines, and reached from
// a second namespace (another pod, over a veth pair) at its pod IP: no
// route but GET /metrics answers there, and no answer carries the
// password; the ZMQ port still accepts the engines' connections; inside
// the pod the admin API is there, and /env does carry the password (so
// this test would see it if it were reachable). Before the fix, --http-host
// 0.0.0.0 served /env to the second namespace.
//
// It runs against every supported LMCache (pyenv.Cells).
func TestMPServerAdminAPIIsPodLocal(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "lmcache") {
		t.Run(cell.Env, func(t *testing.T) { testMPAdminAPI(t, cell) })
	}
}

func testMPAdminAPI(t *testing.T, cell pyenv.Cell) {
	const user, password = "lmcache", "s3cret-for-the-admin-test"
	redisAddr := startRedisWithUser(t, user, password)
	cb := mpBackend(&v1alpha1.MultiprocessL2{RESP: respTier(t, redisAddr)})
	require.Empty(t, validation.Validate(cb))
	pod := startMPPodIn(t, cell.Env, cb, map[string]string{"username": user, "password": password}, redisAddr, nil, nil)

	code, body := pod.getInside(t, "/env")
	require.Equal(t, http.StatusOK, code, "inside the pod the admin API answers")
	require.Contains(t, body, password, "LMCache's /env does expose the password: it must not be reachable from another pod")

	client := pod.peerClient()
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/env"}, {http.MethodGet, "/config"}, {http.MethodGet, "/status"},
		{http.MethodGet, "/"}, {http.MethodGet, "/healthcheck"}, {http.MethodGet, "/env?x=/metrics"},
		{http.MethodPost, "/metrics/reset"}, {http.MethodPost, "/run_script"},
		{http.MethodPost, "/cache/clear"}, {http.MethodPost, "/reconfigure"}, {http.MethodPut, "/metrics"},
		{http.MethodDelete, "/metrics"},
	} {
		req, err := http.NewRequest(tc.method, fmt.Sprintf("http://%s:%d%s", pod.ip, pod.s.HTTPPort, tc.path), strings.NewReader("{}"))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		require.NoError(t, err, "%s %s: the gate answers (the port is the gate's)", tc.method, tc.path)
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		assert.Contains(t, []int{http.StatusNotFound, http.StatusNotImplemented}, resp.StatusCode, "%s %s from another pod: %s", tc.method, tc.path, b)
		assert.NotContains(t, string(b), password, "%s %s", tc.method, tc.path)
		assert.NotContains(t, string(b), "LMCACHE_", "%s %s", tc.method, tc.path)
	}
	code, _ = pod.getInside(t, "/healthcheck")
	require.Equal(t, http.StatusOK, code, "no request from the other pod reached the server's admin API")

	conn, err := pod.peer.Dial(context.Background(), "tcp", net.JoinHostPort(pod.ip, strconv.Itoa(int(pod.s.Port))))
	require.NoError(t, err, "the engines still reach the ZMQ port")
	_ = conn.Close()
	pod.requireMetrics(t)
}

// respTier is an L2 RESP tier at the redis-server at addr with the
// credentials of Secret redis-auth.
func respTier(t *testing.T, addr string) *v1alpha1.MultiprocessRESP {
	t.Helper()
	host, portText, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	port, err := strconv.Atoi(portText)
	require.NoError(t, err)
	return &v1alpha1.MultiprocessRESP{Host: host, Port: int32(port), Capacity: resource.MustParse("1Gi"),
		CredentialsSecretRef: &v1alpha1.RESPCredentials{Name: "redis-auth", UsernameKey: "username", PasswordKey: "password"}}
}

// mpPod is render.MPDaemonSet's pod for a CacheBackend, run as its
// containers: the server and its metrics gate in a network namespace of
// their own (ns, pod IP ip), reached from a second one (peer, another pod
// of the node) over a veth pair, as the kubelet and Prometheus reach a
// pod.
type mpPod struct {
	s            render.MPServer
	spec         *corev1ac.PodSpecApplyConfiguration
	ns, peer     *netns.NS
	ip           string
	server, gate *server
	pyEnv        string // the Python environment its containers run from
}

// startMPPodIn starts cb's MP server pod, its containers run from the
// Python environment pyEnv (a supported-version cell), and waits until
// its rendered startup probe passes. secret fills the env the Secret
// would; redisAddr, if not "", is the host's redis-server, made reachable
// inside the pod at the same address; wrap (nil: none) runs a command as
// the pod's user, with env as its base environment.
func startMPPodIn(t *testing.T, pyEnv string, cb *v1alpha1.CacheBackend, secret map[string]string, redisAddr string, wrap func(argv ...string) *exec.Cmd, env []string) *mpPod {
	t.Helper()
	scratch := "" // the pod user's process has a fresh /tmp of its own
	if wrap == nil {
		wrap = func(argv ...string) *exec.Cmd { return exec.Command(argv[0], argv[1:]...) }
		env, scratch = pyenv.Env(), t.TempDir()
	}
	p := &mpPod{s: render.MPServerFor(cb), pyEnv: pyEnv}
	p.spec = render.MPDaemonSet(cb, p.s).Spec.Template.Spec
	p.ns, p.peer = netns.New(t), netns.New(t)
	p.ip, _ = netns.Link(t, p.ns, p.peer)
	if redisAddr != "" {
		p.ns.ForwardInto(t, redisAddr)
	}
	c := p.spec.Containers[0]
	require.Equal(t, render.MPServerCommand, c.Command)
	// The console script run by the environment's interpreter, as its
	// shebang would.
	cmd := wrap(append([]string{pyenv.Python(t, pyEnv), pyenv.Bin(t, pyEnv, c.Command[0])}, append(c.Command[1:], c.Args...)...)...)
	cmd.Env = append(append([]string{}, env...), containerEnv(t, c.Env, secret, "", scratch)...)
	p.ns.Enter(t, cmd)
	p.server = startCmd(t, int(p.s.Port), cmd)
	for _, g := range p.spec.InitContainers {
		require.Equal(t, "metrics-gate", *g.Name)
		require.Equal(t, "python3", g.Command[0])
		cmd := wrap(append([]string{pyenv.Python(t, pyEnv)}, append(g.Command[1:], g.Args...)...)...)
		cmd.Env = append(append([]string{}, env...), containerEnv(t, g.Env, secret, p.ip, scratch)...)
		p.ns.Enter(t, cmd)
		p.gate = startCmd(t, int(p.s.HTTPPort), cmd)
	}
	took := p.waitProbe(t, wrap, env, c.StartupProbe)
	t.Logf("lmcache server %s passed its startup probe after %s", strings.Join(c.Args, " "), took.Round(100*time.Millisecond))
	return p
}

// containerEnv is a container's env as the kubelet would set it: literal
// values, Secret keys from secret, the pod's IP for status.podIP, and
// NUMBA_CACHE_DIR in scratch (the pod's scratch emptyDir; "": as
// rendered, for a process that has its own).
func containerEnv(t *testing.T, env []corev1ac.EnvVarApplyConfiguration, secret map[string]string, podIP, scratch string) []string {
	t.Helper()
	var out []string
	for _, e := range env {
		switch {
		case e.Name == nil:
			t.Fatal("an env var without a name")
		case *e.Name == "NUMBA_CACHE_DIR" && scratch != "":
			out = append(out, *e.Name+"="+filepath.Join(scratch, "numba"))
		case e.Value != nil:
			out = append(out, *e.Name+"="+*e.Value)
		case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
			require.Equal(t, "redis-auth", *e.ValueFrom.SecretKeyRef.Name)
			out = append(out, *e.Name+"="+secret[*e.ValueFrom.SecretKeyRef.Key])
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && *e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			require.NotEmpty(t, podIP, "%s: the pod's IP", *e.Name)
			out = append(out, *e.Name+"="+podIP)
		default:
			t.Fatalf("env %s has neither a value, a Secret key nor the pod's IP", *e.Name)
		}
	}
	return out
}

// waitProbe runs probe as the kubelet would (an exec probe inside the
// pod, as its user; an HTTP probe from outside the pod, at its IP) until
// it passes, and fails the test with the server's output when the server
// exits first or the probe never passes within serverStartTimeout.
func (p *mpPod) waitProbe(t *testing.T, wrap func(argv ...string) *exec.Cmd, env []string, probe *corev1ac.ProbeApplyConfiguration) time.Duration {
	t.Helper()
	require.NotNil(t, probe)
	start := time.Now()
	var last string
	for {
		if p.server.exited() {
			t.Fatalf("lmcache server %q exited before its probe passed (%v):\n%s", p.server.cmd.Args, p.server.err, tail(p.server.out.String(), 4000))
		}
		switch {
		case probe.Exec != nil:
			argv := append([]string{}, probe.Exec.Command...)
			require.Equal(t, "python3", argv[0], "the probe runs the image's python3")
			argv[0] = pyenv.Python(t, p.pyEnv)
			cmd := wrap(argv...)
			cmd.Env = env
			p.ns.Enter(t, cmd)
			out, err := cmd.CombinedOutput()
			if err == nil {
				return time.Since(start)
			}
			last = fmt.Sprintf("%v: %s", err, tail(string(out), 400))
		case probe.HTTPGet != nil:
			code, _ := p.peerGet(t, fmt.Sprintf("http://%s:%d%s", p.ip, probe.HTTPGet.Port.IntValue(), *probe.HTTPGet.Path))
			if code == http.StatusOK {
				return time.Since(start)
			}
			last = fmt.Sprintf("HTTP %d", code)
		default:
			t.Fatal("a probe that is neither exec nor HTTP")
		}
		if time.Since(start) > serverStartTimeout {
			t.Fatalf("lmcache server %q: its probe did not pass within %s (last: %s):\n%s", p.server.cmd.Args, serverStartTimeout, last, tail(p.server.out.String(), 4000))
		}
		time.Sleep(time.Second)
	}
}

// peerClient is an HTTP client in the second namespace (another pod).
func (p *mpPod) peerClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: p.peer.Dial, DisableKeepAlives: true}}
}

func (p *mpPod) peerGet(t *testing.T, url string) (int, string) {
	t.Helper()
	r, err := p.peerClient().Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// getInside GETs path from the server's loopback HTTP port, inside the
// pod.
func (p *mpPod) getInside(t *testing.T, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: p.ns.Dial, DisableKeepAlives: true}}
	r, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", p.s.HTTPPort, path))
	require.NoError(t, err)
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// requireMetrics: the port named render.MPHTTPPortName (the one the
// monitoring component's PodMonitor scrapes), at the pod's IP from
// another pod, serves LMCache's MP series on render.MPMetricsPath in a
// text format Prometheus' promtool accepts, and no series carries a
// namespace or pod label of its own (so the PodMonitor keeps the
// target's, without honorLabels).
func (p *mpPod) requireMetrics(t *testing.T) {
	t.Helper()
	var port int32
	for _, c := range append(append([]corev1ac.ContainerApplyConfiguration{}, p.spec.InitContainers...), p.spec.Containers...) {
		for _, cp := range c.Ports {
			if *cp.Name == render.MPHTTPPortName {
				port = *cp.ContainerPort
			}
		}
	}
	require.Equal(t, p.s.HTTPPort, port, "a container of the pod has the port named %q", render.MPHTTPPortName)
	var code int
	var body string
	testutil.Eventually(t, 30*time.Second, func() error {
		code, body = p.peerGet(t, fmt.Sprintf("http://%s:%d%s", p.ip, port, render.MPMetricsPath))
		if code != http.StatusOK {
			return fmt.Errorf("GET %s from another pod: %d %s", render.MPMetricsPath, code, tail(body, 400))
		}
		return nil
	})
	assert.Contains(t, body, "lmcache_mp_l1_memory_usage_bytes")
	_, err := os.Stat(promtool)
	require.NoError(t, err, "promtool comes from Debian's prometheus package: run `make packages` (test/tools/install-packages.sh)")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		assert.NotRegexp(t, `[{,](namespace|pod)="`, line)
	}
}

// mpBackend is a multiprocess CacheBackend with a 1 GiB L1 (LRU, the
// CRD's default watermark and ratio) and l2.
func mpBackend(l2 *v1alpha1.MultiprocessL2) *v1alpha1.CacheBackend {
	return &v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Name: "cache", Namespace: "llm", UID: "00000000-0000-0000-0000-000000000001"},
		Spec: v1alpha1.CacheBackendSpec{
			Type: v1alpha1.BackendTypeLMCache, Runtime: v1alpha1.RuntimeVLLM,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": "engine"}},
			Multiprocess: &v1alpha1.Multiprocess{Port: 5555, HTTPPort: 8080,
				L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi"), EvictionPolicy: v1alpha1.MPEvictionLRU, EvictionWatermarkPercent: 80, EvictionRatioPercent: 20},
				L2: l2},
		},
	}
}

// promtool is Debian's (package prometheus).
const promtool = "/usr/bin/promtool"

// startRedisWithUser runs a real redis-server whose default user needs a
// password and which has the ACL user user with password.
func startRedisWithUser(t *testing.T, user, password string) string {
	t.Helper()
	return redisserver.Start(t, "--requirepass", "not-"+password, "--user", user, "on", ">"+password, "~*", "&*", "+@all")
}

// clientsOf counts the connections to addr authenticated as user, other
// than its own.
func clientsOf(addr, user, password string) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: password})
	defer c.Close()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		return 0, err
	}
	n := -1 // this client
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(line) {
			if f == "user="+user {
				n++
			}
		}
	}
	return n, nil
}

// TestMPServerRunsAsItsPodsUser: the MP server of render.MPDaemonSet runs
// as its pod's hardened identity (user and group 65532, no capabilities,
// no_new_privs, HOME "/", its environment read-only, a fresh /tmp; see
// TestManagedServerRunsAsItsPodsUser) with its container's command line
// and env, and answers its probe.
func TestMPServerRunsAsItsPodsUser(t *testing.T) {
	for _, cell := range pyenv.Cells(t, "lmcache") {
		t.Run(cell.Env, func(t *testing.T) { testMPServerAsPodUser(t, cell) })
	}
}

func testMPServerAsPodUser(t *testing.T, cell pyenv.Cell) {
	cb := mpBackend(nil)
	spec := render.MPDaemonSet(cb, render.MPServerFor(cb)).Spec.Template.Spec
	wrap, env, _, _ := asPodUserIn(t, spec, cell.Env)
	pod := startMPPodIn(t, cell.Env, cb, nil, "", wrap, env)
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pod.server.cmd.Process.Pid), "status"))
	require.NoError(t, err)
	f := procStatus(string(status))
	t.Logf("lmcache server healthy as Uid %s, CapEff %s, NoNewPrivs %s", f["Uid"], f["CapEff"], f["NoNewPrivs"])
	assert.NotEqual(t, "0", strings.Fields(f["Uid"])[0], "not root")
	status, err = os.ReadFile(filepath.Join("/proc", strconv.Itoa(pod.gate.cmd.Process.Pid), "status"))
	require.NoError(t, err)
	assert.NotEqual(t, "0", strings.Fields(procStatus(string(status))["Uid"])[0], "the metrics gate is not root either")
	pod.requireMetrics(t)
}
