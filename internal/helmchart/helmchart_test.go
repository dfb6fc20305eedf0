package helmchart

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplitImage(t *testing.T) {
	d := "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		ref, repo, tag, digest string
	}{
		{"inferencecache/operator:v0.1.0", "inferencecache/operator", "v0.1.0", ""},
		{"inferencecache/operator", "inferencecache/operator", "", ""},
		{"registry.example:5000/op", "registry.example:5000/op", "", ""},
		{"registry.example:5000/op:v1", "registry.example:5000/op", "v1", ""},
		{"r.example/op@" + d, "r.example/op", "", d},
		{"r.example/op:v1@" + d, "r.example/op", "v1", d},
	} {
		assert.Equal(t, map[string]any{"repository": tc.repo, "tag": tc.tag, "digest": tc.digest}, splitImage(tc.ref), tc.ref)
	}
}

func TestFlagLeaf(t *testing.T) {
	s := func(v string) *string { return &v }
	for _, tc := range []struct {
		name  string
		value *string
		kind  string
		def   any
	}{
		{"leader-elect", nil, "boolean", true},
		{"metrics-secure", s("false"), "boolean", false},
		{"webhook-port", s("9443"), "integer", 9443},
		{"metrics-bind-address", s(":8443"), "string", ":8443"},
		{"cluster-domain", s(""), "string", ""},
		{"kvevent-subscriber-image", s(""), "image", map[string]any{"repository": "", "tag": "", "digest": ""}},
		{"kvevent-subscriber-image", s("r.example/sub:v1"), "image", map[string]any{"repository": "r.example/sub", "tag": "v1", "digest": ""}},
	} {
		l := flagLeaf(tc.name, tc.value)
		assert.Equal(t, tc.kind, l.kind, tc.name)
		assert.Equal(t, tc.def, l.def, tc.name)
	}
}

func TestCamel(t *testing.T) {
	for in, want := range map[string]string{
		"operator":                 "operator",
		"cache-index":              "cacheIndex",
		"kvevent-subscriber-image": "kveventSubscriberImage",
		"a.b_c":                    "aBC",
	} {
		assert.Equal(t, want, camel(in), in)
	}
}

// TestBranch: a template branches only on the switches its object depends
// on, and an object absent from some variants is wrapped in that switch.
func TestBranch(t *testing.T) {
	n := variant(1) << len(switches)
	all := func(f func(v variant) string) map[variant]string {
		m := map[variant]string{}
		for v := variant(0); v < n; v++ {
			m[v] = f(v)
		}
		return m
	}
	assert.Equal(t, "same\n", branch(all(func(variant) string { return "same\n" }), 0, 0, n))
	assert.Equal(t, "{{- if $.Values.certManager.enabled }}\nprod\n{{- else }}\ndev\n{{- end }}\n",
		branch(all(func(v variant) string {
			if v.on(0) {
				return "prod\n"
			}
			return "dev\n"
		}), 0, 0, n))
	assert.Equal(t, "{{- if $.Values.monitoring.enabled }}\nrule\n{{- end }}\n",
		branch(all(func(v variant) string {
			if v.on(2) {
				return "rule\n"
			}
			return ""
		}), 0, 0, n))
	assert.Equal(t, "{{- if not $.Values.certManager.enabled }}\nself-signed\n{{- end }}\n",
		branch(all(func(v variant) string {
			if !v.on(0) {
				return "self-signed\n"
			}
			return ""
		}), 0, 0, n))
	nested := branch(all(func(v variant) string {
		if v.on(0) && v.on(1) {
			return "prod+optin\n"
		}
		if v.on(0) {
			return "prod\n"
		}
		return "dev\n"
	}), 0, 0, n)
	assert.Equal(t, "{{- if $.Values.certManager.enabled }}\n{{- if $.Values.namespaceOptIn.enabled }}\nprod+optin\n{{- else }}\nprod\n{{- end }}\n{{- else }}\ndev\n{{- end }}\n", nested)
	assert.NotContains(t, nested, "monitoring", "no branch on a switch the object does not depend on")
}

// TestTemplateEscapesActions: text of the overlays that looks like a Go
// template (the PrometheusRule's {{ $labels.x }}) reaches the cluster as
// it is.
func TestTemplateEscapesActions(t *testing.T) {
	g := newGenerator()
	text, err := g.template(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "x", "namespace": Namespace},
		"data":     map[string]any{"summary": "{{ $labels.name }} is down"},
	})
	assert.NoError(t, err)
	assert.Contains(t, text, `summary: '{{ "{{" }} $labels.name {{ "}}" }} is down'`)
	assert.Contains(t, text, "namespace: {{ $.Release.Namespace }}")
	assert.Contains(t, text, `{{- include "inferencecache.labels" $ | nindent 4 }}`)
}

// TestTemplateNetworkPolicy: a NetworkPolicy's one ingress rule reads its
// peers from networkPolicy.<name>.from, the policy renders only while
// networkPolicy.enabled, and a policy the chart could not map (no from,
// which would publish "allow every source" as a default, or two rules) is
// an error.
func TestTemplateNetworkPolicy(t *testing.T) {
	np := func(rules ...any) map[string]any {
		return map[string]any{
			"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
			"metadata": map[string]any{"name": "inferencecache-index-query", "namespace": Namespace},
			"spec": map[string]any{
				"podSelector": map[string]any{},
				"ingress":     rules,
			},
		}
	}
	peer := map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"a": "b"}}}
	g := newGenerator()
	text, err := g.template(np(map[string]any{"from": []any{peer}, "ports": []any{map[string]any{"port": "http"}}}))
	assert.NoError(t, err)
	assert.Contains(t, text, "{{- if $.Values.networkPolicy.enabled }}\n")
	assert.Contains(t, text, "  - from:\n{{- toYaml $.Values.networkPolicy.indexQuery.from | nindent 6 }}\n    ports:")
	assert.Equal(t, []any{peer}, g.values.child("networkPolicy").child("indexQuery").child("from").def)

	_, err = newGenerator().template(np(map[string]any{"ports": []any{map[string]any{"port": "http"}}}))
	assert.ErrorContains(t, err, "no from")
	_, err = newGenerator().template(np(map[string]any{"from": []any{peer}}, map[string]any{"from": []any{peer}}))
	assert.ErrorContains(t, err, "2 ingress rules")
}
