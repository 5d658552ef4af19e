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
threads=1,2
batches=16,64
epochs=10
mode=sync
while [ $# -gt 0 ]; do
	case $1 in
	--threads | --batch | --epochs | --mode)
		if [ $# -lt 2 ]; then
			echo "$1 wants a value" >&2
			exit 2
		fi
		case $1 in
		--threads) threads=$2 ;;
		--batch) batches=$2 ;;
		--epochs) epochs=$2 ;;
		--mode) mode=$2 ;;
		esac
		shift 2
		;;
	*)
		echo "usage: $0 [--threads LIST] [--batch LIST] [--epochs E]" \
			"[--mode sync|hogwild]" >&2
		exit 2
		;;
	esac
done

scripts/deps.sh fashion
data=$(scripts/fetch-fashion.sh)
dir=build-fashion
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" --buildtype=release -Dtests=disabled \
		-Dmpi=disabled >/dev/null
fi
ninja -C "$dir" examples/fashion/fashion >/dev/null
mkdir -p results docs/images
csv=results/fashion.csv
png=docs/images/fashion.png
out=$(mktemp)
part=$(mktemp)
trap 'rm -f "$out" "$part"' EXIT
: >"$csv"
for batch in ${batches//,/ }; do
	OPENBLAS_NUM_THREADS=1 "$dir/examples/fashion/fashion" \
		--threads "$threads" --batch "$batch" --epochs "$epochs" \
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
gnuplot <<GNUPLOT
set terminal pngcairo size 1000,400 font "sans,10"
set output "$png"
set datafile separator ","
set key autotitle columnhead
set multiplot layout 1,2 title "examples/fashion: MLP 784-256-128-10, $mode SGD, $epochs epochs"
set xlabel "training time (s)"
set ylabel "training loss"
set logscale y
set grid
plot $(plot 5)
unset logscale y
set ylabel "test accuracy (%)"
set yrange [80:92]
set key bottom right
plot $(plot 7)
unset multiplot
GNUPLOT

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
