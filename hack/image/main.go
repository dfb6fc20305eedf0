// Command image writes the project's container images as OCI image layouts
// (one per image, linux/amd64 and linux/arm64) with no Docker daemon or
// registry: `make image` runs it; internal/ociimage says what is inside.
//
//	go run ./hack/image -out dist/images -version v0.2.0 -revision $(git rev-parse HEAD)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/inferencecache/operator/internal/ociimage"
)

func main() {
	out := flag.String("out", "dist/images", "folder receiving one OCI layout per image")
	version := flag.String("version", "dev", "version linked into the binaries and set as org.opencontainers.image.version")
	revision := flag.String("revision", "unknown", "VCS revision (org.opencontainers.image.revision)")
	source := flag.String("source", "https://github.com/inferencecache/operator", "source repository (org.opencontainers.image.source)")
	caBundle := flag.String("ca-bundle", ociimage.DefaultCABundle, "CA certificates file shipped in the images")
	only := flag.String("only", "", "comma-separated cmd names to build (all when empty)")
	flag.Parse()
	o := ociimage.Options{
		RepoRoot: ".", OutDir: *out, Version: *version, Revision: *revision, Source: *source,
		CABundle: *caBundle, Log: os.Stderr,
	}
	if *only != "" {
		o.Only = strings.Split(*only, ",")
	}
	built, err := ociimage.Build(context.Background(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	for _, b := range built {
		fmt.Printf("%s\t%s\t%s\n", b.Image.Name, b.Path, b.Digest)
	}
}
