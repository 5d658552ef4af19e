#!/usr/bin/env bash
# Installs libadg into a temporary prefix and builds examples/quickstart.c
# outside the tree with nothing but pkg-config, against the shared and the
# static library, then runs both. Prints "consumer: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

# ADG_WERROR (set by scripts/test.sh, what CI runs): warnings are errors.
meson setup "$work/build" --prefix="$prefix" --libdir=lib \
	--buildtype=release -Dtests=disabled ${ADG_WERROR:+--werror} >/dev/null
ninja -C "$work/build" install >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
cp examples/quickstart.c "$work/"
cd "$work"

passed=0 failed=0
check() { # name, binary
	if out=$("./$2") && [ "$out" = "$(printf 'dy/da = 4\ndy/db = 3')" ]; then
		echo "consumer $1: ok"
		passed=$((passed + 1))
	else
		echo "consumer $1: FAILED"
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
if ldd quickstart-shared | grep -q 'libadg\.so\.0'; then :; else
	echo "consumer shared: not linked against libadg.so.0"
	failed=$((failed + 1))
fi

# static: libadg.a, plus what Requires.private brings (liburcu-bp, ck)
cc -o quickstart-static quickstart.c "${cflags[@]}" \
	-Wl,-Bstatic -ladg -Wl,-Bdynamic "${static_libs[@]}"
check static quickstart-static
if ldd quickstart-static | grep -q libadg; then
	echo "consumer static: still needs libadg.so"
	failed=$((failed + 1))
fi

echo "consumer: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
