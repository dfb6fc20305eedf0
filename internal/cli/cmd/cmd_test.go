package cmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/version"
)

// run runs the CLI in process with no kubeconfig (so nothing can reach a
// cluster) and returns its exit code and outputs.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	var out, errOut bytes.Buffer
	code := Main(args, genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	return code, out.String(), errOut.String()
}

const quickstart = "../../../examples/quickstart"

// TestOfflineCommands: what needs no cluster, with its exit status.
func TestOfflineCommands(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: inferencecache.io/v1alpha1\nkind: CacheBackend\nmetadata: {name: a}\nspec: {type: Redis}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		args     []string
		code     int
		out, err string
		notInOut string
	}{
		"version flag":         {args: []string{"--version"}, out: version.String(Program) + "\n"},
		"client version":       {args: []string{"version", "--client"}, out: "client: " + version.String(Program) + "\n"},
		"render":               {args: []string{"render", "-f", quickstart + "/cachebackend.yaml"}, out: "namespace: default"},
		"render long flags":    {args: []string{"render", "--kustomize", quickstart}, out: "kind: Deployment"},
		"render into -n":       {args: []string{"render", "-n", "team", "-f", quickstart + "/cachebackend.yaml"}, out: "namespace: team", notInOut: "namespace: default"},
		"render engine":        {args: []string{"render", "-f", quickstart + "/cachebackend.yaml", "--engine", quickstart + "/engine.yaml"}, out: "injected by CacheBackend qwen-demo-cache", notInOut: "kvevent-subscriber"},
		"render multiprocess":  {args: []string{"render", "-k", "../../../examples/multiprocess", "-o", "name"}, out: "service/qwen-mp-cache\ndaemonset.apps/qwen-mp-cache\n"},
		"render invalid":       {args: []string{"render", "-f", bad}, code: 1, err: `spec.type: Unsupported value: "Redis"`},
		"render needs a file":  {args: []string{"render"}, code: 1, err: "[filename kustomize] is required"},
		"render -f and -k":     {args: []string{"render", "-f", "a", "-k", "b"}, code: 1, err: "none of the others can be"},
		"diff usage is > 1":    {args: []string{"diff"}, code: 2, err: "is required"},
		"diff unknown flag":    {args: []string{"diff", "-f", "x", "--bogus"}, code: 2, err: "unknown flag"},
		"diff missing file":    {args: []string{"diff", "-f", "/nonexistent.yaml"}, code: 2, err: `the path "/nonexistent.yaml" does not exist`},
		"diff without cluster": {args: []string{"diff", "-f", quickstart + "/cachebackend.yaml"}, code: 2, err: "error:"},
		"audit bad output":     {args: []string{"audit", "-o", "xml"}, code: 1, err: "-o must be wide, json or yaml"},
		"check bad flag value": {args: []string{"check", "--cert-manager", "maybe"}, code: 1, err: "--cert-manager must be"},
		"unknown command":      {args: []string{"frobnicate"}, code: 1, err: "unknown command"},
		"bash completion":      {args: []string{"completion", "bash"}, out: "bash completion V2 for kubectl-cachebackend"},
		"zsh completion":       {args: []string{"completion", "zsh"}, out: "#compdef kubectl-cachebackend"},
		"fish completion":      {args: []string{"completion", "fish"}, out: "complete -c kubectl-cachebackend"},
		"help names kubectl":   {args: []string{"audit", "--help"}, out: "kubectl cachebackend audit [-A]"},
		"explain needs a name": {args: []string{"explain", "pod"}, code: 1, err: "accepts 1 arg(s)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, out, errOut := run(t, tc.args...)
			assert.Equal(t, tc.code, code, "exit status; stderr: %s", errOut)
			assert.Contains(t, out, tc.out)
			assert.Contains(t, errOut, tc.err)
			if tc.notInOut != "" {
				assert.NotContains(t, out, tc.notInOut)
			}
		})
	}
}

// TestRenderEngineSidecar: render --engine with the manager's subscriber
// image shows the KV-event wiring offline: the engine's flags, the native
// sidecar with its endpoints, index address and token volume.
func TestRenderEngineSidecar(t *testing.T) {
	code, out, errOut := run(t, "render", "-f", quickstart+"/cachebackend.yaml", "--engine", quickstart+"/engine.yaml",
		"--kvevent-subscriber-image", "example.com/kvevent-subscriber:v1")
	require.Equal(t, 0, code, errOut)
	for _, want := range []string{
		"injected by CacheBackend qwen-demo-cache",
		"--kv-events-config",
		`"endpoint":"ipc://@inferencecache-kvevents-pub"`,
		"--prefix-caching-hash-algo",
		"initContainers:",
		"name: kvevent-subscriber",
		"image: example.com/kvevent-subscriber:v1",
		"restartPolicy: Always",
		"value: ipc://@inferencecache-kvevents-replay",
		"value: inferencecache-index-peers.inferencecache-system.svc.cluster.local:9400",
		"audience: inferencecache-index",
		"fieldPath: metadata.uid",
	} {
		assert.Contains(t, out, want)
	}

	code, out, errOut = run(t, "render", "-f", quickstart+"/cachebackend.yaml", "--engine", quickstart+"/engine.yaml",
		"--kvevent-subscriber-image", "sub:v1", "--kvindex-endpoint", "index.example:9400", "--cluster-domain", "corp.example")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "value: index.example:9400")
	assert.Contains(t, out, "lm://qwen-demo-cache.default.svc.corp.example:65432")
}

// TestSetNamespace: objects without a namespace get the resolved one; with
// -n given, an object of another namespace is an error, as in kubectl apply.
func TestSetNamespace(t *testing.T) {
	obj := func(ns string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetKind("CacheBackend")
		u.SetName("a")
		u.SetNamespace(ns)
		return u
	}
	cases := map[string]struct {
		objNS, ns string
		explicit  bool
		want, err string
	}{
		"none takes the context's": {"", "ctx", false, "ctx", ""},
		"none takes -n":            {"", "team", true, "team", ""},
		"own beats the context's":  {"own", "ctx", false, "own", ""},
		"own equal to -n":          {"team", "team", true, "team", ""},
		"own differs from -n":      {"own", "team", true, "", "does not match the namespace given with -n (team)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := obj(tc.objNS)
			err := setNamespace([]*unstructured.Unstructured{o}, tc.ns, tc.explicit)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, o.GetNamespace())
		})
	}
}

// runIn is run with stdin as the CLI's standard input.
func runIn(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	var out, errOut bytes.Buffer
	code := Main(args, genericiooptions.IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errOut})
	return code, out.String(), errOut.String()
}

// TestFileHabits: -f as kubectl takes it (issue 24: a repeated -f used the
// last file only; no -, no folders): repeated, standard input, a folder,
// and -R into its subfolders.
func TestFileHabits(t *testing.T) {
	backend := func(name string) string {
		return "apiVersion: inferencecache.io/v1alpha1\nkind: CacheBackend\nmetadata: {name: " + name + "}\nspec: {type: LMCache, engineSelector: {matchLabels: {app: " + name + "}}}\n"
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(backend("a")), 0o600))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nested"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nested", "b.yaml"), []byte(backend("b")), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not yaml"), 0o600))
	services := func(out string) []string {
		var names []string
		for _, doc := range strings.Split(out, "\n---\n") {
			var o unstructured.Unstructured
			if yaml.Unmarshal([]byte(doc), &o.Object) == nil && o.GetKind() == "Service" {
				names = append(names, o.GetName())
			}
		}
		return names
	}
	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		want  []string
	}{
		{"-f twice", "", []string{"-f", filepath.Join(dir, "a.yaml"), "-f", filepath.Join(dir, "nested", "b.yaml")}, []string{"a", "b"}},
		{"-f - reads standard input", backend("c"), []string{"-f", "-"}, []string{"c"}},
		{"-f - with a file", backend("c"), []string{"-f", filepath.Join(dir, "a.yaml"), "-f", "-"}, []string{"a", "c"}},
		{"a folder: its files, not its subfolders", "", []string{"-f", dir}, []string{"a"}},
		{"a folder with -R", "", []string{"-f", dir, "-R"}, []string{"a", "b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runIn(t, tc.stdin, append([]string{"render"}, tc.args...)...)
			require.Equal(t, 0, code, errOut)
			assert.ElementsMatch(t, tc.want, services(out))
		})
	}
}

// TestOutputFormats: -o where kubectl has it (issue 24): render -o json
// (one List), -o name (kind.group/name), the decisions of --engine on
// stderr so stdout stays machine-readable; version -o yaml|json.
func TestOutputFormats(t *testing.T) {
	cb := quickstart + "/cachebackend.yaml"
	code, out, errOut := run(t, "render", "-f", cb, "-o", "name")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "service/qwen-demo-cache\ndeployment.apps/qwen-demo-cache\n", out)

	code, out, errOut = run(t, "render", "-f", cb, "-o", "json")
	require.Equal(t, 0, code, errOut)
	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			Kind string `json:"kind"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	assert.Equal(t, "List", list.Kind)
	require.Len(t, list.Items, 2)
	assert.Equal(t, "Deployment", list.Items[1].Kind)

	code, out, errOut = run(t, "render", "-f", cb, "--engine", quickstart+"/engine.yaml", "-o", "name")
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "deployment.apps/qwen-engine\n", out)
	assert.Contains(t, errOut, "# default/qwen-engine: injected by CacheBackend qwen-demo-cache")

	code, _, errOut = run(t, "render", "-f", cb, "-o", "wide")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `-o must be yaml, json or name, not "wide"`)

	code, out, errOut = run(t, "version", "--client", "-o", "json")
	require.Equal(t, 0, code, errOut)
	assert.JSONEq(t, `{"clientVersion": "`+version.String(Program)+`"}`, out)
	code, out, _ = run(t, "version", "--client", "-o", "yaml")
	require.Equal(t, 0, code)
	assert.Equal(t, "clientVersion: "+version.String(Program)+"\n", out)
}

// TestHelpExamplesExist: every path under examples/ that a command's help
// shows exists (issue 24: diff --help named examples/environments/overlays/prod).
func TestHelpExamplesExist(t *testing.T) {
	path := regexp.MustCompile(`examples/[A-Za-z0-9_./-]+`)
	var walk func(c *cobra.Command)
	seen := 0
	walk = func(c *cobra.Command) {
		for _, p := range path.FindAllString(c.Example+" "+c.Long, -1) {
			seen++
			_, err := os.Stat(filepath.Join("../../..", p))
			assert.NoError(t, err, "%s --help names %s", c.CommandPath(), p)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(NewRoot(genericiooptions.IOStreams{In: strings.NewReader(""), Out: &bytes.Buffer{}, ErrOut: &bytes.Buffer{}}))
	assert.Greater(t, seen, 5, "the help shows example paths")
}
