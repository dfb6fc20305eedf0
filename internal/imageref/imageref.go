// Package imageref splits a container image reference as written
// (registry/repository[:tag][@digest]) without resolving it: the one
// reader of a reference's tag and digest for the webhook, the CLI and the
// chart generator.
package imageref

import "strings"

// Split returns the reference's name (registry and repository), its tag
// ("" when none is written) and its digest ("" when none). A colon before
// the last slash is a registry's port, not a tag.
func Split(ref string) (name, tag, digest string) {
	name, digest, _ = strings.Cut(ref, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name, tag = name[:i], name[i+1:]
	}
	return name, tag, digest
}
