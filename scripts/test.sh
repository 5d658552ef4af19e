#!/usr/bin/env bash
# Builds libadg four ways and runs every test tier (meson suite: unit,
# stress, long, replay, examples, docs) in each: plain,
# AddressSanitizer + UndefinedBehaviorSanitizer, ThreadSanitizer, and
# plain with clang; runs the
# plain build's tests again under valgrind memcheck (scripts/valgrind.sh);
# installs libadg into a temporary prefix and builds an outside consumer
# with pkg-config (scripts/consumer-test.sh); builds and tests the Rust
# crates against it, with valgrind, both sanitizer sides and Miri
# (scripts/rust-test.sh); fuzzes for a minute
# (scripts/fuzz.sh; ADG_FUZZ_SECONDS changes the time). Installs missing
# build dependencies and fetches the data of examples/digits,
# examples/fashion, examples/langid and examples/tagger first. Ends with
# "N passed, N failed", counting test cases over it all.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
# examples/digits, examples/fashion, examples/langid and examples/tagger
# train on data fetched, not committed: fetch it before the builds, so
# that their tests run (without it they are skipped, and a skipped test
# counts as a failure below).
scripts/fetch-digits.sh >/dev/null
scripts/fetch-fashion.sh >/dev/null
scripts/fetch-words.sh >/dev/null
scripts/fetch-brown.sh >/dev/null
# CI's builds treat warnings as errors (a developer's need not): these
# builds, the consumer's and the fuzzer's.
export ADG_WERROR=1

# Each stage's header says when it starts, for finding what takes long.
stage() { echo "=== $1 (at $((SECONDS / 60)) min $((SECONDS % 60)) s)"; }

log=$(mktemp) # valgrind's and the consumer test's verdicts
trap 'rm -f "$log"' EXIT
status=0
# The fourth, clang's, is plain again with another compiler: its
# warnings and its code generation (the trainers' bitwise checks) too.
variants=(plain asan tsan clang)
for variant in "${variants[@]}"; do
	dir=build-test-$variant
	compiler=() # the environment meson setup sees
	# The sanitizer builds at -O1, as their documentation advises:
	# ASan+UBSan builds in 0.64 x the time of -O2 and tests as fast,
	# TSan about even (docs/testing.md); and CI then builds the library
	# at -O1, -O2 (plain) and -O3 (the consumer's).
	# shellcheck disable=SC2054 # the commas are meson's, in one word
	case $variant in
	plain) opts=() ;;
	asan) opts=(-Doptimization=1 -Db_sanitize=address,undefined
		-Db_lundef=false) ;;
	tsan) opts=(-Doptimization=1 -Db_sanitize=thread -Db_lundef=false) ;;
	clang) opts=() compiler=(CC=clang CXX=clang++) ;;
	esac
	stage "$variant build"
	if [ ! -f "$dir/build.ninja" ]; then
		env "${compiler[@]}" meson setup "$dir" \
			--buildtype=debugoptimized --werror "${opts[@]}" >/dev/null
	elif [ ${#opts[@]} -gt 0 ]; then
		meson configure "$dir" "${opts[@]}" >/dev/null # an older tree
	fi
	ninja -C "$dir" >/dev/null
	# No --suite: every tier, and any test that is in none.
	meson test -C "$dir" --verbose --print-errorlogs || status=1
done

# A step that fails before it prints its "name: P passed, F failed" (a
# build error, say) counts as one failure in the summary too.
verdict() { # name, then the command
	local name=$1
	shift
	if ! "$@" 2>&1 | tee -a "$log"; then
		status=1
		grep -q "^$name: [0-9]* passed, [0-9]* failed$" "$log" ||
			echo "$name: 0 passed, 1 failed" | tee -a "$log"
	fi
}

stage "valgrind memcheck (plain build)"
verdict valgrind scripts/valgrind.sh build-test-plain

stage consumer
verdict consumer scripts/consumer-test.sh

stage rust
verdict rust scripts/rust-test.sh

# A short differential fuzzing run against the sequential model (clang,
# ASan + UBSan); it counts as one check.
stage "fuzz (${ADG_FUZZ_SECONDS:-60} s)"
if scripts/fuzz.sh "${ADG_FUZZ_SECONDS:-60}"; then
	echo "fuzz: 1 passed, 0 failed" | tee -a "$log"
else
	echo "fuzz: 0 passed, 1 failed" | tee -a "$log"
	status=1
fi

# One count over everything: a Criterion binary counts its test cases
# ("Synthesis: Tested: T | Passing: P | Failing: F | Crashing: C"), the TSan
# runner, valgrind.sh, the consumer test, the Rust crates' tests (each
# cargo test case) and the fuzz step print "name: P
# passed, F failed", and any other meson test (examples, doc checks) counts as one, by its result.
# A Criterion binary registered with a --filter that picks no test (a test
# renamed, say: tests/meson.build names tests by id) ran nothing: that
# counts as a failure, so that a filter cannot drop tests unseen.
# meson writes one JSON object a line to testlog.json, output included.
stage summary
for variant in "${variants[@]}"; do
	cat "build-test-$variant/meson-logs/testlog.json"
done | awk '
function count(text,   n, i, w, found) {
	found = 0
	ran = 0
	n = split(text, w, /[ |\\]+/)
	for (i = 1; i <= n; i++) {
		if (w[i] == "Tested:") ran += w[i + 1]
		if (w[i] == "Passing:") { p += w[i + 1]; found = 1 }
		if (w[i] == "Failing:" || w[i] == "Crashing:") f += w[i + 1]
		# after "\n", or first in the output when no test ran
		if (w[i] ~ /^("|n)?tsan:$/ && w[i + 2] == "passed,") {
			p += w[i + 1]; f += w[i + 3]; found = 1
			ran += w[i + 1] + w[i + 3]
		}
	}
	return found
}
{
	res = $0; sub(/.*"result": "/, "", res); sub(/".*/, "", res)
	if (!count($0)) { if (res == "OK") p++; else f++ }
	else if (ran == 0) {
		name = $0; sub(/^\{"name": "/, "", name); sub(/".*/, "", name)
		print name ": ran no test case (a --filter that matches none?)" > "/dev/stderr"
		f++
	}
	else if (res != "OK" && res != "EXPECTEDFAIL") f++
}
END {
	while ((getline line < consumer) > 0)
		if (line ~ /^(consumer|valgrind|rust|fuzz): [0-9]+ passed, [0-9]+ failed$/) {
			split(line, w, " "); p += w[2]; f += w[4]
		}
	printf "%d passed, %d failed\n", p, f
	exit (f > 0)
}' consumer="$log" || status=1
exit $status
