package helmchart

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/imageref"
)

// generator turns kustomize's objects into template text and collects the
// values (with their schema) that the templates read.
type generator struct {
	values *node
	// frozen: values are only read, not added, for flags (see run).
	frozen bool
	// blocks and scalars of the object being templated, by sentinel id.
	blocks  []func(prefix string, indent int) string
	scalars []string
	// appVersion is the tag of the first workload's first image.
	appVersion string
}

func newGenerator() *generator {
	root := object("")
	for _, s := range switches {
		path := strings.Split(s.Value, ".")
		root.set(path[:len(path)-1], path[len(path)-1], leaf("boolean", s.Default, s.Doc))
	}
	root.set([]string{"crds"}, "install", leaf("boolean", true, "Install and upgrade the CacheBackend CRD with the chart (from templates/, so `helm upgrade` updates its schema)."))
	root.set([]string{"crds"}, "keep", leaf("boolean", true, "Annotate the CRD helm.sh/resource-policy: keep, so `helm uninstall` leaves it (and every CacheBackend) in place; delete it by hand to remove them."))
	root.set(nil, "createNamespace", leaf("boolean", false, "Render the release's Namespace as an object of the chart (kustomize's overlays include it). Leave false with `helm install --create-namespace`."))
	root.set(nil, "commonLabels", leaf("stringMap", map[string]any{}, "Labels added to every object and pod template of the chart."))
	root.set(nil, "global", leaf("freeObject", map[string]any{}, "Values an umbrella chart passes to all its subcharts; accepted and not read (set imagePullSecrets per workload)."))
	root.set([]string{"networkPolicy"}, "enabled", leaf("boolean", true, "Install the NetworkPolicies (kustomize/base/network): who may reach the webhooks, the index's ingest and query API, and the metrics. Each policy's from (at least one peer) is a value below; docs/security.md#network-policies says what to set per distribution."))
	root.child("networkPolicy").doc = "NetworkPolicies of the operator's and the index's pods (ingress only; egress stays open)."
	root.child("crds").doc = "The CacheBackend CustomResourceDefinition."
	root.child("certManager").doc = "How the webhooks get their serving certificate."
	root.child("namespaceOptIn").doc = "Opt-in namespaces for the Pod webhook (docs/security.md)."
	root.child("monitoring").doc = "Prometheus Operator objects (docs/operations.md#alerts)."
	root.child("engineEviction").doc = "The per-node restart cascade of multiprocess mode (docs/security.md#engine-eviction)."
	return &generator{values: root}
}

const sentinelLabels = "__helm_labels__"
const sentinelPodLabels = "__helm_pod_labels__"
const sentinelKeep = "__helm_crd_keep__"

// template returns one object's template text for one variant.
func (g *generator) template(o map[string]any) (string, error) {
	g.blocks, g.scalars = nil, nil
	md := o["metadata"].(map[string]any)
	labels, _ := md["labels"].(map[string]any)
	if labels == nil {
		labels = map[string]any{}
	}
	for _, l := range chartLabels {
		delete(labels, l)
	}
	labels[sentinelLabels] = ""
	md["labels"] = labels
	kind, _ := o["kind"].(string)
	apiVersion, _ := o["apiVersion"].(string)
	wrap := ""
	switch {
	case kind == "CustomResourceDefinition" && strings.HasPrefix(apiVersion, "apiextensions.k8s.io/"):
		ann, _ := md["annotations"].(map[string]any)
		if ann == nil {
			ann = map[string]any{}
		}
		ann[sentinelKeep] = ""
		md["annotations"] = ann
		wrap = "crds.install"
	case kind == "Namespace" && apiVersion == "v1":
		wrap = "createNamespace"
	case kind == "NetworkPolicy" && apiVersion == "networking.k8s.io/v1":
		if err := g.networkPolicy(o); err != nil {
			return "", err
		}
		wrap = "networkPolicy.enabled"
	case (kind == "Deployment" || kind == "StatefulSet" || kind == "DaemonSet") && strings.HasPrefix(apiVersion, "apps/"):
		if err := g.workload(o); err != nil {
			return "", err
		}
	}
	raw, err := yaml.Marshal(o)
	if err != nil {
		return "", err
	}
	text := escapeActions(string(raw))
	text = strings.ReplaceAll(text, Namespace, "{{ $.Release.Namespace }}")
	text, err = g.substitute(text)
	if err != nil {
		return "", err
	}
	if wrap != "" {
		text = "{{- if $.Values." + wrap + " }}\n" + text + "{{- end }}\n"
	}
	return text, nil
}

var (
	blockLine  = regexp.MustCompile(`^(\s*)(- )?([^\s:]+): '?@@B(\d+)@@'?$`)
	keyLine    = regexp.MustCompile(`^(\s*)(__helm_\w+__): ""$`)
	scalarText = regexp.MustCompile(`'?@@S(\d+)@@'?`)
)

// substitute replaces the sentinels of the marshalled object with template
// actions.
func (g *generator) substitute(text string) (string, error) {
	lines := strings.Split(text, "\n")
	for i, line := range lines {
		if m := blockLine.FindStringSubmatch(line); m != nil {
			id, _ := strconv.Atoi(m[4])
			prefix := m[1] + m[2] + m[3] + ":"
			lines[i] = g.blocks[id](prefix, len(m[1])+len(m[2])+2)
			continue
		}
		if m := keyLine.FindStringSubmatch(line); m != nil {
			n := len(m[1])
			switch m[2] {
			case sentinelLabels:
				lines[i] = fmt.Sprintf(`{{- include "inferencecache.labels" $ | nindent %d }}`, n)
			case sentinelPodLabels:
				lines[i] = fmt.Sprintf("{{- with $.Values.commonLabels }}{{ toYaml . | nindent %d }}{{- end }}", n)
			case sentinelKeep:
				lines[i] = fmt.Sprintf("{{- if $.Values.crds.keep }}\n%shelm.sh/resource-policy: keep\n{{- end }}", m[1])
			}
			continue
		}
		lines[i] = scalarText.ReplaceAllStringFunc(line, func(s string) string {
			id, _ := strconv.Atoi(scalarText.FindStringSubmatch(s)[1])
			return "{{ " + g.scalars[id] + " }}"
		})
	}
	text = strings.Join(lines, "\n")
	if strings.Contains(text, "@@") || strings.Contains(text, "__helm_") {
		return "", fmt.Errorf("a sentinel was left in the template:\n%s", text)
	}
	return text, nil
}

func (g *generator) scalar(expr string) string {
	g.scalars = append(g.scalars, expr)
	return fmt.Sprintf("@@S%d@@", len(g.scalars)-1)
}

func (g *generator) block(f func(prefix string, indent int) string) string {
	g.blocks = append(g.blocks, f)
	return fmt.Sprintf("@@B%d@@", len(g.blocks)-1)
}

// withBlock renders key only when the value is not empty (always when the
// key starts a list item, which cannot be left out).
func (g *generator) withBlock(ref string) string {
	return g.block(func(prefix string, indent int) string {
		if strings.HasPrefix(strings.TrimSpace(prefix), "- ") {
			return fmt.Sprintf("%s\n{{- toYaml %s | nindent %d }}", prefix, ref, indent)
		}
		return fmt.Sprintf("{{- with %s }}\n%s\n{{- toYaml . | nindent %d }}\n{{- end }}", ref, prefix, indent)
	})
}

// workload parameterises a Deployment, StatefulSet or DaemonSet.
func (g *generator) workload(o map[string]any) error {
	md := o["metadata"].(map[string]any)
	name := fmt.Sprint(md["name"])
	wk := camel(strings.TrimPrefix(name, "inferencecache-"))
	if top := g.values.child(wk); top != nil && top.workload != name {
		return fmt.Errorf("workload %s: values key %q is taken", name, wk)
	}
	w := g.values.ensure(wk)
	w.workload = name
	w.doc = fmt.Sprintf("%s %s.", o["kind"], name)
	ref := func(path ...string) string { return "$.Values." + strings.Join(append([]string{wk}, path...), ".") }
	spec, _ := o["spec"].(map[string]any)
	if spec == nil {
		return fmt.Errorf("no spec")
	}
	if r, ok := spec["replicas"]; ok {
		w.set(nil, "replicas", leaf("integer", r, "Replicas."))
		spec["replicas"] = g.scalar(ref("replicas"))
	}
	tmpl, _ := spec["template"].(map[string]any)
	tmd, _ := tmpl["metadata"].(map[string]any)
	pod, _ := tmpl["spec"].(map[string]any)
	if tmd == nil || pod == nil {
		return fmt.Errorf("no pod template")
	}
	tl, _ := tmd["labels"].(map[string]any)
	if tl == nil {
		tl = map[string]any{}
	}
	tl[sentinelPodLabels] = ""
	tmd["labels"] = tl
	if _, has := tmd["annotations"]; has {
		return fmt.Errorf("the pod template has annotations of its own; the chart maps podAnnotations only onto none")
	}
	w.set(nil, "podAnnotations", leaf("stringMap", map[string]any{}, "Annotations of the pods (their template's metadata)."))
	tmd["annotations"] = g.withBlock(ref("podAnnotations"))
	for _, f := range podFields {
		def := pod[f.key]
		if def == nil {
			switch f.kind {
			case "tolerations", "objectList", "localObjectReferences":
				def = []any{}
			case "string":
				def = ""
			default:
				def = map[string]any{}
			}
		}
		w.set(nil, f.key, leaf(f.kind, def, f.doc))
		pod[f.key] = g.withBlock(ref(f.key))
	}
	containers, _ := pod["containers"].([]any)
	for _, c := range containers {
		c := c.(map[string]any)
		cname := fmt.Sprint(c["name"])
		ck := camel(cname)
		if existing := w.child(ck); existing != nil && existing.container != cname || ck == "replicas" || ck == "podAnnotations" || slices.ContainsFunc(podFields, func(f podField) bool { return f.key == ck }) {
			return fmt.Errorf("container %s: values key %s.%s is taken", cname, wk, ck)
		}
		cv := w.ensure(ck)
		cv.container = cname
		cv.doc = fmt.Sprintf("Container %s.", cname)
		cref := func(path ...string) string { return ref(append([]string{ck}, path...)...) }
		if img, ok := c["image"].(string); ok {
			cv.set(nil, "image", leaf("image", splitImage(img), "Image; a digest, when set, is used instead of the tag."))
			c["image"] = g.scalar(fmt.Sprintf(`include "inferencecache.image" %s | quote`, cref("image")))
			if g.appVersion == "" {
				g.appVersion = splitImage(img)["tag"].(string)
			}
		}
		res := c["resources"]
		if res == nil {
			res = map[string]any{}
		}
		cv.set(nil, "resources", leaf("resources", res, "Resource requests and limits."))
		c["resources"] = g.withBlock(cref("resources"))
		if args, ok := c["args"].([]any); ok {
			lines, err := g.args(w.workload, cname, cv, cref, args)
			if err != nil {
				return err
			}
			c["args"] = g.block(func(prefix string, indent int) string {
				pad := strings.Repeat(" ", indent)
				return prefix + "\n" + strings.ReplaceAll(strings.Join(lines, "\n"), "@PAD@", pad)
			})
		}
	}
	return nil
}

// podField is a pod-spec field every workload's pods take from values.
type podField struct{ key, kind, doc string }

// podFields are the pod-spec fields of every workload that are values:
// where the pods run and with what priority and pull credentials.
var podFields = []podField{
	{"nodeSelector", "stringMap", "The pods' nodeSelector."},
	{"tolerations", "tolerations", "The pods' tolerations."},
	{"affinity", "affinity", "The pods' affinity."},
	{"topologySpreadConstraints", "objectList", "The pods' topologySpreadConstraints (e.g. across zones: maxSkew 1, topologyKey topology.kubernetes.io/zone, whenUnsatisfiable ScheduleAnyway, a labelSelector of the workload's pod labels)."},
	{"priorityClassName", "string", "The pods' priorityClassName (e.g. system-cluster-critical: the webhook admits every pod CREATE)."},
	{"imagePullSecrets", "localObjectReferences", "Secrets of the release's namespace to pull the images with ([{name: ...}])."},
}

// networkPolicy turns the peers of a NetworkPolicy's one ingress rule into
// the value networkPolicy.<name>.from: who may connect differs per cluster
// (the API server's addresses, the monitoring namespace), the ports and the
// pods it selects are the bundle's own.
func (g *generator) networkPolicy(o map[string]any) error {
	name := fmt.Sprint(o["metadata"].(map[string]any)["name"])
	key := camel(strings.TrimPrefix(name, "inferencecache-"))
	spec, _ := o["spec"].(map[string]any)
	rules, _ := spec["ingress"].([]any)
	if len(rules) != 1 {
		return fmt.Errorf("networkpolicy %s: %d ingress rules, the chart maps exactly one", name, len(rules))
	}
	rule, _ := rules[0].(map[string]any)
	from, _ := rule["from"].([]any)
	if len(from) == 0 {
		// An empty from allows every source: never a default to publish.
		return fmt.Errorf("networkpolicy %s: its ingress rule has no from", name)
	}
	np := g.values.ensure("networkPolicy")
	if p := np.child(key); p != nil && p.workload != name {
		return fmt.Errorf("networkpolicy %s: values key networkPolicy.%s is taken", name, key)
	}
	p := np.ensure(key)
	p.workload = name
	p.doc = fmt.Sprintf("NetworkPolicy %s.", name)
	p.set(nil, "from", leaf("peers", from, "Who may connect: the ingress rule's from (ipBlock, namespaceSelector and podSelector peers; at least one, since an empty list would allow every source)."))
	rule["from"] = g.withBlock("$.Values.networkPolicy." + key + ".from")
	return nil
}

// optionalFlags are manager flags the overlays do not set but the chart
// exposes (empty: not passed, the binary's default). A flag the overlays
// set is taken from them instead.
var optionalFlags = map[string][]string{
	"inferencecache-operator/manager": {"cluster-domain", "kvevent-subscriber-image"},
}

var flagDocs = map[string]string{
	"cluster-domain":           "The cluster's DNS domain (--cluster-domain; empty: cluster.local).",
	"kvevent-subscriber-image": "The kvevent-subscriber sidecar's image (--kvevent-subscriber-image), of the manager's release; an empty repository never adds the sidecar (the KV-event pipeline off).",
}

// args turns a container's arguments into template lines (@PAD@ is the
// items' indentation): `--flag=value` and `--flag` arguments read values
// under flags, the others stay literal; extraArgs follow.
func (g *generator) args(workload, container string, cv *node, cref func(...string) string, args []any) ([]string, error) {
	var lines []string
	seen := map[string]bool{}
	flags := cv.child("flags")
	add := func(name string, value *string) {
		seen[name] = true
		key := camel(name)
		fref := cref("flags", key)
		if flags == nil || flags.child(key) == nil {
			// Only in a variant other than the default, or naming the
			// namespace (an address of another object): literal.
			if g.frozen && cv.child("flags") != nil || value != nil && strings.Contains(*value, Namespace) {
				arg := "--" + name
				if value != nil {
					arg += "=" + *value
				}
				lines = append(lines, "@PAD@- "+literal(arg))
				return
			}
			flags = cv.ensure("flags")
			flags.doc = "The container's --flag=value arguments (docs/operations.md lists the manager's flags)."
			flags.set(nil, key, flagLeaf(name, value))
		}
		switch flags.child(key).kind {
		case "boolean":
			if value == nil {
				lines = append(lines, "{{- if "+fref+" }}", "@PAD@- --"+name, "{{- else }}", "@PAD@- --"+name+"=false", "{{- end }}")
			} else {
				lines = append(lines, fmt.Sprintf(`@PAD@- {{ printf "--%s=%%v" %s | quote }}`, name, fref))
			}
		case "integer":
			lines = append(lines, fmt.Sprintf(`@PAD@- {{ printf "--%s=%%v" %s | quote }}`, name, fref))
		case "image":
			lines = append(lines, "{{- if "+fref+".repository }}",
				fmt.Sprintf(`@PAD@- {{ printf "--%s=%%s" (include "inferencecache.image" %s) | quote }}`, name, fref), "{{- end }}")
		default:
			lines = append(lines, fmt.Sprintf(`{{- if ne (toString %s) "" }}`, fref),
				fmt.Sprintf(`@PAD@- {{ printf "--%s=%%v" %s | quote }}`, name, fref), "{{- end }}")
		}
	}
	for _, a := range args {
		s := fmt.Sprint(a)
		if !strings.HasPrefix(s, "--") || len(s) == 2 {
			lines = append(lines, "@PAD@- "+literal(s))
			continue
		}
		name, value, hasValue := strings.Cut(s[2:], "=")
		if seen[name] {
			return nil, fmt.Errorf("container %s of %s: flag --%s given twice", container, workload, name)
		}
		if hasValue {
			add(name, &value)
		} else {
			add(name, nil)
		}
	}
	if !g.frozen {
		for _, name := range optionalFlags[workload+"/"+container] {
			if !seen[name] {
				empty := ""
				add(name, &empty)
				flags.child(camel(name)).doc = flagDocs[name]
			}
		}
	} else {
		for _, name := range optionalFlags[workload+"/"+container] {
			if !seen[name] && flags != nil && flags.child(camel(name)) != nil {
				empty := ""
				add(name, &empty)
			}
		}
	}
	cv.set(nil, "extraArgs", leaf("stringList", []any{}, "More arguments, after the flags."))
	lines = append(lines, "{{- range "+cref("extraArgs")+" }}", "@PAD@- {{ . | quote }}", "{{- end }}")
	return lines, nil
}

// literal is an argument as it stands, quoted, the overlays' namespace
// replaced by the release's.
func literal(arg string) string {
	q, _ := json.Marshal(arg)
	return strings.ReplaceAll(escapeActions(string(q)), Namespace, "{{ $.Release.Namespace }}")
}

// escapeActions makes text that Helm's template engine writes as it is.
func escapeActions(text string) string {
	return strings.NewReplacer("{{", `{{ "{{" }}`, "}}", `{{ "}}" }}`).Replace(text)
}

func flagLeaf(name string, value *string) *node {
	doc := "--" + name
	if d, ok := flagDocs[name]; ok {
		doc = d
	}
	switch {
	case value == nil:
		return leaf("boolean", true, doc)
	case strings.HasSuffix(name, "-image"):
		img := map[string]any{"repository": "", "tag": "", "digest": ""}
		if *value != "" {
			img = splitImage(*value)
		}
		return leaf("image", img, doc)
	case *value == "true" || *value == "false":
		return leaf("boolean", *value == "true", doc)
	}
	if n, err := strconv.Atoi(*value); err == nil {
		return leaf("integer", n, doc)
	}
	return leaf("string", *value, doc)
}

// splitImage splits an image reference into repository, tag and digest.
func splitImage(ref string) map[string]any {
	repo, tag, digest := imageref.Split(ref)
	return map[string]any{"repository": repo, "tag": tag, "digest": digest}
}

// camel turns a-flag-name into aFlagName.
func camel(s string) string {
	parts := strings.FieldsFunc(s, func(r rune) bool { return r == '-' || r == '.' || r == '_' })
	for i := 1; i < len(parts); i++ {
		parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
	}
	return strings.Join(parts, "")
}
