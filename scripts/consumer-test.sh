#!/usr/bin/env bash
# Installs libadg into a temporary prefix and builds examples/quickstart.c
# outside the tree with nothing but pkg-config, against the shared and the
# static library, then runs both; the same for examples/quickstart.cpp, the
# C++ layer (adg.hpp), when a C++ compiler is there. pkg-config sees the
# prefix alone, as on a machine where libadg is the only package installed
# (no liburcu-dev, no libck-dev), and the headers must include nothing of
# theirs. Checks that the prefix holds the licence and the docs, and that
# the build tree's adg-uninstalled.pc builds quickstart.c against the
# uninstalled library. Prints "consumer: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

# ADG_WERROR (set by scripts/test.sh, what CI runs): warnings are errors.
meson setup "$work/build" --prefix="$prefix" --libdir=lib \
	--buildtype=release -Dtests=disabled -Dexamples=false -Dbench=false \
	${ADG_WERROR:+--werror} >/dev/null
ninja -C "$work/build" install >/dev/null
# The prefix's .pc files and no others: a Requires of adg.pc that only
# liburcu-dev or libck-dev would satisfy fails here.
export PKG_CONFIG_LIBDIR=$prefix/lib/pkgconfig
unset PKG_CONFIG_PATH
cp examples/quickstart.c examples/quickstart.cpp "$work/"
cd "$work"

passed=0 failed=0
verdict() { count_check consumer "$@"; } # name, then a command: it must succeed

# pkg-config answers for adg alone, and its flags are libadg's only (no
# -D or -I of a dependency's).
pc_alone() {
	pkg-config --cflags --libs adg >/dev/null &&
		pkg-config --static --cflags --libs adg >/dev/null &&
		[ "$(pkg-config --cflags adg | xargs)" = "-I$prefix/include" ]
}
verdict pkg-config pc_alone
# The installed headers reach only the compiler's and libc's own: cc -M
# lists every file adg.h (and adg.hpp) brings in.
headers_alone() {
	local deps
	deps=$(cc -M -I"$prefix/include" -x c - <<<'#include <adg.h>') &&
		if command -v c++ >/dev/null; then
			deps+=$(c++ -std=c++17 -M -I"$prefix/include" -x c++ - \
				<<<'#include <adg.hpp>')
		fi &&
		! grep -E 'urcu|/ck_' <<<"$deps"
}
verdict headers headers_alone
# The licence, the changelog and the docs, where Debian keeps them.
docs_installed() {
	local doc=$prefix/share/doc/libadg
	[ -f "$doc/LICENSE" ] && [ -f "$doc/CHANGELOG.md" ] &&
		[ -f "$doc/README.md" ] && [ -f "$doc/guide.md" ] &&
		[ -f "$doc/api.md" ]
}
verdict docs docs_installed
check() { # name, binary: it must print both gradients, whatever the layout
	if out=$("./$2") && grep -q 'dy/da = 4\([^.0-9]\|$\)' <<<"$out" &&
		grep -q 'dy/db = 3\([^.0-9]\|$\)' <<<"$out"; then
		echo "consumer $1: ok"
		passed=$((passed + 1))
	else
		echo "consumer $1: FAILED"
		failed=$((failed + 1))
	fi
}

# Check $1 fails unless binary $2 loads a library whose line in ldd's
# output matches $3 (grep -E), saying $4; ldd_lacks_libadg: unless it
# loads no libadg. ldd's output whole, then grep: in a pipe, grep -q's
# early exit can kill ldd (SIGPIPE), and pipefail then fails the test at
# random.
ldd_has() {
	if grep -qE "$3" <<<"$(ldd "$2")"; then :; else
		echo "consumer $1: $4"
		failed=$((failed + 1))
	fi
}
ldd_lacks_libadg() {
	if grep -q libadg <<<"$(ldd "$2")"; then
		echo "consumer $1: still needs libadg.so"
		failed=$((failed + 1))
	fi
}

# pkg-config's flags, one word each, as a user's Makefile splits them.
read -ra shared_flags <<<"$(pkg-config --cflags --libs adg)"
read -ra cflags <<<"$(pkg-config --cflags adg)"
read -ra static_libs <<<"$(pkg-config --static --libs adg | sed 's/-ladg//')"

# shared: -ladg finds libadg.so; the rpath stands in for ldconfig
cc -o quickstart-shared quickstart.c "${shared_flags[@]}" \
	-Wl,-rpath,"$prefix/lib"
check shared quickstart-shared
ldd_has shared quickstart-shared 'libadg\.so\.[0-9]+ ' \
	"not linked against libadg.so.N"

# static: libadg.a, plus what Requires.private brings (liburcu-bp, ck)
cc -o quickstart-static quickstart.c "${cflags[@]}" \
	-Wl,-Bstatic -ladg -Wl,-Bdynamic "${static_libs[@]}"
check static quickstart-static
ldd_lacks_libadg static quickstart-static

# C++: adg.hpp is installed next to adg.h, so the same flags serve; the
# C++ driver links libstdc++ itself. A user's usual warnings must stay
# quiet in the header.
if command -v c++ >/dev/null; then
	cxx=(c++ -std=c++17 -Wall -Wextra ${ADG_WERROR:+-Werror})
	"${cxx[@]}" -o quickstart-cpp-shared quickstart.cpp \
		"${shared_flags[@]}" -Wl,-rpath,"$prefix/lib"
	check c++-shared quickstart-cpp-shared
	ldd_has c++-shared quickstart-cpp-shared 'libadg\.so\.[0-9]+ ' \
		"not linked against libadg.so.N"
	"${cxx[@]}" -o quickstart-cpp-static quickstart.cpp "${cflags[@]}" \
		-Wl,-Bstatic -ladg -Wl,-Bdynamic "${static_libs[@]}"
	check c++-static quickstart-cpp-static
	ldd_lacks_libadg c++-static quickstart-cpp-static
else
	echo "consumer c++: no C++ compiler, not built"
fi

# The build tree, uninstalled: meson-uninstalled/adg-uninstalled.pc, which
# `meson devenv` puts on PKG_CONFIG_PATH, names the built library and the
# source tree's headers.
uninstalled_flags=$(PKG_CONFIG_LIBDIR=$work/build/meson-uninstalled \
	pkg-config --cflags --libs adg)
read -ra uninstalled_flags <<<"$uninstalled_flags"
if cc -o quickstart-uninstalled quickstart.c "${uninstalled_flags[@]}" \
	-Wl,-rpath,"$work/build/lib"; then
	check uninstalled quickstart-uninstalled
	ldd_has uninstalled quickstart-uninstalled "$work/build/lib/libadg\.so" \
		"not linked against the build tree's libadg"
else
	echo "consumer uninstalled: FAILED (did not build)"
	failed=$((failed + 1))
fi

echo "consumer: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
