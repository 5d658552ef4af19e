#!/usr/bin/env bash
# examples/langid at 1 to 16 threads, sync, Hogwild and --models N, on a
# machine with more cores that cannot build libadg (no network, no
# liburcu, ck or OpenBLAS): pack here, run there, as scripts/many-cores.sh
# does for the other trainers.
#
# pack (on a Debian machine that builds libadg) builds langid in release
# mode in build-many/ and packs into .many/langid.tar.gz the binary, the
# shared libraries it loads that are not glibc's (every one ldd names),
# glibc's own libraries and loader (a fallback, below), and the words as
# scripts/fetch-words.sh made them.
#
# run unpacks it into a temporary folder and runs langid with
# OPENBLAS_NUM_THREADS=1 (the T threads are the parallelism) on the first
# --subset words of each language, one epoch, B = 32, --runs times each:
#   sync     --threads LIST (one process, a run per count), with a graph
#            per group of words of one length (the default) and per word
#   hogwild  --threads LIST
#   models   --models N for each N of LIST and 2 x its largest
#            (oversubscribed)
# all under `timeout --budget`. Prints a Markdown table, a row per figure
# and a column per thread count, each cell the median of the runs, and
# writes the raw output and the table to $OUT (results/langid-cores/
# when OUT is not set). The binary runs on the machine's glibc when it
# can, else on the packed glibc through its loader. OPENBLAS_CORETYPE, when
# set, reaches OpenBLAS: 0.3.21 takes a CPU it does not know (a virtual
# machine's, say) for a Prescott and multiplies with SSE3 only, 2 to 3
# times slower; the kernels it chose are printed with the machine.
# Usage: langid-cores.sh pack
#        langid-cores.sh run [--threads LIST] [--subset N] [--runs N]
#                            [--budget S]
#        (defaults: 1,2,4,8,16; 5000; 3; 240)
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.many
tarball=$pack/langid.tar.gz
# shellcheck source=scripts/pack-libs.sh
. scripts/pack-libs.sh

usage() {
	echo "usage: $0 pack" >&2
	echo "       $0 run [--threads LIST] [--subset N] [--runs N]" \
		"[--budget S]" >&2
	exit 2
}

do_pack() {
	scripts/deps.sh fashion # meson, liburcu, ck, OpenBLAS
	local words dir=build-many stage
	words=$(scripts/fetch-words.sh)
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" --buildtype=release -Dtests=disabled \
			-Dmpi=disabled >/dev/null
	fi
	ninja -C "$dir" examples/langid/langid >/dev/null
	stage=$(mktemp -d)
	# shellcheck disable=SC2064 # $stage is set now, for good
	trap "rm -rf '$stage'" EXIT
	mkdir -p "$stage/bin" "$stage/words"
	cp "$dir/examples/langid/langid" "$stage/bin/"
	pack_libs "$stage" langid-cores "$dir/examples/langid/langid" || exit 1
	cp "$words"/train.txt "$words"/test.txt "$stage/words/"
	{
		echo "libadg langid-cores pack, $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
		echo "built on: $(uname -srm), $(getconf GNU_LIBC_VERSION)"
		(cd "$stage" && find . -type f -printf '  %p %s\n' | sort)
	} >"$stage/MANIFEST"
	mkdir -p "$pack"
	tar -C "$stage" -cf - . | gzip -9 >"$tarball.part"
	mv "$tarball.part" "$tarball"
	echo "packed: $(du -h "$tarball" | cut -f1) in $tarball (carry $pack/;" \
		"then scripts/langid-cores.sh run)"
}

do_run() {
	local threads=1,2,4,8,16 subset=5000 runs=3 budget=240
	while [ $# -gt 0 ]; do
		case $1 in
		--threads | --subset | --runs | --budget)
			[ $# -ge 2 ] || usage
			case $1 in
			--threads) threads=$2 ;;
			--subset) subset=$2 ;;
			--runs) runs=$2 ;;
			--budget) budget=$2 ;;
			esac
			shift 2
			;;
		*) usage ;;
		esac
	done
	[[ $threads =~ ^[0-9]+(,[0-9]+)*$ ]] || usage
	[[ $subset$runs$budget =~ ^[0-9]+$ ]] || usage
	[ -f "$tarball" ] || {
		echo "langid-cores: no $tarball: run $0 pack first" >&2
		exit 1
	}
	local out=${OUT:-results/langid-cores} root cores
	mkdir -p "$out"
	root=$(mktemp -d)
	# shellcheck disable=SC2064 # $root is set now, for good
	trap "rm -rf '$root'" EXIT
	tar -C "$root" -xzf "$tarball"
	cores=$(nproc)
	export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
	local launch=(env "LD_LIBRARY_PATH=$root/lib" "$root/bin/langid")
	if ! "${launch[@]}" --help >/dev/null 2>"$out/start.txt"; then
		launch=(env "LD_LIBRARY_PATH=$root/lib"
			"$root/glibc/ld-linux-x86-64.so.2" --library-path
			"$root/lib:$root/glibc" "$root/bin/langid")
		"${launch[@]}" --help >/dev/null 2>>"$out/start.txt" || {
			cat "$out/start.txt" >&2
			echo "langid-cores: langid starts on neither glibc" >&2
			exit 1
		}
	fi
	local cpu
	cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
	local blas
	blas=$(OPENBLAS_VERBOSE=2 "${launch[@]}" --help 2>&1 >/dev/null |
		sed -n 's/^Core: //p' | head -1)
	echo "machine: ${cpu:-unknown CPU}, $cores cores online, $(uname -srm);" \
		"OpenBLAS kernels: ${blas:-?}${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE)}" |
		tee "$out/machine.txt"
	local largest=${threads##*,} args=(--epochs 1 --subset "$subset"
		--test-subset 200 "$root/words")
	series() { # each series once, in turn, for the runs
		local r m
		for r in $(seq "$runs"); do
			echo "run $r of $runs ..." >&2
			"${launch[@]}" --mode sync --threads "$threads" "${args[@]}"
			"${launch[@]}" --mode sync --graphs word --threads "$threads" \
				"${args[@]}"
			"${launch[@]}" --mode hogwild --threads "$threads" "${args[@]}"
			for m in ${threads//,/ } $((2 * largest)); do
				"${launch[@]}" --models "$m" "${args[@]}"
			done
		done
	}
	local rc=0
	SECONDS=0
	timeout -k 5 "$budget" bash -c "$(declare -f series); $(declare -p \
		launch threads args runs largest); series" >"$out/raw.txt" 2>&1 ||
		rc=$?
	grep '^result ' "$out/raw.txt" | awk -v list="$threads,$((2 * largest))" '
	function median(s,   v, n, i, j, t) {
		n = split(s, v, " ")
		for (i = 2; i <= n; i++)
			for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) {
				t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
			}
		return n == 0 ? "" : n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
	}
	{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		m = f["mode"] (f["graphs"] == "word" ? ", a graph per word" : ""); t = f["threads"]
		if (m == "models") {
			total["models: total samples/s", t] = total["models: total samples/s", t] " " f["samples_per_s"]
			total["models: each model'"'"'s samples/s", t] = total["models: each model'"'"'s samples/s", t] " " f["per_model_samples_per_s"]
		} else {
			total[m ": samples/s", t] = total[m ": samples/s", t] " " f["samples_per_s"]
			total[m ": test accuracy %", t] = total[m ": test accuracy %", t] " " f["test_accuracy"]
		}
	}
	END {
		n = split(list, cols, ",")
		nr = split("sync: samples/s;sync: test accuracy %;sync, a graph per word: samples/s;hogwild: samples/s;hogwild: test accuracy %;models: total samples/s;models: each model'"'"'s samples/s", rows, ";")
		head = "| figure (medians) |"; rule = "|---|"
		for (i = 1; i <= n; i++) { head = head " T=" cols[i] " |"; rule = rule "---:|" }
		print head; print rule
		for (r = 1; r <= nr; r++) {
			line = "| " rows[r] " |"
			for (i = 1; i <= n; i++) {
				v = median(total[rows[r], cols[i]])
				line = line " " (v == "" ? "-" : rows[r] ~ /%/ ? sprintf("%.2f", v) : sprintf("%.0f", v)) " |"
			}
			print line
		}
	}' | tee "$out/table.md"
	echo "one epoch on $((subset * 9)) words, B = 32, $runs runs; $SECONDS s;" \
		"raw output: $out/raw.txt"
	if [ $rc -ne 0 ]; then
		echo "langid-cores: stopped with status $rc (124: out of its" \
			"$budget s)" >&2
		exit 1
	fi
}

case ${1:-} in
pack)
	[ $# -eq 1 ] || usage
	do_pack
	;;
run)
	shift
	do_run "$@"
	;;
*) usage ;;
esac
