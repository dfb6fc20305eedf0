#!/usr/bin/env bash
# Runs one Go fuzz target for a while: test/tools/fuzz.sh TARGET DURATION PACKAGE.
# A real finding fails (a failing input written, a panic, a test error). Go
# 1.26's fuzz coordinator can also report a bare "context deadline exceeded"
# when -fuzztime ends while a worker is mid-call (go.dev/issue/75804, fixed in
# Go 1.27; this project stays on the machine's Go 1.26): such a run found
# nothing and wrote no input, so it is reported as that and passes.
# test/tools/fuzz.sh --classify LOG prints "finding" or "deadline-race".
set -uo pipefail

classify() {
	if grep -q 'Failing input written to' "$1" || grep -q '^panic: ' "$1"; then
		echo finding
		return
	fi
	# The indented lines under "--- FAIL": only the deadline for the race.
	if awk '/^--- FAIL: /{f=1; next} f && /^[ \t]/{l=$0; sub(/^[ \t]+/, "", l); if (l != "context deadline exceeded") bad=1; seen=1; next} {f=0} END{exit !(seen && !bad)}' "$1"; then
		echo deadline-race
		return
	fi
	echo finding
}

if [ "${1:-}" = --classify ]; then
	classify "$2"
	exit 0
fi

target=$1 duration=$2 pkg=$3
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test -run '^$' -fuzz "^${target}\$" -fuzztime "$duration" "$pkg" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] && exit 0
if [ "$(classify "$log")" = deadline-race ]; then
	echo "fuzz: $target stopped on Go's -fuzztime deadline race (go.dev/issue/75804) with no finding: passed"
	exit 0
fi
exit "$rc"
