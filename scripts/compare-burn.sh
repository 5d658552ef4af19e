#!/usr/bin/env bash
# libadg beside burn 0.21, the Rust framework whose GraphMutexClient is
# libadg's reference design, on burn issues #2729's and #715's shape: N
# threads in one process, each training its own small model
# (bench/compare/burn/, docs/bench.md "libadg beside burn").
#
# Installs libadg (release) into a temporary prefix, as
# scripts/consumer-test.sh does, and builds bench/compare/burn with
# pkg-config pointed there (the adg-sys crate finds libadg so); builds
# adg-bench (release) beside it and runs its disjoint workload on the
# seed port (bench/impl_seed.c) and on adg, then runs burn-vs-adg with the
# arguments given (burn-vs-adg --help; default: threads 1,2,8,32, 5 reps,
# the mlp, chain and disjoint workloads), which checks that both sides
# agree, prints its tables and, from adg-bench's CSV, how well the seed
# port predicted burn. On 2 cores the whole script takes about 4
# minutes the first time (burn's first build is about 3 of them, on one
# job) and 1 to 3 minutes after, more on a busy machine. Not run by CI.
# Usage: scripts/compare-burn.sh [burn-vs-adg flags]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if ! command -v cargo >/dev/null; then
	echo "compare-burn: needs cargo (rustup), 1.80 or later" >&2
	exit 2
fi
scripts/deps.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

meson setup "$work/build" --prefix="$prefix" --libdir=lib \
	--buildtype=release -Dtests=disabled -Dexamples=false -Dbench=false \
	>/dev/null
ninja -C "$work/build" install >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
export LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# The seed port and adg's C API on adg-bench's disjoint workload (a chain
# of 32 products and a 31-node tree over 4 leaves per iteration), the
# iteration burn-vs-adg's disjoint workload repeats.
meson setup "$work/bench" --buildtype=release -Dtests=disabled \
	-Dexamples=false -Dbench=true >/dev/null
ninja -C "$work/bench" bench/adg-bench >/dev/null
threads=1,2,8,32
for arg in "$@"; do
	case $arg in --threads=*) threads=${arg#--threads=} ;; esac
done
"$work/bench/bench/adg-bench" --workloads=disjoint --impls=seed,adg \
	--threads="$threads" --no-idle --no-checkpoint --no-plot \
	--out="$work/results" >"$work/adg-bench.txt"
csv=$(find "$work/results" -name bench.csv | head -n 1)

# burn's own target folder, kept between runs: its first build is long.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/bench/compare/burn/target}
cargo build --release --locked --manifest-path bench/compare/burn/Cargo.toml
# ndarray without BLAS does its math on the calling thread; burn is built
# without its multi-threads feature (no rayon), and RAYON_NUM_THREADS=1
# holds anything else to one thread, so each model runs on its own thread.
export RAYON_NUM_THREADS=1
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n 1)," \
	"$(nproc) cores online, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "burn: $(grep -A1 '^name = "burn"$' bench/compare/burn/Cargo.lock |
	sed -n 's/^version = //p' | tr -d '"'); rustc: $(rustc --version)"
echo
echo "adg-bench, disjoint (the seed port and adg's C API):"
grep -E '^(workload|disjoint) ' "$work/adg-bench.txt"
"$CARGO_TARGET_DIR/release/burn-vs-adg" --seed-csv="$csv" "$@"
