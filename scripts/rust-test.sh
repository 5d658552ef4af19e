#!/usr/bin/env bash
# Builds and tests the Rust crates (rust/: adg-sys and adg) against libadg
# installed into a temporary prefix, found through pkg-config as a user's
# would be: cargo fmt --check, clippy with warnings as errors, rustdoc with
# warnings as errors, cargo test (unit, integration and doc tests), the
# examples, then the test binaries again under valgrind memcheck (which sees
# the safe crate's unsafe code and the C library both), cargo test against
# a libadg built with AddressSanitizer + UBSan, cargo test with the Rust
# side built with AddressSanitizer (nightly, which rustup installs on the
# CI machine), Miri over the unit tests that call no C, and cargo test with
# both sides built with ThreadSanitizer (libadg by clang). Prints "rust: N
# passed, N failed" (each cargo test case counts, and each other step as
# one). Usage: rust-test.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$PWD
command -v cargo >/dev/null || {
	echo "rust: cargo not found (Rust comes by rustup on the CI machine)" >&2
	echo "rust: 0 passed, 1 failed"
	exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0

# shellcheck source=scripts/lib.sh
. scripts/lib.sh
step() { count_check rust "$@"; } # name, then the command: one check

# Installs libadg, built with meson options $2..., into prefix $1.
install_libadg() {
	local prefix=$1
	shift
	meson setup "$work/build-$(basename "$prefix")" --prefix="$prefix" \
		--libdir=lib --buildtype=debugoptimized -Dtests=disabled \
		-Dexamples=false -Dbench=false ${ADG_WERROR:+--werror} "$@" \
		>/dev/null && ninja -C "$work/build-$(basename "$prefix")" install >/dev/null
}

# Runs cargo test with $@ before "test", adds its cases to the counts (each
# "test result: ok. P passed; F failed" line), and fails the step as one
# more failure when cargo fails without a count (a build error).
cargo_tests() {
	local name=$1 out p f
	shift
	out=$(mktemp)
	"$@" 2>&1 | tee "$out"
	local rc=${PIPESTATUS[0]}
	p=$(awk '/^test result:/ { s += $4 } END { print s + 0 }' "$out")
	f=$(awk '/^test result:/ { s += $6 } END { print s + 0 }' "$out")
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
	echo "rust $name: $p passed, $f failed"
	passed=$((passed + p))
	failed=$((failed + f))
	rm -f "$out"
}

if ! install_libadg "$work/plain"; then
	echo "rust: 0 passed, 1 failed (libadg did not build)"
	exit 1
fi
export PKG_CONFIG_PATH=$work/plain/lib/pkgconfig
export CARGO_TARGET_DIR=$root/build-test-rust
cd rust || exit 2

step fmt cargo fmt --all --check
step clippy cargo clippy --workspace --all-targets --quiet -- -D warnings
step doc env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
cargo_tests tests cargo test --workspace

# The examples users copy: each runs, and the trainer's weights are the
# same at every thread count (one "T = N: ..., weights HASH" line a count).
step example-quickstart cargo run --quiet --example quickstart
step example-threads cargo run --quiet --example threads
same_hash() {
	local hashes
	hashes=$(cargo run --quiet --example trainer -- --threads 1,2,3,4 |
		awk '/^T = / { print $NF }') || return 1
	echo "$hashes"
	[ "$(wc -l <<<"$hashes")" -eq 4 ] && [ "$(sort -u <<<"$hashes" | wc -l)" -eq 1 ]
}
step example-trainer same_hash

# valgrind memcheck over every test binary cargo built (not the examples,
# run above, nor the doc tests, which rustdoc builds at run time);
# rust/valgrind.supp hides one record of Rust's standard library.
memcheck() {
	local exe=$1 out
	out=$(mktemp)
	if RUST_BACKTRACE=0 valgrind --error-exitcode=99 --leak-check=full \
		--errors-for-leak-kinds=definite,indirect,possible \
		--suppressions=valgrind.supp "$exe" --test-threads=1 \
		>"$out" 2>&1; then
		rm -f "$out"
		return 0
	fi
	tail -60 "$out"
	rm -f "$out"
	return 1
}
if command -v valgrind >/dev/null; then
	while read -r exe; do
		step "valgrind-$(basename "$exe")" memcheck "$exe"
	done < <(cargo test --workspace --no-run --message-format=json 2>/dev/null |
		grep -v '"kind":\["example"\]' |
		sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')
else
	step valgrind false
fi

# libadg with AddressSanitizer + UBSan under the same tests: the Rust code is
# not instrumented (stable cargo cannot), the library is; GCC's runtime is
# preloaded into the test binaries (through cargo's runner, not into cargo
# and rustc), as the library needs it first.
cd "$root" || exit 2
if install_libadg "$work/asan" -Db_sanitize=address,undefined -Db_lundef=false; then
	cd rust || exit 2
	cargo_tests tests-libadg-asan env PKG_CONFIG_PATH="$work/asan/lib/pkgconfig" \
		CARGO_TARGET_DIR="$root/build-test-rust-libasan" \
		CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="env LD_PRELOAD=$(gcc -print-file-name=libasan.so)" \
		ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
		cargo test --workspace --tests --target x86_64-unknown-linux-gnu
else
	step libadg-asan-build false
fi

# The Rust side under AddressSanitizer (nightly), against the plain
# library: it sees the safe crate's unsafe code at every access, doc tests
# included. Then Miri over the unit tests that call no C (how values are
# packed, the closures' block cache): Miri cannot call libadg.
cd "$root/rust" || exit 2
cargo +nightly --version >/dev/null 2>&1 ||
	rustup toolchain install nightly --profile minimal >/dev/null 2>&1
asan="-Zsanitizer=address -Cunsafe-allow-abi-mismatch=sanitizer"
cargo_tests tests-rust-asan env CARGO_TARGET_DIR="$root/build-test-rust-nightly" \
	RUSTFLAGS="$asan" RUSTDOCFLAGS="$asan" \
	cargo +nightly test --workspace --target x86_64-unknown-linux-gnu
if rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1; then
	cargo_tests miri env CARGO_TARGET_DIR="$root/build-test-rust-miri" \
		cargo +nightly miri test -p adg --lib -- value:: blocks:: reducer::
else
	step miri-install false
fi

# ThreadSanitizer over both sides at once: libadg built with clang's, whose
# instrumentation the runtime rustc links (LLVM's) understands, and the
# Rust side and its standard library (-Zbuild-std, rust-src above) with
# nightly's. TSan sees the C side's atomics and locks then, so a report
# is a race; liburcu-bp, not instrumented, is hidden as in the C suite.
cd "$root" || exit 2
if CC=clang install_libadg "$work/tsan" -Db_sanitize=thread -Db_lundef=false; then
	cd rust || exit 2
	tsan="-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer"
	under_tsan() { # cargo +nightly's subcommand and arguments
		local sub=$1
		shift
		env PKG_CONFIG_PATH="$work/tsan/lib/pkgconfig" \
			CARGO_TARGET_DIR="$root/build-test-rust-tsan" \
			RUSTFLAGS="$tsan" RUSTDOCFLAGS="$tsan" \
			TSAN_OPTIONS="halt_on_error=1 suppressions=$root/tests/tsan.supp" \
			cargo +nightly "$sub" -Zbuild-std \
			--target x86_64-unknown-linux-gnu "$@"
	}
	cargo_tests tests-tsan under_tsan test --workspace
	# The examples' threads too: the trainer exits 1 unless every thread
	# count gives one weights hash.
	step example-threads-tsan under_tsan run --quiet --example threads
	step example-trainer-tsan under_tsan run --quiet --example trainer \
		-- --threads 1,2,3,4
else
	step libadg-tsan-build false
fi

echo "rust: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
