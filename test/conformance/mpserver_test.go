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
	"github.com/inferencecache/operator/test/testutil/freeport"
	"github.com/inferencecache/operator/test/testutil/pyenv"
	"github.com/inferencecache/operator/test/testutil/redisserver"
)

// TestMPServerStartsWithTheRenderedCommandLine: the multiprocess-mode
// server started as a real process of the installed LMCache with exactly
// the command, arguments and env of the container the reconcile applies
// (render.MPDaemonSet of render.MPServerFor a CacheBackend's
// spec.multiprocess, which the validating webhook admits), for each L2
// shape: none, RESP against a real redis-server that requires a password
// (an ACL user; the credentials come from the env the Secret fills), a
// bounded local disk (fs_native), and both. fs_native takes the rendered
// eviction block (it does not log that the capacity "will NOT bound disk
// usage"). Each answers the rendered probe (GET /healthcheck on the HTTP
// port) with 200; with RESP, redis-server sees the server's connections
// authenticated as the ACL user, and the server's unauthenticated GET
// /config does not carry the password. Only the listen addresses (0.0.0.0
// to 127.0.0.1) and the two ports (to free ones) are changed for the test.
func TestMPServerStartsWithTheRenderedCommandLine(t *testing.T) {
	const user, password = "lmcache", "s3cret-for-the-test"
	redisAddr := startRedisWithUser(t, user, password)
	host, portText, err := net.SplitHostPort(redisAddr)
	require.NoError(t, err)
	redisPort, err := strconv.Atoi(portText)
	require.NoError(t, err)
	secret := map[string]string{"username": user, "password": password}
	resp := func() *v1alpha1.MultiprocessRESP {
		return &v1alpha1.MultiprocessRESP{Host: host, Port: int32(redisPort), Capacity: resource.MustParse("1Gi"),
			CredentialsSecretRef: &v1alpha1.RESPCredentials{Name: "redis-auth", UsernameKey: "username", PasswordKey: "password"}}
	}
	disk := func() *v1alpha1.MultiprocessDisk {
		// Not under /tmp: the webhook keeps the tier out of the server's
		// scratch space.
		dir, err := os.MkdirTemp("/var/tmp", "lmcache-l2-")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		return &v1alpha1.MultiprocessDisk{Path: dir, Capacity: resource.MustParse("1Gi")}
	}
	for _, tc := range []struct {
		name string
		l2   *v1alpha1.MultiprocessL2
	}{
		{"l1 only", nil},
		{"resp with a password", &v1alpha1.MultiprocessL2{RESP: resp()}},
		{"local disk", &v1alpha1.MultiprocessL2{Disk: disk()}},
		{"resp and local disk", &v1alpha1.MultiprocessL2{RESP: resp(), Disk: disk()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := mpBackend(tc.l2)
			require.Empty(t, validation.Validate(cb), "the validating webhook admits the backend")
			s := render.MPServerFor(cb)
			c := render.MPDaemonSet(cb, s).Spec.Template.Spec.Containers[0]
			require.Equal(t, render.MPServerCommand, c.Command)
			zmq, httpPort := freeport.MustTake(t), freeport.MustTake(t)
			local := localMPArgs(t, c.Args, s, zmq, httpPort)

			cmd := exec.Command(pyenv.Bin(t, pyenv.VLLM, c.Command[0]), append(c.Command[1:], local...)...)
			cmd.Env = pyenv.Env()
			for _, e := range c.Env {
				switch {
				case e.Name == nil:
					t.Fatal("an env var without a name")
				case *e.Name == "NUMBA_CACHE_DIR":
					cmd.Env = append(cmd.Env, *e.Name+"="+filepath.Join(t.TempDir(), "numba")) // the pod's scratch emptyDir
				case e.Value != nil:
					cmd.Env = append(cmd.Env, *e.Name+"="+*e.Value)
				case e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil:
					require.Equal(t, "redis-auth", *e.ValueFrom.SecretKeyRef.Name)
					cmd.Env = append(cmd.Env, *e.Name+"="+secret[*e.ValueFrom.SecretKeyRef.Key])
				default:
					t.Fatalf("env %s has neither a value nor a Secret key", *e.Name)
				}
			}
			srv := startCmd(t, zmq, cmd)

			probe := c.ReadinessProbe
			require.NotNil(t, probe.HTTPGet)
			require.Equal(t, int(s.HTTPPort), probe.HTTPGet.Port.IntValue(), "the probe asks the HTTP port")
			took := waitHealthy(t, srv, fmt.Sprintf("http://127.0.0.1:%d%s", httpPort, *probe.HTTPGet.Path))
			t.Logf("lmcache server %s healthy after %s", strings.Join(c.Args, " "), took.Round(100*time.Millisecond))
			requireMetrics(t, c, httpPort)

			if s.RESP != nil {
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
				_, body := get(fmt.Sprintf("http://127.0.0.1:%d/config", httpPort))
				assert.NotContains(t, body, password, "the unauthenticated /config carries no credential")
			}
			if s.Disk != nil {
				// fs_native's own warning when max_capacity_gb has no
				// eviction block to enforce it (fs_native_l2_adapter.py).
				assert.NotContains(t, srv.out.String(), "will NOT bound disk usage", "the disk tier is bounded")
			}
			require.False(t, srv.exited(), "the server keeps running:\n%s", tail(srv.out.String(), 4000))
		})
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

// localMPArgs are args with the listen addresses on the loopback and the
// rendered ports replaced by free ones; every other argument as rendered.
func localMPArgs(t *testing.T, args []string, s render.MPServer, zmq, httpPort int) []string {
	t.Helper()
	out := append([]string{}, args...)
	seen := map[string]bool{}
	for i := 0; i+1 < len(out); i++ {
		switch out[i] {
		case "--host", "--http-host":
			require.Equal(t, "0.0.0.0", out[i+1], "%s listens on every address of the pod", out[i])
			out[i+1] = "127.0.0.1"
		case "--port":
			require.Equal(t, strconv.Itoa(int(s.Port)), out[i+1])
			out[i+1] = strconv.Itoa(zmq)
		case "--http-port":
			require.Equal(t, strconv.Itoa(int(s.HTTPPort)), out[i+1])
			out[i+1] = strconv.Itoa(httpPort)
		default:
			continue
		}
		seen[out[i]] = true
	}
	require.Len(t, seen, 4, "both addresses and both ports are rendered: %q", args)
	return out
}

// waitHealthy waits until url (the MP server's probe) answers 200; a
// server that exits first, or is not healthy within serverStartTimeout,
// fails the test with its output.
func waitHealthy(t *testing.T, srv *server, url string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if srv.exited() {
			t.Fatalf("lmcache server %q exited before it was healthy (%v):\n%s", srv.cmd.Args, srv.err, tail(srv.out.String(), 4000))
		}
		if code, _ := get(url); code == http.StatusOK {
			return time.Since(start)
		}
		if time.Since(start) > serverStartTimeout {
			t.Fatalf("lmcache server %q not healthy within %s:\n%s", srv.cmd.Args, serverStartTimeout, tail(srv.out.String(), 4000))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// requireMetrics: the port of c named render.MPHTTPPortName (the one the
// monitoring component's PodMonitor scrapes), here at local, serves
// LMCache's MP series on render.MPMetricsPath in a text format Prometheus'
// promtool accepts, and no series carries a namespace or pod label of its
// own (so the PodMonitor keeps the target's, without honorLabels).
func requireMetrics(t *testing.T, c corev1ac.ContainerApplyConfiguration, local int) {
	t.Helper()
	var named bool
	for _, p := range c.Ports {
		named = named || (*p.Name == render.MPHTTPPortName && *p.ContainerPort == c.ReadinessProbe.HTTPGet.Port.IntVal)
	}
	require.True(t, named, "the HTTP port is named %q", render.MPHTTPPortName)
	code, body := get(fmt.Sprintf("http://127.0.0.1:%d%s", local, render.MPMetricsPath))
	require.Equal(t, http.StatusOK, code)
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

// promtool is Debian's (package prometheus).
const promtool = "/usr/bin/promtool"

func get(url string) (int, string) {
	c := &http.Client{Timeout: 3 * time.Second}
	r, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

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
	cb := mpBackend(nil)
	s := render.MPServerFor(cb)
	ds := render.MPDaemonSet(cb, s)
	spec := ds.Spec.Template.Spec
	wrap, env, _, _ := asPodUser(t, spec)
	c := spec.Containers[0]
	zmq, httpPort := freeport.MustTake(t), freeport.MustTake(t)
	args := localMPArgs(t, c.Args, s, zmq, httpPort)
	require.Equal(t, render.MPServerCommand, c.Command)
	// The console script run by the environment's interpreter, as its
	// shebang would.
	cmd := wrap(append([]string{pyenv.Python(t, pyenv.VLLM), pyenv.Bin(t, pyenv.VLLM, c.Command[0])}, append(c.Command[1:], args...)...)...)
	cmd.Env = env
	srv := startCmd(t, zmq, cmd)
	took := waitHealthy(t, srv, fmt.Sprintf("http://127.0.0.1:%d%s", httpPort, *c.ReadinessProbe.HTTPGet.Path))
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(srv.cmd.Process.Pid), "status"))
	require.NoError(t, err)
	f := procStatus(string(status))
	t.Logf("lmcache server healthy after %s as Uid %s, CapEff %s, NoNewPrivs %s", took.Round(100*time.Millisecond), f["Uid"], f["CapEff"], f["NoNewPrivs"])
	assert.NotEqual(t, "0", strings.Fields(f["Uid"])[0], "not root")
}
