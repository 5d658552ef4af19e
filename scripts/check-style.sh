#!/bin/sh
# The repository's style as tests (meson suite `style`): clang-format, with
# the repository's .clang-format, over every C and C++ file; shellcheck over
# every shell script. Lists files with git where the tree is a checkout,
# else with find. Usage: check-style.sh clang-format|shellcheck
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
*)
	echo "usage: $0 clang-format|shellcheck" >&2
	exit 2
	;;
esac
