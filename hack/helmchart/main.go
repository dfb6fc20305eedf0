// Command helmchart writes the Helm chart charts/inferencecache-operator from
// the kustomize overlays (internal/helmchart): `make manifests` runs it and
// `make verify` fails when the chart and the overlays drift apart.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/inferencecache/operator/internal/helmchart"
)

func main() {
	out := flag.String("out", "charts/inferencecache-operator", "the chart's folder")
	kustomize := flag.String("kustomize", "kustomize", "the kustomize folder (overlays/, components/)")
	flag.Parse()
	if err := helmchart.Generate(*kustomize, *out); err != nil {
		fmt.Fprintln(os.Stderr, "helmchart:", err)
		os.Exit(1)
	}
}
