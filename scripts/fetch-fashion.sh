#!/usr/bin/env bash
# Fetches Fashion-MNIST (Zalando's 60,000 training and 10,000 test images
# of 28x28 grey pixels, 10 classes of clothing) for examples/fashion/:
# Debian ships it as the package dataset-fashion-mnist, four gzipped IDX
# files under usr/share/datasets/fashion-mnist/. Downloads that package
# with apt-get (it is not installed), unpacks it with dpkg-deb, checks each
# file (IDX magic number, counts, 28x28 images, exact size, labels in 0..9)
# and caches them, uncompressed, in .cache/fashion/ (git-ignored). Does
# nothing when good copies are there already; prints the folder.
# Usage: fetch-fashion.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
dir=.cache/fashion
package=dataset-fashion-mnist
# name, IDX magic number (0x801: unsigned bytes, 1 dimension; 0x803: 3
# dimensions), and count
files=(train-images-idx3-ubyte train-labels-idx1-ubyte
	t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)
magic() { case $1 in *images*) echo 2051 ;; *) echo 2049 ;; esac }
count() { case $1 in train*) echo 60000 ;; *) echo 10000 ;; esac }

# The big-endian 32-bit words at the start of $1, one a line.
header_words() {
	od -An -v -tu1 -N"$2" "$1" |
		awk '{ for (i = 1; i <= NF; i++) b[n++] = $i }
		END { for (i = 0; i + 3 < n; i += 4)
			print ((b[i] * 256 + b[i + 1]) * 256 + b[i + 2]) * 256 + b[i + 3] }'
}

# Prints what is wrong with the IDX file $1 named $2, or nothing when it is
# that file of the data set.
problem() {
	local file=$1 name=$2 want_magic want_count words bytes expected
	want_magic=$(magic "$name")
	want_count=$(count "$name")
	bytes=$(wc -c <"$file")
	if [ "$want_magic" -eq 2051 ]; then
		mapfile -t words < <(header_words "$file" 16)
		expected=$((16 + want_count * 28 * 28))
	else
		mapfile -t words < <(header_words "$file" 8)
		expected=$((8 + want_count))
	fi
	if [ "${words[0]:-}" != "$want_magic" ]; then
		echo "magic number ${words[0]:-(none)}, not $want_magic"
		return
	fi
	if [ "${words[1]}" != "$want_count" ]; then
		echo "${words[1]} items, not $want_count"
		return
	fi
	if [ "$want_magic" -eq 2051 ] &&
		{ [ "${words[2]}" != 28 ] || [ "${words[3]}" != 28 ]; }; then
		echo "images of ${words[2]}x${words[3]}, not 28x28"
		return
	fi
	if [ "$bytes" -ne "$expected" ]; then
		echo "$bytes bytes, not $expected"
		return
	fi
	if [ "$want_magic" -eq 2049 ]; then
		od -An -v -tu1 -j8 "$file" | awk '
		{ for (i = 1; i <= NF; i++) { n++; if ($i > 9) {
			print "label " n " is " $i ", not in 0..9"; exit } } }'
	fi
}

# Every cached file good: nothing to do.
good=1
for name in "${files[@]}"; do
	if [ ! -f "$dir/$name" ] || [ -n "$(problem "$dir/$name" "$name")" ]; then
		good=0
		break
	fi
done
if [ $good -eq 1 ]; then
	echo "$dir"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! apt_download "$tmp" fetch-fashion "$package"; then
	echo "fetch-fashion: cannot download Debian's $package" \
		"(no network, or no Debian package source that has it:" \
		"it is in bookworm's main)." \
		"apt-get said the above." >&2
	exit 1
fi
deb=$(find "$tmp" -maxdepth 1 -name "${package}_*.deb" | head -1)
if [ -z "$deb" ] || ! dpkg-deb -x "$deb" "$tmp/root" 2>"$tmp/dpkg.log"; then
	cat "$tmp/dpkg.log" >&2 || true
	echo "fetch-fashion: the downloaded $package package" \
		"is not a readable .deb" >&2
	exit 1
fi
mkdir -p "$tmp/out"
for name in "${files[@]}"; do
	gz=$tmp/root/usr/share/datasets/fashion-mnist/$name.gz
	if [ ! -f "$gz" ]; then
		echo "fetch-fashion: $(basename "$deb") holds no" \
			"usr/share/datasets/fashion-mnist/$name.gz" >&2
		exit 1
	fi
	if ! gzip -dc "$gz" >"$tmp/out/$name" 2>"$tmp/gzip.log"; then
		cat "$tmp/gzip.log" >&2
		echo "fetch-fashion: $name.gz in $(basename "$deb") is not" \
			"valid gzip" >&2
		exit 1
	fi
	wrong=$(problem "$tmp/out/$name" "$name")
	if [ -n "$wrong" ]; then
		echo "fetch-fashion: $name from $(basename "$deb") is not" \
			"Fashion-MNIST's: $wrong" >&2
		exit 1
	fi
done
mkdir -p "$dir"
for name in "${files[@]}"; do
	mv "$tmp/out/$name" "$dir/$name"
done
echo "fetch-fashion: 60000 training and 10000 test images" \
	"from $(basename "$deb")" >&2
echo "$dir"
