// Command installer writes dist/install.yaml (the production overlay) and
// dist/install-dev.yaml (the dev overlay) with the manager's image pinned by
// the digest of the layout `make image` built: `make build-installer`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/inferencecache/operator/internal/installer"
)

func main() {
	out := flag.String("out", "dist", "folder receiving install.yaml and install-dev.yaml")
	images := flag.String("images", "dist/images", "folder of the OCI image layouts (make image)")
	registry := flag.String("registry", "ghcr.io/inferencecache", "registry the images are pushed to (make push REGISTRY=...)")
	version := flag.String("version", "dev", "release version (app.kubernetes.io/version)")
	flag.Parse()
	for file, overlay := range map[string]string{
		"install.yaml":     "kustomize/overlays/production",
		"install-dev.yaml": "kustomize/overlays/dev",
	} {
		b, err := installer.Build(installer.Options{Overlay: overlay, ImagesDir: *images, Registry: *registry, Version: *version})
		if err == nil {
			err = os.WriteFile(filepath.Join(*out, file), b, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "installer:", err)
			os.Exit(1)
		}
		fmt.Println(filepath.Join(*out, file))
	}
}
