#!/bin/sh
# The repository's style as tests (meson suite `style`): clang-format, with
# the repository's .clang-format, over every C and C++ file; shellcheck over
# every shell script; the size of every function of lib/ (CONTRIBUTING.md,
# "The core and its annexes"). Lists files with git where the tree is a
# checkout, else with find.
# Usage: check-style.sh clang-format|shellcheck|functions
cd "$(dirname "$0")/.." || exit 2
tracked() { # git pathspecs; the find fallback reads the same globs
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
		git ls-files -- "$@"
	else
		for spec in "$@"; do
			find . -path "./build*" -prune -o -path "./$spec" -print |
				sed 's|^\./||'
		done
	fi
}
# Prints each function over max_lines lines or max_params parameters and
# fails if there is one. It reads clang-formatted C, where a function's
# braces, and only a function's, stand alone at column 0 (BreakBeforeBraces:
# Linux): its lines are those between them, blank lines and comments
# included; its signature is the lines from one starting at column 0 to the
# brace, and its parameters the commas at depth 1 of the first parenthesis
# that follows a name other than __attribute__, plus one (none for "void").
# POSIX awk only (Debian's is mawk).
# shellcheck disable=SC2016 # the $ are awk's
function_sizes='
FNR == 1 { sig = ""; body = 0 }
body {
	if ($0 != "}")
		next
	lines = FNR - body - 1
	if (lines > max_lines)
		report(body, lines " lines", max_lines)
	body = 0
	next
}
$0 == "{" {
	if (sig != "" && count_params(sig) > max_params)
		report(FNR, nparams " parameters", max_params)
	body = sig != "" ? FNR : 0
	sig = ""
	next
}
/^[A-Za-z_]/ {
	sig = sig != "" && !ended ? sig " " $0 : $0
	ended = /;$/
	next
}
/^[ \t]/ && sig != "" && !ended { sig = sig " " $0; ended = /;$/; next }
{ sig = "" }
function report(line, what, most) {
	printf "%s:%d: %s: %s, at most %d\n", FILENAME, line, name, what, most
	bad = 1
}
function count_params(s,    i, c, depth, word, start) {
	gsub(/\/\*([^*]|\*+[^*\/])*\*+\//, "", s)
	name = ""
	nparams = 0
	depth = 0
	for (i = 1; i <= length(s); i++) {
		c = substr(s, i, 1)
		if (c ~ /[A-Za-z0-9_]/) {
			word = word c
			continue
		}
		if (c == "(" && depth == 0 && name == "" && word != "" &&
		    word != "__attribute__") {
			name = word
			start = i + 1
		}
		word = ""
		if (c == "(")
			depth++
		else if (c == ")" && --depth == 0 && name != "")
			break
		else if (c == "," && depth == 1 && name != "")
			nparams++
	}
	s = substr(s, start, i - start)
	gsub(/^[ \t]+|[ \t]+$/, "", s)
	nparams = s == "" || s == "void" ? 0 : nparams + 1
	return nparams
}
END { exit bad }
'
case ${1:-} in
clang-format)
	# shellcheck disable=SC2046 # the repository has no file name with a space
	clang-format --dry-run --Werror $(tracked '*.c' '*.h' '*.cpp' '*.hpp') &&
		echo "clang-format: every C and C++ file as .clang-format says"
	;;
shellcheck)
	# shellcheck disable=SC2046
	shellcheck -x $(tracked 'scripts/*.sh' '.ci/run' 'examples/*.sh' 'tests/*.sh') &&
		echo "shellcheck: no finding"
	;;
functions)
	# shellcheck disable=SC2046
	awk -v max_lines=80 -v max_params=6 "$function_sizes" \
		$(tracked 'lib/*.c' 'lib/*.h') &&
		echo "functions: none in lib/ over 80 lines or 6 parameters"
	;;
*)
	echo "usage: $0 clang-format|shellcheck|functions" >&2
	exit 2
	;;
esac
