// Package version holds the build's version, set at link time:
//
//	go build -ldflags "-X github.com/inferencecache/operator/internal/version.Version=$(git describe --tags --always --dirty)"
//
// Every binary of this repository prints it with --version; without the
// flag it is "dev".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version, set by -ldflags -X; "dev" otherwise.
var Version = "dev"

// Revision returns the VCS revision the binary was built from, as recorded
// by the Go toolchain, or "unknown".
func Revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// String is the line a binary prints for --version, e.g.
// "manager v0.2.0 (revision 1a2b3c, go1.26.8 linux/amd64)".
func String(program string) string {
	return fmt.Sprintf("%s %s (revision %s, %s %s/%s)", program, Version, Revision(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
