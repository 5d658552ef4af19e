#!/usr/bin/env bash
# Builds libadg three ways and runs the whole test suite in each: plain,
# AddressSanitizer + UndefinedBehaviorSanitizer, ThreadSanitizer.
# Installs missing build dependencies first. Ends with "N passed, N failed",
# counting test cases over all three builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
for variant in plain asan tsan; do
	dir=build-test-$variant
	case $variant in
	plain) opts=() ;;
	asan) opts=(-Db_sanitize=address,undefined -Db_lundef=false) ;;
	tsan) opts=(-Db_sanitize=thread -Db_lundef=false) ;;
	esac
	echo "=== $variant build"
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" --buildtype=debugoptimized "${opts[@]}" >/dev/null
	fi
	ninja -C "$dir" >/dev/null
	meson test -C "$dir" --verbose --print-errorlogs 2>&1 | tee -a "$log" ||
		status=1
done

# Criterion prints "Synthesis: Tested: T | Passing: P | Failing: F |
# Crashing: C"; the TSan build's runner prints "tsan: P passed, F failed".
awk '
/Synthesis: Tested:/ { for (i = 1; i <= NF; i++) {
	if ($i == "Passing:") p += $(i + 1)
	if ($i == "Failing:" || $i == "Crashing:") f += $(i + 1) } }
/^tsan: [0-9]+ passed, [0-9]+ failed/ { p += $2; f += $4 }
END { printf "%d passed, %d failed\n", p, f; exit (f > 0) }' "$log" || status=1
exit $status
