#!/usr/bin/env bash
# Builds the local control plane from the Go module proxy: kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes), etcd
# (go.etcd.io/etcd/server/v3) and kwok (sigs.k8s.io/kwok), plus kwok's stage
# files. Binaries go to a per-user cache folder keyed by version, so a fresh
# clone reuses them; only missing binaries are built; concurrent callers
# wait for one build (flock). Prints the folder.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Renovate (renovate.json, regex manager) bumps these from the comments
# above each; KUBE_VERSION moves with test/tools/kube/go.mod and
# ETCD_VERSION with test/tools/etcd/go.mod (one grouped pull request).
# renovate: datasource=go depName=k8s.io/kubernetes
KUBE_VERSION=v1.37.2
# renovate: datasource=go depName=go.etcd.io/etcd/server/v3
ETCD_VERSION=v3.6.16
# renovate: datasource=go depName=sigs.k8s.io/kwok
KWOK_VERSION=v0.8.0
cache=${INFERENCECACHE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferencecache-operator}
dir=${CONTROLPLANE_DIR:-$cache/controlplane-kube${KUBE_VERSION}-etcd${ETCD_VERSION}-kwok${KWOK_VERSION}}
mkdir -p "$dir"
# Concurrent callers (make test's phases, a test binary that finds the
# folder incomplete) wait for one build: without the lock two builds of one
# binary race on its temporary name.
exec 9>"$dir/.lock"
flock 9

log() { echo "controlplane: $*" >&2; }

# Build into a temporary name and move into place, so an interrupted build
# never leaves a truncated binary that later runs would trust.
build() { # name module-dir package
	local name=$1 mod=$2 pkg=$3
	[ -x "$dir/$name" ] && return 0
	log "building $name ($pkg) into $dir"
	(cd "$mod" && go build -trimpath -o "$dir/.$name.tmp" "$pkg")
	mv "$dir/.$name.tmp" "$dir/$name"
}

build etcd "$here/etcd" .
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	build "$c" "$here/kube" "k8s.io/kubernetes/cmd/$c"
done

# kwok is a tool of the same module, built against the same Kubernetes
# modules: it reuses the compiled Kubernetes packages of the binaries above
# and compiles only what kwok adds (cold: 174 s; from kwok's own module,
# with its own Kubernetes release, 246 of a cold demo's 675 s). The module
# must pin KWOK_VERSION.
kwok_pinned=$(cd "$here/kube" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)
if [ "$kwok_pinned" != "$KWOK_VERSION" ]; then
	echo "test/tools/kube/go.mod pins sigs.k8s.io/kwok $kwok_pinned, install.sh KWOK_VERSION $KWOK_VERSION: move them together" >&2
	exit 1
fi
# A kwok built before, from its own module, is built again from this one.
if [ -x "$dir/kwok" ] && ! grep -q "^[[:space:]]*=>[[:space:]]*k8s.io/client-go[[:space:]]" <<<"$(go version -m "$dir/kwok")"; then
	log "kwok in $dir was built from its own module; building it again from test/tools/kube"
	rm -f "$dir/kwok"
fi
build kwok "$here/kube" sigs.k8s.io/kwok/cmd/kwok

if [ ! -f "$dir/kwok-stages.yaml" ]; then
	src=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage
	if [ ! -d "$src" ]; then
		GOFLAGS=-mod=mod go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
	fi
	{
		for f in node/fast/*.yaml node/heartbeat/*.yaml pod/fast/*.yaml; do
			for y in "$src"/$f; do
				case "$y" in */kustomization.yaml) continue ;; esac
				cat "$y"; echo "---"
			done
		done
	} > "$dir/.kwok-stages.tmp"
	mv "$dir/.kwok-stages.tmp" "$dir/kwok-stages.yaml"
fi

echo "$dir"
