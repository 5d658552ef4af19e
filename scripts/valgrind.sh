#!/usr/bin/env bash
# Runs every Criterion test binary of a plain build under valgrind memcheck
# (errors and definite, indirect or possible leaks fail it; suppressed:
# nothing, tests/valgrind.supp) and prints
# "valgrind: N passed, N failed", one per binary. Criterion ignores a child
# process's valgrind exit code, so the verdict comes from the ERROR SUMMARY
# of every process. Usage: valgrind.sh [build folder] (default build).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
build=${1:-build}
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 2; }
passed=0 failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One binary under memcheck, its output in $work/NAME.
memcheck() {
	# --fair-sched: valgrind runs one thread at a time, and by default
	# hands the lock to whichever thread grabs it, so that a test's
	# threads that wait on each other (spinning, yielding) could take 12
	# to 209 s for test_stress from run to run; its ticket lock gives
	# 18 s every time.
	valgrind --fair-sched=yes --trace-children=yes --leak-check=full \
		--show-leak-kinds=definite,indirect,possible \
		--errors-for-leak-kinds=definite,indirect,possible \
		--suppressions=tests/valgrind.supp "$1" \
		>"$work/$(basename "$1")" 2>&1
}

# As many binaries at once as there are cores: valgrind runs a process's
# threads on one core, and most binaries keep about one busy (Criterion
# runs their tests two at a time, but one is often left alone).
exes=()
for exe in "$build"/tests/test_*; do
	if [ -f "$exe" ] && [ -x "$exe" ]; then
		exes+=("$exe")
	fi
done
cores=$(nproc)
for exe in "${exes[@]}"; do
	while [ "$(jobs -rp | wc -l)" -ge "$cores" ]; do
		wait -n
	done
	memcheck "$exe" &
done
wait

# The verdicts, in the binaries' order.
for exe in "${exes[@]}"; do
	out=$work/$(basename "$exe")
	bad=$(grep -c 'ERROR SUMMARY: [1-9]' "$out")
	ran=$(grep -c 'ERROR SUMMARY:' "$out")
	if [ "$bad" -eq 0 ] && [ "$ran" -gt 0 ] &&
		grep -q 'Synthesis: .*Failing: 0 | Crashing: 0' "$out"; then
		echo "valgrind $(basename "$exe"): clean ($ran processes)"
		passed=$((passed + 1))
	elif [ "$bad" -eq 0 ] && [ "$ran" -gt 0 ]; then
		# Clean, but a test failed: under valgrind's emulation only,
		# perhaps (it rounds some operations its own way).
		echo "valgrind $(basename "$exe"): no memcheck errors, but a test failed"
		grep -E '^\[FAIL\]' "$out"
		grep -E '^\[----\]' "$out" | head -20
		failed=$((failed + 1))
	else
		echo "valgrind $(basename "$exe"): $bad of $ran processes with errors"
		grep -B2 -A20 'ERROR SUMMARY: [1-9]\|definitely lost in\|possibly lost in\|Invalid' "$out" | head -60
		failed=$((failed + 1))
	fi
done
echo "valgrind: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
