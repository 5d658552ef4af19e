#!/usr/bin/env bash
# Fetches the UCI handwritten digits (1,797 images of 8x8 pixels, 10
# classes) for examples/digits/: Debian ships them in python3-sklearn as
# sklearn/datasets/data/digits.csv.gz. Downloads that package with apt-get
# (no Python needed), unpacks it with dpkg-deb, checks the file (size, 1,797
# rows of 64 pixels in 0..16 and a label in 0..9) and caches it,
# uncompressed, as .cache/digits/digits.csv (git-ignored). Does nothing
# when a good copy is there already; prints the path. Usage: fetch-digits.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
dir=.cache/digits
csv=$dir/digits.csv
rows=1797

# Prints what is wrong with $1, or nothing when it is the data set.
problem() {
	local bytes
	bytes=$(wc -c <"$1")
	# 265 kB as Debian 12 ships it; the bounds only catch a truncated or
	# foreign file.
	if [ "$bytes" -lt 150000 ] || [ "$bytes" -gt 500000 ]; then
		echo "$bytes bytes, not about 265 kB"
		return
	fi
	awk -F, -v rows=$rows '
	NF != 65 { print "line " NR ": " NF " fields, not 65"; bad = 1; exit }
	{
		for (i = 1; i <= 65; i++)
			if ($i !~ /^[0-9]+$/ || $i > (i < 65 ? 16 : 9)) {
				print "line " NR ", field " i ": \"" $i "\" out of range"
				bad = 1
				exit
			}
	}
	END { if (!bad && NR != rows) print NR " rows, not " rows }' "$1"
}

if [ -f "$csv" ] && [ -z "$(problem "$csv")" ]; then
	echo "$csv"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! apt_download "$tmp" fetch-digits python3-sklearn; then
	echo "fetch-digits: cannot download Debian's python3-sklearn" \
		"(no network, or no Debian package source configured)." \
		"apt-get said the above." >&2
	exit 1
fi
deb=$(find "$tmp" -maxdepth 1 -name 'python3-sklearn_*.deb' | head -1)
if [ -z "$deb" ] || ! dpkg-deb -x "$deb" "$tmp/root" 2>"$tmp/dpkg.log"; then
	cat "$tmp/dpkg.log" >&2 || true
	echo "fetch-digits: the downloaded python3-sklearn package" \
		"is not a readable .deb" >&2
	exit 1
fi
gz=$(find "$tmp/root" -path '*/sklearn/datasets/data/digits.csv.gz' | head -1)
if [ -z "$gz" ]; then
	echo "fetch-digits: $(basename "$deb") holds no" \
		"sklearn/datasets/data/digits.csv.gz" >&2
	exit 1
fi
if ! gzip -dc "$gz" >"$tmp/digits.csv" 2>"$tmp/gzip.log"; then
	cat "$tmp/gzip.log" >&2
	echo "fetch-digits: digits.csv.gz in $(basename "$deb") is not" \
		"valid gzip" >&2
	exit 1
fi
wrong=$(problem "$tmp/digits.csv")
if [ -n "$wrong" ]; then
	echo "fetch-digits: digits.csv from $(basename "$deb") is not the" \
		"digits data set: $wrong" >&2
	exit 1
fi
mkdir -p "$dir"
mv "$tmp/digits.csv" "$csv"
echo "fetch-digits: $rows images from $(basename "$deb")" >&2
echo "$csv"
