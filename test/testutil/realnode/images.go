package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/inferencecache/operator/internal/ociimage"
)

// PauseArchive writes a docker archive of PauseImage: the static pause
// binary as /pause, its entrypoint. No registry is reachable from the test
// machine, so the node's sandbox image is made here.
func PauseArchive(pauseBin, out string) (string, error) {
	bin, err := os.ReadFile(pauseBin)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "pause", Mode: 0o755, Size: int64(len(bin)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(bin); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", runtime.GOARCH
	cfg.Config.Entrypoint = []string{"/pause"}
	cfg.Config.User = "65535:65535"
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return "", err
	}
	return out, write(out, PauseImage, img)
}

// ImportLayout imports the OCI image layout dir (as `make image` writes
// them: one multi-platform index, its tag in the ref.name annotation) into
// the node's containerd, for the kubelet, as <base>:<tag> and as
// <base>@<index digest>: the name an install bundle pins
// (internal/installer).
func (n *Node) ImportLayout(ctx context.Context, dir, base string) error {
	tarball := filepath.Join(n.opts.WorkDir, filepath.Base(dir)+".oci.tar")
	if err := tarDir(dir, tarball); err != nil {
		return err
	}
	defer func() { _ = os.Remove(tarball) }()
	digest, err := ociimage.IndexDigest(dir)
	if err != nil {
		return err
	}
	ctr := func(args ...string) error {
		_, err := n.Run(ctx, filepath.Join(n.opts.NodeDir, "ctr"), append([]string{
			"--address", filepath.Join(n.opts.WorkDir, "containerd", "containerd.sock"), "--namespace", "k8s.io"}, args...)...)
		return err
	}
	if err := ctr("images", "import", "--base-name", base, "--all-platforms", tarball); err != nil {
		return err
	}
	// ctr's --digests names the layout's top-level index.json, not the
	// multi-platform index a bundle pins: name that one here.
	tag, err := layoutTag(dir)
	if err != nil {
		return err
	}
	return ctr("images", "tag", "--force", base+":"+tag, base+"@"+digest.String())
}

// layoutTag is the ref.name annotation of the layout's index.
func layoutTag(dir string) (string, error) {
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", err
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return "", err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return "", err
	}
	if len(m.Manifests) != 1 || m.Manifests[0].Annotations[ociimage.AnnotationRefName] == "" {
		return "", fmt.Errorf("%s: want one index with a %s annotation in index.json", dir, ociimage.AnnotationRefName)
	}
	return m.Manifests[0].Annotations[ociimage.AnnotationRefName], nil
}

// tarDir writes the files of dir, relative to it, as a tar archive.
func tarDir(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if e.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer func() { _ = src.Close() }()
		_, err = io.Copy(tw, src)
		return err
	})
	return errors.Join(err, tw.Close(), f.Close())
}

func write(out, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(out, tag, img)
}
