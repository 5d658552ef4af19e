#!/usr/bin/env bash
# Trains examples/tagger's model (dynet-benchmark's BiLSTM tagger with a
# character model, on the Brown corpus) with libadg and with PyTorch's C++
# API, side by side, from the same setup (tagger --export: the initial
# weights, each epoch's learning rate and order), and against its floor.
# Programs, at T threads and mini-batches of the trainer's default size:
#   libadg sync           tagger (its default): each batch's graphs, one
#                         per group of sentences of one length, dealt into
#                         work units the T threads take in turn, gradients
#                         through adg::reducer
#   libadg sync sentence  tagger --graphs sentence: one graph per sentence
#   libadg Hogwild        tagger --mode hogwild
#   PyTorch batched       bench/compare/tagger_torch.cpp batched: each
#                         batch padded, packed, through bidirectional
#                         torch::nn::LSTMs (the rare words' spellings too),
#                         at::set_num_threads(T)
#   PyTorch sentence      tagger_torch sentence: a graph per sentence, a
#                         character nn::LSTM per rare word, Hogwild over T
#                         threads of one intra-op thread each
#   floor (T = 1)         bench/compare/tagger_floor.cpp: the same kernels
#                         (lstm.hpp), batched as libadg's default, a
#                         backward through time by hand, no autodiff
# and tagger --models N for each N of --models (N models at once, one per
# thread). Threads are pinned: libadg's side, the floor and PyTorch's
# sentence mode run BLAS on the calling thread (OPENBLAS_NUM_THREADS=1,
# OMP_NUM_THREADS=1, and at::set_num_threads(1)); PyTorch batched gets T
# intra-op threads and T OpenBLAS threads, with OMP_WAIT_POLICY=passive;
# inter-op threads are 1. Each run's CPU time over its wall time (the
# whole process, from /usr/bin/time) says how many cores it used.
#
# Speed: one epoch on the first --subset training sentences, each cell the
# median of --runs runs, the programs taking turns so that the machine's
# ups and downs reach all alike; the evaluation (on the first
# --test-subset test sentences) is not timed. Accuracy: --epochs epochs on
# the first --accuracy-subset training sentences (0: all of them), tested
# on every test sentence, once, libadg's default and PyTorch batched on
# one thread, from one export. Prints one Markdown table (words/s: tokens
# of training a second) and the targets of issue 45, PASS or MISS; every
# run's figures stay in build-compare/tagger-compare-runs.txt, every run's
# output in build-compare/tagger-compare-logs/. Builds in build-compare/
# (not part of CI); scripts/compare-torch.sh tagger runs this.
# Usage: compare-tagger.sh [--runs N] [--subset N] [--test-subset N]
#                          [--threads LIST] [--models LIST] [--epochs E]
#                          [--accuracy-subset N] [--no-accuracy]
#   (defaults: 3; 12000; 300; 1,2; 1,2; 3; 0)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
runs=3
subset=12000
test_subset=300
threads=1,2
models=1,2
epochs=3
accuracy_subset=0
accuracy=1
args=()
for arg in "$@"; do # the one option without a value
	if [ "$arg" = --no-accuracy ]; then accuracy=0; else args+=("$arg"); fi
done
parse_options "runs subset test-subset threads models epochs accuracy-subset" \
	"$0 [--runs N] [--subset N] [--test-subset N] [--threads LIST]\
 [--models LIST] [--epochs E] [--accuracy-subset N] [--no-accuracy]" \
	${args[@]+"${args[@]}"}
want_number --runs "$runs"
want_number --subset "$subset"
want_number --test-subset "$test_subset"
want_number --epochs "$epochs"
want_list --threads "$threads"
want_list --models "$models"
[ "$accuracy_subset" = 0 ] || want_number --accuracy-subset "$accuracy_subset"
IFS=, read -r -a thread_counts <<<"$threads"
IFS=, read -r -a model_counts <<<"$models"

scripts/deps.sh compare
data=$(scripts/fetch-brown.sh | tail -1)
dir=build-compare
build_release "$dir" examples/tagger/tagger
adg=$dir/examples/tagger/tagger
floor=$dir/tagger_floor
torch=$dir/tagger_torch
build_floor bench/compare/tagger_floor.cpp "$floor" -Iexamples/tagger
build_torch bench/compare/tagger_torch.cpp "$torch" -Iexamples/tagger

describe_machine
echo "tagger: BiLSTM 128-50 with a char BiLSTM 20-64 for rare words, MLP 32," \
	"Brown corpus; speed: 1 epoch on $subset training sentences, each" \
	"cell the median of $runs runs, the programs taking turns"
echo

results=$dir/tagger-compare-runs.txt
logs=$dir/tagger-compare-logs
: >"$results"
rm -rf "$logs"
mkdir -p "$logs"
count=0
# Runs one program ($1: its kind, $2: T, then the command), its output
# kept in $logs, and appends "KIND T key=value..." to the results
# (timed_result; tee's share of the CPU time is negligible).
cell() {
	local kind=$1 t=$2
	shift 2
	count=$((count + 1))
	# shellcheck disable=SC2016 # expanded by the inner bash
	timed_result "$results" "$kind $t" bash -c \
		'log=$1; shift; "$@" | tee "$log"; exit "${PIPESTATUS[0]}"' \
		_ "$logs/$count-$kind-$t.txt" "$@"
}

one="env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1"
setup=$dir/tagger-setup-s$subset
"$adg" --export "$setup" --epochs 1 --subset "$subset" "$data" >/dev/null
# The trainers' own evaluation is not timed; a small test set keeps the
# runs short.
short=(--epochs 1 --subset "$subset" --test-subset "$test_subset")
for _ in $(seq "$runs"); do
	for t in "${thread_counts[@]}"; do
		echo "T=$t ..." >&2
		many="env OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t"
		many="$many OMP_WAIT_POLICY=passive"
		# $one and $many are words to split.
		# shellcheck disable=SC2086
		{
			cell adg-sync "$t" $one "$adg" --threads "$t" "${short[@]}" "$data"
			cell torch-batched "$t" $many "$torch" batched "$setup" \
				"$data" "$t" "$test_subset"
			cell adg-sentence "$t" $one "$adg" --threads "$t" \
				--graphs sentence "${short[@]}" "$data"
			cell torch-sentence "$t" $one "$torch" sentence "$setup" \
				"$data" "$t" "$test_subset"
			cell adg-hogwild "$t" $one "$adg" --mode hogwild \
				--threads "$t" "${short[@]}" "$data"
			[ "$t" != 1 ] ||
				cell floor 1 $one "$floor" "$setup" "$data" "$test_subset"
		}
	done
	for m in "${model_counts[@]}"; do
		echo "--models $m ..." >&2
		# shellcheck disable=SC2086
		cell adg-models "$m" $one "$adg" --models "$m" "${short[@]}" "$data"
	done
done
if [ $accuracy -eq 1 ]; then
	what="every training sentence"
	picked=()
	if [ "$accuracy_subset" != 0 ]; then
		what="the first $accuracy_subset training sentences"
		picked=(--subset "$accuracy_subset")
	fi
	echo "$epochs epochs on $what, T = 1 ..." >&2
	full=$dir/tagger-setup-e$epochs-a$accuracy_subset
	"$adg" --export "$full" --epochs "$epochs" ${picked[@]+"${picked[@]}"} \
		"$data" >/dev/null
	# shellcheck disable=SC2086
	{
		cell accuracy-adg 1 $one "$adg" --epochs "$epochs" \
			${picked[@]+"${picked[@]}"} "$data"
		cell accuracy-torch 1 $one "$torch" batched "$full" "$data" 1
	}
fi

# "KIND T key=value ..." -> the table and the targets.
awk -v epochs="$epochs" -v what="${what:-}" "$stats_awk$cells_awk"'
{ read_cell("words_per_s") }
END {
	speed_table("sentence")
	print ""
	print "words/s (tokens) of training, evaluation excluded, medians; PyTorch'"'"'s better = the better of its two modes."
	print ""
	models_table("words/s")
	print ""
	threads_report("adg-sync adg-sentence adg-hogwild torch-batched torch-sentence floor")
	print ""
	sync_checks()
	if ((1 in seen) && (2 in seen))
		printf "  %s sync gives the same weights at T=1 and T=2\n",
			verdict(hash["adg-sync", 1] == hash["adg-sync", 2])
	print ""
	print "Targets (issue 45):"
	if (("accuracy-adg", 1) in acc) {
		a = median(acc["accuracy-adg", 1]); p = median(acc["accuracy-torch", 1])
		g = a - p; if (g < 0) g = -g
		printf "  %s test accuracy after %d epochs on %s >= 93%% and within 0.5 points of PyTorch (batched, the same batches): %.2f%%, PyTorch %.2f%%, %+.2f\n",
			verdict(a >= 93 && g <= 0.5), epochs, what, a, p, a - p
	} else {
		print "  not checked: test accuracy (--no-accuracy)"
	}
	for (i = 1; i <= n; i++) {
		t = ts[i]
		if (t > 2) continue
		printf "  %s T=%d: libadg (sync) >= 2 x PyTorch'"'"'s better mode: %.2f x\n",
			verdict(vs_torch[t] >= 2), t, vs_torch[t]
		printf "  %s T=%d: libadg a graph per sentence >= 10 x PyTorch a graph per sentence: %.2f x\n",
			verdict(vs_per[t] >= 10), t, vs_per[t]
	}
	if ((1 in seen) && (2 in seen))
		printf "  %s sync: 2 threads >= 1.8 x 1 thread: %.2f x\n",
			verdict(sync[2] / sync[1] >= 1.8), sync[2] / sync[1]
	if ((1 in models) && (2 in models)) {
		r = median(per_model["adg-models", 2]) / median(rate["adg-models", 1])
		printf "  %s --models 2: each model >= 0.9 x one model alone: %.2f x\n",
			verdict(r >= 0.9), r
	}
	if (1 in seen)
		printf "  %s T=1: libadg within 1.3 x of its floor: the floor is %.2f x libadg\n",
			verdict(vs_floor <= 1.3), vs_floor
}' "$results"
