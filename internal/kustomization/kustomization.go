// Package kustomization builds a kustomization written for the occasion on
// top of the tree's own (an overlay, components, image pins, labels), in
// process, as `kustomize build` would: how the install file and the Helm
// chart are derived from kustomize/.
package kustomization

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Build writes k as a kustomization.yaml in a temporary folder and runs
// kustomize on it with opts (krusty's defaults when nil). The entries of
// k's "resources" and "components" ([]string) are paths of folders of the
// tree, absolute or relative to the working directory; Build makes them
// relative to the temporary folder, as kustomize requires.
func Build(k map[string]any, opts *krusty.Options) (resmap.ResMap, error) {
	tmp, err := os.MkdirTemp("", "kustomization-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	out := make(map[string]any, len(k))
	for key, v := range k {
		out[key] = v
	}
	for _, key := range []string{"resources", "components"} {
		paths, _ := k[key].([]string)
		if paths == nil {
			continue
		}
		rel := make([]string, len(paths))
		for i, p := range paths {
			abs, err := filepath.Abs(p)
			if err != nil {
				return nil, err
			}
			r, err := filepath.Rel(tmp, abs)
			if err != nil {
				return nil, err
			}
			rel[i] = filepath.ToSlash(r)
		}
		out[key] = rel
	}
	raw, err := yaml.Marshal(out)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), raw, 0o600); err != nil {
		return nil, err
	}
	if opts == nil {
		opts = krusty.MakeDefaultOptions()
	}
	rm, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), tmp)
	if err != nil {
		return nil, fmt.Errorf("kustomize build of %v: %w", k["resources"], err)
	}
	return rm, nil
}
