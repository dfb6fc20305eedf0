// Package engineversion says which vLLM and LMCache release an engine pod
// or a server image runs, from what the pod or the CacheBackend declares,
// so that the wiring can follow the version (the engines change their
// flags and defaults between minor releases). It is pure: strings in,
// versions out.
//
// A version is read, in this order, from:
//  1. the pod's annotation (AnnotationVLLMVersion, AnnotationLMCacheVersion);
//  2. the tag of the engine container's image, for the projects' own
//     repositories on Docker Hub: vllm/* images are tagged with the vLLM
//     release (vllm/vllm-openai:v0.34.0), lmcache/* images with the LMCache
//     release (lmcache/vllm-openai:v0.5.6);
//  3. the CacheBackend's spec.integration.versions.
//
// Anything else (a digest without a tag, latest, nightly, another
// registry's repository) leaves the version unknown.
package engineversion

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/inferencecache/operator/internal/imageref"
)

// Version is a release as major.minor.patch; Pre keeps whatever follows
// (rc2, .post1, .dev3, +cu129). A pre-release belongs to its release's
// line: 0.5.7rc2 is at least 0.5.7 (LMCache's 0.5.7 pre-releases already
// ship what the release removes).
type Version struct {
	Major, Minor, Patch int
	Pre                 string
}

var versionRE = regexp.MustCompile(`^v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,4}))?((?:[.+-]?[a-z0-9]+)*)$`)

// Parse reads "0.34.0", "v0.34.0", "0.5.7rc2", "0.5.7.post1" or "0.34"
// (patch 0). It refuses anything else.
func Parse(s string) (Version, error) {
	m := versionRE.FindStringSubmatch(strings.ToLower(s))
	if m == nil {
		shown := s
		if len(shown) > 40 {
			// The value may be a user's annotation of any size: the
			// message goes into admission warnings and logs.
			shown = shown[:40] + "..."
		}
		return Version{}, fmt.Errorf("%q is not a release version (major.minor[.patch], e.g. 0.34.0 or 0.5.7rc2)", shown)
	}
	var v Version
	v.Major, _ = strconv.Atoi(m[1])
	v.Minor, _ = strconv.Atoi(m[2])
	if m[3] != "" {
		v.Patch, _ = strconv.Atoi(m[3])
	}
	v.Pre = m[4]
	return v, nil
}

// MustParse is Parse for constants; it panics on an invalid version.
func MustParse(s string) Version {
	v, err := Parse(s)
	if err != nil {
		panic(err)
	}
	return v
}

// AtLeast reports whether v's release line is o's or later (Pre is not
// compared).
func (v Version) AtLeast(o Version) bool {
	if v.Major != o.Major {
		return v.Major > o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor > o.Minor
	}
	return v.Patch >= o.Patch
}

func (v Version) String() string {
	return strconv.Itoa(v.Major) + "." + strconv.Itoa(v.Minor) + "." + strconv.Itoa(v.Patch) + v.Pre
}

// Project is a project whose release a pod may run.
type Project string

// The projects whose releases change the wiring.
const (
	VLLM    Project = "vllm"
	LMCache Project = "lmcache"
)

// Image is what an image reference says about releases: its Docker Hub
// organisation (vllm, lmcache, ...) and its tag, when it has both.
type Image struct {
	Org, Tag string
}

// ParseImage reads an image reference once for every project: the
// organisation of a Docker Hub repository (docker.io/ORG/NAME) and the
// tag (also one written before a digest). Any other registry, a library
// image or a reference without a tag gives the zero Image.
func ParseImage(image string) Image {
	if !strings.Contains(image, "/") || !strings.Contains(image, ":") {
		return Image{} // a library image, or no tag
	}
	ref, err := name.ParseReference(image, name.WeakValidation)
	if err != nil {
		return Image{}
	}
	repo := ref.Context()
	if repo.RegistryStr() != name.DefaultRegistry {
		return Image{}
	}
	org, _, found := strings.Cut(repo.RepositoryStr(), "/")
	if !found {
		return Image{}
	}
	tag := ""
	switch r := ref.(type) {
	case name.Tag:
		tag = r.TagStr()
	case name.Digest:
		// name.Digest drops a tag written before the digest; read it
		// from the reference as written.
		_, tag, _ = imageref.Split(image)
	}
	if tag == "" {
		return Image{}
	}
	return Image{Org: org, Tag: tag}
}

// Release is the release of project the image's tag names: an image of
// the project's own Docker Hub organisation (docker.io/vllm/...,
// docker.io/lmcache/...) whose tag is a release version.
func (i Image) Release(project Project) (Version, bool) {
	if i.Org != string(project) {
		return Version{}, false
	}
	v, err := Parse(i.Tag)
	if err != nil {
		return Version{}, false
	}
	return v, true
}

// Source says where a version was read from.
type Source string

// Sources of a Detected version, in the order they are tried.
const (
	FromAnnotation Source = "annotation"
	FromImageTag   Source = "image"
	FromBackend    Source = "backend"
	Unknown        Source = "unknown"
)

// Detected is the release a pod runs of one project, and where it was
// read from. Known is false when no source names it.
type Detected struct {
	Version Version
	Known   bool
	Source  Source
}

func (d Detected) String() string {
	if !d.Known {
		return "unknown"
	}
	return d.Version.String() + " (" + string(d.Source) + ")"
}

// Detect reads project's release in the documented order: annotation (a
// pod annotation's value; "" when absent), then image (the engine
// container's), then declared (the CacheBackend's default; "" when
// unset). An annotation or default that is not a version is an error: the
// user said something the webhook cannot read.
func Detect(project Project, annotation, image, declared string) (Detected, error) {
	return DetectIn(project, annotation, ParseImage(image), declared)
}

// DetectIn is Detect with the image already parsed (one parse for every
// project).
func DetectIn(project Project, annotation string, image Image, declared string) (Detected, error) {
	if annotation != "" {
		v, err := Parse(annotation)
		if err != nil {
			return Detected{Source: FromAnnotation}, err
		}
		return Detected{Version: v, Known: true, Source: FromAnnotation}, nil
	}
	if v, ok := image.Release(project); ok {
		return Detected{Version: v, Known: true, Source: FromImageTag}, nil
	}
	if declared != "" {
		v, err := Parse(declared)
		if err != nil {
			return Detected{Source: FromBackend}, err
		}
		return Detected{Version: v, Known: true, Source: FromBackend}, nil
	}
	return Detected{Source: Unknown}, nil
}
