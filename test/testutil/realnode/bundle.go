package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/inferencecache/operator/internal/installer"
	"github.com/inferencecache/operator/internal/ociimage"
)

// Registry is the install bundle's registry on a real node: the project's
// images exist only in the node's containerd, imported under it.
const Registry = "localhost"

// StartWithBundle builds the project's three images for this machine's
// platform (make image's builder, internal/ociimage) into imagesDir and
// the dev overlay's install bundle that pins them by digest under
// Registry, starts the node (Start) and imports the images under the
// digests the bundle names. It returns the node and the bundle's path
// (beside imagesDir). version stamps the images and the bundle.
func StartWithBundle(ctx context.Context, repoRoot, imagesDir, version string, opts Options) (*Node, string, error) {
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	start := time.Now()
	built, err := ociimage.Build(ctx, ociimage.Options{
		RepoRoot: repoRoot, OutDir: imagesDir, Version: version,
		Platforms: []v1.Platform{{OS: "linux", Architecture: runtime.GOARCH}},
	})
	if err != nil {
		return nil, "", fmt.Errorf("building the images: %w", err)
	}
	b, err := installer.Build(installer.Options{Overlay: filepath.Join(repoRoot, "kustomize", "overlays", "dev"), ImagesDir: imagesDir, Registry: Registry, Version: version})
	if err != nil {
		return nil, "", fmt.Errorf("building the install bundle: %w", err)
	}
	bundle := filepath.Join(filepath.Dir(imagesDir), "install-dev.yaml")
	if err := os.WriteFile(bundle, b, 0o644); err != nil {
		return nil, "", err
	}
	for _, img := range built {
		logf("image %s %s", img.Image.Name, img.Digest)
	}
	logf("images and bundle built in %s", time.Since(start).Round(time.Second))

	start = time.Now()
	n, err := Start(ctx, opts)
	if err != nil {
		return nil, "", err
	}
	for _, img := range built {
		if err := n.ImportLayout(ctx, img.Path, Registry+"/"+img.Image.Name); err != nil {
			return n, "", errors.Join(fmt.Errorf("importing %s: %w", img.Image.Name, err), n.Stop())
		}
	}
	logf("node Ready and images imported in %s", time.Since(start).Round(time.Second))
	return n, bundle, nil
}

// ImportEngineImage builds (once per environment, EngineImageArchive) the
// engine image of the Python environment pyEnv under ref and imports it
// into the node. The archive is kept in cacheDir.
func (n *Node) ImportEngineImage(ctx context.Context, pyEnv, cacheDir, ref string) error {
	archive, err := EngineImageArchive(ctx, pyEnv, cacheDir, ref)
	if err != nil {
		return err
	}
	return n.Import(ctx, archive)
}

// ImagesCacheDir is where the engine image's archive is kept: the
// per-user cache of the project's tools (INFERENCECACHE_TOOLS_CACHE, else
// ~/.cache/inferencecache-operator), under images.
func ImagesCacheDir() string {
	if d := os.Getenv("INFERENCECACHE_TOOLS_CACHE"); d != "" {
		return filepath.Join(d, "images")
	}
	return filepath.Join(os.Getenv("HOME"), ".cache", "inferencecache-operator", "images")
}

// StandInEngine is an engine container that runs the stand-in engine
// (EngineProgram) of the engine image ref, with env besides its own: the
// model id resolved offline, no GPU. Its numba cache (LMCache's import
// needs one writable) is what the webhook gives it. It is ready once the
// program checked everything (/tmp/ready).
func StandInEngine(ref string, env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{
		Name: "vllm", Image: ref,
		Command: []string{"python3", EngineProgram},
		Args:    []string{"--model", "Qwen/Qwen2.5-0.5B-Instruct"},
		Env:     append([]corev1.EnvVar{{Name: "HF_HUB_OFFLINE", Value: "1"}, {Name: "CUDA_VISIBLE_DEVICES", Value: ""}}, env...),
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{
			Command: []string{"python3", "-I", "-S", "-c", "import os,sys; sys.exit(0 if os.path.exists('/tmp/ready') else 1)"}}},
			PeriodSeconds: 2},
	}
}
