#!/usr/bin/env bash
# Differential fuzzing: builds tests/fuzz/adg-fuzz with clang and libFuzzer
# (ASan + UBSan, libadg instrumented for coverage) in its own build folder,
# then runs it for a bounded time over a copy of the seed corpus.
#
#   scripts/fuzz.sh [seconds]      (default 60)
#
# Environment: FUZZ_BUILD (build folder, default build-fuzz), FUZZ_JOBS
# (parallel fuzzing processes, default 1). Findings (crash-*, leak-*,
# timeout-* files) go to $FUZZ_BUILD/findings/; new corpus entries stay in
# a temporary copy, so tests/fuzz/corpus/ changes only by hand. Exits
# non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
build=${FUZZ_BUILD:-build-fuzz}
jobs=${FUZZ_JOBS:-1}

as_root() {
	if [ "$(id -u)" = 0 ]; then
		"$@"
	elif command -v sudo >/dev/null; then
		sudo "$@"
	else
		echo "fuzz.sh: need root or sudo to run: $*" >&2
		exit 1
	fi
}

# libFuzzer's runtime comes with clang's compiler-rt, packaged per clang
# major version (libclang-rt-N-dev).
fuzzer_runtime() {
	[ -f "$(clang -print-file-name=libclang_rt.fuzzer-x86_64.a)" ]
}
if ! command -v clang >/dev/null || ! fuzzer_runtime; then
	as_root apt-get update -qq
	command -v clang >/dev/null ||
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends clang >/dev/null
	major=$(clang -dumpversion | cut -d. -f1)
	fuzzer_runtime ||
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends "libclang-rt-$major-dev" >/dev/null
fi

if [ ! -f "$build/build.ninja" ]; then
	# fuzzer-no-link puts coverage instrumentation in libadg too, so that
	# libFuzzer is guided by the library's branches, not only the
	# driver's.
	CC=clang meson setup "$build" --buildtype=debugoptimized \
		-Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
		-Dc_args=-fsanitize=fuzzer-no-link ${ADG_WERROR:+--werror} \
		>/dev/null
fi
ninja -C "$build" tests/fuzz/adg-fuzz >"$build/fuzz-build.log" 2>&1 || {
	cat "$build/fuzz-build.log" >&2
	exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$build/findings"
cp tests/fuzz/corpus/* "$work/corpus/"
log="$work/fuzz.log"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
parallel=()
if [ "$jobs" -gt 1 ]; then
	# Each worker logs to fuzz-N.log in the current folder: run there.
	parallel=(-jobs="$jobs" -workers="$jobs")
fi
status=0
fuzzer=$(realpath "$build/tests/fuzz/adg-fuzz")
findings=$(realpath "$build/findings")
(cd "$work" && "$fuzzer" -max_total_time="$seconds" -print_final_stats=1 \
	-timeout=30 -rss_limit_mb=4096 "${parallel[@]}" \
	-artifact_prefix="$findings/" corpus >"$log" 2>&1) || status=$?
for f in "$work"/fuzz-*.log; do
	[ -f "$f" ] && cat "$f" >>"$log"
done

grep -E 'MISMATCH|ERROR: |SUMMARY: |==[0-9]+==|Test unit written' "$log" ||
	true
grep -E '^(Done [0-9]+ runs|stat::number_of_executed_units|stat::peak_rss_mb)' \
	"$log" || true
echo "corpus: $(find "$work/corpus" -type f | wc -l) files after the run"
if [ "$status" -ne 0 ] || grep -q 'Test unit written' "$log"; then
	echo "fuzz.sh: FINDING (exit $status); see $build/findings/ and" \
		"replay with $build/tests/fuzz/adg-fuzz FILE" >&2
	tail -n 60 "$log" >&2
	exit 1
fi
echo "fuzz.sh: no findings in ${seconds}s"
