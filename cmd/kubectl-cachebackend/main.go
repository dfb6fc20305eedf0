// Command kubectl-cachebackend previews, checks and audits what the
// inferencecache operator does. Installed on the PATH it is also
// `kubectl cachebackend`. It takes kubectl's flags (--kubeconfig, --context,
// -n/--namespace, ...); see `kubectl cachebackend --help`.
//
//	kubectl cachebackend render -f cachebackend.yaml        child objects the controller applies
//	kubectl cachebackend render -k overlays/prod            the same, from a kustomization built in process
//	kubectl cachebackend render -f cb.yaml --engine dep.yaml  an engine's pod template as the webhook wires it
//	kubectl cachebackend diff -f cachebackend.yaml          what a reconcile would change (exit 0 none, 1 changes, 2 error)
//	kubectl cachebackend explain pod NAME [-n NAMESPACE]    what the webhook did with a pod, and why
//	kubectl cachebackend audit [-A] [-o json|yaml]          every engine pod: outcome, receipt, generation
//	kubectl cachebackend check [--pre]                      the install (or its prerequisites), ✔/✗
//	kubectl cachebackend version                            the CLI's and the running manager's versions
//	kubectl cachebackend completion bash|zsh|fish           shell completion
package main

import (
	"os"

	"github.com/go-logr/zapr"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/inferencecache/operator/internal/cli/cmd"
	"github.com/inferencecache/operator/internal/logging"
)

func main() {
	ctrl.SetLogger(zapr.NewLogger(logging.Console(os.Stderr)))
	os.Exit(cmd.Main(os.Args[1:], genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
