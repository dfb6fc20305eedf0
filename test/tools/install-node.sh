#!/usr/bin/env bash
# Builds a real node's parts from the Go module proxy: the kubelet and
# kube-proxy (k8s.io/kubernetes, the control plane's release, from
# test/tools/kube), containerd with its runc shim and ctr
# (github.com/containerd/containerd/v2), CoreDNS (github.com/coredns/coredns)
# and the pod sandbox's pause binary (test/tools/pause). runc, the CNI
# plugins and iptables are Debian's (test/tools/install-packages.sh).
# Binaries go to a per-user cache folder keyed by version, so a fresh clone
# reuses them; only missing binaries are built; concurrent callers wait for
# one build (flock). Prints the folder. See docs/testing.md#the-real-node.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# renovate: datasource=go depName=k8s.io/kubernetes
KUBE_VERSION=v1.37.2
# renovate: datasource=go depName=github.com/containerd/containerd/v2
CONTAINERD_VERSION=v2.4.2
# renovate: datasource=go depName=github.com/coredns/coredns
COREDNS_VERSION=v1.15.0
cache=${INFERENCECACHE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferencecache-operator}
dir=${NODE_DIR:-$cache/node-kube${KUBE_VERSION}-containerd${CONTAINERD_VERSION}-coredns${COREDNS_VERSION}}
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

log() { echo "node: $*" >&2; }

# Build into a temporary name and move into place, so an interrupted build
# never leaves a truncated binary that later runs would trust.
build() { # name module-dir package [go build flags...]
	local name=$1 mod=$2 pkg=$3
	shift 3
	[ -x "$dir/$name" ] && return 0
	log "building $name ($pkg) into $dir"
	(cd "$mod" && go build -trimpath "$@" -o "$dir/.$name.tmp" "$pkg")
	mv "$dir/.$name.tmp" "$dir/$name"
}

# go install of a module at a version, into the folder.
install() { # module-path@version binary-name [go install flags...]
	local pkg=$1 name=$2
	shift 2
	[ -x "$dir/$name" ] && return 0
	log "building $name ($pkg) into $dir"
	local tmp
	tmp=$(mktemp -d)
	GOBIN=$tmp go install -trimpath "$@" "$pkg"
	mv "$tmp/$name" "$dir/$name"
	rmdir "$tmp"
}

for c in kubelet kube-proxy; do
	build "$c" "$here/kube" "k8s.io/kubernetes/cmd/$c"
done
for c in containerd containerd-shim-runc-v2 ctr; do
	install "github.com/containerd/containerd/v2/cmd/$c@$CONTAINERD_VERSION" "$c" -tags no_btrfs
done
CGO_ENABLED=0 install "github.com/coredns/coredns@$COREDNS_VERSION" coredns
CGO_ENABLED=0 build pause "$here/pause" . -ldflags "-s -w"

echo "$dir"
