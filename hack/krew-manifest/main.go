// Command krew-manifest writes the krew plugin manifest of kubectl
// cachebackend for the release archives in a folder (made by
// `make cli-archives`), with each archive's sha256:
//
//	go run ./hack/krew-manifest -version v0.2.0 -dist dist -out dist/krew/cachebackend.yaml
//
// Archives are named kubectl-cachebackend_<version>_<os>_<arch>.tar.gz and
// hold the binary (kubectl-cachebackend, .exe on Windows) and LICENSE when
// the repository has one.
package main

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// Plugin is krew's plugin manifest (krew.googlecontainertools.github.com/v1alpha2).
type Plugin struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   Metadata   `json:"metadata"`
	Spec       PluginSpec `json:"spec"`
}

// Metadata names the plugin: `kubectl krew install cachebackend`.
type Metadata struct {
	Name string `json:"name"`
}

// PluginSpec is a plugin's description and its per-platform archives.
type PluginSpec struct {
	Version          string     `json:"version"`
	Homepage         string     `json:"homepage"`
	ShortDescription string     `json:"shortDescription"`
	Description      string     `json:"description"`
	Caveats          string     `json:"caveats,omitempty"`
	Platforms        []Platform `json:"platforms"`
}

// Platform is one archive and the os/arch it runs on.
type Platform struct {
	Selector Selector        `json:"selector"`
	URI      string          `json:"uri"`
	Sha256   string          `json:"sha256"`
	Bin      string          `json:"bin"`
	Files    []FileOperation `json:"files"`
}

// Selector matches krew's os and arch labels.
type Selector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// FileOperation copies files out of the archive.
type FileOperation struct {
	From string `json:"from"`
	To   string `json:"to"`
}

const (
	binary   = "kubectl-cachebackend"
	homepage = "https://github.com/inferencecache/operator"
)

func main() {
	dist := flag.String("dist", "dist", "folder with the release archives")
	version := flag.String("version", "", "release version, as in the archive names (required)")
	baseURL := flag.String("base-url", homepage+"/releases/download/{{version}}", "where the archives are published; {{version}} is replaced")
	out := flag.String("out", "", "manifest file to write (default: standard output)")
	flag.Parse()
	if *version == "" {
		fmt.Fprintln(os.Stderr, "krew-manifest: -version is required")
		os.Exit(2)
	}
	p, err := Manifest(*dist, *version, strings.ReplaceAll(*baseURL, "{{version}}", *version))
	if err == nil {
		err = write(p, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "krew-manifest:", err)
		os.Exit(1)
	}
}

func write(p *Plugin, path string) error {
	b, err := yaml.Marshal(p)
	if err != nil {
		return err
	}
	if path == "" {
		_, err = os.Stdout.Write(b)
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Manifest builds the manifest from the archives of version in dist; their
// URIs are baseURL/<archive>. It is an error when there is none.
func Manifest(dist, version, baseURL string) (*Plugin, error) {
	pattern := regexp.MustCompile("^" + regexp.QuoteMeta(binary+"_"+version+"_") + `([a-z0-9]+)_([a-z0-9]+)\.tar\.gz$`)
	entries, err := os.ReadDir(dist)
	if err != nil {
		return nil, err
	}
	var platforms []Platform
	for _, e := range entries {
		m := pattern.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		sum, err := sha256File(filepath.Join(dist, e.Name()))
		if err != nil {
			return nil, err
		}
		goos, arch := m[1], m[2]
		bin := binary
		if goos == "windows" {
			bin += ".exe"
		}
		names, err := archiveFiles(filepath.Join(dist, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		if !names[bin] {
			return nil, fmt.Errorf("%s holds no %s", e.Name(), bin)
		}
		files := []FileOperation{{From: bin, To: "."}}
		if names["LICENSE"] {
			files = append(files, FileOperation{From: "LICENSE", To: "."})
		}
		platforms = append(platforms, Platform{
			Selector: Selector{MatchLabels: map[string]string{"os": goos, "arch": arch}},
			URI:      strings.TrimSuffix(baseURL, "/") + "/" + e.Name(),
			Sha256:   sum,
			Bin:      bin,
			Files:    files,
		})
	}
	if len(platforms) == 0 {
		return nil, errors.New("no archive " + binary + "_" + version + "_<os>_<arch>.tar.gz in " + dist + " (run make cli-archives)")
	}
	sort.Slice(platforms, func(i, j int) bool { return platforms[i].URI < platforms[j].URI })
	return &Plugin{
		APIVersion: "krew.googlecontainertools.github.com/v1alpha2",
		Kind:       "Plugin",
		Metadata:   Metadata{Name: "cachebackend"},
		Spec: PluginSpec{
			Version:          version,
			Homepage:         homepage,
			ShortDescription: "Preview, diff, check and audit the inferencecache operator",
			Description: `Previews the child objects the inferencecache operator applies for a
CacheBackend (render) and what a reconcile would change (diff, exit 1 on
changes); explains and audits what its webhook did with vLLM and SGLang
engine pods (explain pod, audit); checks an install or its prerequisites
(check, check --pre); prints the CLI's and the manager's versions.`,
			Platforms: platforms,
		},
	}, nil
}

// archiveFiles lists the regular files of a .tar.gz.
func archiveFiles(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	names := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			names[strings.TrimPrefix(h.Name, "./")] = true
		}
	}
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
