#!/usr/bin/env bash
# Installs the Debian packages the tests use as real peers (not mocks), only
# those missing: the reference ZeroMQ (libzmq through python3-zmq, with
# python3-msgpack) for the KV-event interoperability tests, redis-server for
# the index's Redis backend, Prometheus' promtool for the alert rules,
# protoc for the gRPC contract, tcmalloc for vLLM's CPU backend
# (test/realengine), python3.11-venv so that test/tools/install-python.sh
# can make the engines' virtual environments, and util-linux's nsenter,
# unshare and setpriv (network namespaces; the cache server run as its
# pod's user in test/conformance), and the real node's runc, CNI plugins
# and iptables (test/testutil/realnode; Debian's containerd is left out:
# its 1.6 shim on PATH would shadow the 2.x one install-node.sh builds).
# CI runs as root on a fresh machine: one `apt-get update`, then
# `apt-get install -y`. Prints nothing on success when everything is
# already there.
set -euo pipefail

# command-or-file the test looks for, and the Debian package that brings it.
need=(
	"/usr/bin/python3:python3"
	"/usr/lib/python3.11/ensurepip:python3.11-venv"
	"/usr/lib/python3/dist-packages/zmq:python3-zmq"
	"/usr/lib/python3/dist-packages/msgpack:python3-msgpack"
	"/usr/bin/redis-server:redis-server"
	"/usr/bin/promtool:prometheus"
	"/usr/bin/prometheus:prometheus"
	"/usr/bin/shellcheck:shellcheck"
	"/usr/bin/protoc:protobuf-compiler"
	"/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:libtcmalloc-minimal4"
	"/usr/bin/nsenter:util-linux"
	"/usr/bin/unshare:util-linux"
	"/usr/bin/setpriv:util-linux"
	"/sbin/ip:iproute2"
	"/usr/sbin/runc:runc"
	"/usr/lib/cni/bridge:containernetworking-plugins"
	"/usr/sbin/iptables:iptables"
)

missing=()
for n in "${need[@]}"; do
	path=${n%%:*} pkg=${n#*:}
	[ -e "$path" ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "packages: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
	echo "packages: not root; install these Debian packages first: ${missing[*]}" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
# A package's post-install script may start its service (redis-server):
# the tests start and stop their own servers on free ports.
if command -v systemctl >/dev/null 2>&1; then systemctl stop redis-server >/dev/null 2>&1 || true; fi
pkill -x redis-server >/dev/null 2>&1 || true
