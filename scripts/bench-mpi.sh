#!/usr/bin/env bash
# Sums across ranks, two ways side by side (issues 31, 42): examples/
# mpi_data_parallel's default, the ranks' partial sums of each bucket
# folded over the job's tree by the example (MPI_Ialltoallv of slices, a
# fold, MPI_Iallgatherv), against MPI_Iallreduce (--allreduce mpi), at 2
# and 4 ranks on shared memory:
#   model   the example's training (a 2-layer MLP, 49 weights in 4
#           buckets), --threads T, --steps steps: its median time a step,
#           the two ways in alternate runs, --runs runs each
#   bucket  one bucket of --bucket doubles, the two ways taking turns
#           inside one run (--bench-bucket), 30 of each: the medians
# Prints a Markdown table with the ratios. Builds in build-mpi-bench/
# (release, with MPI). Not part of CI; docs/bench.md has its figures.
# Usage: bench-mpi.sh [--runs N] [--steps N] [--threads T] [--bucket N]
#        (defaults: 5; 200; 1; 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
runs=5
steps=200
threads=1
bucket=1000000
parse_options "runs steps threads bucket" "$0 [--runs N] [--steps N]\
 [--threads T] [--bucket N]" "$@"
want_number --runs "$runs"
want_number --steps "$steps"
want_number --threads "$threads"
want_number --bucket "$bucket"

dir=build-mpi-bench
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" --buildtype=release -Dtests=disabled \
		-Dmpi=enabled >/dev/null
fi
ninja -C "$dir" examples/mpi_data_parallel >/dev/null
exe=$dir/examples/mpi_data_parallel
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2054 # the comma is mpirun's, in one word
mpi=(mpirun --oversubscribe --mca btl self,vader)

describe_machine
echo "Open MPI $(ompi_info --version | sed -n 's/^Open MPI v//p'), btl" \
	"self,vader; model: $steps steps at $threads thread(s) a rank, $runs" \
	"runs each way; bucket: $bucket doubles, 30 exchanges each way"
echo

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ranks in 2 4; do
	for r in $(seq "$runs"); do
		for how in tree mpi; do
			us=$("${mpi[@]}" -np "$ranks" "$exe" --threads "$threads" \
				--allreduce "$how" "$steps" |
				sed -n 's/.* \([0-9.]*\) us a step.*/\1/p')
			[ -n "$us" ] || {
				echo "no time from $how at $ranks ranks" >&2
				exit 1
			}
			echo "model $ranks $how $us" >>"$results"
		done
		echo "ranks=$ranks run $r of $runs" >&2
	done
	"${mpi[@]}" -np "$ranks" "$exe" --bench-bucket "$bucket" 30 |
		awk -v r="$ranks" '/^bench / {
			for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
			print "bucket " r " tree " f["tree_us"]
			print "bucket " r " mpi " f["mpi_us"]
		}' >>"$results"
done

awk "$stats_awk"'
{ t[$1, $2, $3] = t[$1, $2, $3] " " $4 }
END {
	print "| what | ranks | the tree, us | MPI_Iallreduce, us | the tree / MPI |"
	print "|---|---:|---:|---:|---:|"
	split("model bucket", whats, " ")
	for (w = 1; w <= 2; w++)
		for (r = 2; r <= 4; r += 2) {
			o = median(t[whats[w], r, "tree"]); m = median(t[whats[w], r, "mpi"])
			printf "| %s | %d | %.1f | %.1f | %.2f |\n",
				whats[w] == "model" ? "a step of the model" : "a bucket", r, o, m, o / m
		}
	m2 = median(t["model", 2, "tree"]) / median(t["model", 2, "mpi"])
	b2 = median(t["bucket", 2, "tree"]) / median(t["bucket", 2, "mpi"])
	print ""
	printf "%s 2 ranks, the model: the tree <= 1.2 x MPI_Iallreduce: %.2f x\n", verdict(m2 <= 1.2), m2
	printf "%s 2 ranks, the bucket: the tree <= 1.2 x MPI_Iallreduce: %.2f x\n", verdict(b2 <= 1.2), b2
}' "$results"
