// Package ociimage builds the operator's container images as OCI image
// layouts, without a Docker daemon or a registry: each image is a
// multi-platform index (linux/amd64, linux/arm64) of images made of two
// layers, the CA certificates with a passwd entry for the non-root user,
// and one static Go binary (CGO_ENABLED=0) as the entrypoint. `make image`
// runs it through hack/image; `make push` publishes the layouts.
package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Image maps a binary of cmd/ to the image that ships it.
type Image struct {
	// Cmd is the folder under cmd/ (and the binary's name in the image).
	Cmd string
	// Name is the image's repository name, under the registry.
	Name string
}

// Images is every image the project ships. A binary whose cmd/ folder does
// not exist (yet) is left out by Build; adding a runtime binary is one line.
var Images = []Image{
	{Cmd: "manager", Name: "inferencecache-operator"},
	{Cmd: "kvevent-subscriber", Name: "inferencecache-kvevent-subscriber"},
	{Cmd: "cache-index", Name: "inferencecache-cache-index"},
}

// Platforms are the platforms of every image.
var Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}

// UID is the non-root user (and group) every image runs as, distroless'
// "nonroot".
const UID = 65532

// DefaultCABundle is the Debian ca-certificates bundle of the build
// machine, copied into each image at the same path, where Go's crypto/x509
// looks first on Linux.
const DefaultCABundle = "/etc/ssl/certs/ca-certificates.crt"

// OCI label keys (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelRevision = "org.opencontainers.image.revision"
	LabelSource   = "org.opencontainers.image.source"
	LabelTitle    = "org.opencontainers.image.title"
	LabelLicenses = "org.opencontainers.image.licenses"
	// AnnotationRefName names the index in the layout's index.json.
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// Options say what to build.
type Options struct {
	// RepoRoot is the module root (holding cmd/).
	RepoRoot string
	// OutDir receives one OCI layout per image: OutDir/<image name>.
	OutDir string
	// Version is linked into internal/version and labels the images.
	Version string
	// Revision is the VCS revision of the sources (label only).
	Revision string
	// Source is the repository URL (label only).
	Source string
	// CABundle is the CA certificates file to ship; DefaultCABundle when empty.
	CABundle string
	// Only, when not empty, restricts the build to these cmd names.
	Only []string
	// Created is the images' creation time; the Unix epoch when zero, so
	// that the same sources give the same digests.
	Created time.Time
	// Log receives one line per step; nothing when nil.
	Log io.Writer
	// Platforms, when not empty, replaces the package's Platforms (the
	// real-node tests build only the machine's own).
	Platforms []v1.Platform
}

// Built is one image layout written by Build.
type Built struct {
	Image  Image
	Path   string
	Digest v1.Hash // of the multi-platform index
}

// Build writes an OCI image layout for every image of Images whose cmd/
// folder exists (restricted to Options.Only when set).
func Build(ctx context.Context, o Options) ([]Built, error) {
	if o.CABundle == "" {
		o.CABundle = DefaultCABundle
	}
	if o.Created.IsZero() {
		o.Created = time.Unix(0, 0)
	}
	certs, err := os.ReadFile(o.CABundle)
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificates (Debian's ca-certificates package): %w", err)
	}
	base, err := baseLayer(certs, o.Created)
	if err != nil {
		return nil, err
	}
	var out []Built
	for _, img := range Images {
		if len(o.Only) > 0 && !contains(o.Only, img.Cmd) {
			continue
		}
		if _, err := os.Stat(filepath.Join(o.RepoRoot, "cmd", img.Cmd)); err != nil {
			if os.IsNotExist(err) {
				o.logf("image %s: cmd/%s does not exist, skipped", img.Name, img.Cmd)
				continue
			}
			return nil, err
		}
		b, err := buildImage(ctx, o, img, base)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		out = append(out, b)
	}
	return out, nil
}

func buildImage(ctx context.Context, o Options, img Image, base v1.Layer) (Built, error) {
	labels := map[string]string{
		LabelVersion:  o.Version,
		LabelRevision: o.Revision,
		LabelSource:   o.Source,
		LabelTitle:    img.Name,
		LabelLicenses: "Apache-2.0",
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.Annotations(idx, labels).(v1.ImageIndex)
	tmp, err := os.MkdirTemp("", "ociimage-")
	if err != nil {
		return Built{}, err
	}
	defer os.RemoveAll(tmp)
	platforms := Platforms
	if len(o.Platforms) > 0 {
		platforms = o.Platforms
	}
	for _, p := range platforms {
		bin := filepath.Join(tmp, img.Cmd+"-"+p.Architecture)
		o.logf("image %s: building cmd/%s for %s/%s", img.Name, img.Cmd, p.OS, p.Architecture)
		if err := goBuild(ctx, o, img.Cmd, p, bin); err != nil {
			return Built{}, err
		}
		raw, err := os.ReadFile(bin)
		if err != nil {
			return Built{}, err
		}
		app, err := layer(o.Created, []file{{name: img.Cmd, mode: 0o755, data: raw}})
		if err != nil {
			return Built{}, err
		}
		i, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), base, app)
		if err != nil {
			return Built{}, err
		}
		i = mutate.ConfigMediaType(i, types.OCIConfigJSON)
		cf, err := i.ConfigFile()
		if err != nil {
			return Built{}, err
		}
		cf = cf.DeepCopy()
		cf.OS, cf.Architecture = p.OS, p.Architecture
		cf.Created = v1.Time{Time: o.Created.UTC()}
		cf.Config.Entrypoint = []string{"/" + img.Cmd}
		cf.Config.User = fmt.Sprintf("%d:%d", UID, UID)
		cf.Config.WorkingDir = "/"
		cf.Config.Env = []string{"PATH=/", "SSL_CERT_FILE=" + DefaultCABundle}
		cf.Config.Labels = labels
		if i, err = mutate.ConfigFile(i, cf); err != nil {
			return Built{}, err
		}
		i = mutate.Annotations(i, labels).(v1.Image)
		plat := p
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: i, Descriptor: v1.Descriptor{Platform: &plat}})
	}
	dir := filepath.Join(o.OutDir, img.Name)
	if err := os.RemoveAll(dir); err != nil {
		return Built{}, err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return Built{}, err
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{AnnotationRefName: o.Version})); err != nil {
		return Built{}, err
	}
	d, err := idx.Digest()
	if err != nil {
		return Built{}, err
	}
	o.logf("image %s: %s@%s", img.Name, dir, d)
	return Built{Image: img, Path: dir, Digest: d}, nil
}

// goBuild builds a static binary of cmd/<name> for p with the version linked in.
func goBuild(ctx context.Context, o Options, name string, p v1.Platform, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath",
		"-ldflags", "-s -w -X github.com/inferencecache/operator/internal/version.Version="+o.Version,
		"-o", out, "./cmd/"+name)
	cmd.Dir = o.RepoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/%s for %s/%s: %w\n%s", name, p.OS, p.Architecture, err, b)
	}
	return nil
}

// baseLayer holds what a static binary needs from an OS: CA certificates,
// the non-root user's passwd and group entries, and a writable /tmp.
func baseLayer(certs []byte, created time.Time) (v1.Layer, error) {
	return layer(created, []file{
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: certs},
		{name: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID))},
		{name: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", UID))},
		{name: "home/nonroot", mode: 0o700, dir: true, uid: UID},
		{name: "tmp", mode: 0o1777, dir: true},
	})
}

type file struct {
	name string
	mode int64
	data []byte
	dir  bool
	uid  int
}

// layer is a tar layer of files, with their parent folders, at a fixed time.
func layer(created time.Time, files []file) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	for _, f := range files {
		parts := strings.Split(f.name, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if seen[d] {
				continue
			}
			seen[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: created, Format: tar.FormatPAX}); err != nil {
				return nil, err
			}
		}
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: created, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, f.name+"/"
			seen[h.Name] = true
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	raw := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

func (o Options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// IndexDigest is the digest of the multi-platform index an OCI layout
// written by Build holds: what a registry serves after `make push`, and
// what the install bundle pins.
func IndexDigest(path string) (v1.Hash, error) {
	lp, err := layout.FromPath(path)
	if err != nil {
		return v1.Hash{}, err
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return v1.Hash{}, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	if len(m.Manifests) != 1 {
		return v1.Hash{}, fmt.Errorf("%s: index.json has %d entries, want 1", path, len(m.Manifests))
	}
	return m.Manifests[0].Digest, nil
}
