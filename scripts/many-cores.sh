#!/usr/bin/env bash
# adg-bench's contention comparison and the three trainers at 1 to 16
# threads, on a machine that cannot build libadg (no network, no liburcu,
# ck or OpenBLAS): pack here, run there.
#
# pack (on a Debian machine that builds libadg) builds adg-bench,
# examples/digits, examples/fashion, examples/langid and examples/tagger
# in release mode in
# build-many/, and packs into .many/many.tar.gz (gzip; about 45 MiB) the
# binaries, the shared libraries they load that are not glibc's (libadg,
# liburcu-bp, OpenBLAS, libgfortran, libstdc++, ...: every one ldd
# names), glibc's own libraries and loader apart (a fallback, below), and
# the data: .cache/digits, .cache/fashion, .cache/words and the Brown
# corpus (.cache/brown/corpus) as the trainers read them. .many/MANIFEST says what is in it and from which
# commit. Installs missing build tools and fetches missing data first
# (scripts/deps.sh, scripts/fetch-*.sh).
#
# run reads .many/ alone: unpacks it into a temporary folder and runs, with
# OPENBLAS_NUM_THREADS=1 and OMP_NUM_THREADS=1 (the T threads are the
# parallelism), the stages below. They share --budget seconds (default
# 510: with the unpacking, under 9 minutes in all; about 4 expected on 16
# cores), each stage under a cap that keeps a share for those after it:
#   bench    adg-bench: disjoint, shared-params, merge, lookup and trainer
#            for adg, seed and floor at each thread count (--runs runs of
#            --ms ms per cell), and wide on the same counts of workers
#   digits   Hogwild at B = 1 (its default mode) and sync (the gradient
#            reducer) at B = 16, --digits-epochs epochs
#   fashion  sync (its default mode, the reducer) at B = 64 and 16, and
#            Hogwild at B = 64, --epochs epochs; then sync at B = 256 in
#            units of 16 rows, one epoch, with --profile
#   langid   sync (its default mode, the reducer, a graph per group of
#            words of one length), then --models N for each N of --threads
#            and twice the largest (oversubscribed): one epoch on the first
#            --words words of each language, B = 32
#   tagger   sync at B = 256 in 16 units of 16 sentences, Hogwild at
#            B = 32, then --models N for each N of --threads and twice the
#            largest: one epoch on the first --sentences training
#            sentences, lr 4
# It prints one Markdown table (a row per figure, a column per thread
# count) and writes the raw output of each stage, the table and the
# figures as CSV (results.csv) into $OUT, or results/many-cores/ when OUT
# is not set. The binaries run on the machine's glibc when it is recent
# enough (--loader auto tries), else on the packed glibc through its
# loader. The OpenBLAS kernels chosen are printed with the machine:
# OpenBLAS 0.3.21 takes a CPU it does not know (a virtual machine's, say)
# for a Prescott and multiplies with SSE3 only, 2 to 3 times slower; set
# OPENBLAS_CORETYPE (SkylakeX, say) to choose. Exit status 1 when a stage
# failed or ran out of time (the table is printed anyway).
# Usage: many-cores.sh pack
#        many-cores.sh run [--threads LIST] [--ms N] [--runs N]
#                          [--epochs E] [--digits-epochs E] [--words N]
#                          [--sentences N] [--loader auto|system|bundled]
#                          [--budget S]
#        (defaults: 1,2,4,8,16; 100; 5; 5; 30; 3000; 2000; auto; 510)
set -euo pipefail
cd "$(dirname "$0")/.."
pack=.many
tarball=$pack/many.tar.gz
# shellcheck source=scripts/pack-libs.sh
. scripts/pack-libs.sh

usage() {
	echo "usage: $0 pack" >&2
	echo "       $0 run [--threads LIST] [--ms N] [--runs N] [--epochs E]" \
		"[--digits-epochs E] [--words N] [--sentences N]" \
		"[--loader auto|system|bundled]" \
		"[--budget S]" >&2
	exit 2
}

do_pack() {
	scripts/deps.sh fashion # meson, liburcu, ck, OpenBLAS
	local digits fashion words brown dir=build-many stage
	digits=$(scripts/fetch-digits.sh)
	fashion=$(scripts/fetch-fashion.sh)
	words=$(scripts/fetch-words.sh)
	brown=$(scripts/fetch-brown.sh | tail -1)
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" --buildtype=release -Dtests=disabled \
			-Dmpi=disabled >/dev/null
	fi
	local bins=(bench/adg-bench examples/digits/digits
		examples/fashion/fashion examples/langid/langid
		examples/tagger/tagger)
	ninja -C "$dir" "${bins[@]}" >/dev/null
	stage=$(mktemp -d)
	# shellcheck disable=SC2064 # $stage is set now, for good
	trap "rm -rf '$stage'" EXIT
	mkdir -p "$stage/bin" "$stage/data/digits" "$stage/data/fashion" \
		"$stage/data/words" "$stage/data/brown"
	for b in "${bins[@]}"; do
		cp "$dir/$b" "$stage/bin/"
	done
	pack_libs "$stage" many-cores "${bins[@]/#/$dir/}" || exit 1
	cp "$digits" "$stage/data/digits/"
	# The trainer reads the four IDX files whole (it checks their sizes):
	# all of them, gzip makes them 31 MB.
	cp "$fashion"/*-ubyte "$stage/data/fashion/"
	cp "$words"/train.txt "$words"/test.txt "$stage/data/words/"
	cp -r "$brown"/. "$stage/data/brown/"
	{
		echo "libadg many-cores pack, $(date -u '+%Y-%m-%d %H:%M UTC')"
		echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
		echo "built on: $(uname -srm), $(getconf GNU_LIBC_VERSION)"
		if command -v objdump >/dev/null; then
			echo "needs: $(cd "$stage" && objdump -T bin/* lib/* 2>/dev/null |
				grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1) (system glibc," \
				"else the packed one in glibc/)"
		fi
		echo "files (bytes):"
		(cd "$stage" && find . -type f ! -name MANIFEST -printf '  %p %s\n' | sort)
	} >"$stage/MANIFEST"
	rm -rf "$pack"
	mkdir -p "$pack"
	tar -C "$stage" -cf - . | gzip -9 >"$tarball.part"
	mv "$tarball.part" "$tarball"
	cp "$stage/MANIFEST" "$pack/"
	cat "$pack/MANIFEST"
	echo "packed: $(du -sh "$pack" | cut -f1) in $pack/ (carry it; then" \
		"scripts/many-cores.sh run)"
}

# The table: rows of results.csv (what,unit,threads,value) in the order
# they came, a column per thread count of $1, and the row's last figure
# against its first (for ns per step, the first against the last: a
# speedup either way).
table() {
	awk -F, -v list="$1" '
	function fmt(v, unit) {
		if (v == "") return "-"
		if (v !~ /^[0-9.]+$/) return v
		if (unit == "samples/s" || unit == "words/s") return sprintf("%.0f", v)
		if (unit ~ /%/ || unit ~ /^ns/) return sprintf(unit ~ /%/ ? "%.2f" : "%.1f", v)
		if (v >= 1e9) return sprintf("%.2fG", v / 1e9)
		if (v >= 1e6) return sprintf("%.2fM", v / 1e6)
		if (v >= 1e3) return sprintf("%.1fk", v / 1e3)
		return sprintf("%.0f", v)
	}
	BEGIN {
		n = split(list, t, ",")
		head = "| figure | unit |"; rule = "|---|---|"
		for (i = 1; i <= n; i++) { head = head " T=" t[i] " |"; rule = rule "---:|" }
		print head " last vs first |"
		print rule "---:|"
	}
	{
		k = $1 SUBSEP $2
		if (!(k in seen)) { seen[k] = 1; what[++rows] = $1; unit[rows] = $2 }
		v[k, $3] = $4
	}
	END {
		for (r = 1; r <= rows; r++) {
			k = what[r] SUBSEP unit[r]; line = "| " what[r] " | " unit[r] " |"
			for (i = 1; i <= n; i++) line = line " " fmt(v[k, t[i]], unit[r]) " |"
			a = v[k, t[1]]; b = ""; x = "-"
			for (i = 1; i <= n; i++) if (v[k, t[i]] != "") b = v[k, t[i]]
			if (unit[r] !~ /%/ && a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && a > 0 && b > 0)
				x = sprintf("%.2f x", unit[r] ~ /^ns/ ? a / b : b / a)
			print line " " x " |"
		}
	}' "$2"
}

do_run() {
	local threads=1,2,4,8,16 ms=100 runs=5 epochs=5 digits_epochs=30
	local words=3000 sentences=2000 loader=auto budget=510
	while [ $# -gt 0 ]; do
		case $1 in
		--threads | --ms | --runs | --epochs | --digits-epochs | --words | \
			--sentences | --loader | --budget)
			[ $# -ge 2 ] || usage
			case $1 in
			--threads) threads=$2 ;;
			--ms) ms=$2 ;;
			--runs) runs=$2 ;;
			--epochs) epochs=$2 ;;
			--digits-epochs) digits_epochs=$2 ;;
			--words) words=$2 ;;
			--sentences) sentences=$2 ;;
			--loader) loader=$2 ;;
			--budget) budget=$2 ;;
			esac
			shift 2
			;;
		*) usage ;;
		esac
	done
	[[ $threads =~ ^[0-9]+(,[0-9]+)*$ ]] || usage
	[[ $budget$words$sentences =~ ^[0-9]+$ ]] || usage
	case $loader in auto | system | bundled) ;; *) usage ;; esac
	if [ ! -f "$tarball" ]; then
		echo "many-cores: no $tarball: run scripts/many-cores.sh pack" \
			"on a machine that builds libadg, and carry $pack/" >&2
		exit 1
	fi
	local start=$SECONDS out=${OUT:-results/many-cores} root
	mkdir -p "$out"
	root=$(mktemp -d)
	# shellcheck disable=SC2064 # $root is set now, for good
	trap "rm -rf '$root'" EXIT
	tar -C "$root" -xzf "$tarball"
	local cores
	cores=$(nproc) # before OMP_NUM_THREADS, which nproc obeys
	export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

	# How the binaries start: on this machine's glibc, with the packed
	# libraries first; or on the packed glibc, through its loader. Only
	# the binaries see LD_LIBRARY_PATH, not the tools run here.
	local launch system=(env "LD_LIBRARY_PATH=$root/lib")
	local bundled=(env "LD_LIBRARY_PATH=$root/lib"
		"$root/glibc/ld-linux-x86-64.so.2" --library-path "$root/lib:$root/glibc")
	starts() { # every binary starts and says its usage
		local b
		for b in adg-bench digits fashion langid tagger; do
			"${launch[@]}" "$root/bin/$b" --help >/dev/null 2>>"$out/start.txt" ||
				return 1
		done
	}
	: >"$out/start.txt"
	case $loader in
	auto | system) launch=("${system[@]}") ;;
	bundled) launch=("${bundled[@]}") ;;
	esac
	if ! starts; then
		if [ "$loader" != auto ]; then
			cat "$out/start.txt" >&2
			echo "many-cores: the binaries do not start (--loader $loader)" >&2
			exit 1
		fi
		loader=bundled
		launch=("${bundled[@]}")
		if ! starts; then
			cat "$out/start.txt" >&2
			echo "many-cores: the binaries start on neither glibc" >&2
			exit 1
		fi
	elif [ "$loader" = auto ]; then
		loader=system
	fi
	local cpu blas
	cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
	blas=$(OPENBLAS_VERBOSE=2 "${launch[@]}" "$root/bin/langid" --help 2>&1 \
		>/dev/null | sed -n 's/^Core: //p' | head -1)
	{
		echo "machine: ${cpu:-unknown CPU}, $cores cores online," \
			"$(uname -srm), $(getconf GNU_LIBC_VERSION 2>/dev/null || echo 'glibc ?');" \
			"OpenBLAS kernels: ${blas:-?}${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE)}"
		echo "glibc used: $loader"
		cat "$root/MANIFEST"
		echo "libraries as loaded:"
		for b in adg-bench digits fashion langid tagger; do
			echo "  $b:"
			"${launch[0]}" LD_TRACE_LOADED_OBJECTS=1 "${launch[@]:1}" \
				"$root/bin/$b" | sed 's/^[[:space:]]*/    /'
		done
	} >"$out/machine.txt"
	# Any library but glibc's taken from outside the pack means that the
	# pack misses it: here it would hide, there it would fail.
	local outside
	outside=$(awk -v root="$root" -v re="$pack_glibc_re" '
		$2 == "=>" && $1 !~ re && index($3, root) != 1 { print $1 " => " $3 }' \
		"$out/machine.txt" | sort -u)
	if [ -n "$outside" ]; then
		echo "many-cores: loaded from outside the pack:" >&2
		echo "$outside" >&2
	fi
	head -2 "$out/machine.txt" >&2

	local csv=$out/results.csv failed=() stages=()
	: >"$csv"
	# The stages share --budget seconds: each may run for what is left but
	# the shares of the stages after it (the bench 60 s, each digits run
	# 10, each fashion run 50 or 60, the profile 20, langid's 20 and 40,
	# the tagger's 20, 20 and 30:
	# some twice what
	# they should take on 16 cores at the defaults), so a quick stage
	# leaves its time to the next, and a slow one cannot take a later
	# one's.
	local kept=390 # the shares, all together
	stage() { # name, its share, command...: runs it, logs to name.txt
		local name=$1 cap t0=$SECONDS rc=0
		kept=$((kept - $2))
		cap=$((budget - (SECONDS - start) - kept))
		[ $cap -ge 10 ] || cap=10
		shift 2
		echo "many-cores: $name (at most $cap s) ..." >&2
		timeout -k 5 "$cap" "$@" >"$out/$name.txt" 2>&1 || rc=$?
		stages+=("$name $((SECONDS - t0)) s")
		if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
			failed+=("$name: out of time after $cap s")
		elif [ $rc -ne 0 ]; then
			failed+=("$name: exit status $rc (see $out/$name.txt)")
		fi
	}

	stage bench 60 "${launch[@]}" "$root/bin/adg-bench" \
		--workloads=disjoint,shared-params,merge,lookup,trainer,wide \
		--threads="$threads" --wide-workers="$threads" --runs="$runs" \
		--ms="$ms" --no-idle --no-checkpoint --no-plot --out="$out/bench"
	# Its progress lines: a cell's rate (M, k as the bench writes them),
	# then wide's ns per step for each count of workers.
	awk '
	function num(s, m) {
		m = s ~ /G$/ ? 1e9 : s ~ /M$/ ? 1e6 : s ~ /k$/ ? 1e3 : 1
		if (m > 1) s = substr(s, 1, length(s) - 1)
		return s ~ /^[0-9.]+$/ ? sprintf("%.0f", s * m) : s
	}
	/^\[[0-9]+\/[0-9]+\] / {
		t = $3; sub(/threads=/, "", t); impl = $4; sub(/:$/, "", impl)
		print "bench " $2 " " impl "," $6 "," t "," num($5)
	}
	/^wide [0-9]+ workers?: / {
		print "bench wide ~1 us steps adg (workers)," "ns/step," $2 "," $4
		print "bench wide empty steps adg (workers)," "ns/step," $2 "," $10
	}' "$out/bench.txt" >>"$csv"

	local spec program mode batch e name share data
	for spec in "digits hogwild 1 $digits_epochs" "digits sync 16 $digits_epochs" \
		"fashion sync 64 $epochs" "fashion sync 16 $epochs" \
		"fashion hogwild 64 $epochs"; do
		read -r program mode batch e <<<"$spec"
		name=$program-$mode-b$batch
		if [ "$program" = digits ]; then
			share=10 data=$root/data/digits/digits.csv
		else
			share=50 data=$root/data/fashion
		fi
		[ "$name" != fashion-sync-b16 ] || share=60
		stage "$name" $share "${launch[@]}" "$root/bin/$program" \
			--threads "$threads" --mode "$mode" --batch "$batch" \
			--epochs "$e" --csv "$out/$name.csv" "$data"
		# Its "result" lines, one per thread count that finished.
		awk -v what="$program $mode B=$batch E=$e" '/^result / {
			for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
			print what ",samples/s," f["threads"] "," f["samples_per_s"]
			print what ",test accuracy %," f["threads"] "," f["test_accuracy"]
		}' "$out/$name.txt" >>"$csv"
	done

	# fashion sync at B = 256 in 16 units of 16 rows, one epoch, with
	# --profile: where a round's time goes at each T, for the cost model
	# of docs/trainers.md (T = 16 >= 10 x T = 1, its target).
	stage fashion-sync-b256-profile 20 "${launch[@]}" "$root/bin/fashion" \
		--threads "$threads" --mode sync --batch 256 --unit-rows 16 \
		--epochs 1 --profile "$root/data/fashion"
	awk '/^result / {
		for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		print "fashion sync B=256 units of 16 E=1,samples/s," f["threads"] "," f["samples_per_s"]
	}' "$out/fashion-sync-b256-profile.txt" >>"$csv"

	# langid: sync at each thread count in one process, then each --models
	# N in a process of its own, and twice the largest count.
	local args=(--epochs 1 --subset "$words" --test-subset 200)
	local data=$root/data/words models=$threads,$((2 * ${threads##*,}))
	stage langid-sync 20 "${launch[@]}" "$root/bin/langid" \
		--threads "$threads" "${args[@]}" "$data"
	# shellcheck disable=SC2016 # expanded by the inner bash
	stage langid-models 40 bash -c 'list=$1 data=$2; shift 2
		for n in ${list//,/ }; do "$@" --models "$n" "$data" || exit; done' \
		models "$models" "$data" "${launch[@]}" "$root/bin/langid" "${args[@]}"
	# Their result lines; --models N goes in the column of N threads.
	awk -v what="langid" '/^result / {
		for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		if (f["mode"] == "models") {
			print what " --models N (total),samples/s," f["models"] "," f["samples_per_s"]
			print what " --models N (each),samples/s," f["models"] "," f["per_model_samples_per_s"]
		} else {
			print what " sync B=32,samples/s," f["threads"] "," f["samples_per_s"]
			print what " sync B=32,test accuracy %," f["threads"] "," f["test_accuracy"]
		}
	}' "$out/langid-sync.txt" "$out/langid-models.txt" >>"$csv"

	# tagger: sync (16 units a batch, so that 16 threads have one each) and
	# Hogwild at each thread count in one process each, then each
	# --models N in a process of its own.
	local targs=(--epochs 1 --lr 4 --subset "$sentences" --test-subset 200)
	data=$root/data/brown
	stage tagger-sync 20 "${launch[@]}" "$root/bin/tagger" \
		--threads "$threads" --batch 256 --unit-sentences 16 "${targs[@]}" \
		"$data"
	stage tagger-hogwild 20 "${launch[@]}" "$root/bin/tagger" \
		--threads "$threads" --mode hogwild "${targs[@]}" "$data"
	# shellcheck disable=SC2016 # expanded by the inner bash
	stage tagger-models 30 bash -c 'list=$1 data=$2; shift 2
		for n in ${list//,/ }; do "$@" --models "$n" "$data" || exit; done' \
		models "$models" "$data" "${launch[@]}" "$root/bin/tagger" "${targs[@]}"
	awk -v what="tagger" '/^result / {
		for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
		if (f["mode"] == "models") {
			print what " --models N (total),words/s," f["models"] "," f["words_per_s"]
			print what " --models N (each),words/s," f["models"] "," f["per_model_words_per_s"]
		} else {
			b = f["mode"] == "sync" ? " B=256 units of 16" : " B=32"
			print what " " f["mode"] b ",words/s," f["threads"] "," f["words_per_s"]
			print what " " f["mode"] b ",test accuracy %," f["threads"] "," f["test_accuracy"]
		}
	}' "$out/tagger-sync.txt" "$out/tagger-hogwild.txt" \
		"$out/tagger-models.txt" >>"$csv"

	table "$models" "$csv" >"$out/table.md"
	echo
	head -1 "$out/machine.txt"
	echo "glibc: $loader; adg-bench $runs runs of $ms ms per cell; stages:" \
		"$(printf '%s, ' "${stages[@]}")$((SECONDS - start)) s in all"
	echo
	cat "$out/table.md"
	echo
	echo "Last column: a row's rate at its last thread count over its first" \
		"(ns per step: the first over the last); langid's and the tagger's" \
		"--models N are in the column of N threads."
	echo "raw output, CSV and this table: $out/"
	if [ ${#failed[@]} -gt 0 ]; then
		printf 'FAILED: %s\n' "${failed[@]}"
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
