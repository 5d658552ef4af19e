#!/bin/sh
# The README's first block of each language must be its quick start, word
# for word: the snippet a newcomer copies is the one the suite compiles and
# runs. Usage: check-readme.sh README C_SOURCE [CPP_SOURCE [RUST_SOURCE]]
readme=$1
block() { # the first ```$1 block of the README
	awk -v fence="\`\`\`$1" '$0 == fence { inside = 1; next }
		/^```$/ && inside { exit } inside' "$readme"
}
block c | diff -u "$2" - || exit 1
echo "README quick start matches $2"
if [ -n "${3:-}" ]; then
	block cpp | diff -u "$3" - || exit 1
	echo "README C++ quick start matches $3"
fi
if [ -n "${4:-}" ]; then
	block rust | diff -u "$4" - || exit 1
	echo "README Rust quick start matches $4"
fi
