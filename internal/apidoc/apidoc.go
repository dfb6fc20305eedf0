// Package apidoc renders the CacheBackend CRD's schema as a Markdown API
// reference: one row per field, with its type, default, validation and the
// first sentence of its description (the Go doc comment).
package apidoc

import (
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// leaves are Kubernetes types documented upstream: not expanded.
var leaves = map[string]string{
	"spec.remoteStorage.lmCacheServer.resources": "core/v1 ResourceRequirements",
	"spec.integration.engineOverrides.env":       "list of core/v1 EnvVar, keyed by name",
	"status.conditions":                          "list of meta/v1 Condition, keyed by type",
}

// Generate returns the reference for the CRD in crdYAML.
func Generate(crdYAML []byte) (string, error) {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(crdYAML, crd); err != nil {
		return "", err
	}
	if len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Schema == nil {
		return "", fmt.Errorf("expected one version with a schema")
	}
	v := crd.Spec.Versions[0]
	var b strings.Builder
	fmt.Fprintf(&b, "# %s API reference (%s/%s)\n\n", crd.Spec.Names.Kind, crd.Spec.Group, v.Name)
	b.WriteString("Generated from the CRD by `make manifests` (hack/apidoc); do not edit. The design doc explains the behaviour behind each field.\n\n")
	root := v.Schema.OpenAPIV3Schema
	for _, top := range []string{"spec", "status"} {
		fmt.Fprintf(&b, "## %s\n\n| Field | Type | Default | Validation | Description |\n|---|---|---|---|---|\n", top)
		walk(&b, top, root.Properties[top], root.Properties[top].Required)
		b.WriteString("\n")
	}
	if len(root.XValidations) > 0 || len(root.Properties["spec"].XValidations) > 0 {
		b.WriteString("## Cross-field rules\n\n")
		for _, r := range append(root.XValidations, root.Properties["spec"].XValidations...) {
			fmt.Fprintf(&b, "- %s\n", r.Message)
		}
	}
	return b.String(), nil
}

func walk(b *strings.Builder, path string, s apiextensionsv1.JSONSchemaProps, _ []string) {
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := s.Properties[n]
		fp := path + "." + n
		typ := p.Type
		if p.XIntOrString {
			typ = "quantity"
		}
		if t, ok := leaves[fp]; ok {
			typ = t
		}
		if p.Type == "array" && p.Items != nil && p.Items.Schema != nil && leaves[fp] == "" {
			typ = "list of " + p.Items.Schema.Type
		}
		req := ""
		if contains(s.Required, n) {
			req = " (required)"
		}
		def := ""
		if p.Default != nil {
			def = "`" + string(p.Default.Raw) + "`"
		}
		fmt.Fprintf(b, "| `%s`%s | %s | %s | %s | %s |\n", fp, req, typ, def, validation(p), firstSentence(p.Description))
		if _, leaf := leaves[fp]; !leaf && p.Type == "object" && len(p.Properties) > 0 {
			walk(b, fp, p, p.Required)
		}
	}
}

func validation(p apiextensionsv1.JSONSchemaProps) string {
	var v []string
	if len(p.Enum) > 0 {
		var vals []string
		for _, e := range p.Enum {
			vals = append(vals, strings.Trim(string(e.Raw), `"`))
		}
		v = append(v, "one of "+strings.Join(vals, ", "))
	}
	if p.Items != nil && p.Items.Schema != nil && len(p.Items.Schema.Enum) > 0 {
		var vals []string
		for _, e := range p.Items.Schema.Enum {
			vals = append(vals, strings.Trim(string(e.Raw), `"`))
		}
		v = append(v, "items one of "+strings.Join(vals, ", "))
	}
	if p.Minimum != nil {
		v = append(v, fmt.Sprintf("≥ %v", *p.Minimum))
	}
	if p.Maximum != nil {
		v = append(v, fmt.Sprintf("≤ %v", *p.Maximum))
	}
	if p.MaxLength != nil {
		v = append(v, fmt.Sprintf("at most %d characters", *p.MaxLength))
	}
	if p.Pattern != "" {
		v = append(v, "pattern `"+strings.ReplaceAll(p.Pattern, "|", "\\|")+"`")
	}
	for _, r := range p.XValidations {
		v = append(v, r.Message)
	}
	if p.XListType != nil && *p.XListType == "map" {
		v = append(v, "list-map keyed by "+strings.Join(p.XListMapKeys, ", "))
	}
	return strings.Join(v, "; ")
}

func firstSentence(d string) string {
	d = strings.Join(strings.Fields(d), " ")
	for off := 0; ; {
		i := strings.Index(d[off:], ". ")
		if i < 0 {
			break
		}
		end := off + i
		if strings.HasSuffix(d[:end], "e.g") || strings.HasSuffix(d[:end], "i.e") {
			off = end + 2
			continue
		}
		d = d[:end+1]
		break
	}
	return strings.ReplaceAll(d, "|", "\\|")
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
