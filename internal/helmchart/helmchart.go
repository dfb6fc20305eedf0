// Package helmchart writes the Helm chart charts/inferencecache-operator from
// the kustomize overlays (hack/helmchart, run by `make manifests`; `make
// verify` fails when the chart and the overlays drift apart). It builds every combination of the
// chart's switches with kustomize (krusty): certManager (overlays/production)
// or not (overlays/dev), the namespace-opt-in component, the monitoring
// component, the engine-eviction grant (without-engine-eviction when off). Each object of those outputs becomes one template: the objects
// as kustomize wrote them, branched with `if` on exactly the switches that
// change them, and with only these fields turned into values, for whatever
// workloads the overlays hold (only optionalFlags names one):
//   - every Deployment, StatefulSet or DaemonSet: replicas, nodeSelector,
//     tolerations, affinity, topologySpreadConstraints, priorityClassName,
//     imagePullSecrets, podAnnotations; per container image (repository, tag, digest),
//     resources, the `--flag=value` arguments (typed; `--x-image` flags as
//     images) and extraArgs;
//   - every object: the release's namespace instead of the overlays' one, the
//     chart's labels and commonLabels (pod templates get commonLabels);
//   - CRDs: behind crds.install, kept on uninstall while crds.keep;
//   - NetworkPolicies: behind networkPolicy.enabled, the peers of each
//     one's ingress rule as networkPolicy.<name>.from.
//
// Beside the templates it writes NOTES.txt and accepts a free `global`
// (umbrella charts pass one). README.md of the chart is written by hand and
// left alone.
package helmchart

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/inferencecache/operator/internal/kustomization"
)

// Namespace is the overlays' namespace; the chart installs into the
// release's namespace instead.
const Namespace = "inferencecache-system"

// switches of the chart, in the order templates branch on them. Each one
// changes how the kustomization of a variant is written.
var switches = []struct {
	// Value is the values.yaml path (under .Values) of the switch.
	Value string
	// Default is its default; the defaults build overlays/production.
	Default bool
	Doc     string
}{
	{"certManager.enabled", true, "The webhooks' serving certificate from cert-manager (an Issuer and a Certificate; cert-manager injects the CA), as overlays/production; false: the manager provisions and renews its own certificate and publishes the CA, as overlays/dev."},
	{"namespaceOptIn.enabled", false, "The Pod webhook sees only pods of namespaces labelled inferencecache.io/inject=enabled (kustomize/components/namespace-opt-in)."},
	{"monitoring.enabled", false, "A ServiceMonitor for the manager, PodMonitors for the cache index, the kvevent-subscriber sidecars and the multiprocess LMCache servers, and a PrometheusRule with the operator's alerts (kustomize/components/monitoring; needs the Prometheus Operator's CRDs)."},
	{"engineEviction.enabled", true, "The operator's one pod write, pods/eviction create (ClusterRole inferencecache-operator-engine-eviction): multiprocess mode evicts the engines of a node whose LMCache server was replaced. false leaves it out (kustomize/components/without-engine-eviction): the operator then names the pods to restart by hand (Warning event EngineEvictionForbidden)."},
}

// variant is one combination of the switches (bit i = switches[i]).
type variant uint

func (v variant) on(i int) bool { return v&(1<<i) != 0 }

func defaultVariant() variant {
	var v variant
	for i, s := range switches {
		if s.Default {
			v |= 1 << i
		}
	}
	return v
}

// build runs kustomize for one variant.
func build(kustomizeDir string, v variant) ([]map[string]any, error) {
	root := kustomizeDir
	overlay := "overlays/dev"
	if v.on(0) {
		overlay = "overlays/production"
	}
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{filepath.Join(root, overlay)},
	}
	var components []string
	if v.on(1) {
		components = append(components, filepath.Join(root, "components/namespace-opt-in"))
	}
	if v.on(2) {
		components = append(components, filepath.Join(root, "components/monitoring"))
	}
	if !v.on(3) {
		components = append(components, filepath.Join(root, "components/without-engine-eviction"))
	}
	if len(components) > 0 {
		k["components"] = components
	}
	rm, err := kustomization.Build(k, nil)
	if err != nil {
		return nil, fmt.Errorf("variant %b: %w", v, err)
	}
	var objs []map[string]any
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		objs = append(objs, m)
	}
	return objs, nil
}

// objectKey names an object across variants.
func objectKey(o map[string]any) string {
	md, _ := o["metadata"].(map[string]any)
	av, _ := o["apiVersion"].(string)
	group := ""
	if i := strings.Index(av, "/"); i >= 0 {
		group = av[:i]
	}
	return fmt.Sprintf("%s|%s|%v|%v", group, o["kind"], md["namespace"], md["name"])
}

// Generate writes the chart into out (its templates/ replaced, README.md
// left alone) from the kustomize folder kustomizeDir (overlays/ and
// components/ under it).
func Generate(kustomizeDir, out string) error {
	n := variant(1) << len(switches)
	def := defaultVariant()
	order := []variant{def}
	for v := variant(0); v < n; v++ {
		if v != def {
			order = append(order, v)
		}
	}
	g := newGenerator()
	texts := map[string]map[variant]string{}
	names := map[string]string{}
	for i, v := range order {
		objs, err := build(kustomizeDir, v)
		if err != nil {
			return err
		}
		// Values come from the default variant: the others only reuse them
		// (a flag only another variant has stays literal).
		g.frozen = i > 0
		for _, o := range objs {
			k := objectKey(o)
			text, err := g.template(o)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			if texts[k] == nil {
				texts[k] = map[variant]string{}
			}
			texts[k][v] = text
			md := o["metadata"].(map[string]any)
			names[k] = strings.ToLower(fmt.Sprint(o["kind"])) + "-" + fmt.Sprint(md["name"])
		}
	}

	templates := filepath.Join(out, "templates")
	if err := os.RemoveAll(templates); err != nil {
		return err
	}
	if err := os.MkdirAll(templates, 0o755); err != nil {
		return err
	}
	files := map[string]string{}
	for k, byVariant := range texts {
		name := names[k] + ".yaml"
		if _, dup := files[name]; dup {
			return fmt.Errorf("two objects would be written to templates/%s", name)
		}
		files[name] = header + branch(byVariant, 0, 0, n)
	}
	files["_helpers.tpl"] = helpers
	files["NOTES.txt"] = notes
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(templates, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	values, schema, err := g.valuesFiles()
	if err != nil {
		return err
	}
	for name, body := range map[string]string{
		"Chart.yaml":         fmt.Sprintf(chartYAML, g.appVersion),
		"values.yaml":        values,
		"values.schema.json": schema,
		".helmignore":        "README.md.orig\n*.swp\n",
	} {
		if err := os.WriteFile(filepath.Join(out, name), []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

const header = "# Generated by hack/helmchart from kustomize/ (make manifests). DO NOT EDIT.\n"

// notes is templates/NOTES.txt: what helm prints after an install or
// upgrade.
const notes = `{{- /* Generated by hack/helmchart (make manifests). DO NOT EDIT. */ -}}
inferencecache-operator {{ .Chart.AppVersion }} is installed in namespace {{ .Release.Namespace }}.

Wait for the manager and the KV-block index:
  kubectl -n {{ .Release.Namespace }} rollout status deployment/inferencecache-operator
  kubectl -n {{ .Release.Namespace }} rollout status deployment/inferencecache-index
{{- if .Values.certManager.enabled }}

The webhooks' serving certificate comes from cert-manager (certManager.enabled):
install cert-manager first, or the webhooks get no certificate.
{{- else }}

The manager provisions and renews the webhooks' serving certificate itself.
{{- end }}
{{- if .Values.namespaceOptIn.enabled }}

Engine pods are wired only in namespaces labelled for it:
  kubectl label namespace <namespace> inferencecache.io/inject=enabled
{{- end }}
{{- if not .Values.operator.manager.flags.kveventSubscriberImage.repository }}

The KV-event sidecar is off (operator.manager.flags.kveventSubscriberImage.repository is empty).
{{- end }}

Next: a CacheBackend selecting your engine pods (examples/quickstart in the
project); "kubectl cachebackend explain pod <pod>" says why a pod was or was
not wired.
`

// branch writes the template of one object over the variants whose bits
// below `bit` are fixed (fixed, mask), branching on a switch only where the
// text differs with it.
func branch(byVariant map[variant]string, fixed, mask variant, n variant) string {
	var set []variant
	for v := variant(0); v < n; v++ {
		if v&mask == fixed {
			set = append(set, v)
		}
	}
	same := true
	for _, v := range set[1:] {
		if byVariant[v] != byVariant[set[0]] {
			same = false
			break
		}
	}
	if same {
		return byVariant[set[0]]
	}
	for i := range switches {
		bit := variant(1) << i
		if mask&bit != 0 {
			continue
		}
		if !dependsOn(byVariant, set, bit) {
			continue
		}
		on := branch(byVariant, fixed|bit, mask|bit, n)
		off := branch(byVariant, fixed, mask|bit, n)
		s := "{{- if $.Values." + switches[i].Value + " }}\n" + on
		if off != "" {
			s += "{{- else }}\n" + off
		}
		if on == "" {
			s = "{{- if not $.Values." + switches[i].Value + " }}\n" + off
		}
		return s + "{{- end }}\n"
	}
	return byVariant[set[0]]
}

// dependsOn says whether flipping bit changes the text for some variant of set.
func dependsOn(byVariant map[variant]string, set []variant, bit variant) bool {
	for _, v := range set {
		if byVariant[v] != byVariant[v^bit] {
			return true
		}
	}
	return false
}

const chartYAML = `# Generated by hack/helmchart from kustomize/ (make manifests). DO NOT EDIT.
apiVersion: v2
name: inferencecache-operator
description: The inferencecache operator (CacheBackend, an LMCache server per backend, a Pod webhook wiring vLLM and SGLang engines to it), rendered from the project's kustomize overlays.
type: application
version: 0.1.0
appVersion: %q
home: https://github.com/inferencecache/operator
sources:
  - https://github.com/inferencecache/operator
`

const helpers = `{{/* Generated by hack/helmchart (make manifests). DO NOT EDIT. */}}
{{/* The chart's labels on every object's metadata, then commonLabels. */}}
{{- define "inferencecache.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{/* An image reference from {repository, tag, digest}: the digest wins. */}}
{{- define "inferencecache.image" -}}
{{- if .digest }}{{ .repository }}@{{ .digest }}{{ else }}{{ .repository }}:{{ .tag }}{{ end }}
{{- end }}
`

// chartLabels are set by the chart's labels helper; kustomize's own values
// of them (if any) are dropped so no key appears twice.
var chartLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}
