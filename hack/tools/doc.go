// Package tools pins the development tools that are built from Go modules in
// a module of their own, so that their dependency graphs stay out of the
// operator's go.mod. Run one with `go tool -modfile=hack/tools/go.mod NAME`.
package tools
