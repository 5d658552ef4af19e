#!/bin/sh
# Compares the ABI of a built libadg.so with the baseline kept in the
# repository, abi/libadg.abi (abigail-tools: abidw, abidiff), counting only
# what include/ declares. CONTRIBUTING.md, "The ABI", says when to take a
# new baseline.
# Usage: abi-check.sh [LIB]            (fails on a change; LIB defaults to
#                                       build/lib/libadg.so)
#        abi-check.sh --write [LIB]    (takes LIB's ABI as the baseline)
#
# abidiff's exit status is a bit set: 1 an error, 2 a usage error, 4 the
# ABI changed, 8 a change it knows to be incompatible (a symbol removed).
# It sets 8 for symbols only: a struct that grows or is reordered is a 4,
# whether include/adg.h's rules allow it or not, so every change fails here
# until the baseline is taken again in the same commit, where a reviewer
# sees it. The one exception: when the soname and the version have both
# moved since the baseline, a new ABI is being made and anything goes.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
baseline=$root/abi/libadg.abi

write=0
if [ "${1:-}" = --write ]; then
	write=1
	shift
fi
lib=${1:-$root/build/lib/libadg.so}
if [ ! -f "$lib" ]; then
	echo "abi-check: no library at $lib: build first" >&2
	exit 2
fi
version=$(sed -n "s/^  version: '\([0-9.]*\)',$/\1/p" "$root/meson.build")

# The ABI of $lib as abidw writes it, public types only, made stable
# across machines and build directories: no locations, no absolute paths,
# the compilation units' paths from the source root, type ids by hash;
# the version as a comment after the first line (abidiff reads the
# corpus's first line to know the file).
dump() {
	abidw --headers-dir "$root/include" --drop-private-types \
		--no-corpus-path --no-comp-dir-path --no-show-locs \
		--type-id-style hash "$lib" |
		sed -e "s|path='\(\.\./\)*|path='|" \
			-e "1a\\  <!-- libadg $version -->"
}

if [ $write = 1 ]; then
	mkdir -p "$(dirname "$baseline")"
	dump >"$baseline"
	echo "abi-check: wrote $baseline (libadg $version)"
	exit 0
fi
if [ ! -f "$baseline" ]; then
	echo "abi-check: no baseline $baseline: run scripts/abi-check.sh --write" >&2
	exit 1
fi

now=$(mktemp)
trap 'rm -f "$now"' EXIT
dump >"$now"
rc=0
abidiff "$baseline" "$now" || rc=$?
soname_of() { sed -n "1s/.* soname='\([^']*\)'.*/\1/p" "$1"; }
version_of() { sed -n "2s/.*<!-- libadg \([0-9.]*\) -->.*/\1/p" "$1"; }
was="$(soname_of "$baseline") $(version_of "$baseline")"
is="$(soname_of "$now") $version"

if [ $((rc & 3)) -ne 0 ]; then
	echo "abi-check: abidiff failed ($rc)" >&2
	exit 1
fi
if [ $rc -eq 0 ]; then
	echo "abi-check: the ABI is the baseline's ($is)"
	exit 0
fi
if [ "${was% *}" != "${is% *}" ] && [ "${was#* }" != "${is#* }" ]; then
	echo "abi-check: the soname and version moved ($was -> $is): a new ABI;"
	echo "  once it is settled, take it with scripts/abi-check.sh --write"
	exit 0
fi
if [ $((rc & 8)) -ne 0 ]; then
	echo "abi-check: an incompatible change under $was: move the soname" \
		"(lib/meson.build) and the version (meson.build, ADG_VERSION_*)," \
		"then take the baseline with scripts/abi-check.sh --write" >&2
else
	echo "abi-check: the ABI changed (abidiff judges symbols, not layouts):" \
		"if include/adg.h's ABI rules allow it (a new function, a field at" \
		"the end of a sized struct), move the minor version and take the" \
		"baseline with scripts/abi-check.sh --write in the same commit;" \
		"if not, move the soname too" >&2
fi
exit 1
