# shellcheck shell=bash
# What the shell tests of the data fetchers (fetch-words.sh,
# fetch-brown.sh) share. Sourced: makes a scratch folder, $tmp, removed
# on exit, and defines
#   check NAME COMMAND...  counts a pass when COMMAND succeeds, else a
#                          failure, said on stderr with NAME;
#   said TEXT              whether $tmp/stderr (where each test keeps the
#                          last run's) holds TEXT;
#   checks_done NAME       prints the counts; fails when a check failed
#                          (the test's last command, its exit status).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
check() {
	local name=$1
	shift
	if "$@"; then
		passed=$((passed + 1))
	else
		echo "FAIL: $name" >&2
		failed=$((failed + 1))
	fi
}
said() { grep -q -- "$1" "$tmp/stderr"; }
checks_done() {
	echo "$1: $passed passed, $failed failed"
	[ "$failed" -eq 0 ]
}
