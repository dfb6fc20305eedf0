// Package cmd is the command layer of kubectl-cachebackend: cobra commands
// with kubectl's standard flags (k8s.io/cli-runtime's ConfigFlags:
// --kubeconfig, --context, -n/--namespace and the rest) over package cli,
// which does the work.
package cmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/cli"
	"github.com/inferencecache/operator/internal/version"
)

// Program is the binary's name; as a kubectl plugin it is `kubectl cachebackend`.
const Program = "kubectl-cachebackend"

// Exit codes.
const (
	ExitOK = 0
	// ExitFailed: an error, or a check that failed.
	ExitFailed = 1
	// ExitDiffChanges: diff found changes (as flux diff and diff(1)).
	ExitDiffChanges = 1
	// ExitDiffError: diff could not tell (as flux diff: greater than 1).
	ExitDiffError = 2
)

// exitError carries an exit code through cobra. A nil err exits silently.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Main runs the CLI on args and returns the process's exit code.
func Main(args []string, streams genericiooptions.IOStreams) int {
	root := NewRoot(streams)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	if err == nil {
		return ExitOK
	}
	code := ExitFailed
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		err = ee.err
	} else if c, _, ferr := root.Find(args); ferr == nil && c.Name() == "diff" {
		code = ExitDiffError // a usage error of diff is not "no changes" nor "changes"
	}
	if err != nil {
		fmt.Fprintln(streams.ErrOut, "error:", err)
	}
	return code
}

// options are what every command shares.
type options struct {
	streams genericiooptions.IOStreams
	flags   *genericclioptions.ConfigFlags
	// operatorNamespace holds the manager, its webhook Service and the
	// receipt key Secret.
	operatorNamespace string
}

// NewRoot returns the root command with every subcommand.
func NewRoot(streams genericiooptions.IOStreams) *cobra.Command {
	o := &options{streams: streams, flags: genericclioptions.NewConfigFlags(true)}
	root := &cobra.Command{
		Use:   Program,
		Short: "Preview, diff, check and audit what the inferencecache operator does",
		Long: `kubectl cachebackend previews what the inferencecache operator does with a
CacheBackend (render, diff), explains and audits what its webhook did with
engine pods (explain, audit), and checks an install (check, version).

It takes kubectl's flags (--kubeconfig, --context, -n/--namespace, ...).`,
		Version:       version.String(Program),
		SilenceErrors: true,
		SilenceUsage:  true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl cachebackend"},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	// Declared here so that cobra does not take -v, which kubectl plugins
	// users expect to be verbosity.
	root.Flags().Bool("version", false, "print the CLI's version")
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	o.flags.AddFlags(root.PersistentFlags())
	root.PersistentFlags().StringVar(&o.operatorNamespace, "operator-namespace", cli.DefaultOperatorNamespace,
		"namespace of the operator: its manager Deployment, webhook Service and receipt key Secret")
	root.AddCommand(newRender(o), newDiff(o), newExplain(o), newCheck(o), newAudit(o), newVersion(o))
	return root
}

var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(v1alpha1.AddToScheme(s))
	return s
}()

// client connects as kubectl would with the same flags.
func (o *options) client() (client.Client, error) {
	cfg, err := o.flags.ToRESTConfig()
	if err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// namespace is -n, else the kubeconfig context's namespace, else
// "default"; explicit reports whether -n was given.
func (o *options) namespace() (ns string, explicit bool, err error) {
	ns, explicit, err = o.flags.ToRawKubeConfigLoader().Namespace()
	if clientcmd.IsEmptyConfig(err) {
		return "default", false, nil
	}
	return ns, explicit, err
}
