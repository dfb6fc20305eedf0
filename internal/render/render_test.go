package render_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
	"github.com/inferencecache/operator/internal/version"
)

var update = flag.Bool("update", false, "rewrite the golden files from the current output")

func load(t *testing.T, path string) *v1alpha1.CacheBackend {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	cb := &v1alpha1.CacheBackend{}
	require.NoError(t, yaml.UnmarshalStrict(raw, cb))
	return cb
}

// TestRenderGolden renders each testdata/<case>.yaml for a new server and
// compares the children with testdata/<case>.golden.yaml (go test -update
// rewrites them), and for a live server created before the hardened pod
// defaults (render.Options{LegacyPod: true}) with
// testdata/<case>.legacy.golden.yaml. The legacy files are what the
// operator rendered before those defaults and are never rewritten: a
// change to them is a restart of every server created before.
func TestRenderGolden(t *testing.T) {
	for _, in := range inputs(t) {
		name := strings.TrimSuffix(filepath.Base(in), ".yaml")
		for _, mode := range []struct {
			suffix string
			opts   render.Options
		}{{".golden.yaml", render.Options{}}, {".legacy.golden.yaml", render.Options{LegacyPod: true}}} {
			t.Run(name+mode.suffix, func(t *testing.T) {
				children := render.RenderWith(load(t, in), mode.opts)
				// A legacy file is written only for a new case.
				matchGolden(t, name+mode.suffix, !mode.opts.LegacyPod, children.PVC, children.Service, children.Deployment, children.StatefulSet, children.DaemonSet, children.HPA)
			})
		}
	}
}

// inputs are the CacheBackends of testdata: every *.yaml but the golden
// files; at least one.
func inputs(t *testing.T) []string {
	t.Helper()
	all, err := filepath.Glob("testdata/*.yaml")
	require.NoError(t, err)
	var out []string
	for _, in := range all {
		if !strings.HasSuffix(in, ".golden.yaml") {
			out = append(out, in)
		}
	}
	require.NotEmpty(t, out)
	return out
}

// matchGolden compares objs (nil ones left out), as YAML documents, with
// testdata/<file>. go test -update rewrites the file when rewrite is true,
// and writes it when it does not exist yet.
func matchGolden(t *testing.T, file string, rewrite bool, objs ...any) {
	t.Helper()
	var buf bytes.Buffer
	for _, obj := range objs {
		if isNil(obj) {
			continue
		}
		out, err := yaml.Marshal(obj)
		require.NoError(t, err)
		buf.WriteString("---\n")
		buf.Write(out)
	}
	golden := filepath.Join("testdata", file)
	if _, err := os.Stat(golden); *update && (rewrite || os.IsNotExist(err)) {
		require.NoError(t, os.WriteFile(golden, buf.Bytes(), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err, "missing golden file: run go test ./internal/render -update")
	assert.Equal(t, string(want), buf.String())
}

func isNil(v any) bool { return reflect.ValueOf(v).IsNil() }

// TestRenderIsDeterministic: the bytes applied for one CacheBackend never
// change between renders (no map iteration order, clock or randomness
// leaks into them), so a no-op reconcile stays a no-op. Comparing the
// rendered structs could not fail (maps compare equal in any order); the
// serialized objects are compared instead, over many renders of fresh
// copies.
func TestRenderIsDeterministic(t *testing.T) {
	for _, file := range []string{"testdata/full.yaml", "testdata/storage-rwo.yaml"} {
		cb := load(t, file)
		first, err := render.Objects(render.Render(cb.DeepCopy()))
		require.NoError(t, err)
		want, err := json.Marshal(first)
		require.NoError(t, err)
		for range 50 {
			objs, err := render.Objects(render.Render(cb.DeepCopy()))
			require.NoError(t, err)
			got, err := json.Marshal(objs)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "%s renders different bytes", file)
		}
	}
}

func TestRenderRules(t *testing.T) {
	cases := []struct {
		name  string
		file  string
		check func(t *testing.T, c render.Children)
	}{
		{"no replicas on the Deployment while an HPA owns them", "testdata/full.yaml", func(t *testing.T, c render.Children) {
			require.NotNil(t, c.HPA)
			assert.Nil(t, c.Deployment.Spec.Replicas)
		}},
		{"replicas from the spec without an HPA", "testdata/storage-rwo.yaml", func(t *testing.T, c render.Children) {
			assert.Nil(t, c.HPA)
			require.NotNil(t, c.Deployment.Spec.Replicas)
			assert.Equal(t, int32(1), *c.Deployment.Spec.Replicas)
		}},
		{"retained claim has no owner", "testdata/storage-rwo.yaml", func(t *testing.T, c render.Children) {
			require.NotNil(t, c.PVC)
			assert.Empty(t, c.PVC.OwnerReferences)
			assert.Equal(t, "persistent-data", *c.PVC.Name)
		}},
		{"deleted-with-backend claim is owned", "testdata/full.yaml", func(t *testing.T, c render.Children) {
			require.Len(t, c.PVC.OwnerReferences, 1)
			assert.Equal(t, "CacheBackend", *c.PVC.OwnerReferences[0].Kind)
		}},
		{"every port sets its protocol", "testdata/full.yaml", func(t *testing.T, c render.Children) {
			for _, p := range c.Service.Spec.Ports {
				require.NotNil(t, p.Protocol)
			}
			for _, ctr := range c.Deployment.Spec.Template.Spec.Containers {
				for _, p := range ctr.Ports {
					require.NotNil(t, p.Protocol)
				}
			}
		}},
		{"readiness and liveness send LMCache's HEALTH request from the image's python3", "testdata/full.yaml", func(t *testing.T, c render.Children) {
			ctr := c.Deployment.Spec.Template.Spec.Containers[0]
			for _, p := range []*corev1ac.ProbeApplyConfiguration{ctr.ReadinessProbe, ctr.LivenessProbe} {
				require.NotNil(t, p.Exec)
				assert.Nil(t, p.TCPSocket)
				assert.Equal(t, []string{"python3", "-c", lmcacheproto.ProbeScript(), "7000"}, p.Exec.Command)
				assert.GreaterOrEqual(t, *p.TimeoutSeconds, int32(5), "an exec probe starts Python")
			}
		}},
		{"lmcache_server gets exactly host, port and device cpu, with storage too", "testdata/full.yaml", func(t *testing.T, c render.Children) {
			ctr := c.Deployment.Spec.Template.Spec.Containers[0]
			assert.Equal(t, []string{"lmcache_server"}, ctr.Command)
			assert.Equal(t, []string{"0.0.0.0", "7000", "cpu"}, ctr.Args)
			mounts := map[string]string{}
			for _, m := range ctr.VolumeMounts {
				mounts[*m.Name] = *m.MountPath
			}
			assert.Equal(t, map[string]string{render.DataVolumeName: "/data", render.ScratchVolumeName: render.ScratchPath}, mounts, "the claim is still mounted, beside the scratch space")
		}},
		{"engine-local backends have no children", "testdata/hicache.yaml", func(t *testing.T, c render.Children) {
			assert.Equal(t, render.Children{}, c)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := render.Render(load(t, tc.file))
			tc.check(t, c)
		})
	}
}

// TestStoredExtraArgsAreNotRendered: extraArgs an object was stored with
// before the webhook refused them never reach lmcache_server, which would
// exit on them.
func TestStoredExtraArgsAreNotRendered(t *testing.T) {
	for _, file := range []string{"testdata/full.yaml", "testdata/statefulset.yaml", "testdata/minimal.yaml"} {
		cb := load(t, file)
		if cb.Spec.RemoteStorage == nil {
			cb.Spec.RemoteStorage = &v1alpha1.RemoteStorage{}
		}
		if cb.Spec.RemoteStorage.LMCacheServer == nil {
			cb.Spec.RemoteStorage.LMCacheServer = &v1alpha1.LMCacheServer{}
		}
		cb.Spec.RemoteStorage.LMCacheServer.ExtraArgs = []string{"--log-level", "debug"}
		c := render.Render(cb)
		tpl := c.Deployment
		var args []string
		if tpl != nil {
			args = tpl.Spec.Template.Spec.Containers[0].Args
		} else {
			args = c.StatefulSet.Spec.Template.Spec.Containers[0].Args
		}
		assert.Equal(t, render.ServerArgs(cb), args, file)
		assert.Len(t, args, 3, file)
	}
}

func TestRenderStatefulSet(t *testing.T) {
	c := render.Render(load(t, "testdata/statefulset.yaml"))
	assert.Nil(t, c.Deployment)
	assert.Nil(t, c.PVC, "per-replica claims come from the volumeClaimTemplate")
	require.NotNil(t, c.StatefulSet)
	require.Len(t, c.StatefulSet.Spec.VolumeClaimTemplates, 1)
	assert.Equal(t, render.DataVolumeName, *c.StatefulSet.Spec.VolumeClaimTemplates[0].Name)
	for _, v := range c.StatefulSet.Spec.Template.Spec.Volumes {
		assert.NotEqual(t, render.DataVolumeName, *v.Name, "the template's claim provides the volume")
	}
	assert.Equal(t, "StatefulSet", *c.HPA.Spec.ScaleTargetRef.Kind)

	plain := load(t, "testdata/minimal.yaml")
	plain.Spec.DeploymentKind = "StatefulSet"
	c = render.Render(plain)
	p := c.StatefulSet.Spec.PersistentVolumeClaimRetentionPolicy
	require.NotNil(t, p, "the retention policy is always set")
	assert.Equal(t, "Retain", string(*p.WhenDeleted))
	assert.Equal(t, "Retain", string(*p.WhenScaled))
}

func TestEndpoint(t *testing.T) {
	cb := load(t, "testdata/full.yaml")
	assert.Equal(t, "lm://big.llm.svc.cluster.local:7000", topology.Endpoint(cb, ""))
	assert.Equal(t, "lm://cache.llm.svc.cluster.local:65432", topology.Endpoint(load(t, "testdata/minimal.yaml"), "cluster.local"))
	assert.Equal(t, "lm://cache.llm.svc.corp.example:65432", topology.Endpoint(load(t, "testdata/minimal.yaml"), "corp.example."),
		"the cluster domain comes from the flag, a trailing dot dropped")
	assert.Equal(t, "big.llm.svc.cluster.local", topology.Host(cb, ""))
}

// TestVersionLabels: every child carries the operator's version and the
// project it is part of, but no pod template or claim template does, so an
// operator upgrade rolls no cache server and never edits a StatefulSet's
// immutable volumeClaimTemplates.
func TestVersionLabels(t *testing.T) {
	defer func(v string) { version.Version = v }(version.Version)
	version.Version = "v9.8.7"
	full := render.Render(load(t, "testdata/full.yaml"))
	sts := render.Render(load(t, "testdata/statefulset.yaml"))
	objects := map[string]map[string]string{
		"Deployment":              full.Deployment.Labels,
		"Service":                 full.Service.Labels,
		"HorizontalPodAutoscaler": full.HPA.Labels,
		"PersistentVolumeClaim":   full.PVC.Labels,
		"StatefulSet":             sts.StatefulSet.Labels,
	}
	for kind, l := range objects {
		assert.Equal(t, "v9.8.7", l["app.kubernetes.io/version"], kind)
		assert.Equal(t, "inferencecache", l["app.kubernetes.io/part-of"], kind)
	}
	templates := map[string]map[string]string{
		"Deployment pod template":  full.Deployment.Spec.Template.Labels,
		"StatefulSet pod template": sts.StatefulSet.Spec.Template.Labels,
		"volumeClaimTemplate":      sts.StatefulSet.Spec.VolumeClaimTemplates[0].Labels,
	}
	for what, l := range templates {
		assert.NotContains(t, l, "app.kubernetes.io/version", what)
	}
}
