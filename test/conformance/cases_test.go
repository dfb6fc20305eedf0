package conformance_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/topology"
)

// The case builder every engine's conformance test shares: a CacheBackend
// and an engine pod go through inject.Decide, the webhook's own decision,
// and the admitted engine container is run the way the kubelet would start
// it, with stub engines on PATH that record the argv and environment they
// receive. What the engines' own parsers then read is exactly what an
// engine process in the pod would get: shells, wrappers (env, nohup, ...)
// and the image's entrypoint included.

const (
	caseNamespace = "llm"
	// caseLabel selects the engine pods of every case.
	caseLabel = "conformance"
	// SubscriberImage turns the KV-event wiring on (with spec.observation.modelID).
	subscriberImage = "example.com/kvevent-subscriber:v1"
)

// newBackend is a CacheBackend of the given runtime and type that selects
// the case pods, with the status.endpoint the operator publishes for it
// (topology.Endpoint: the address the webhook requires) when it runs a server.
func newBackend(rt v1alpha1.Runtime, typ v1alpha1.BackendType, mut ...func(*v1alpha1.CacheBackend)) v1alpha1.CacheBackend {
	cb := v1alpha1.CacheBackend{
		ObjectMeta: metav1.ObjectMeta{Namespace: caseNamespace, Name: "cache", UID: types.UID("uid-cache"), Generation: 1},
		Spec: v1alpha1.CacheBackendSpec{
			Runtime: rt, Type: typ,
			EngineSelector: v1alpha1.EngineSelector{MatchLabels: map[string]string{"app": caseLabel}},
		},
	}
	for _, m := range mut {
		m(&cb)
	}
	if cb.Spec.Type == v1alpha1.BackendTypeLMCache {
		cb.Status.Endpoint = topology.Endpoint(&cb, "")
	}
	return cb
}

// newEnginePod is a pod the case backends select, with c as its only container.
func newEnginePod(c corev1.Container, mut ...func(*corev1.Pod)) *corev1.Pod {
	if c.Name == "" {
		c.Name = "engine"
	}
	if c.Image == "" {
		c.Image = "example.com/engine:v1"
	}
	p := &corev1.Pod{
		// The case pods opt in to engineOverrides.optIn: the cases hold the
		// engines to every flag a backend may hand them, listed or opted in.
		ObjectMeta: metav1.ObjectMeta{Namespace: caseNamespace, Name: "engine", Labels: map[string]string{"app": caseLabel},
			Annotations: map[string]string{inject.AnnotationAllowOverrides: "true"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{c}},
	}
	for _, m := range mut {
		m(p)
	}
	return p
}

// observeOptions are the manager's options with the KV-event wiring on
// (it also needs spec.observation.modelID on the backend).
func observeOptions() inject.Options {
	return inject.Options{KVEventSubscriberImage: subscriberImage}
}

// admit runs the webhook's decision on pod and returns it with the admitted
// engine container (the first one: the case pods have one).
func admit(t *testing.T, cb v1alpha1.CacheBackend, pod *corev1.Pod, opts inject.Options) (inject.Decision, corev1.Container) {
	t.Helper()
	d := inject.Decide(pod, []v1alpha1.CacheBackend{cb}, opts)
	require.NotNil(t, d.Pod)
	require.NotEmpty(t, d.Pod.Spec.Containers)
	return d, d.Pod.Spec.Containers[0]
}

// sidecarEnv is the plain env of the kvevent-subscriber the webhook added
// to an admitted pod, nil when there is none.
func sidecarEnv(p *corev1.Pod) map[string]string {
	for _, c := range p.Spec.InitContainers {
		if c.Name != inject.SubscriberContainer {
			continue
		}
		out := map[string]string{}
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				out[e.Name] = e.Value
			}
		}
		return out
	}
	return nil
}

// Process is what an engine process started from a container receives.
type Process struct {
	// Argv is its argv; Argv[0] is the program's base name.
	Argv []string
	// Env is its environment (without the stubs' own PATH).
	Env map[string]string
}

// startContainer runs c the way the kubelet starts it: command and args, or
// the image's entrypoint followed by args when the container has no
// command; the env from c.Env (valueFrom variables are empty here), HOME an
// empty folder (no login profile of this machine). Every
// program in stubs (vllm, python3, sglang, ...) is a stub on PATH, also
// when the command names it by an absolute path, that records its argv and
// environment and exits; shells, env, nohup and the other programs are this
// machine's own. It fails the test if no stub ran. Kubernetes' $(VAR)
// expansion is not applied: no case uses it.
func startContainer(t *testing.T, c corev1.Container, entrypoint []string, stubs ...string) Process {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	require.NoError(t, os.Mkdir(bin, 0o755))
	record := filepath.Join(dir, "record")
	script := "#!/bin/sh\n" +
		`printf '%s\0' "${0##*/}" "$@" > "$CONFORMANCE_RECORD.argv"` + "\n" +
		`env -0 > "$CONFORMANCE_RECORD.env"` + "\n"
	for _, s := range stubs {
		require.NoError(t, os.WriteFile(filepath.Join(bin, s), []byte(script), 0o755))
	}
	argv := append([]string{}, c.Command...)
	if len(argv) == 0 {
		argv = append(argv, entrypoint...)
	}
	argv = append(argv, c.Args...)
	require.NotEmpty(t, argv, "container %q runs nothing", c.Name)
	for _, s := range stubs {
		if filepath.IsAbs(argv[0]) && filepath.Base(argv[0]) == s {
			argv[0] = filepath.Join(bin, s)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Resolved on the stubs' PATH, not this process's.
	cmd := exec.CommandContext(ctx, lookPath(bin, argv[0]), argv[1:]...)
	cmd.Args[0] = argv[0]
	cmd.Env = []string{"PATH=" + bin + ":/usr/local/bin:/usr/bin:/bin", "CONFORMANCE_RECORD=" + record, "HOME=" + dir}
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	a, aerr := os.ReadFile(record + ".argv")
	require.NoError(t, aerr, "container %q (%q) started no engine (%v): %s", c.Name, argv, err, out.String())
	require.NoError(t, err, "container %q (%q): %s", c.Name, argv, out.String())
	e, err := os.ReadFile(record + ".env")
	require.NoError(t, err)
	p := Process{Argv: strings.Split(strings.TrimSuffix(string(a), "\x00"), "\x00"), Env: map[string]string{}}
	for _, kv := range strings.Split(strings.TrimSuffix(string(e), "\x00"), "\x00") {
		k, v, _ := strings.Cut(kv, "=")
		if k != "PATH" && k != "CONFORMANCE_RECORD" && k != "HOME" && k != "PWD" && k != "SHLVL" && k != "_" {
			p.Env[k] = v
		}
	}
	return p
}

// lookPath resolves a program name on the stubs' PATH.
func lookPath(bin, name string) string {
	if strings.Contains(name, "/") {
		return name
	}
	for _, d := range []string{bin, "/usr/local/bin", "/usr/bin", "/bin"} {
		if st, err := os.Stat(filepath.Join(d, name)); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return filepath.Join(d, name)
		}
	}
	return name
}
