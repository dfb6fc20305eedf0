// Package crd holds the CacheBackend CRD that `make manifests` generates
// here, for the programs that validate against its schema offline (the
// CLI's render and diff).
package crd

import _ "embed"

// CacheBackends is inferencecache.io_cachebackends.yaml.
//
//go:embed inferencecache.io_cachebackends.yaml
var CacheBackends []byte
