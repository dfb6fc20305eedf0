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
	Generation string `json:"generation,omitempty"`
	// Mode is the CacheBackend's mode (in-process, multiprocess, hicache).
	Mode string `json:"mode,omitempty"`
	// Connector is the kv_connector of the pod's --kv-transfer-config.
	Connector string `json:"connector,omitempty"`
	// WiringMismatch: the pod is wired with another connector than its
	// CacheBackend's mode wires (LMCacheConnectorV1 where the backend now
	// runs in multiprocess mode, or the reverse): roll its workload.
	WiringMismatch bool `json:"wiringMismatch,omitempty"`
	// Node and NodeServer: in multiprocess mode, the pod's node and the
	// state of that node's server (ready, not-ready, none, not-listed,
	// unknown, unscheduled).
	Node       string   `json:"node,omitempty"`
	NodeServer string   `json:"nodeServer,omitempty"`
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
			Outcome: e.Outcome, Receipt: e.Receipt, Generation: e.Generation,
			Mode: e.Mode, Connector: e.Connector, WiringMismatch: e.WiringMismatch, Node: e.Node, NodeServer: e.NodeServer,
			Details: e.Lines})
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
	if v1alpha1.Claimant(p.Labels, backends) != nil {
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
	return printAudit(w, rows, withNamespace, false)
}

// PrintAuditWide writes rows as PrintAuditTable does, with the columns of
// the modes (-o wide): MODE, CONNECTOR (the pod's kv_connector, with "!"
// when the backend's mode wires another), NODE and NODE-SERVER (in
// multiprocess mode, the state of the server of the pod's node).
func PrintAuditWide(w io.Writer, rows []AuditRow, withNamespace bool) error {
	return printAudit(w, rows, withNamespace, true)
}

func printAudit(w io.Writer, rows []AuditRow, withNamespace, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	if withNamespace {
		fmt.Fprint(tw, "NAMESPACE\t")
	}
	fmt.Fprint(tw, "POD\tCACHEBACKEND\tOUTCOME\tRECEIPT\tGENERATION")
	if wide {
		fmt.Fprint(tw, "\tMODE\tCONNECTOR\tNODE\tNODE-SERVER")
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		if withNamespace {
			fmt.Fprintf(tw, "%s\t", r.Namespace)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s", r.Pod, dash(r.CacheBackend), r.Outcome, r.Receipt, dash(r.Generation))
		if wide {
			connector := dash(r.Connector)
			if r.WiringMismatch {
				connector += "!"
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s", dash(r.Mode), connector, dash(r.Node), dash(r.NodeServer))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// AuditWarnings are the warnings a table of rows is printed with: the
// pods wired with another connector than their backend's mode, and the
// multiprocess engine pods whose node has no ready server.
func AuditWarnings(rows []AuditRow) []string {
	var mismatched, serverless []string
	for _, r := range rows {
		if r.WiringMismatch {
			mismatched = append(mismatched, r.Namespace+"/"+r.Pod)
		}
		if r.NodeServer == NodeServerNone || r.NodeServer == NodeServerNotReady {
			serverless = append(serverless, r.Namespace+"/"+r.Pod+" (node "+r.Node+": "+r.NodeServer+")")
		}
	}
	var out []string
	if len(mismatched) > 0 {
		out = append(out, fmt.Sprintf("%d pod(s) wired with another connector than their CacheBackend's mode wires; roll their workloads: %s", len(mismatched), strings.Join(mismatched, ", ")))
	}
	if len(serverless) > 0 {
		out = append(out, fmt.Sprintf("%d multiprocess engine pod(s) on a node without a ready server: %s", len(serverless), strings.Join(serverless, ", ")))
	}
	return out
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
