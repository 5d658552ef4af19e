#!/usr/bin/env bash
# Runs examples/langid (a character-level GRU that tells nine languages
# apart, word by word) for each thread count, writes its per-epoch figures
# to results/langid.csv, draws loss and test accuracy against training
# time with gnuplot into docs/images/langid.png (a line per thread count),
# and prints a Markdown table of the runs. Fetches the data and installs
# OpenBLAS and gnuplot when missing; builds in build-langid/ (release).
# BLAS runs on the calling thread (OPENBLAS_NUM_THREADS=1): the T threads
# are the parallelism.
# Usage: langid.sh [--threads LIST] [--epochs E] [--mode sync|hogwild]
#                  [--graphs length|word]
#        (defaults: 1,2; 5; sync; length)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
threads=1,2
epochs=5
mode=sync
graphs=length
parse_options "threads epochs mode graphs" "$0 [--threads LIST]\
 [--epochs E] [--mode sync|hogwild] [--graphs length|word]" "$@"

scripts/deps.sh fashion # OpenBLAS and gnuplot
data=$(scripts/fetch-words.sh)
dir=build-langid
build_release "$dir" examples/langid/langid
mkdir -p results docs/images
csv=results/langid.csv
png=docs/images/langid.png
out=$(mktemp)
trap 'rm -f "$out"' EXIT
OPENBLAS_NUM_THREADS=1 "$dir/examples/langid/langid" --threads "$threads" \
	--epochs "$epochs" --mode "$mode" --graphs "$graphs" --csv "$csv" \
	"$data" | tee "$out"

# One line per thread count, in the order they ran; csv columns: mode,
# threads, models, graphs, batch, epoch, seconds, train_loss, test_loss,
# test_accuracy, samples_per_s.
plot() { # column
	local sep="" t
	for t in ${threads//,/ }; do
		# shellcheck disable=SC2016 # $2 and $7 are gnuplot's columns
		printf '%s"%s" using ($2 == %s ? $7 : 1/0):%s with linespoints lw 2 title "T = %s"' \
			"$sep" "$csv" "$t" "$1" "$t"
		sep=", "
	done
}
plot_against_time "$png" \
	"examples/langid: GRU 32-64 on bytes, 9 languages, $mode SGD, B = 32, $epochs epochs" \
	"$(plot 8)" "$(plot 10)"

echo
echo "| mode | graphs | T | epochs | test accuracy | samples/s | x T = 1 |"
echo "|---|---|---:|---:|---:|---:|---:|"
awk '/^result / {
	for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
	if (f["threads"] == 1) one = f["samples_per_s"]
	printf "| %s | %s | %d | %d | %.2f%% | %s | %s |\n", f["mode"],
		f["graphs"], f["threads"], f["epochs"], f["test_accuracy"],
		f["samples_per_s"],
		one != "" ? sprintf("%.2f", f["samples_per_s"] / one) : "-"
}' "$out"
echo
echo "wrote $csv and $png"
