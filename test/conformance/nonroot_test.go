package conformance_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"

	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/test/testutil/freeport"
	"github.com/inferencecache/operator/test/testutil/pyenv"
)

// TestManagedServerRunsAsItsPodsUser: a server the operator creates runs
// as its pod's hardened security context says (render.ServerPodDefaults):
// user and group 65532, no supplementary groups, no_new_privs
// (allowPrivilegeEscalation false), every capability dropped, and HOME "/"
// (what a container runtime gives a user the image's passwd does not
// list), the container's env and a fresh scratch space at /tmp (its
// emptyDir). The installed LMCache's lmcache_server starts so and answers
// both probes (the container's exec probe run as the same user), with its
// environment mounted read-only. Without the scratch space and
// NUMBA_CACHE_DIR it exits at import (numba finds nowhere to cache
// LMCache's kernels): what this test found first. As root (CI), the process
// is started in a private mount namespace where the folders of the Python
// environment are exposed read-only under their own paths (the per-user
// cache under /root is not readable by another user), then drops to the
// pod's identity with setpriv (util-linux); the test reads the running
// server's /proc status to see the identity took. Not as root, it runs as
// the test's own user, which is not root either.
func TestManagedServerRunsAsItsPodsUser(t *testing.T) {
	cb := serverShapes()[0].cb.DeepCopy()
	c := render.Render(cb).Deployment
	require.NotNil(t, c)
	spec := c.Spec.Template.Spec
	wrap, env, uid, gid := asPodUser(t, spec)
	line := commandLine(&spec.Containers[0])
	port := freeport.MustTake(t)
	bin, args := localArgs(t, line, topology.Port(cb), port)
	asRoot := os.Geteuid() == 0

	// The console script is run by the environment's interpreter, as its
	// shebang would.
	cmd := wrap(append([]string{pyenv.Python(t, pyenv.VLLM), bin}, args...)...)
	cmd.Env = env
	s := startCmd(t, port, cmd)
	took := waitServing(t, cb, s)

	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(s.cmd.Process.Pid), "status"))
	require.NoError(t, err)
	fields := procStatus(string(status))
	t.Logf("lmcache_server answered HEALTH after %s; its /proc status: Uid %s, Gid %s, Groups %q, CapEff %s, CapBnd %s, NoNewPrivs %s",
		took.Round(100*time.Millisecond), fields["Uid"], fields["Gid"], fields["Groups"], fields["CapEff"], fields["CapBnd"], fields["NoNewPrivs"])
	assert.NotEqual(t, "0", strings.Fields(fields["Uid"])[0], "not root")
	if asRoot {
		want := strconv.FormatInt(uid, 10)
		assert.Equal(t, []string{want, want, want, want}, strings.Fields(fields["Uid"]), "real, effective, saved and file-system user")
		want = strconv.FormatInt(gid, 10)
		assert.Equal(t, []string{want, want, want, want}, strings.Fields(fields["Gid"]))
		assert.Empty(t, fields["Groups"])
		assert.Equal(t, "0000000000000000", fields["CapEff"], "no capability")
		assert.Equal(t, "0000000000000000", fields["CapBnd"], "none to regain")
		assert.Equal(t, "1", fields["NoNewPrivs"])
	}

	// The container's exec probe, as the same user.
	probe := spec.Containers[0].ReadinessProbe
	out, err := runProbeAs(t, wrap, env, probe, topology.Port(cb), port)
	require.NoError(t, err, "the exec probe as the pod's user: %s", out)
	require.False(t, s.exited(), "the server keeps running:\n%s", s.out.String())
}

// asPodUser checks that spec's pod runs its first container as a non-root
// user without privileges (the hardened defaults), and returns how to run
// a command as that pod would (wrap), the container's environment with
// HOME "/" (its literal values; secrets are not resolved here), and the
// user and group.
func asPodUser(t *testing.T, spec *corev1ac.PodSpecApplyConfiguration) (wrap func(argv ...string) *exec.Cmd, env []string, uid, gid int64) {
	t.Helper()
	return asPodUserIn(t, spec, pyenv.VLLM)
}

// asPodUserIn is asPodUser for a server run from the Python environment
// pyEnv (a supported-version cell).
func asPodUserIn(t *testing.T, spec *corev1ac.PodSpecApplyConfiguration, pyEnv string) (wrap func(argv ...string) *exec.Cmd, env []string, uid, gid int64) {
	t.Helper()
	psc, csc := spec.SecurityContext, spec.Containers[0].SecurityContext
	require.NotNil(t, psc, "a new server's pod has a security context")
	require.NotNil(t, csc, "and its container")
	require.Equal(t, ptr.To(true), psc.RunAsNonRoot)
	require.NotNil(t, psc.RunAsUser)
	require.NotNil(t, psc.RunAsGroup)
	require.Equal(t, ptr.To(false), csc.AllowPrivilegeEscalation)
	require.NotNil(t, csc.Capabilities)
	require.Equal(t, "ALL", string(csc.Capabilities.Drop[0]))
	uid, gid = *psc.RunAsUser, *psc.RunAsGroup
	asRoot := os.Geteuid() == 0
	wrap = func(argv ...string) *exec.Cmd {
		if !asRoot {
			return exec.Command(argv[0], argv[1:]...)
		}
		return exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "--", "sh", "-ec", exposeScript(t, pyEnv, uid, gid), "sh"}, argv...)...)
	}
	// The container's own environment and its scratch mount (an emptyDir,
	// stood for by a fresh tmpfs in the namespace).
	env = append(withoutHome(pyenv.Env()), "HOME=/")
	for _, e := range spec.Containers[0].Env {
		if e.Value != nil {
			env = append(env, *e.Name+"="+*e.Value)
		}
	}
	var scratch bool
	for _, m := range spec.Containers[0].VolumeMounts {
		scratch = scratch || *m.MountPath == render.ScratchPath
	}
	require.True(t, scratch, "the server container mounts its scratch space at %s", render.ScratchPath)
	return wrap, env, uid, gid
}

// exposeScript is the sh script (run as root inside a private mount
// namespace, the command line as its arguments) that makes the Python
// environment readable to uid:gid under its own paths, read-only, and
// then runs the command as uid:gid without privileges.
func exposeScript(t *testing.T, pyEnv string, uid, gid int64) string {
	t.Helper()
	venv, err := filepath.EvalSymlinks(pyenv.Dir(t, pyEnv))
	require.NoError(t, err)
	base, err := filepath.EvalSymlinks(pyenv.Python(t, pyEnv))
	require.NoError(t, err)
	prefix := filepath.Dir(filepath.Dir(base)) // <prefix>/bin/python3.x
	stash := t.TempDir()
	var b strings.Builder
	hidden := map[string]string{} // a folder others cannot enter -> where the original is kept
	for _, dir := range []string{venv, prefix} {
		top := closedAncestor(t, dir)
		if top == "" {
			continue // every folder above is open to others
		}
		orig, ok := hidden[top]
		if !ok {
			orig = filepath.Join(stash, strconv.Itoa(len(hidden)))
			hidden[top] = orig
			fmt.Fprintf(&b, "mkdir -p %q\nmount --bind %q %q\nmount -t tmpfs -o mode=0755 tmpfs %q\n", orig, top, orig, top)
		}
		rel, err := filepath.Rel(top, dir)
		require.NoError(t, err)
		fmt.Fprintf(&b, "mkdir -p %q\nmount --bind -o ro %q %q\n", dir, filepath.Join(orig, rel), dir)
	}
	fmt.Fprintf(&b, "mount -t tmpfs -o mode=1777 tmpfs %q\n", render.ScratchPath)
	fmt.Fprintf(&b, "exec setpriv --reuid=%d --regid=%d --clear-groups --no-new-privs --inh-caps=-all --ambient-caps=-all --bounding-set=-all -- \"$@\"\n", uid, gid)
	return b.String()
}

// closedAncestor is the topmost folder on dir's path (dir included) that
// users other than its owner cannot enter, "" when there is none.
func closedAncestor(t *testing.T, dir string) string {
	t.Helper()
	var parts []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		parts = append([]string{d}, parts...)
	}
	for _, d := range parts {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		if fi.Mode().Perm()&0o001 == 0 {
			return d
		}
	}
	return ""
}

func runProbeAs(t *testing.T, wrap func(...string) *exec.Cmd, env []string, probe *corev1ac.ProbeApplyConfiguration, renderedPort int32, port int) (string, error) {
	t.Helper()
	require.NotNil(t, probe)
	require.NotNil(t, probe.Exec)
	argv := append([]string{}, probe.Exec.Command...)
	require.Equal(t, "python3", argv[0])
	require.Equal(t, strconv.Itoa(int(renderedPort)), argv[len(argv)-1])
	argv[0] = pyenv.Python(t, pyenv.VLLM)
	argv[len(argv)-1] = strconv.Itoa(port)
	cmd := wrap(argv...)
	cmd.Env = env
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
		return string(out), err
	case <-time.After(time.Duration(*probe.TimeoutSeconds+30) * time.Second): // + the namespace's set-up
		_ = cmd.Process.Kill()
		<-done
		return string(out), fmt.Errorf("the probe did not finish")
	}
}

func withoutHome(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "HOME=") {
			out = append(out, kv)
		}
	}
	return out
}

func procStatus(s string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}
