#!/usr/bin/env bash
# Runs a test binary with the --filter that tests/meson.build makes of
# test ids (suite/name), once every id is found to name a test in it: an
# id that names none (a test renamed) would leave the filter picking
# nothing, and the registration passing on no test. The binary's output
# passes through unchanged: scripts/test.sh counts its tests in meson's log.
# Usage: check-ids.sh pick|drop EXE ID... (pick runs only those tests, drop
# all the others).
set -euo pipefail
shopt -s extglob # ids are --filter patterns, which may use @(...) and !(...)
if [ $# -lt 3 ] || { [ "$1" != pick ] && [ "$1" != drop ]; }; then
	echo "usage: $0 pick|drop EXE ID..." >&2
	exit 2
fi
mode=$1 exe=$2
shift 2

# --list, Criterion's and tsan-runner's alike, prints "SUITE: N tests",
# then a line per test that ends in its name.
list=$("$exe" --list) || {
	echo "check-ids.sh: $exe --list failed" >&2
	exit 1
}
paths=()
suite=
while IFS= read -r line; do
	if [[ $line =~ ^([^ ]+):\ [0-9]+\ tests?$ ]]; then
		suite=${BASH_REMATCH[1]}
	elif [ -n "$suite" ] && [ -n "$line" ]; then
		paths+=("$suite/${line##* }")
	fi
done <<<"$list"

stale=0
for id in "$@"; do
	found=0
	for path in "${paths[@]}"; do
		# shellcheck disable=SC2053 # unquoted: the id matches as a pattern
		if [[ $path == $id ]]; then
			found=1
			break
		fi
	done
	if [ $found -eq 0 ]; then
		echo "check-ids.sh: no test in $(basename "$exe") has the id '$id'" \
			"(renamed? tests/meson.build, split_off)" >&2
		stale=1
	fi
done
if [ $stale -ne 0 ]; then
	exit 1
fi

ids=$(
	IFS='|'
	echo "$*"
)
if [ "$mode" = pick ]; then
	exec "$exe" "--filter=@($ids)"
fi
exec "$exe" "--filter=!($ids)"
