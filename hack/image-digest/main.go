// Command image-digest prints the digest of the image index of an OCI
// image layout that `make image` wrote: the digest a registry serves
// after `make push`, which the release signs.
//
//	go run ./hack/image-digest dist/images/inferencecache-operator
package main

import (
	"fmt"
	"os"

	"github.com/inferencecache/operator/internal/ociimage"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: image-digest <OCI layout folder>")
		os.Exit(2)
	}
	d, err := ociimage.IndexDigest(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "image-digest:", err)
		os.Exit(1)
	}
	fmt.Println(d.String())
}
