package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/cli/cmd"
	"github.com/inferencecache/operator/test/controlplane"
	"github.com/inferencecache/operator/test/integration/suite"
	"github.com/inferencecache/operator/test/testutil"
)

// The kubectl plugin run in process (cmd.Main, what the binary runs) with a
// kubeconfig file, against this suite's API server and webhooks.

// kubeconfig writes a kubeconfig for c with one context per entry of
// contexts (name → namespace; a name starting with "unreachable" points at a
// closed port) and returns its path.
func kubeconfig(t *testing.T, c *rest.Config, current string, contexts map[string]string) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	kc.Clusters["unreachable"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1", CertificateAuthorityData: c.CAData}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertData, ClientKeyData: c.KeyData, Token: c.BearerToken}
	for name, ns := range contexts {
		cluster := "envtest"
		if strings.HasPrefix(name, "unreachable") {
			cluster = "unreachable"
		}
		kc.Contexts[name] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: "admin", Namespace: ns}
	}
	kc.CurrentContext = current
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, path))
	return path
}

// runCLI runs `kubectl cachebackend ARGS --kubeconfig KC` and returns its
// exit status, standard output and standard error.
func runCLI(t *testing.T, kc string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cmd.Main(append(args, "--kubeconfig", kc), genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	return code, out.String(), errOut.String()
}

// checkRow finds the row of check's table whose name starts with name, its
// columns separated by one space.
func checkRow(t *testing.T, out, name string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(strings.Join(f[1:], " "), name) {
			return strings.Join(f, " ")
		}
	}
	t.Fatalf("no row %q in:\n%s", name, out)
	return ""
}

// TestCLICheckBeforeInstall: on a bare API server (its own, without the
// CRD or the operator), check fails and --pre passes, with cert-manager a
// warning unless required.
func TestCLICheckBeforeInstall(t *testing.T) {
	dir, err := controlplane.Dir()
	require.NoError(t, err)
	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	bare, err := env.Start()
	require.NoError(t, err)
	defer func() { _ = env.Stop() }()
	kc := kubeconfig(t, bare, "bare", map[string]string{"bare": "default"})

	code, out, errOut := runCLI(t, kc, "check")
	t.Logf("check on a bare API server:\n%s%s", out, errOut)
	assert.Equal(t, 1, code, out+errOut)
	assert.Contains(t, checkRow(t, out, "CRD "+cli.CRDName), "✗")
	assert.Contains(t, checkRow(t, out, "CRD "+cli.CRDName), "not installed")
	assert.Contains(t, checkRow(t, out, "manager Deployment"), "✗")
	assert.Contains(t, checkRow(t, out, "MutatingWebhookConfiguration"), "✗")
	assert.Contains(t, errOut, "checks failed")

	code, out, errOut = runCLI(t, kc, "check", "--pre")
	t.Logf("check --pre on a bare API server:\n%s%s", out, errOut)
	assert.Equal(t, 0, code, out+errOut)
	assert.Contains(t, checkRow(t, out, "Kubernetes version"), "✔")
	assert.Contains(t, checkRow(t, out, "permission to install"), "✔")
	assert.Contains(t, checkRow(t, out, "cert-manager"), "! cert-manager not installed: overlays/production needs it")

	code, out, _ = runCLI(t, kc, "check", "--pre", "--cert-manager=true")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, checkRow(t, out, "cert-manager"), "✗")
}

// TestCLICheckAfterInstall: against the suite's API server (CRD installed,
// webhooks served by the manager) check fails until the manager Deployment
// is available and cert-manager (which the base's webhook configurations
// ask for their CA) is there, then passes; the Pod webhook check fails when
// the webhook does not answer. version reads the manager Deployment.
func TestCLICheckAfterInstall(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	kc := kubeconfig(t, suite.Cfg, "admin", map[string]string{"admin": ns})

	// A stand-in for the install's manager Deployment: envtest runs no
	// controller-manager, so the test writes its status.
	labels := map[string]string{"app.kubernetes.io/name": "inferencecache-operator"}
	mgr := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: suite.OperatorNamespace, Name: cli.ManagerDeployment,
			Labels: map[string]string{"app.kubernetes.io/name": "inferencecache-operator", cli.LabelVersion: "v0.3.0"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "manager", Image: "registry.example/inferencecache/operator:v0.3.0"}}}}},
	}
	code, out, _ := runCLI(t, kc, "version")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "manager: unknown (no manager Deployment inferencecache-system/inferencecache-operator")

	require.NoError(t, suite.K8s.Create(ctx, mgr))
	t.Cleanup(func() { _ = suite.K8s.Delete(ctx, mgr) })

	code, out, _ = runCLI(t, kc, "version")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "manager: v0.3.0 (image registry.example/inferencecache/operator:v0.3.0, app.kubernetes.io/version=v0.3.0)")

	code, out, errOut := runCLI(t, kc, "check")
	assert.Equal(t, 1, code, out+errOut)
	assert.Contains(t, checkRow(t, out, "CRD "+cli.CRDName), "✔ CRD cachebackends.inferencecache.io served v1alpha1, stored v1alpha1")
	assert.Contains(t, checkRow(t, out, "manager Deployment"), "✗")
	assert.Contains(t, checkRow(t, out, "manager Deployment"), "0/2 available")
	assert.Contains(t, checkRow(t, out, "cert-manager"), "✗", "the base's webhooks take their CA from cert-manager")

	suite.MarkDeploymentAvailable(t, client.ObjectKeyFromObject(mgr))
	installCertManagerKinds(t)
	code, out, errOut = runCLI(t, kc, "check")
	t.Logf("check after the install:\n%s%s", out, errOut)
	assert.Equal(t, 0, code, out+errOut)
	for _, row := range []string{"Kubernetes version", "CRD", "cert-manager", "manager Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
		"CacheBackend webhook answers", "Pod webhook answers"} {
		assert.Contains(t, checkRow(t, out, row), "✔", row)
	}
	assert.Contains(t, checkRow(t, out, "manager Deployment"), "2/2 available")
	assert.Contains(t, checkRow(t, out, "CacheBackend webhook"), "invalid rejected by validate.cachebackend.inferencecache.io")
	assert.Contains(t, checkRow(t, out, "Pod webhook"), "stripped a stale receipt")

	// With a CacheBackend that can wire pods in the namespace, the dry-run
	// pod must come back wired by it.
	suite.ServingBackend(t, ns, "cache")
	code, out, _ = runCLI(t, kc, "check")
	assert.Equal(t, 0, code, out)
	assert.Contains(t, checkRow(t, out, "Pod webhook"), "a pod matching CacheBackend cache came back wired by it")

	// Dry runs write nothing.
	var pods corev1.PodList
	require.NoError(t, suite.K8s.List(ctx, &pods, client.InNamespace(ns)))
	assert.Empty(t, pods.Items)
	var backends v1alpha1.CacheBackendList
	require.NoError(t, suite.K8s.List(ctx, &backends, client.InNamespace(ns)))
	assert.Len(t, backends.Items, 1)

	suite.WithWebhookUnreachable(t, func() {
		code, out, _ = runCLI(t, kc, "check")
	})
	assert.Equal(t, 1, code, out)
	assert.Contains(t, checkRow(t, out, "Pod webhook"), "✗")
	assert.Contains(t, checkRow(t, out, "Pod webhook"), "came back unchanged")

	// A namespace the Pod webhook leaves out cannot prove it answers.
	code, out, _ = runCLI(t, kc, "check", "-n", suite.OperatorNamespace)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, checkRow(t, out, "Pod webhook"), "not called for namespace inferencecache-system")
}

// installCertManagerKinds registers the stand-in cert-manager CRDs the
// install tests use, until the test ends.
func installCertManagerKinds(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	objs, err := cli.ReadFile("../../install/testdata/cert-manager-kinds.yaml", false)
	require.NoError(t, err)
	for _, o := range objs {
		require.NoError(t, suite.K8s.Create(ctx, o))
		t.Cleanup(func() { _ = suite.K8s.Delete(ctx, o) })
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		for _, o := range objs {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(o.GroupVersionKind())
			if err := suite.K8s.Get(ctx, client.ObjectKeyFromObject(o), got); err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			if !strings.Contains(fmt.Sprint(conds), "type:Established") {
				return fmt.Errorf("%s not established", o.GetName())
			}
		}
		return nil
	})
}

// TestCLIServiceReadyReadsEndpointSlices: a webhook Service counts as
// serving only with a ready endpoint in its EndpointSlices.
func TestCLIServiceReadyReadsEndpointSlices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	ok, detail := cli.ServiceReady(ctx, suite.K8s, ns, "webhook")
	assert.False(t, ok)
	assert.Contains(t, detail, "not found")

	require.NoError(t, suite.K8s.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "webhook"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 443, Protocol: corev1.ProtocolTCP}}}}))
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: "webhook-1", Labels: map[string]string{discoveryv1.LabelServiceName: "webhook"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}},
	}
	require.NoError(t, suite.K8s.Create(ctx, slice))
	ok, detail = cli.ServiceReady(ctx, suite.K8s, ns, "webhook")
	assert.False(t, ok)
	assert.Contains(t, detail, "has no ready endpoint")

	slice.Endpoints[0].Conditions.Ready = ptr.To(true)
	require.NoError(t, suite.K8s.Update(ctx, slice))
	ok, detail = cli.ServiceReady(ctx, suite.K8s, ns, "webhook")
	assert.True(t, ok, detail)
	assert.Contains(t, detail, "1 ready endpoint(s)")
}

// TestCLIAuditClassifiesEveryOutcome: one engine pod of each outcome, as
// explain says it, with its receipt and generation; -o json and yaml; -A.
func TestCLIAuditClassifiesEveryOutcome(t *testing.T) {
	ctx := context.Background()
	ns := suite.NewNamespace(t)
	other := suite.NewNamespace(t)
	kc := kubeconfig(t, suite.Cfg, "admin", map[string]string{"admin": ns})
	cb := suite.ServingBackend(t, ns, "cache")
	sel := map[string]string{"app": "engine-cache"}

	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "stale", sel, nil)))
	// A new generation: pods wired before it are stale.
	suite.UpdateBackend(t, client.ObjectKeyFromObject(cb), func(cb *v1alpha1.CacheBackend) { cb.Spec.Integration.Role = v1alpha1.RoleReadOnly })
	testutil.Eventually(t, 15*time.Second, func() error {
		p := suite.Engine(ns, "", sel, nil)
		p.GenerateName = "current-"
		if err := suite.K8s.Create(ctx, p); err != nil {
			return err
		}
		if g := p.Annotations[v1alpha1.AnnotationInjectedGeneration]; g != "2" {
			_ = suite.K8s.Delete(ctx, p)
			return fmt.Errorf("wired with generation %q", g)
		}
		return nil
	})
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "optout", sel, map[string]string{v1alpha1.AnnotationSkipInject: "true"})))
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "stranger", map[string]string{"app": "other"}, nil)))
	web := suite.Engine(ns, "web", map[string]string{"app": "web"}, nil)
	web.Spec.Containers[0].Image = "nginx"
	web.Spec.Containers[0].Args = nil
	require.NoError(t, suite.K8s.Create(ctx, web))
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(other, "elsewhere", map[string]string{"app": "other"}, nil)))
	suite.WithWebhookUnreachable(t, func() {
		testutil.Eventually(t, 15*time.Second, func() error {
			p := suite.Engine(ns, "", sel, nil)
			p.GenerateName = "unwired-"
			if err := suite.K8s.Create(ctx, p); err != nil {
				return err
			}
			if suite.IsWired(p) {
				_ = suite.K8s.Delete(ctx, p)
				return fmt.Errorf("still wired")
			}
			return nil
		})
		require.NoError(t, suite.K8s.Create(ctx, suite.Engine(ns, "forged", sel, map[string]string{
			v1alpha1.AnnotationInjectedBy: ns + "/cache", v1alpha1.AnnotationInjectedByUID: "copied", v1alpha1.AnnotationInjectedGeneration: "2"})))
	})

	code, out, errOut := runCLI(t, kc, "audit", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var rows []cli.AuditRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	got := map[string]string{}
	for _, r := range rows {
		name := r.Pod
		for _, prefix := range []string{"current-", "unwired-"} {
			if strings.HasPrefix(name, prefix) {
				name = prefix
			}
		}
		got[name] = strings.Join([]string{r.CacheBackend, r.Outcome, r.Receipt, r.Generation}, " ")
	}
	backend := ns + "/cache"
	assert.Equal(t, map[string]string{
		"stale":    backend + " injected verified stale",
		"current-": backend + " injected verified current",
		"optout":   backend + " skipped none ",
		"unwired-": backend + " fail-open none ",
		"stranger": " no-match none ",
		"forged":   backend + " forged-receipt failed ",
	}, got, "web (nginx, matching nothing) is not an engine pod")

	code, out, _ = runCLI(t, kc, "audit")
	require.Equal(t, 0, code)
	assert.Regexp(t, `(?m)^POD\s+CACHEBACKEND\s+OUTCOME\s+RECEIPT\s+GENERATION$`, out)
	assert.Regexp(t, `(?m)^stale\s+`+backend+`\s+injected\s+verified\s+stale$`, out)
	assert.Regexp(t, `(?m)^stranger\s+-\s+no-match\s+none\s+-$`, out)

	code, out, _ = runCLI(t, kc, "audit", "-A", "-o", "yaml")
	require.Equal(t, 0, code)
	var all []cli.AuditRow
	require.NoError(t, yaml.Unmarshal([]byte(out), &all))
	var namespaces []string
	for _, r := range all {
		if r.Namespace == other || r.Namespace == ns {
			namespaces = append(namespaces, r.Namespace+"/"+r.Pod)
		}
	}
	assert.Contains(t, namespaces, other+"/elsewhere")
	assert.Len(t, namespaces, 7)

	// Without the receipt key Secret (another operator namespace), receipts
	// are unchecked, and said so.
	code, out, errOut = runCLI(t, kc, "audit", "-o", "json", "--operator-namespace", other)
	require.Equal(t, 0, code)
	assert.Contains(t, errOut, "warning: receipts are not checked")
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	for _, r := range rows {
		if r.Pod == "stale" {
			assert.Equal(t, cli.ReceiptUnchecked, r.Receipt)
		}
	}
}

// TestCLIDiffExitCodes: 0 when the file is what the cluster runs, 1 when a
// reconcile would change something, 2 when diff cannot tell.
func TestCLIDiffExitCodes(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	kc := kubeconfig(t, suite.Cfg, "admin", map[string]string{"admin": ns, "unreachable": ns})
	cb := suite.NewBackend(ns, "cache")
	cb.Spec.Autoscaling = &v1alpha1.Autoscaling{MaxReplicas: 3}
	require.NoError(t, suite.K8s.Create(context.Background(), cb))
	key := client.ObjectKeyFromObject(cb)
	suite.WaitDeployment(t, key, nil)

	// The file a user keeps: the CacheBackend as the API server holds it
	// (with its defaults), without status or server-set metadata, and
	// without a namespace (the context's applies).
	file := func(cb *v1alpha1.CacheBackend) string {
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(cb)
		require.NoError(t, err)
		doc := map[string]any{"apiVersion": v1alpha1.GroupVersion.String(), "kind": "CacheBackend",
			"metadata": map[string]any{"name": cb.Name}, "spec": u["spec"]}
		b, err := yaml.Marshal(doc)
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "cachebackend.yaml")
		require.NoError(t, os.WriteFile(path, b, 0o600))
		return path
	}
	same := file(suite.GetBackend(t, key))
	testutil.Eventually(t, 10*time.Second, func() error {
		if code, out, errOut := runCLI(t, kc, "diff", "-f", same); code != 0 {
			return fmt.Errorf("exit %d: %s%s", code, out, errOut)
		}
		return nil
	})
	code, out, _ := runCLI(t, kc, "diff", "-f", same)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "no changes")

	edited := suite.GetBackend(t, key)
	edited.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Image: "example.com/lmcache:v9"}}
	code, out, _ = runCLI(t, kc, "diff", "-f", file(edited))
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "Deployment/"+key.Namespace+"/cache would be changed")
	assert.Contains(t, out, `/spec/template/spec/containers/0/image: "example.com/lmcache:v9"`)

	code, _, errOut := runCLI(t, kc, "diff", "-f", same, "--context", "unreachable")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "127.0.0.1:1")

	// -n puts the file's CacheBackend in another namespace, where it does
	// not exist yet: applying it would create it.
	code, out, _ = runCLI(t, kc, "diff", "-f", same, "-n", "default")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "CacheBackend default/cache is not in the cluster")
}

// TestCLIHonoursContextAndNamespace: a kubeconfig with two contexts (and an
// unreachable current one): --context picks the cluster and its namespace,
// -n overrides the namespace.
func TestCLIHonoursContextAndNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, b := suite.NewNamespace(t), suite.NewNamespace(t)
	kc := kubeconfig(t, suite.Cfg, "unreachable", map[string]string{"team-a": a, "team-b": b, "unreachable": a})
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(a, "engine-a", map[string]string{"app": "x"}, nil)))
	require.NoError(t, suite.K8s.Create(ctx, suite.Engine(b, "engine-b", map[string]string{"app": "x"}, nil)))

	pods := func(args ...string) []string {
		t.Helper()
		code, out, errOut := runCLI(t, kc, append([]string{"audit", "-o", "json"}, args...)...)
		require.Equal(t, 0, code, errOut)
		var rows []cli.AuditRow
		require.NoError(t, json.Unmarshal([]byte(out), &rows))
		var names []string
		for _, r := range rows {
			names = append(names, r.Namespace+"/"+r.Pod)
		}
		return names
	}
	assert.Equal(t, []string{a + "/engine-a"}, pods("--context", "team-a"))
	assert.Equal(t, []string{b + "/engine-b"}, pods("--context", "team-b"))
	assert.Equal(t, []string{b + "/engine-b"}, pods("--context", "team-a", "-n", b))
	assert.Equal(t, []string{a + "/engine-a"}, pods("--context", "team-b", "--namespace", a))

	code, _, errOut := runCLI(t, kc, "audit")
	assert.Equal(t, 1, code, "the current context is unreachable")
	assert.Contains(t, errOut, "127.0.0.1:1")

	code, out, _ := runCLI(t, kc, "explain", "pod", "engine-b", "--context", "team-b")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "Outcome:      no-match")

	// Shell completion of pod names reads the context's namespace.
	var buf bytes.Buffer
	code = cmd.Main([]string{"__complete", "--kubeconfig", kc, "--context", "team-a", "explain", "pod", ""},
		genericiooptions.IOStreams{In: strings.NewReader(""), Out: &buf, ErrOut: &bytes.Buffer{}})
	assert.Equal(t, 0, code)
	assert.Equal(t, "engine-a\n:4\n", buf.String())
}

// TestCLIRenderRefusesAsTheAPIServer: `render -f bad.yaml` offline refuses
// what the API server refuses, with the same message (issue 24: values
// out of the schema's range rendered with exit 0; a webhook refusal was
// worded by hand): the CRD's schema and CEL rules, and the validating
// webhook's own code. Each object goes to the real API server (dry run,
// with the webhook) and, as a file, to the CLI.
func TestCLIRenderRefusesAsTheAPIServer(t *testing.T) {
	t.Parallel()
	ns := suite.NewNamespace(t)
	const webhookPrefix = `admission webhook "validate.cachebackend.inferencecache.io" denied the request: `
	for _, tc := range []struct {
		name   string
		mutate func(*v1alpha1.CacheBackend)
		text   string
	}{
		{"a port past 65535 (schema)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Port: 99999}}
		}, "less than or equal to 65535"},
		{"500 replicas (schema)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{LMCacheServer: &v1alpha1.LMCacheServer{Replicas: ptr.To[int32](500)}}
		}, "less than or equal to 100"},
		{"HiCache on vLLM (a CEL rule)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Type = v1alpha1.BackendTypeSGLangHiCache
		}, "requires runtime SGLang"},
		{"the PYTHONWARNINGS attack (the webhook)", func(cb *v1alpha1.CacheBackend) {
			cb.Spec.Integration.EngineOverrides = &v1alpha1.EngineOverrides{Env: []corev1.EnvVar{{Name: "PYTHONWARNINGS", Value: "ignore::antigravity.x"}}}
		}, "annotated inferencecache.io/allow-overrides"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cb := suite.NewBackend(ns, "bad")
			tc.mutate(cb)
			err := suite.K8s.Create(context.Background(), cb.DeepCopy(), client.DryRunAll)
			require.Error(t, err, "the API server refuses it")
			server := strings.TrimPrefix(err.Error(), webhookPrefix)
			require.Contains(t, server, tc.text)

			cb.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "CacheBackend"}
			raw, err := yaml.Marshal(cb)
			require.NoError(t, err)
			file := filepath.Join(t.TempDir(), "bad.yaml")
			require.NoError(t, os.WriteFile(file, raw, 0o600))
			code, out, errOut := runCLI(t, filepath.Join(t.TempDir(), "none"), "render", "-f", file)
			assert.Equal(t, 1, code, "render refuses it")
			assert.Empty(t, out)
			assert.Equal(t, "error: "+server+"\n", errOut, "the API server's message, word for word")
		})
	}
}
