package cmd

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/version"
)

func newExplain(o *options) *cobra.Command {
	explain := &cobra.Command{
		Use:   "explain",
		Short: "Explain what the webhook did with an object",
	}
	pod := &cobra.Command{
		Use:   "pod NAME",
		Short: "Say whether a pod was injected, skipped, admitted unwired (fail-open) or matched nothing, and why",
		Long: `Say whether a pod was injected, skipped, admitted unwired (fail-open) or
matched no CacheBackend, and why; whether its receipt verifies with the
operator's key (read from the receipt key Secret when the caller may); and
the operator's events on it.`,
		Example: `  kubectl cachebackend explain pod qwen-demo-7c9f -n llm`,
		Args:    cobra.ExactArgs(1),
		ValidArgsFunction: func(c *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return o.podNames(c.Context()), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			k, err := o.client()
			if err != nil {
				return err
			}
			ns, _, err := o.namespace()
			if err != nil {
				return err
			}
			keys, keysErr := cli.ReadKeys(c.Context(), k, o.operatorNamespace)
			e, err := cli.Explain(c.Context(), k, ns, args[0], keys, keysErr)
			if err != nil {
				return err
			}
			e.Print(o.streams.Out)
			return nil
		},
	}
	explain.AddCommand(pod)
	return explain
}

// podNames completes pod names of the namespace; nothing on any error.
func (o *options) podNames(ctx context.Context) []cobra.Completion {
	k, err := o.client()
	if err != nil {
		return nil
	}
	ns, _, err := o.namespace()
	if err != nil {
		return nil
	}
	var pods corev1.PodList
	if err := k.List(ctx, &pods, client.InNamespace(ns)); err != nil {
		return nil
	}
	out := make([]cobra.Completion, 0, len(pods.Items))
	for _, p := range pods.Items {
		out = append(out, p.Name)
	}
	return out
}

func newCheck(o *options) *cobra.Command {
	var pre bool
	certManager := cli.CertManagerAuto
	c := &cobra.Command{
		Use:   "check [--pre]",
		Short: "Check a cluster before an install (--pre) or an installed operator",
		Long: `Check a cluster before an install (--pre): the Kubernetes version, the
permission to install, and cert-manager (needed by overlays/production).

Without --pre, check the install: the CRD's served and stored versions, the
manager Deployment available, the webhook configurations and their Services'
ready endpoints, and that both webhooks answer, by a server-side dry-run
create of a CacheBackend (a valid one accepted, an invalid one rejected by
the validating webhook) and of a Pod in the namespace (-n) that must come
back mutated. Nothing is written.

Prints a table (✔ pass, ✗ fail, ! warning); exits 1 when any check fails.`,
		Example: `  kubectl cachebackend check --pre
  kubectl cachebackend check -n llm`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			switch certManager {
			case cli.CertManagerAuto, cli.CertManagerRequired, cli.CertManagerIgnored:
			default:
				return fmt.Errorf("--cert-manager must be auto, true or false, not %q", certManager)
			}
			cfg, err := o.flags.ToRESTConfig()
			if err != nil {
				return err
			}
			k, err := client.New(cfg, client.Options{Scheme: scheme})
			if err != nil {
				return err
			}
			dc, err := discovery.NewDiscoveryClientForConfig(cfg)
			if err != nil {
				return err
			}
			ns, _, err := o.namespace()
			if err != nil {
				return err
			}
			results := cli.CheckInstall(c.Context(), k, dc.ServerVersion, cli.CheckOptions{
				Pre: pre, Namespace: ns, OperatorNamespace: o.operatorNamespace, CertManager: certManager})
			if err := cli.PrintChecks(o.streams.Out, results); err != nil {
				return err
			}
			if cli.Failed(results) {
				n := 0
				for _, r := range results {
					if !r.OK {
						n++
					}
				}
				return &exitError{code: ExitFailed, err: fmt.Errorf("%d of %d checks failed", n, len(results))}
			}
			return nil
		},
	}
	c.Flags().BoolVar(&pre, "pre", false, "check the prerequisites of an install instead of an install")
	c.Flags().StringVar(&certManager, "cert-manager", certManager,
		"auto (required when the installed webhooks take their CA from cert-manager; a warning before an install), true (required) or false (not checked)")
	_ = c.RegisterFlagCompletionFunc("cert-manager", cobra.FixedCompletions(
		[]cobra.Completion{cli.CertManagerAuto, cli.CertManagerRequired, cli.CertManagerIgnored}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newAudit(o *options) *cobra.Command {
	var all bool
	var output string
	c := &cobra.Command{
		Use:   "audit [-A] [-o wide|json|yaml]",
		Short: "List every engine pod with what the webhook did with it",
		Long: `List every engine pod of the namespace (or of all namespaces with -A) with
the CacheBackend it matched, the outcome of its admission (injected,
skipped, fail-open, no-match, forged-receipt: as explain pod says), whether
its receipt verifies (verified, failed, unchecked when the receipt key
Secret cannot be read, none), and whether its receipt's generation is the
CacheBackend's current one or stale (the pod needs a rollout).

-o wide adds the CacheBackend's mode (in-process, multiprocess, hicache),
the kv_connector the pod is wired with (marked "!" when the mode wires
another: LMCacheConnectorV1 in-process, LMCacheMPConnector in
multiprocess mode) and, in multiprocess mode, the pod's node and the
state of that node's lmcache server (ready, not-ready, none, not-listed,
unknown, unscheduled), from the CacheBackend's status.multiprocess.
Pods wired with the wrong connector, and multiprocess engines on a node
without a ready server, are also named in warnings on stderr.

An engine pod is one a CacheBackend selects, one with an injection
annotation, or one running a vLLM or SGLang image or command.`,
		Example: `  kubectl cachebackend audit -n llm
  kubectl cachebackend audit -n llm -o wide
  kubectl cachebackend audit -A -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			switch output {
			case "", "wide", "json", "yaml":
			default:
				return fmt.Errorf("-o must be wide, json or yaml, not %q", output)
			}
			k, err := o.client()
			if err != nil {
				return err
			}
			ns := ""
			if !all {
				if ns, _, err = o.namespace(); err != nil {
					return err
				}
			}
			keys, keysErr := cli.ReadKeys(c.Context(), k, o.operatorNamespace)
			if keysErr != nil {
				fmt.Fprintf(o.streams.ErrOut, "warning: receipts are not checked: %v\n", keysErr)
			}
			rows, err := cli.Audit(c.Context(), k, ns, keys, keysErr)
			if err != nil {
				return err
			}
			switch output {
			case "json":
				b, err := json.MarshalIndent(rows, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(o.streams.Out, "%s\n", b)
				return err
			case "yaml":
				b, err := yaml.Marshal(rows)
				if err != nil {
					return err
				}
				_, err = o.streams.Out.Write(b)
				return err
			}
			if len(rows) == 0 {
				where := "in namespace " + ns
				if all {
					where = "in any namespace"
				}
				fmt.Fprintf(o.streams.ErrOut, "No engine pods found %s.\n", where)
				return nil
			}
			for _, w := range cli.AuditWarnings(rows) {
				fmt.Fprintf(o.streams.ErrOut, "warning: %s\n", w)
			}
			if output == "wide" {
				return cli.PrintAuditWide(o.streams.Out, rows, all)
			}
			return cli.PrintAuditTable(o.streams.Out, rows, all)
		},
	}
	c.Flags().BoolVarP(&all, "all-namespaces", "A", false, "audit the engine pods of every namespace")
	c.Flags().StringVarP(&output, "output", "o", "", "output format: wide (with the mode, connector and node server), json or yaml (default: a table)")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"wide", "json", "yaml"}, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newVersion(o *options) *cobra.Command {
	var clientOnly bool
	var output string
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the CLI's version and the running manager's",
		Long: `Print the CLI's version and the running manager's: the image of the manager
Deployment's container and its tag, and the Deployment's
app.kubernetes.io/version label ("unknown" when absent).`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			if output != "" && output != "yaml" && output != "json" {
				return fmt.Errorf("-o must be yaml or json, not %q", output)
			}
			// -o: kubectl version's shape, clientVersion and the
			// manager's, for scripts.
			type versions struct {
				ClientVersion  string              `json:"clientVersion"`
				ManagerVersion *cli.ManagerVersion `json:"managerVersion,omitempty"`
				ManagerError   string              `json:"managerError,omitempty"`
			}
			out := versions{ClientVersion: version.String(Program)}
			print := func() error {
				if output == "" {
					return nil
				}
				var b []byte
				var err error
				if output == "json" {
					b, err = json.MarshalIndent(out, "", "  ")
					b = append(b, '\n')
				} else {
					b, err = yaml.Marshal(out)
				}
				if err != nil {
					return err
				}
				_, err = o.streams.Out.Write(b)
				return err
			}
			if output == "" {
				fmt.Fprintf(o.streams.Out, "client: %s\n", out.ClientVersion)
			}
			if clientOnly {
				return print()
			}
			k, err := o.client()
			if err != nil {
				return err
			}
			v, err := cli.ReadManagerVersion(c.Context(), k, o.operatorNamespace)
			if apierrors.IsNotFound(err) {
				if output == "" {
					fmt.Fprintf(o.streams.Out, "manager: %s (%v)\n", cli.Unknown, err)
				}
				out.ManagerError = err.Error()
				return print()
			}
			if err != nil {
				return err
			}
			if output == "" {
				fmt.Fprintf(o.streams.Out, "manager: %s (image %s, %s=%s)\n", v.Tag, v.Image, cli.LabelVersion, v.Label)
			}
			out.ManagerVersion = &v
			return print()
		},
	}
	c.Flags().BoolVar(&clientOnly, "client", false, "print the CLI's version only")
	c.Flags().StringVarP(&output, "output", "o", "", "output format: yaml or json (default: two lines)")
	return c
}
