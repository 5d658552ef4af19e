#!/usr/bin/env bash
# Builds libadg and adg-bench (release) and runs the bench suite: with no
# arguments, the default contention sweep (about a minute on 2 cores); any
# arguments go to adg-bench (try --help). Installs missing build tools,
# gnuplot (for the plot) and valgrind (for --callgrind) first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh bench
dir=build-bench
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" --buildtype=release -Dtests=disabled >/dev/null
fi
ninja -C "$dir" >/dev/null
exec "$dir/bench/adg-bench" "$@"
