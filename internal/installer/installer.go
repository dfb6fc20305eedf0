// Package installer writes the single-file install bundles (`make
// build-installer`): a kustomize overlay built in process, with the
// manager's image pinned by the digest of its OCI image layout and every
// object labelled with the release's app.kubernetes.io/version.
package installer

import (
	"fmt"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"

	"github.com/inferencecache/operator/internal/kustomization"
	"github.com/inferencecache/operator/internal/ociimage"
)

// ManagerImage is the manager's image name in the kustomize base
// (kustomize/base/manager/deployment.yaml), which the bundle pins.
const ManagerImage = "inferencecache/operator"

// IndexImage is the KV-block index's image name in the kustomize base
// (kustomize/base/index/deployment.yaml), which the bundle pins too.
const IndexImage = "inferencecache/cache-index"

// pinned maps the images of the kustomize base to the commands whose
// image layouts (ociimage.Images) pin them.
var pinned = []struct{ base, cmd string }{{ManagerImage, "manager"}, {IndexImage, "cache-index"}}

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
// and the index's images as <Registry>/<image name>@<digest of its
// layout's index>.
func Build(o Options) ([]byte, error) {
	var images []map[string]string
	for _, p := range pinned {
		name := ""
		for _, i := range ociimage.Images {
			if i.Cmd == p.cmd {
				name = i.Name
			}
		}
		digest, err := ociimage.IndexDigest(filepath.Join(o.ImagesDir, name))
		if err != nil {
			return nil, fmt.Errorf("the %s image layout (run make image first): %w", p.cmd, err)
		}
		images = append(images, map[string]string{
			"name":    p.base,
			"newName": strings.TrimSuffix(o.Registry, "/") + "/" + name,
			"digest":  digest.String(),
		})
	}
	// A kustomization of our own on top of the overlay: kustomize's image
	// and label transformers do the pinning and labelling. kubectl apply
	// -f applies in file order: the Namespace and the CRD before what
	// lives in them (kustomize's legacy order, as kubectl -k).
	opts := krusty.MakeDefaultOptions()
	opts.Reorder = krusty.ReorderOptionLegacy
	rm, err := kustomization.Build(map[string]any{
		"apiVersion": "kustomize.config.k8s.io/v1beta1",
		"kind":       "Kustomization",
		"resources":  []string{o.Overlay},
		"images":     images,
		"labels": []map[string]any{{
			"pairs":            map[string]string{"app.kubernetes.io/version": o.Version},
			"includeSelectors": false,
			"includeTemplates": false,
		}},
	}, opts)
	if err != nil {
		return nil, fmt.Errorf("building %s: %w", o.Overlay, err)
	}
	body, err := rm.AsYaml()
	if err != nil {
		return nil, err
	}
	header := fmt.Sprintf("# inferencecache operator %s, built from %s by `make build-installer`.\n# Install or upgrade: kubectl apply --server-side -f <this file>\n", o.Version, filepath.ToSlash(o.Overlay))
	return append([]byte(header), body...), nil
}
