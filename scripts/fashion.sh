#!/usr/bin/env bash
# Runs examples/fashion (an MLP 784-256-128-10 on Fashion-MNIST) for each
# batch size and thread count, writes its per-epoch figures to
# results/fashion.csv, draws loss and test accuracy against training time
# with gnuplot into docs/images/fashion.png (a line per batch size and
# thread count), and prints a Markdown table of the runs. Fetches the data
# and installs OpenBLAS and gnuplot when missing; builds in build-fashion/
# (release). BLAS runs on the calling thread (OPENBLAS_NUM_THREADS=1): the
# T threads are the parallelism.
# Usage: fashion.sh [--threads LIST] [--batch LIST] [--epochs E]
#                   [--mode sync|hogwild]
#        (defaults: 1,2; 16,64; 10; sync)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
threads=1,2
batch=16,64
epochs=10
mode=sync
parse_options "threads batch epochs mode" "$0 [--threads LIST]\
 [--batch LIST] [--epochs E] [--mode sync|hogwild]" "$@"

scripts/deps.sh fashion
data=$(scripts/fetch-fashion.sh)
dir=build-fashion
build_release "$dir" examples/fashion/fashion
mkdir -p results docs/images
csv=results/fashion.csv
png=docs/images/fashion.png
out=$(mktemp)
part=$(mktemp)
trap 'rm -f "$out" "$part"' EXIT
: >"$csv"
for b in ${batch//,/ }; do
	OPENBLAS_NUM_THREADS=1 "$dir/examples/fashion/fashion" \
		--threads "$threads" --batch "$b" --epochs "$epochs" \
		--mode "$mode" --csv "$part" "$data" | tee -a "$out"
	# One header for all the batch sizes.
	if [ -s "$csv" ]; then tail -n +2 "$part" >>"$csv"; else cat "$part" >"$csv"; fi
done

# One line per batch size and thread count, in the order they ran.
runs=$(awk -F, 'NR > 1 && !seen[$2 " " $1]++ { printf "%s:%s ", $2, $1 }' "$csv")
plot() { # column, title of a line
	local sep="" b t
	for run in $runs; do
		b=${run%%:*}
		t=${run#*:}
		# shellcheck disable=SC2016 # $1, $2 and $4 are gnuplot's columns
		printf '%s"%s" using ($2 == %s && $1 == %s ? $4 : 1/0):%s with linespoints lw 2 title "B = %s, T = %s"' \
			"$sep" "$csv" "$b" "$t" "$1" "$b" "$t"
		sep=", "
	done
}
plot_against_time "$png" \
	"examples/fashion: MLP 784-256-128-10, $mode SGD, $epochs epochs" \
	"$(plot 5)" "$(plot 7)" "set yrange [80:92]" log

echo
echo "| mode | B | T | epochs | test accuracy | train accuracy | samples/s | x T = 1 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
# The csv's last epoch of each run, and the run's samples/s over all its
# epochs (its "result" line), against the same batch size's T = 1.
awk -F, -v mode="$mode" 'FNR == NR {
	if (/^result /) {
		t = $0; sub(/.*threads=/, "", t); sub(/ .*/, "", t)
		b = $0; sub(/.*batch=/, "", b); sub(/ .*/, "", b)
		r = $0; sub(/.*samples_per_s=/, "", r); sub(/ .*/, "", r)
		rate[b " " t] = r
	}
	next
}
FNR > 1 {
	k = $2 " " $1
	if (!(k in last)) order[++n] = k
	last[k] = $0
}
END {
	for (i = 1; i <= n; i++) {
		k = order[i]; split(last[k], f, ",")
		one = rate[f[2] " 1"]
		printf "| %s | %d | %d | %d | %.2f%% | %.2f%% | %s | %s |\n",
			mode, f[2], f[1], f[3], f[7], f[6], rate[k],
			one != "" ? sprintf("%.2f", rate[k] / one) : "-"
	}
}' "$out" "$csv"
echo
echo "wrote $csv and $png"
