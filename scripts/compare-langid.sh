#!/usr/bin/env bash
# Trains examples/langid's model (a character-level GRU on the words of
# nine languages) with libadg and with PyTorch's C++ API, side by side,
# from the same setup (langid --export: the initial weights, each epoch's
# learning rate and order), and against its floor. Programs, at T threads
# and mini-batches of 32:
#   libadg sync         langid (its default): each batch split across the
#                       T threads, one graph per group of a share's words
#                       of one length, gradients through adg::reducer
#   libadg sync word    langid --graphs word: one graph per word
#   libadg Hogwild      langid --mode hogwild
#   PyTorch batched     bench/compare/langid_torch.cpp batched: each
#                       batch padded, packed, through torch::nn::GRU,
#                       at::set_num_threads(T)
#   PyTorch word        langid_torch word: a torch::nn::GRUCell loop per
#                       word, Hogwild over T threads of one intra-op
#                       thread each
#   floor (T = 1)       bench/compare/langid_floor.cpp: the same kernels,
#                       batched as libadg's default, a backward through
#                       time by hand, no autodiff
# and langid --models N for each N of --models (N models at once, one per
# thread). Threads are pinned: libadg's side, the floor and PyTorch's word
# mode run BLAS on the calling thread (OPENBLAS_NUM_THREADS=1,
# OMP_NUM_THREADS=1, and at::set_num_threads(1)); PyTorch batched gets T
# intra-op threads and T OpenBLAS threads, with OMP_WAIT_POLICY=passive
# (OpenMP's spinning workers otherwise take the cores OpenBLAS's threads
# need); inter-op threads are 1. Each run's CPU time over its wall time
# (the whole process, from /usr/bin/time) says how many cores it used.
#
# Speed: one epoch on the first --subset words of each language, each cell
# the median of --runs runs, the programs taking turns so that the
# machine's ups and downs reach all alike. Accuracy: --epochs epochs on
# every word, once, libadg's default and PyTorch batched on one thread
# (both deterministic there). Prints one Markdown table and the targets of
# issue 30, PASS or MISS; every run's figures stay in
# build-compare/langid-compare-runs.txt. Builds in build-compare/ (not part
# of CI); scripts/compare-torch.sh langid runs this.
# Usage: compare-langid.sh [--runs N] [--subset N] [--threads LIST]
#                          [--models LIST] [--epochs E] [--no-accuracy]
#   (defaults: 3; 2000; 1,2; 1,2,8,32; 5)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
runs=3
subset=2000
threads=1,2
models=1,2,8,32
epochs=5
accuracy=1
args=()
for arg in "$@"; do # the one option without a value
	if [ "$arg" = --no-accuracy ]; then accuracy=0; else args+=("$arg"); fi
done
parse_options "runs subset threads models epochs" "$0 [--runs N]\
 [--subset N] [--threads LIST] [--models LIST] [--epochs E] [--no-accuracy]" \
	${args[@]+"${args[@]}"}
want_number --runs "$runs"
want_number --subset "$subset"
want_number --epochs "$epochs"
want_list --threads "$threads"
want_list --models "$models"
IFS=, read -r -a thread_counts <<<"$threads"
IFS=, read -r -a model_counts <<<"$models"

scripts/deps.sh compare
data=$(scripts/fetch-words.sh)
dir=build-compare
build_release "$dir" examples/langid/langid
adg=$dir/examples/langid/langid
floor=$dir/langid_floor
torch=$dir/langid_torch
build_floor bench/compare/langid_floor.cpp "$floor" -Iexamples/langid
build_torch bench/compare/langid_torch.cpp "$torch" -Iexamples/langid

describe_machine
echo "langid: GRU 32-64 on bytes, 9 languages, B = 32; speed: 1 epoch on" \
	"$((subset * 9)) words, each cell the median of $runs runs, the" \
	"programs taking turns"
echo

results=$dir/langid-compare-runs.txt
: >"$results"
# Runs one program ($1: its kind, $2: T, then the command) and appends
# "KIND T key=value..." to the results (timed_result).
cell() {
	local kind=$1 t=$2
	shift 2
	timed_result "$results" "$kind $t" "$@"
}

one="env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1"
setup=$dir/langid-setup-s$subset
"$adg" --export "$setup" --epochs 1 --subset "$subset" "$data" >/dev/null
# The trainer's own evaluation is not timed; a small test set keeps the
# runs short.
short=(--epochs 1 --subset "$subset" --test-subset 200)
for _ in $(seq "$runs"); do
	for t in "${thread_counts[@]}"; do
		echo "T=$t ..." >&2
		many="env OPENBLAS_NUM_THREADS=$t OMP_NUM_THREADS=$t"
		many="$many OMP_WAIT_POLICY=passive"
		# $one and $many are words to split.
		# shellcheck disable=SC2086
		{
			cell adg-sync "$t" $one "$adg" --threads "$t" "${short[@]}" "$data"
			cell torch-batched "$t" $many "$torch" batched "$setup" "$data" "$t"
			cell adg-word "$t" $one "$adg" --threads "$t" --graphs word \
				"${short[@]}" "$data"
			cell torch-word "$t" $one "$torch" word "$setup" "$data" "$t"
			cell adg-hogwild "$t" $one "$adg" --mode hogwild \
				--threads "$t" "${short[@]}" "$data"
			[ "$t" != 1 ] || cell floor 1 $one "$floor" "$setup" "$data"
		}
	done
	for m in "${model_counts[@]}"; do
		echo "--models $m ..." >&2
		# shellcheck disable=SC2086
		cell adg-models "$m" $one "$adg" --models "$m" "${short[@]}" "$data"
	done
done
if [ $accuracy -eq 1 ]; then
	echo "$epochs epochs on every word, T = 1 ..." >&2
	full=$dir/langid-setup-e$epochs
	"$adg" --export "$full" --epochs "$epochs" "$data" >/dev/null
	# shellcheck disable=SC2086
	{
		cell accuracy-adg 1 $one "$adg" --epochs "$epochs" "$data"
		cell accuracy-torch 1 $one "$torch" batched "$full" "$data" 1
	}
fi

# "KIND T key=value ..." -> the table and the targets.
awk -v epochs="$epochs" "$stats_awk$cells_awk"'
{ read_cell("samples_per_s") }
END {
	speed_table("word")
	print ""
	print "samples/s of training (evaluation excluded), medians; PyTorch'"'"'s better = the better of its two modes."
	print ""
	models_table("samples/s")
	print ""
	threads_report("adg-sync adg-word adg-hogwild torch-batched torch-word floor")
	print ""
	sync_checks()
	print ""
	print "Targets (issue 30):"
	if ((1 in seen) && (2 in seen))
		printf "  %s sync: 2 threads >= 1.8 x 1 thread: %.2f x\n",
			verdict(sync[2] / sync[1] >= 1.8), sync[2] / sync[1]
	if ((1 in models) && (2 in models)) {
		r = median(per_model["adg-models", 2]) / median(rate["adg-models", 1])
		printf "  %s --models 2: each model >= 0.9 x one model alone: %.2f x\n",
			verdict(r >= 0.9), r
	}
	for (m = 3; m <= 1024; m++)
		if ((m in models) && (2 in models)) {
			r = median(rate["adg-models", m]) / median(rate["adg-models", 2])
			printf "  %s --models %d: total >= 0.9 x --models 2: %.2f x\n",
				verdict(r >= 0.9), m, r
		}
	for (i = 1; i <= n; i++) {
		t = ts[i]
		if (t > 2) continue
		printf "  %s T=%d: libadg (sync) >= 2 x PyTorch'"'"'s better mode: %.2f x\n",
			verdict(vs_torch[t] >= 2), t, vs_torch[t]
		printf "  %s T=%d: libadg a graph per word >= 5 x PyTorch a graph per word: %.2f x\n",
			verdict(vs_per[t] >= 5), t, vs_per[t]
	}
	if (1 in seen)
		printf "  %s T=1: libadg within 1.3 x of its floor: the floor is %.2f x libadg\n",
			verdict(vs_floor <= 1.3), vs_floor
	if (("accuracy-adg", 1) in acc) {
		a = median(acc["accuracy-adg", 1]); p = median(acc["accuracy-torch", 1])
		g = a - p; if (g < 0) g = -g
		printf "  %s test accuracy after %d epochs >= 85%% and within 0.5 points of PyTorch (batched, the same batches): %.2f%%, %+.2f\n",
			verdict(a >= 85 && g <= 0.5), epochs, a, a - p
	} else {
		print "  not checked: test accuracy (--no-accuracy)"
	}
}' "$results"
