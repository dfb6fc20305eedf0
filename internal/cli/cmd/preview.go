package cmd

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/render"
)

// sourceFlags are -f/--filename (repeatable: files, folders, - for
// standard input; -R/--recursive into folders) and -k/--kustomize, as
// kubectl names them. Files are read by cli-runtime's resource builder,
// kubectl's own.
type sourceFlags struct {
	files     []string
	recursive bool
	dir       string
	in        io.Reader
}

func (s *sourceFlags) add(c *cobra.Command, in io.Reader) {
	s.in = in
	c.Flags().StringArrayVarP(&s.files, "filename", "f", nil, "file, folder or - (standard input) with CacheBackends; repeatable")
	c.Flags().BoolVarP(&s.recursive, "recursive", "R", false, "read the folders given with -f recursively")
	c.Flags().StringVarP(&s.dir, "kustomize", "k", "", "kustomization directory with CacheBackends (built in process)")
	c.MarkFlagsMutuallyExclusive("filename", "kustomize")
	c.MarkFlagsOneRequired("filename", "kustomize")
	_ = c.MarkFlagFilename("filename", "yaml", "yml", "json")
	_ = c.MarkFlagDirname("kustomize")
}

// objects reads the files or kustomization. Objects without a namespace get
// ns; with -n given (explicit), an object in another namespace is an error,
// as with kubectl apply.
func (s *sourceFlags) objects(ns string, explicit bool) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	var err error
	if s.dir != "" {
		objs, err = cli.ReadFile(s.dir, true)
	} else {
		objs, err = cli.ReadSources(s.files, s.recursive, s.in)
	}
	if err != nil {
		return nil, err
	}
	return objs, setNamespace(objs, ns, explicit)
}

func setNamespace(objs []*unstructured.Unstructured, ns string, explicit bool) error {
	for _, o := range objs {
		switch {
		case o.GetNamespace() == "":
			o.SetNamespace(ns)
		case explicit && o.GetNamespace() != ns:
			return fmt.Errorf("the namespace of %s %s (%s) does not match the namespace given with -n (%s)", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
		}
	}
	return nil
}

// backends reads the CacheBackends of the file or kustomization, in
// namespace ns unless they name theirs.
func (s *sourceFlags) backends(ns string, explicit bool) ([]*v1alpha1.CacheBackend, error) {
	objs, err := s.objects(ns, explicit)
	if err != nil {
		return nil, err
	}
	return cli.Backends(objs)
}

func newRender(o *options) *cobra.Command {
	var src sourceFlags
	var engine, domain, output string
	var wiring inject.Options
	c := &cobra.Command{
		Use:   "render (-f FILE... [-R] | -k DIR) [--engine FILE [--kvevent-subscriber-image IMAGE]] [-o yaml|json|name]",
		Short: "Print the child objects the controller applies for CacheBackends, offline",
		Long: `Print the child objects the controller applies for the CacheBackends of a
file or kustomization, in the order it applies them. With --engine, print
instead each engine Deployment's pod template as the webhook wires it; add
--kvevent-subscriber-image (the manager's flag of that name) to see the
kvevent-subscriber sidecar wiring of CacheBackends with
spec.observation.modelID. Nothing is read from a cluster, so the server's
pod template is the one a new server gets (with the hardened defaults); a
server created before them keeps its own, which diff shows.`,
		Example: `  kubectl cachebackend render -f examples/quickstart/cachebackend.yaml
  kubectl cachebackend render -k examples/quickstart
  kubectl cachebackend render -f examples/quickstart/cachebackend.yaml --engine examples/quickstart/engine.yaml
  kubectl cachebackend render -f examples/quickstart/cachebackend.yaml --engine examples/quickstart/engine.yaml \
    --kvevent-subscriber-image ghcr.io/inferencecache/inferencecache-kvevent-subscriber:v0.1.0`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			// Offline: a kubeconfig only lends its namespace, if it can.
			ns, explicit, err := o.namespace()
			if err != nil {
				ns, explicit = "default", false
			}
			if output != "yaml" && output != "json" && output != "name" {
				return fmt.Errorf("-o must be yaml, json or name, not %q", output)
			}
			backends, err := src.backends(ns, explicit)
			if err != nil {
				return err
			}
			if engine == "" {
				if output != "yaml" {
					var objs []*unstructured.Unstructured
					for _, cb := range backends {
						children, err := render.Objects(render.Render(cb))
						if err != nil {
							return err
						}
						objs = append(objs, children...)
					}
					return printObjects(o.streams.Out, output, objs)
				}
				for _, cb := range backends {
					if err := cli.RenderYAML(o.streams.Out, cb); err != nil {
						return err
					}
				}
				return nil
			}
			eobjs, err := cli.ReadFile(engine, false)
			if err != nil {
				return err
			}
			if err := setNamespace(eobjs, ns, explicit); err != nil {
				return err
			}
			if wiring.IndexEndpoint == "" {
				wiring.IndexEndpoint = inject.DefaultIndexEndpoint(operatorNamespace, domain)
			}
			wiring.ClusterDomain = domain
			if output != "yaml" {
				// The decisions go to stderr, the objects alone to stdout.
				engines, err := wireEngines(backends, eobjs, wiring)
				if err != nil {
					return err
				}
				objs := make([]*unstructured.Unstructured, 0, len(engines))
				for _, e := range engines {
					fmt.Fprintf(o.streams.ErrOut, "# %s\n", e.decision)
					objs = append(objs, e.object)
				}
				return printObjects(o.streams.Out, output, objs)
			}
			return renderEngines(o.streams.Out, backends, eobjs, wiring)
		},
	}
	src.add(c, o.streams.In)
	c.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml (with the decisions as comments), json (one List) or name (kind.group/name)")
	c.Flags().StringVar(&engine, "engine", "", "file with an engine Deployment: print its pod template as the webhook wires it")
	_ = c.MarkFlagFilename("engine", "yaml", "yml", "json")
	c.Flags().StringVar(&wiring.KVEventSubscriberImage, "kvevent-subscriber-image", "", "with --engine: the manager's --kvevent-subscriber-image; empty shows no sidecar, as the manager adds none")
	c.Flags().StringVar(&wiring.IndexEndpoint, "kvindex-endpoint", "", "with --engine: the manager's --kvindex-endpoint (default: the install bundle's index Service)")
	c.Flags().StringVar(&domain, "cluster-domain", "", "with --engine: the manager's --cluster-domain (default cluster.local)")
	return c
}

// printObjects prints objs as kubectl does with -o json (one List) or
// -o name (kind.group/name a line).
func printObjects(w io.Writer, output string, objs []*unstructured.Unstructured) error {
	if output == "name" {
		p := &printers.NamePrinter{}
		for _, o := range objs {
			if err := p.PrintObj(o, w); err != nil {
				return err
			}
		}
		return nil
	}
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{}}}
	for _, o := range objs {
		list.Items = append(list.Items, *o)
	}
	return (&printers.JSONPrinter{}).PrintObj(list, w)
}

// operatorNamespace is the install bundle's namespace, where the manager's
// default --kvindex-endpoint points.
const operatorNamespace = "inferencecache-system"

// wiredEngine is one engine Deployment of render --engine: the webhook's
// decision, said as a line, and the Deployment with its template wired.
type wiredEngine struct {
	decision string
	object   *unstructured.Unstructured
}

func wireEngines(backends []*v1alpha1.CacheBackend, eobjs []*unstructured.Unstructured, opts inject.Options) ([]wiredEngine, error) {
	engines, err := cli.Engines(eobjs)
	if err != nil {
		return nil, err
	}
	var out []wiredEngine
	for _, d := range engines {
		wired := d
		decision := fmt.Sprintf("%s/%s: no CacheBackend selects its pod labels; its pods would not be wired", d.Namespace, d.Name)
		for _, cb := range backends {
			if cb.Namespace != d.Namespace {
				continue
			}
			w, dec := cli.WireEngineWith(cb, d, opts)
			if dec.Backend == nil {
				continue
			}
			decision = fmt.Sprintf("%s/%s: %s by CacheBackend %s", d.Namespace, d.Name, dec.Outcome, dec.Backend.Name)
			if dec.Message != "" {
				decision += fmt.Sprintf(" (%s)", dec.Message)
			}
			wired = w
			break
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(wired)
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetAPIVersion("apps/v1")
		u.SetKind("Deployment")
		out = append(out, wiredEngine{decision: decision, object: u})
	}
	return out, nil
}

func renderEngines(out io.Writer, backends []*v1alpha1.CacheBackend, eobjs []*unstructured.Unstructured, opts inject.Options) error {
	engines, err := wireEngines(backends, eobjs, opts)
	if err != nil {
		return err
	}
	for _, e := range engines {
		b, err := yaml.Marshal(e.object.Object)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "# %s\n---\n%s", e.decision, b)
	}
	return nil
}

func newDiff(o *options) *cobra.Command {
	var src sourceFlags
	c := &cobra.Command{
		Use:   "diff (-f FILE... [-R] | -k DIR)",
		Short: "Show what a reconcile of CacheBackends would change in the cluster",
		Long: `Show what a reconcile of the CacheBackends of a file or kustomization would
change in the cluster: each child is applied with a server-side dry run
under the operator's field manager and compared with the live object.
Nothing is written.

Exit status: 0 no changes, 1 changes, 2 (or more) an error.`,
		Example: `  kubectl cachebackend diff -f examples/quickstart/cachebackend.yaml
  kubectl cachebackend diff -k examples/environments/overlays/production --context prod`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			changed, err := runDiff(c, o, &src)
			if err != nil {
				return &exitError{code: ExitDiffError, err: err}
			}
			if changed {
				return &exitError{code: ExitDiffChanges}
			}
			return nil
		},
	}
	src.add(c, o.streams.In)
	return c
}

func runDiff(c *cobra.Command, o *options, src *sourceFlags) (bool, error) {
	ns, explicit, err := o.namespace()
	if err != nil {
		return false, err
	}
	backends, err := src.backends(ns, explicit)
	if err != nil {
		return false, err
	}
	k, err := o.client()
	if err != nil {
		return false, err
	}
	// The receipt keys verify the engines a roll would restart; without
	// them the rolls are not previewed (and the diff says so).
	keys, keysErr := cli.ReadKeys(c.Context(), k, o.operatorNamespace)
	if keysErr != nil {
		keys = nil
	}
	changed := false
	for _, cb := range backends {
		d, err := cli.Diff(c.Context(), k, cb, keys)
		if err != nil {
			return false, err
		}
		changed = changed || d.HasChanges()
		fmt.Fprintf(o.streams.Out, "# CacheBackend %s/%s\n%s", cb.Namespace, cb.Name, d.String())
	}
	return changed, nil
}
