#!/usr/bin/env bash
# Side by side with PyTorch's C++ API (libtorch, Debian's libtorch-dev),
# on four models: examples/digits (below), examples/fashion
# (scripts/compare-fashion.sh, which this runs; its header says what it
# measures), examples/langid (scripts/compare-langid.sh, likewise) and
# examples/tagger (scripts/compare-tagger.sh, likewise; only when named).
# With no model named, runs digits and then fashion, each with the options
# given (--epochs E applies to both; each has its own default), then
# langid with its defaults.
#
# digits: trains examples/digits' model with libadg and with PyTorch
# (bench/compare/digits_torch.cpp): the same data, split, initial weights,
# learning rates and batch order (digits --export writes them), Hogwild
# SGD on T = 1, 2, 8 and 32 threads, at mini-batches of B = 1 and 16, both
# sides with BLAS and PyTorch's intra-op work on the calling thread. Prints
# one Markdown table (samples/s and final test accuracy of each, the ratio
# libadg / PyTorch) and the issue's targets. Each cell is the median of
# --runs runs (default 3), libadg's and PyTorch's alternating so that the
# machine's ups and downs reach both alike; accuracies are medians too
# (Hogwild on more than one thread is not deterministic). Installs what it
# misses (libtorch-dev is large), builds in build-compare/, which is not
# part of CI.
# Usage: compare-torch.sh [--epochs E] [--runs N]        digits, then fashion
#        compare-torch.sh digits [--epochs E] [--runs N]  (default 30 epochs)
#        compare-torch.sh fashion [options]   scripts/compare-fashion.sh's
#        compare-torch.sh langid [options]    scripts/compare-langid.sh's
#        compare-torch.sh tagger [options]    scripts/compare-tagger.sh's
set -euo pipefail
cd "$(dirname "$0")/.."
model=both
case ${1:-} in
digits | fashion | langid | tagger)
	model=$1
	shift
	;;
esac
if [ "$model" = fashion ]; then
	exec scripts/compare-fashion.sh "$@"
fi
if [ "$model" = langid ]; then
	exec scripts/compare-langid.sh "$@"
fi
if [ "$model" = tagger ]; then
	exec scripts/compare-tagger.sh "$@"
fi
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
args=("$@")
epochs=30
runs=3
parse_options "epochs runs" "$0 [digits|fashion|langid|tagger] [--epochs E]\
 [--runs N]" "$@"
want_number --epochs "$epochs"
want_number --runs "$runs"

scripts/deps.sh compare
data=$(scripts/fetch-digits.sh)
dir=build-compare
build_release "$dir" examples/digits/digits
adg=$dir/examples/digits/digits
torch=$dir/digits_torch
build_torch bench/compare/digits_torch.cpp "$torch" -O2
# BLAS on the calling thread, for both: the T threads are the parallelism
# (examples/tensor/trainer.c calls openblas_set_num_threads(1) too).
export OPENBLAS_NUM_THREADS=1

describe_machine
echo "$epochs epochs; each cell the median of $runs runs, libadg's and" \
	"PyTorch's alternating"
echo

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for batch in 1 16; do
	setup=$dir/setup-b$batch.txt
	"$adg" --batch "$batch" --epochs "$epochs" --export "$setup" \
		"$data" >/dev/null
	for threads in 1 2 8 32; do
		echo "B=$batch T=$threads ..." >&2
		for _ in $(seq "$runs"); do
			line=$("$adg" --batch "$batch" --epochs "$epochs" \
				--threads "$threads" "$data" | grep '^result ')
			echo "adg $line" >>"$results"
			line=$("$torch" "$setup" "$data" "$threads" |
				grep '^result ')
			echo "torch $line" >>"$results"
		done
	done
done

# "SIDE result threads=T batch=B epochs=E samples_per_s=R test_accuracy=A"
awk "$stats_awk"'
function value(field) { sub(/.*=/, "", field); return field }
{
	key = value($4) " " value($3)
	if (!(key in seen)) { seen[key] = 1; keys[++n] = key }
	rate[$1, key] = rate[$1, key] " " value($6)
	acc[$1, key] = acc[$1, key] " " value($7)
}
END {
	print "| B | T | libadg samples/s | PyTorch samples/s | libadg / PyTorch | libadg test accuracy | PyTorch test accuracy |"
	print "|---:|---:|---:|---:|---:|---:|---:|"
	for (i = 1; i <= n; i++) {
		k = keys[i]; split(k, bt, " ")
		ra = median(rate["adg", k]); rt = median(rate["torch", k])
		aa = median(acc["adg", k]); at = median(acc["torch", k])
		ratio[k] = ra / rt; gap[k] = aa - at
		printf "| %d | %d | %.0f | %.0f | %.2f | %.2f%% | %.2f%% |\n",
			bt[1], bt[2], ra, rt, ratio[k], aa, at
	}
	print ""
	print "Targets:"
	for (i = 1; i <= n; i++) {
		k = keys[i]; split(k, bt, " ")
		want = bt[1] == 1 ? 5 : 1
		printf "  %-7s B=%d, T=%d: libadg >= %d x PyTorch samples/s: %.2f x\n",
			(ratio[k] >= want ? "holds" : "MISSED"), bt[1], bt[2], want, ratio[k]
	}
	for (i = 1; i <= n; i++) {
		k = keys[i]; split(k, bt, " ")
		g = gap[k] < 0 ? -gap[k] : gap[k]
		printf "  %-7s B=%d, T=%d: test accuracy within 1 point of PyTorch: %+.2f\n",
			(g <= 1 ? "holds" : "MISSED"), bt[1], bt[2], gap[k]
	}
}' "$results"

if [ "$model" = both ]; then
	echo
	scripts/compare-fashion.sh "${args[@]}"
	echo
	scripts/compare-langid.sh
fi
