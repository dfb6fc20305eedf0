// Command kubectl-cachebackend previews and explains what the inferencecache
// operator does. Installed on the PATH it is also `kubectl cachebackend`.
//
//	kubectl cachebackend render -f cachebackend.yaml        child objects the controller applies
//	kubectl cachebackend render -k overlays/prod            the same, from a kustomization built in process
//	kubectl cachebackend render -f cb.yaml --engine dep.yaml  an engine's pod template as the webhook wires it
//	kubectl cachebackend diff -f cachebackend.yaml          what a reconcile would change in the cluster (server-side dry run)
//	kubectl cachebackend explain pod NAME [-n NAMESPACE]    what the webhook did with a pod, and why
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

const usage = `usage:
  kubectl cachebackend render (-f FILE | -k DIR) [--engine FILE]
  kubectl cachebackend diff (-f FILE | -k DIR)
  kubectl cachebackend explain pod NAME [-n NAMESPACE]`

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "render":
		return renderCmd(args[1:], out)
	case "explain":
		return explainCmd(args[1:], out)
	case "diff":
		return diffCmd(args[1:], out)
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

func renderCmd(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	engine := fs.String("engine", "", "file with an engine Deployment: print its pod template as the webhook wires it")
	backends, err := backendsFromFlags(fs, args)
	if err != nil {
		return err
	}
	if *engine == "" {
		for _, cb := range backends {
			if err := cli.RenderYAML(out, cb); err != nil {
				return err
			}
		}
		return nil
	}
	eobjs, err := cli.ReadFile(*engine, false)
	if err != nil {
		return err
	}
	engines, err := cli.Engines(eobjs)
	if err != nil {
		return err
	}
	for _, d := range engines {
		var wired any = d
		decided := false
		for _, cb := range backends {
			if cb.Namespace != d.Namespace {
				continue
			}
			w, dec := cli.WireEngine(cb, d)
			if dec.Backend == nil {
				continue
			}
			fmt.Fprintf(out, "# %s/%s: %s by CacheBackend %s", d.Namespace, d.Name, dec.Outcome, dec.Backend.Name)
			if dec.Message != "" {
				fmt.Fprintf(out, " (%s)", dec.Message)
			}
			fmt.Fprintln(out)
			wired, decided = w, true
			break
		}
		if !decided {
			fmt.Fprintf(out, "# %s/%s: no CacheBackend selects its pod labels; its pods would not be wired\n", d.Namespace, d.Name)
		}
		b, err := yaml.Marshal(wired)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "---\n%s", b)
	}
	return nil
}

func explainCmd(args []string, out io.Writer) error {
	if len(args) < 2 || args[0] != "pod" {
		return errors.New("usage: kubectl cachebackend explain pod NAME [-n NAMESPACE]")
	}
	name := args[1]
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	ns := fs.String("n", "", "namespace (default: the kubeconfig context's)")
	opNS := fs.String("operator-namespace", "inferencecache-system", "namespace of the receipt key Secret")
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	c, defaultNS, err := newClient()
	if err != nil {
		return err
	}
	if *ns == "" {
		*ns = defaultNS
	}
	ctx := context.Background()
	keys, keysErr := cli.ReadKeys(ctx, c, *opNS)
	e, err := cli.Explain(ctx, c, *ns, name, keys, keysErr)
	if err != nil {
		return err
	}
	e.Print(out)
	return nil
}

func diffCmd(args []string, out io.Writer) error {
	backends, err := backendsFromFlags(flag.NewFlagSet("diff", flag.ContinueOnError), args)
	if err != nil {
		return err
	}
	c, _, err := newClient()
	if err != nil {
		return err
	}
	for _, cb := range backends {
		d, err := cli.Diff(context.Background(), c, cb)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "# CacheBackend %s/%s\n%s", cb.Namespace, cb.Name, d.String())
	}
	return nil
}

// backendsFromFlags adds -f and -k to fs, parses args and reads the
// CacheBackends of the file or kustomization named.
func backendsFromFlags(fs *flag.FlagSet, args []string) ([]*v1alpha1.CacheBackend, error) {
	file := fs.String("f", "", "file with CacheBackends")
	dir := fs.String("k", "", "kustomization directory with CacheBackends (built in process)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if (*file == "") == (*dir == "") {
		return nil, fmt.Errorf("%s needs exactly one of -f FILE or -k DIR", fs.Name())
	}
	path, kustomize := *file, false
	if *dir != "" {
		path, kustomize = *dir, true
	}
	objs, err := cli.ReadFile(path, kustomize)
	if err != nil {
		return nil, err
	}
	return cli.Backends(objs)
}

// newClient connects with the kubeconfig kubectl would use.
func newClient() (client.Client, string, error) {
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{})
	cfg, err := loader.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := loader.Namespace()
	if err != nil {
		return nil, "", err
	}
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	c, err := client.New(cfg, client.Options{Scheme: s})
	return c, ns, err
}
