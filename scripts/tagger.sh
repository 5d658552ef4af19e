#!/usr/bin/env bash
# Runs examples/tagger (dynet-benchmark's BiLSTM tagger with a character
# model, on the Brown corpus) for each thread count on the whole training
# set, writes its per-epoch figures to results/tagger.csv, draws loss and
# test accuracy against training time with gnuplot into
# docs/images/tagger.png (a line per thread count), and prints a Markdown
# table of the runs (none with --epochs 0). Then, unless --speed-runs is
# 0, times --speed-runs runs of one epoch on the first --speed-subset
# training sentences each of sync at T = 1 and 2, --models 1 and
# --models 2, side by side in turns, and prints their medians: words/s,
# sync T = 2 over T = 1, and each of 2 models over one model alone. Fetches the data and installs
# OpenBLAS and gnuplot when missing; builds in build-tagger/ (release).
# BLAS runs on the calling thread (OPENBLAS_NUM_THREADS=1): the T threads
# are the parallelism.
# Usage: tagger.sh [--threads LIST] [--epochs E] [--mode sync|hogwild]
#                  [--graphs length|sentence] [--chars on|off] [--lr X]
#                  [--speed-runs N] [--speed-subset N]
#        (defaults: 1,2; 3; sync; length; on; 4; 3; 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
threads=1,2
epochs=3
mode=sync
graphs=length
chars=on
lr=4
speed_runs=3
speed_subset=10000
parse_options "threads epochs mode graphs chars lr speed-runs speed-subset" \
	"$0 [--threads LIST] [--epochs E] [--mode sync|hogwild]\
 [--graphs length|sentence] [--chars on|off] [--lr X] [--speed-runs N]\
 [--speed-subset N]" "$@"
want_list --threads "$threads"
want_number --speed-subset "$speed_subset"
for option in epochs speed_runs; do
	[[ ${!option} =~ ^[0-9]+$ ]] || {
		echo "--${option//_/-} wants a number, not '${!option}'" >&2
		exit 2
	}
done

scripts/deps.sh fashion # OpenBLAS and gnuplot
data=$(scripts/fetch-brown.sh | tail -1)
dir=build-tagger
build_release "$dir" examples/tagger/tagger
bin=$dir/examples/tagger/tagger
mkdir -p results docs/images
csv=results/tagger.csv
png=docs/images/tagger.png
out=$(mktemp)
speed=$(mktemp)
trap 'rm -f "$out" "$speed"' EXIT
describe_machine
train() {
	OPENBLAS_NUM_THREADS=1 "$bin" --threads "$threads" --epochs "$epochs" \
		--mode "$mode" --graphs "$graphs" --chars "$chars" --lr "$lr" \
		--csv "$csv" "$data" | tee "$out"

	# One line per thread count, in the order they ran; csv columns: mode,
	# threads, models, graphs, chars, batch, epoch, seconds, train_loss,
	# train_accuracy, test_loss, test_accuracy, words_per_s.
	plot() { # column
		local sep="" t
		for t in ${threads//,/ }; do
			# shellcheck disable=SC2016 # $2 and $8 are gnuplot's columns
			printf '%s"%s" using ($2 == %s ? $8 : 1/0):%s with linespoints lw 2 title "T = %s"' \
				"$sep" "$csv" "$t" "$1" "$t"
			sep=", "
		done
	}
	plot_against_time "$png" \
		"examples/tagger: BiLSTM tagger, chars $chars, Brown corpus, $mode SGD, B = 32, lr $lr, $epochs epochs" \
		"$(plot 9)" "$(plot 12)"

	echo
	echo "| mode | graphs | chars | T | epochs | test accuracy | words/s | x T = 1 |"
	echo "|---|---|---|---:|---:|---:|---:|---:|"
	awk '/^result / {
		for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		if (f["threads"] == 1) one = f["words_per_s"]
		printf "| %s | %s | %s | %d | %d | %.2f%% | %s | %s |\n", f["mode"],
			f["graphs"], f["chars"], f["threads"], f["epochs"],
			f["test_accuracy"], f["words_per_s"],
			one != "" ? sprintf("%.2f", f["words_per_s"] / one) : "-"
	}' "$out"
	echo
	echo "wrote $csv and $png"
}
[ "$epochs" -eq 0 ] || train
[ "$speed_runs" -gt 0 ] || exit 0

# Speed: the four cells in turns, so that a shared machine's load falls
# on each alike; one epoch each on the subset, the test set cut to 500
# sentences (testing is not timed).
echo
echo "speed: $speed_runs runs of one epoch on $speed_subset sentences," \
	"graphs $graphs, chars $chars (medians)"
for ((r = 1; r <= speed_runs; r++)); do
	for cell in "sync 1" "sync 2" "models 1" "models 2"; do
		read -r way count <<<"$cell"
		if [ "$way" = models ]; then
			how=(--models "$count")
		else
			how=(--threads "$count")
		fi
		OPENBLAS_NUM_THREADS=1 timed_result "$speed" "$cell" "$bin" \
			"${how[@]}" --epochs 1 --lr "$lr" --graphs "$graphs" \
			--chars "$chars" --subset "$speed_subset" \
			--test-subset 500 "$data"
	done
done
awk "$stats_awk"'
{
	cell = $1 " " $2
	for (i = 3; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
	words[cell] = words[cell] " " f["words_per_s"]
	model[cell] = model[cell] " " f["per_model_words_per_s"]
	cpu[cell] = cpu[cell] " " f["cpu_over_wall"]
}
END {
	one = median(words["sync 1"]); two = median(words["sync 2"])
	each = median(model["models 2"]); alone = median(words["models 1"])
	print "| cell | words/s (median) | runs | CPU / wall |"
	print "|---|---:|---|---:|"
	n = split("sync 1,sync 2,models 1,models 2", cells, ",")
	for (i = 1; i <= n; i++)
		printf "| %s | %.0f | %s | %.2f |\n", cells[i],
			median(words[cells[i]]), words[cells[i]],
			median(cpu[cells[i]])
	printf "\nsync T = 2 / T = 1: %.2f x; --models 2, each model / one" \
		" model alone: %.2f x\n", two / one, each / alone
}' "$speed"
