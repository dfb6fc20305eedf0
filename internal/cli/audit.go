package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/receipt"
	"github.com/inferencecache/operator/internal/render"
)

// AuditRow is one engine pod in an audit: the verdict of Explain, in a
// form for a table, JSON or YAML.
type AuditRow struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// CacheBackend is the <namespace>/<name> the receipt or labels point at.
	CacheBackend string `json:"cacheBackend,omitempty"`
	// Outcome is one of the Explain* outcomes.
	Outcome string `json:"outcome"`
	// Receipt is one of the Receipt* states.
	Receipt string `json:"receipt"`
	// Generation is current or stale when the receipt names the live
	// CacheBackend, empty otherwise.
	Generation string   `json:"generation,omitempty"`
	Details    []string `json:"details,omitempty"`
}

// Audit classifies every engine pod of namespace ns (all namespaces when ns
// is empty) as Explain does, one row per pod, sorted by namespace and name.
// keys and keysErr are as for Explain.
func Audit(ctx context.Context, c client.Reader, ns string, keys []receipt.Key, keysErr error) ([]AuditRow, error) {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	var list v1alpha1.CacheBackendList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, fmt.Errorf("listing CacheBackends: %w", err)
	}
	byNS := map[string][]v1alpha1.CacheBackend{}
	for _, cb := range list.Items {
		byNS[cb.Namespace] = append(byNS[cb.Namespace], cb)
	}
	rows := []AuditRow{}
	for i := range pods.Items {
		p := &pods.Items[i]
		backends := byNS[p.Namespace]
		if !IsEnginePod(p, backends) {
			continue
		}
		e := explain(p, backends, keys, keysErr)
		rows = append(rows, AuditRow{Namespace: p.Namespace, Pod: p.Name, CacheBackend: e.Backend,
			Outcome: e.Outcome, Receipt: e.Receipt, Generation: e.Generation, Details: e.Lines})
	}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].Namespace != rows[j].Namespace {
			return rows[i].Namespace < rows[j].Namespace
		}
		return rows[i].Pod < rows[j].Pod
	})
	return rows, nil
}

// IsEnginePod reports whether an audit lists p: a pod a CacheBackend of its
// namespace selects, a pod with any injection annotation (receipt, skip
// request or skip record), or a pod running a vLLM or SGLang image or
// command, which matches no CacheBackend but may be meant to. The operator's
// own cache-server pods are not engines.
func IsEnginePod(p *corev1.Pod, backends []v1alpha1.CacheBackend) bool {
	if _, ok := p.Labels[render.LabelCacheBackend]; ok {
		return false
	}
	if inject.Select(p.Labels, backends) != nil {
		return true
	}
	for _, k := range []string{v1alpha1.AnnotationInjectedBy, v1alpha1.AnnotationSkipInject, v1alpha1.AnnotationInjectSkipped} {
		if _, ok := p.Annotations[k]; ok {
			return true
		}
	}
	for _, c := range p.Spec.Containers {
		words := append([]string{c.Image}, c.Command...)
		for _, w := range append(words, c.Args...) {
			w = strings.ToLower(w)
			if strings.Contains(w, "vllm") || strings.Contains(w, "sglang") {
				return true
			}
		}
	}
	return false
}

// PrintAuditTable writes rows as a kubectl-style table.
func PrintAuditTable(w io.Writer, rows []AuditRow, withNamespace bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	if withNamespace {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprintln(tw, "POD\tCACHEBACKEND\tOUTCOME\tRECEIPT\tGENERATION")
	for _, r := range rows {
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", r.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Pod, dash(r.CacheBackend), r.Outcome, r.Receipt, dash(r.Generation))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
