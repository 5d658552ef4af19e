#!/usr/bin/env bash
# Runs examples/digits (an MLP trained by SGD on the UCI digits, Hogwild or
# sync) for each thread count, writes its figures to results/digits.csv,
# draws loss and test accuracy against training time with gnuplot into
# docs/images/digits.png, and prints a Markdown table of the runs.
# Fetches the data and installs OpenBLAS and gnuplot when missing; builds
# in build-digits/ (release).
# Usage: digits.sh [--threads LIST] [--batch B] [--epochs E]
#                  [--mode hogwild|sync]
#        (defaults: 1,8; 1; 30; hogwild)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
threads=1,8
batch=1
epochs=30
mode=hogwild
parse_options "threads batch epochs mode" "$0 [--threads LIST] [--batch B]\
 [--epochs E] [--mode hogwild|sync]" "$@"

scripts/deps.sh digits
data=$(scripts/fetch-digits.sh)
dir=build-digits
build_release "$dir" examples/digits/digits
mkdir -p results docs/images
csv=results/digits.csv
png=docs/images/digits.png
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# BLAS on the calling thread: the T threads are the parallelism.
OPENBLAS_NUM_THREADS=1 "$dir/examples/digits/digits" --threads "$threads" \
	--batch "$batch" --epochs "$epochs" --mode "$mode" --csv "$csv" \
	"$data" | tee "$out"

# One line per thread count, in the order they ran.
runs=$(awk -F, 'NR > 1 && !seen[$1]++ { printf "%s ", $1 }' "$csv")
plot() { # column, title of a line
	local sep=""
	for t in $runs; do
		# shellcheck disable=SC2016 # $1 and $4 are gnuplot's columns
		printf '%s"%s" using ($1 == %s ? $4 : 1/0):%s with lines lw 2 title "T = %s"' \
			"$sep" "$csv" "$t" "$1" "$t"
		sep=", "
	done
}
plot_against_time "$png" \
	"examples/digits: MLP 64-64-10, $mode SGD, B = $batch, $epochs epochs" \
	"$(plot 5)" "$(plot 7)" "set yrange [85:100]" log

echo
echo "| T | B | epochs | test accuracy | first epoch at 96% | train accuracy | samples/s |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
# The csv's last epoch of each run, the first epoch at 96% or more, and
# the run's samples/s over all its epochs (its "result" line).
awk -F, 'FNR == NR {
	if (/^result /) { t = $0; sub(/.*threads=/, "", t); sub(/ .*/, "", t)
		r = $0; sub(/.*samples_per_s=/, "", r); sub(/ .*/, "", r)
		rate[t] = r }
	next
}
FNR > 1 {
	if (!($1 in last)) order[++n] = $1
	last[$1] = $0
	if ($7 >= 96 && !($1 in first)) first[$1] = $3
}
END {
	for (i = 1; i <= n; i++) {
		t = order[i]; split(last[t], f, ",")
		printf "| %d | %d | %d | %.2f%% | %s | %.2f%% | %s |\n",
			f[1], f[2], f[3], f[7], (t in first) ? first[t] : "-",
			f[6], rate[t]
	}
}' "$out" "$csv"
echo
echo "wrote $csv and $png"
