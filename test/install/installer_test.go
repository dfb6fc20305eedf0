package install

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/installer"
	"github.com/inferencecache/operator/internal/ociimage"
)

const installVersion = "v0.0.0-installtest"

// TestInstallYAML: the single-file bundle of `make build-installer` (the
// production overlay, the manager pinned by the digest of the image layout
// built here) applies cleanly twice with kubectl apply --server-side; the
// manager binary of the same version runs as its ServiceAccount (it makes
// its own webhook certificate: cert-manager's kinds are only registered by
// stand-in CRDs here, nothing issues the Certificate) and the quickstart
// becomes Ready. Every installed object carries the version, and the
// manager's metrics report the backend's Ready condition and the build.
func TestInstallYAML(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	work := t.TempDir()
	images := filepath.Join(work, "images")
	built, err := ociimage.Build(ctx, ociimage.Options{RepoRoot: "../..", OutDir: images, Version: installVersion, Revision: "test", Only: []string{"manager"}})
	require.NoError(t, err)
	require.Len(t, built, 1)
	// The index's and the subscriber's layouts (make image builds the
	// real ones).
	indexDigest := fakeLayoutOf(t, images, "inferencecache-cache-index")
	subscriberDigest := fakeLayoutOf(t, images, "inferencecache-kvevent-subscriber")
	bundle, err := installer.Build(installer.Options{Overlay: "../../kustomize/overlays/production", ImagesDir: images, Registry: "registry.example/inferencecache", Version: installVersion})
	require.NoError(t, err)
	installYAML := filepath.Join(work, "install.yaml")
	require.NoError(t, os.WriteFile(installYAML, bundle, 0o600))

	cluster, kubectl := startCluster(ctx, t, work, "testdata")
	first := kubectl("apply", "--server-side", "-f", installYAML)
	assert.Contains(t, first, "deployment.apps/inferencecache-operator serverside-applied")
	second := kubectl("apply", "--server-side", "-f", installYAML)
	assert.NotContains(t, strings.ToLower(second), "error")
	kubectl("wait", "--for=condition=Established", "crd/cachebackends.inferencecache.io", "--timeout=30s")
	image := kubectl("get", "-n", "inferencecache-system", "deployment/inferencecache-operator", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	assert.Equal(t, "registry.example/inferencecache/inferencecache-operator@"+built[0].Digest.String(), image)
	image = kubectl("get", "-n", "inferencecache-system", "deployment/inferencecache-index", "-o", "jsonpath={.spec.template.spec.containers[0].image}")
	assert.Equal(t, "registry.example/inferencecache/inferencecache-cache-index@"+indexDigest, image)
	for _, obj := range []string{"crd/cachebackends.inferencecache.io", "-n=inferencecache-system deployment/inferencecache-operator", "-n=inferencecache-system service/inferencecache-operator-metrics", "mutatingwebhookconfiguration/inferencecache-pod-injector"} {
		args := append([]string{"get"}, strings.Fields(obj)...)
		labels := kubectl(append(args, "-o", "jsonpath={.metadata.labels}")...)
		assert.Contains(t, labels, `"app.kubernetes.io/version":"`+installVersion+`"`, obj)
		assert.Contains(t, labels, `"app.kubernetes.io/part-of":"inferencecache"`, obj)
	}

	// The KV-event pipeline is on in the bundle (issue 24): the manager's
	// Deployment names the subscriber pinned like the images, and the
	// manager run with that argument adds the sidecar to the quickstart's
	// engine pods (its CacheBackend sets spec.observation).
	var subscriberArg string
	for _, a := range strings.Fields(kubectl("get", "-n", "inferencecache-system", "deployment/inferencecache-operator", "-o", `jsonpath={range .spec.template.spec.containers[0].args[*]}{@}{" "}{end}`)) {
		if strings.HasPrefix(a, installer.SubscriberFlag) {
			subscriberArg = a
		}
	}
	subscriberImage := "registry.example/inferencecache/inferencecache-kvevent-subscriber@" + subscriberDigest
	require.Equal(t, installer.SubscriberFlag+subscriberImage, subscriberArg)

	k8s, metricsURL := runManager(ctx, t, work, cluster, installVersion, subscriberArg)
	quickstartReady(t, ctx, k8s, kubectl)
	var pods corev1.PodList
	require.NoError(t, k8s.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{"app": "qwen-demo"}))
	require.NotEmpty(t, pods.Items)
	for _, p := range pods.Items {
		var images []string
		for _, c := range p.Spec.InitContainers {
			if c.Name == inject.SubscriberContainer {
				images = append(images, c.Image)
			}
		}
		assert.Equal(t, []string{subscriberImage}, images, "pod %s has the bundle's kvevent-subscriber sidecar", p.Name)
	}

	// The children carry the manager's version; the metrics say Ready.
	svcLabels := kubectl("get", "service/qwen-demo-cache", "-o", "jsonpath={.metadata.labels}")
	assert.Contains(t, svcLabels, `"app.kubernetes.io/version":"`+installVersion+`"`)
	// Metrics are served over HTTPS to callers the API server authenticates
	// (TokenReview) and authorises (SubjectAccessReview): a scraper's
	// ServiceAccount bound to the bundle's metrics-reader ClusterRole reads
	// them, an anonymous request is refused.
	kubectl("create", "serviceaccount", "prometheus", "-n", "default")
	kubectl("create", "clusterrolebinding", "prometheus-inferencecache-metrics", "--clusterrole=inferencecache-metrics-reader", "--serviceaccount=default:prometheus")
	token := strings.TrimSpace(kubectl("create", "token", "prometheus", "-n", "default"))
	scraper := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the manager's self-signed metrics certificate
	anonymous, err := scraper.Get(metricsURL)
	require.NoError(t, err)
	_ = anonymous.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, anonymous.StatusCode, "metrics without a token")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := scraper.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	assert.Contains(t, string(body), `inferencecache_cachebackend_condition{name="qwen-demo-cache",namespace="default",status="True",type="Ready"} 1`)
	assert.Contains(t, string(body), `version="`+installVersion+`"`)
}

// fakeLayoutOf writes an OCI layout named name holding one random
// multi-platform image index, and returns its digest: kwok runs no
// containers, so the bundle needs digests to pin, not binaries.
func fakeLayoutOf(t *testing.T, dir, name string) string {
	t.Helper()
	idx, err := random.Index(64, 1, 2)
	require.NoError(t, err)
	lp, err := layout.Write(filepath.Join(dir, name), empty.Index)
	require.NoError(t, err)
	require.NoError(t, lp.AppendIndex(idx))
	d, err := idx.Digest()
	require.NoError(t, err)
	return d.String()
}
