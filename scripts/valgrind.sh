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
for exe in "$build"/tests/test_*; do
	if [ ! -f "$exe" ] || [ ! -x "$exe" ]; then
		continue
	fi
	out=$(mktemp)
	valgrind --trace-children=yes --leak-check=full \
		--show-leak-kinds=definite,indirect,possible \
		--errors-for-leak-kinds=definite,indirect,possible \
		--suppressions=tests/valgrind.supp "$exe" >"$out" 2>&1
	bad=$(grep -c 'ERROR SUMMARY: [1-9]' "$out")
	ran=$(grep -c 'ERROR SUMMARY:' "$out")
	if [ "$bad" -eq 0 ] && [ "$ran" -gt 0 ] &&
		grep -q 'Synthesis: .*Failing: 0 | Crashing: 0' "$out"; then
		echo "valgrind $(basename "$exe"): clean ($ran processes)"
		passed=$((passed + 1))
	else
		echo "valgrind $(basename "$exe"): $bad of $ran processes with errors"
		grep -B2 -A20 'ERROR SUMMARY: [1-9]\|definitely lost in\|possibly lost in\|Invalid' "$out" | head -60
		failed=$((failed + 1))
	fi
	rm -f "$out"
done
echo "valgrind: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
