package helm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"helm.sh/helm/v4/pkg/action"
	"sigs.k8s.io/yaml"
)

// TestSchemaRejects: values.schema.json refuses a key the chart does not
// read, at every level, and a value of the wrong type.
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct {
		name, vals, msg string
	}{
		{"unknown top-level key", `{replicaCount: 3}`, "replicaCount"},
		{"unknown key of a workload", `{operator: {replica: 3}}`, "replica"},
		{"unknown key of an image", `{operator: {manager: {image: {name: x}}}}`, "name"},
		{"unknown manager flag", `{operator: {manager: {flags: {clusterDomian: example.org}}}}`, "clusterDomian"},
		{"unknown resource", `{operator: {manager: {resources: {requests: {cpus: 1}}}}}`, "cpus"},
		{"unknown toleration key", `{operator: {tolerations: [{key: a, effects: NoSchedule}]}}`, "effects"},
		{"wrong type of replicas", `{operator: {replicas: two}}`, "replicas"},
		{"wrong type of a switch", `{certManager: {enabled: "yes"}}`, "enabled"},
		{"wrong type of a label", `{commonLabels: {team: {a: b}}}`, "team"},
		{"a digest that is not one", `{operator: {manager: {image: {digest: latest}}}}`, "digest"},
		{"an empty from, which would allow every source", `{networkPolicy: {webhook: {from: []}}}`, "from"},
		{"an unknown key of a peer", `{networkPolicy: {metrics: {from: [{namespaceSelectr: {}}]}}}`, "namespaceSelectr"},
		{"an ipBlock without cidr", `{networkPolicy: {webhook: {from: [{ipBlock: {except: [10.0.0.0/8]}}]}}}`, "cidr"},
		{"a pull secret without its name", `{operator: {imagePullSecrets: [{secret: regcred}]}}`, "secret"},
		{"a priority class that is not a string", `{index: {priorityClassName: [a]}}`, "priorityClassName"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{}
			require.NoError(t, yaml.Unmarshal([]byte(tc.vals), &vals))
			_, err := render(vals)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "schema")
			assert.Contains(t, err.Error(), tc.msg)
		})
	}
}

// TestValuesReachTheObjects: each value the chart exposes lands where it
// should (one value at a time, the rest at their defaults).
func TestValuesReachTheObjects(t *testing.T) {
	const deployment = "apps/v1 Deployment inferencecache-system/inferencecache-operator"
	digest := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	podSpec := func(objs map[string]object) map[string]any {
		return objs[deployment]["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	}
	manager := func(objs map[string]object) map[string]any {
		return podSpec(objs)["containers"].([]any)[0].(map[string]any)
	}
	for _, tc := range []struct {
		name  string
		vals  string
		check func(t *testing.T, objs map[string]object)
	}{
		{"image by digest", `{operator: {manager: {image: {repository: registry.example/op, digest: ` + digest + `}}}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, "registry.example/op@"+digest, manager(objs)["image"])
		}},
		// issue 24: what an umbrella chart and a platform team pass.
		{"global from an umbrella chart", `{global: {imageRegistry: registry.example, imagePullSecrets: [regcred]}}`, func(t *testing.T, objs map[string]object) {
			assert.NotNil(t, objs[deployment], "the chart renders with global set")
		}},
		{"pod annotations", `{operator: {podAnnotations: {prometheus.io/scrape: "false", team: infra}}}`, func(t *testing.T, objs map[string]object) {
			md := objs[deployment]["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)
			assert.Equal(t, map[string]any{"prometheus.io/scrape": "false", "team": "infra"}, md["annotations"])
		}},
		{"priority class", `{operator: {priorityClassName: system-cluster-critical}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, "system-cluster-critical", podSpec(objs)["priorityClassName"])
		}},
		{"image pull secrets", `{operator: {imagePullSecrets: [{name: regcred}]}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, []any{map[string]any{"name": "regcred"}}, podSpec(objs)["imagePullSecrets"])
		}},
		{"topology spread", `{operator: {topologySpreadConstraints: [{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app.kubernetes.io/name: inferencecache-operator}}}]}}`, func(t *testing.T, objs map[string]object) {
			tsc := podSpec(objs)["topologySpreadConstraints"].([]any)
			require.Len(t, tsc, 1)
			assert.Equal(t, "topology.kubernetes.io/zone", tsc[0].(map[string]any)["topologyKey"])
		}},
		{"none of them by default", `{}`, func(t *testing.T, objs map[string]object) {
			for _, k := range []string{"priorityClassName", "imagePullSecrets", "topologySpreadConstraints"} {
				assert.NotContains(t, podSpec(objs), k)
			}
			md := objs[deployment]["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)
			assert.NotContains(t, md, "annotations")
		}},
		// issue 24: the KV-event sidecar is on by default, of the chart's
		// release, and one value turns it off.
		{"subscriber image by default", `{}`, func(t *testing.T, objs map[string]object) {
			assert.Contains(t, manager(objs)["args"], "--kvevent-subscriber-image=ghcr.io/inferencecache/inferencecache-kvevent-subscriber:v0.1.0")
		}},
		{"subscriber off", `{operator: {manager: {flags: {kveventSubscriberImage: {repository: ""}}}}}`, func(t *testing.T, objs map[string]object) {
			for _, a := range manager(objs)["args"].([]any) {
				assert.NotContains(t, a, "--kvevent-subscriber-image")
			}
		}},
		{"image tag", `{operator: {manager: {image: {tag: v9.9.9}}}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, "ghcr.io/inferencecache/inferencecache-operator:v9.9.9", manager(objs)["image"])
		}},
		{"replicas", `{operator: {replicas: 3}}`, func(t *testing.T, objs map[string]object) {
			assert.EqualValues(t, 3, objs[deployment]["spec"].(map[string]any)["replicas"])
		}},
		{"resources", `{operator: {manager: {resources: {limits: {memory: 1Gi}}}}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, map[string]any{"limits": map[string]any{"memory": "1Gi"}, "requests": map[string]any{"cpu": "50m", "memory": "64Mi"}}, manager(objs)["resources"])
		}},
		{"cluster domain, subscriber image, a flag off, extra args", `{operator: {manager: {flags: {clusterDomain: corp.example, leaderElect: false, webhookPort: 9444, kveventSubscriberImage: {repository: r.example/sub, tag: v1}}, extraArgs: [--zap-devel]}}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, []any{"--leader-elect=false", "--metrics-bind-address=:8443", "--health-probe-bind-address=:8081", "--webhook-port=9444",
				"--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs", "--kvevent-subscriber-image=r.example/sub:v1", "--cluster-domain=corp.example", "--zap-devel"}, manager(objs)["args"])
		}},
		{"scheduling", `{operator: {nodeSelector: {pool: system}, tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}], affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: []}}}}`, func(t *testing.T, objs map[string]object) {
			assert.Equal(t, map[string]any{"pool": "system"}, podSpec(objs)["nodeSelector"])
			assert.Equal(t, []any{map[string]any{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}}, podSpec(objs)["tolerations"])
			assert.Contains(t, podSpec(objs)["affinity"], "podAntiAffinity")
		}},
		{"commonLabels", `{commonLabels: {team: inference}}`, func(t *testing.T, objs map[string]object) {
			for k, o := range objs {
				assert.Equal(t, "inference", o["metadata"].(map[string]any)["labels"].(map[string]any)["team"], k)
			}
			labels := objs[deployment]["spec"].(map[string]any)["template"].(map[string]any)["metadata"].(map[string]any)["labels"].(map[string]any)
			assert.Equal(t, "inference", labels["team"], "pod template")
			selector := objs[deployment]["spec"].(map[string]any)["selector"].(map[string]any)["matchLabels"].(map[string]any)
			assert.NotContains(t, selector, "team", "selectors are immutable: never labelled")
		}},
		{"CRDs not kept", `{crds: {keep: false}}`, func(t *testing.T, objs map[string]object) {
			crd := objs["apiextensions.k8s.io/v1 CustomResourceDefinition <nil>/cachebackends.inferencecache.io"]
			require.NotNil(t, crd)
			assert.NotContains(t, crd["metadata"].(map[string]any)["annotations"], "helm.sh/resource-policy")
		}},
		{"CRDs left out", `{crds: {install: false}}`, func(t *testing.T, objs map[string]object) {
			assert.NotContains(t, objs, "apiextensions.k8s.io/v1 CustomResourceDefinition <nil>/cachebackends.inferencecache.io")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]any{}
			require.NoError(t, yaml.Unmarshal([]byte(tc.vals), &vals))
			tc.check(t, renderObjects(t, vals))
		})
	}
}

// TestLint: `helm lint --strict` (the library's) finds nothing, with each
// switch on and off.
func TestLint(t *testing.T) {
	for _, vals := range []string{`{}`, `{certManager: {enabled: false}, namespaceOptIn: {enabled: true}, monitoring: {enabled: true}, createNamespace: true}`} {
		v := map[string]any{}
		require.NoError(t, yaml.Unmarshal([]byte(vals), &v))
		lint := action.NewLint()
		lint.Strict = true
		lint.Namespace = namespace
		result := lint.Run([]string{chartDir}, v)
		assert.Empty(t, result.Errors, vals)
		for _, m := range result.Messages {
			t.Logf("%s: %s", vals, m)
		}
		assert.Equal(t, 1, result.TotalChartsLinted)
	}
}

// TestNotes: helm prints NOTES.txt after an install: the namespace, the
// rollouts to wait for, and what the switches mean for the user.
func TestNotes(t *testing.T) {
	for _, tc := range []struct {
		vals      string
		has, lack []string
	}{
		{`{}`, []string{"installed in namespace inferencecache-system", "rollout status deployment/inferencecache-operator", "install cert-manager first"},
			[]string{"inject=enabled", "sidecar is off"}},
		{`{certManager: {enabled: false}, namespaceOptIn: {enabled: true}, operator: {manager: {flags: {kveventSubscriberImage: {repository: ""}}}}}`,
			[]string{"provisions and renews", "kubectl label namespace <namespace> inferencecache.io/inject=enabled", "sidecar is off"},
			[]string{"cert-manager first"}},
	} {
		vals := map[string]any{}
		require.NoError(t, yaml.Unmarshal([]byte(tc.vals), &vals))
		notes, err := renderNotes(vals)
		require.NoError(t, err)
		for _, s := range tc.has {
			assert.Contains(t, notes, s, tc.vals)
		}
		for _, s := range tc.lack {
			assert.NotContains(t, notes, s, tc.vals)
		}
	}
}
