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
	"sigs.k8s.io/kustomize/api/resmap"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"

	"github.com/inferencecache/operator/internal/kustomization"
	"github.com/inferencecache/operator/internal/ociimage"
)

// ManagerImage is the manager's image name in the kustomize base
// (kustomize/base/manager/deployment.yaml), which the bundle pins: the
// name `make push` publishes under the default registry.
const ManagerImage = "ghcr.io/inferencecache/inferencecache-operator"

// IndexImage is the KV-block index's image name in the kustomize base
// (kustomize/base/index/deployment.yaml), which the bundle pins too.
const IndexImage = "ghcr.io/inferencecache/inferencecache-cache-index"

// SubscriberFlag is the manager's argument naming the kvevent-subscriber
// image (kustomize/base/manager/deployment.yaml), which the bundle pins
// like the images; an overlay that sets it empty keeps it empty.
const SubscriberFlag = "--kvevent-subscriber-image="

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
		ref, err := pinnedRef(o, p.cmd)
		if err != nil {
			return nil, err
		}
		name, digest, _ := strings.Cut(ref, "@")
		images = append(images, map[string]string{"name": p.base, "newName": name, "digest": digest})
	}
	subscriber, err := pinnedRef(o, "kvevent-subscriber")
	if err != nil {
		return nil, err
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
	if err := pinSubscriber(rm, subscriber); err != nil {
		return nil, err
	}
	body, err := rm.AsYaml()
	if err != nil {
		return nil, err
	}
	header := fmt.Sprintf("# inferencecache operator %s, built from %s by `make build-installer`.\n# Install or upgrade: kubectl apply --server-side -f <this file>\n", o.Version, filepath.ToSlash(o.Overlay))
	return append([]byte(header), body...), nil
}

// pinnedRef is <Registry>/<image name>@<digest of its layout's index> of
// the image that ships cmd.
func pinnedRef(o Options, cmd string) (string, error) {
	name := ""
	for _, i := range ociimage.Images {
		if i.Cmd == cmd {
			name = i.Name
		}
	}
	digest, err := ociimage.IndexDigest(filepath.Join(o.ImagesDir, name))
	if err != nil {
		return "", fmt.Errorf("the %s image layout (run make image first): %w", cmd, err)
	}
	return strings.TrimSuffix(o.Registry, "/") + "/" + name + "@" + digest.String(), nil
}

// pinSubscriber sets the manager's SubscriberFlag to ref, unless the
// overlay left it empty (the KV-event pipeline off).
func pinSubscriber(rm resmap.ResMap, ref string) error {
	for _, r := range rm.Resources() {
		if r.GetKind() != "Deployment" || r.GetName() != "inferencecache-operator" {
			continue
		}
		args, err := r.Pipe(kyaml.Lookup("spec", "template", "spec", "containers", "[name=manager]", "args"))
		if err != nil {
			return fmt.Errorf("reading the manager's arguments: %w", err)
		}
		found := false
		if args != nil {
			for _, n := range args.YNode().Content {
				if v, ok := strings.CutPrefix(n.Value, SubscriberFlag); ok {
					found = true
					if v != "" {
						n.Value = SubscriberFlag + ref
					}
				}
			}
		}
		if !found {
			return fmt.Errorf("the manager's Deployment has no %s argument to pin", strings.TrimSuffix(SubscriberFlag, "="))
		}
		return nil
	}
	return fmt.Errorf("no Deployment inferencecache-operator in the overlay")
}
