// Package installer writes the single-file install bundles (`make
// build-installer`): a kustomize overlay built in process, with the
// manager's image pinned by the digest of its OCI image layout and every
// object labelled with the release's app.kubernetes.io/version.
package installer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/inferencecache/operator/internal/ociimage"
)

// ManagerImage is the manager's image name in the kustomize base
// (kustomize/base/manager/deployment.yaml), which the bundle pins.
const ManagerImage = "inferencecache/operator"

// Options say which overlay to build and how to pin it.
type Options struct {
	// Overlay is the kustomization to build (kustomize/overlays/production or dev).
	Overlay string
	// ImagesDir holds the OCI layouts of `make image` (<dir>/<image name>).
	ImagesDir string
	// Registry is where the images are pushed (`make push REGISTRY=...`).
	Registry string
	// Version labels every object (app.kubernetes.io/version).
	Version string
}

// Build returns the overlay's objects as one YAML stream, the manager's
// image as <Registry>/<image name>@<digest of its layout's index>.
func Build(o Options) ([]byte, error) {
	name := ""
	for _, i := range ociimage.Images {
		if i.Cmd == "manager" {
			name = i.Name
		}
	}
	digest, err := ociimage.IndexDigest(filepath.Join(o.ImagesDir, name))
	if err != nil {
		return nil, fmt.Errorf("the manager's image layout (run make image first): %w", err)
	}
	// A kustomization of our own on top of the overlay: kustomize's image
	// and label transformers do the pinning and labelling.
	tmp, err := os.MkdirTemp("", "installer-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	overlay, err := filepath.Abs(o.Overlay)
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(tmp, overlay)
	if err != nil {
		return nil, err
	}
	k := map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{filepath.ToSlash(rel)},
		"images": []map[string]string{{
			"name":    ManagerImage,
			"newName": strings.TrimSuffix(o.Registry, "/") + "/" + name,
			"digest":  digest.String(),
		}},
		"labels": []map[string]any{{
			"pairs":            map[string]string{"app.kubernetes.io/version": o.Version},
			"includeSelectors": false,
			"includeTemplates": false,
		}},
	}
	raw, err := yaml.Marshal(k)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), raw, 0o600); err != nil {
		return nil, err
	}
	// kubectl apply -f applies in file order: the Namespace and the CRD
	// before what lives in them (kustomize's legacy order, as kubectl -k).
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy
	rm, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), tmp)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", o.Overlay, err)
	}
	body, err := rm.AsYaml()
	if err != nil {
		return nil, err
	}
	header := fmt.Sprintf("# inferencecache operator %s, built from %s by `make build-installer`.\n# Install or upgrade: kubectl apply --server-side -f <this file>\n", o.Version, filepath.ToSlash(o.Overlay))
	return append([]byte(header), body...), nil
}
