// Command apidoc writes docs/reference/api.md, the CacheBackend API
// reference, from the generated CRD (so from the Go types and their
// markers). `make manifests` runs it; a test fails when the file is stale.
package main

import (
	"fmt"
	"os"

	"github.com/inferencecache/operator/internal/apidoc"
)

func main() {
	crd, err := os.ReadFile("kustomize/base/crd/inferencecache.io_cachebackends.yaml")
	if err == nil {
		var md string
		if md, err = apidoc.Generate(crd); err == nil {
			err = os.WriteFile("docs/reference/api.md", []byte(md), 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "apidoc:", err)
		os.Exit(1)
	}
}
