#!/usr/bin/env bash
# Fetches the words of nine languages for examples/langid/ and builds its
# data set. Debian ships word lists under usr/share/dict in the packages
# below; this downloads them with apt-get (into .cache/words/debs/, not
# installed), unpacks each with dpkg-deb, decodes each list as what it is
# (UTF-8, or ISO-8859-1 where the package ships that: the Swedish one), and
# builds one deterministic data set:
# - each word lowercased; only words of letters kept (accented letters
#   too; a word with a digit, an apostrophe, a hyphen or any other symbol
#   is dropped), of at most 20 bytes in UTF-8;
# - a word found in more than one list dropped, since its language is
#   not a fact about it;
# - per language, a sample of 20,000 training and 2,000 test words, drawn
#   from the sorted words by a generator of fixed seed (xorshift32), so
#   that the same lists give the same files on any machine.
# Writes, in .cache/words/ (git-ignored), train.txt and test.txt, a line
# per word, "CODE<tab>WORD" (en fr de es it pt nl pl sv, in that order,
# each language's words in sample order), and info.txt, what they were
# made from. Prints the packages, encodings and counts; does nothing when
# good files are there already; prints the folder last. Says what is
# wrong, and exits 1, when it cannot (no network, a list missing, a
# package without its file, a list in another encoding, too few words).
# Needs apt-get, dpkg-deb, iconv and perl (all in a Debian base system).
#
# Usage: fetch-words.sh [--debs DIR] [--offline] [--out DIR]
#                       [--train N] [--test N]
#   --debs DIR   where the .deb files are kept (default .cache/words/debs)
#   --offline    use the .deb files in DIR only, never apt-get
#   --out DIR    where the data set goes (default .cache/words)
#   --train N, --test N   words per language (default 20000 and 2000)
# The options are for tests of the failure paths (tests/fetch-words.sh),
# which point the script at fake packages.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
debs=.cache/words/debs
out=.cache/words
offline=0
n_train=20000
n_test=2000
seed=1 # of the sample: part of the data set's definition
usage() {
	echo "usage: $0 [--debs DIR] [--offline] [--out DIR] [--train N]" \
		"[--test N]" >&2
	exit 2
}
while [ $# -gt 0 ]; do
	case $1 in
	--offline)
		offline=1
		shift
		;;
	--debs | --out | --train | --test)
		[ $# -ge 2 ] || usage
		case $1 in
		--debs) debs=$2 ;;
		--out) out=$2 ;;
		--train | --test)
			[[ $2 =~ ^[1-9][0-9]*$ ]] || usage
			if [ "$1" = --train ]; then n_train=$2; else n_test=$2; fi
			;;
		esac
		shift 2
		;;
	*) usage ;;
	esac
done

# Package, its list under usr/share/dict, language code and name, and the
# encoding the package ships its list in.
lists=(
	"wamerican american-english en English UTF-8"
	"wfrench french fr French UTF-8"
	"wngerman ngerman de German UTF-8"
	"wspanish spanish es Spanish UTF-8"
	"witalian italian it Italian UTF-8"
	"wportuguese portuguese pt Portuguese UTF-8"
	"wdutch dutch nl Dutch UTF-8"
	"wpolish polish pl Polish UTF-8"
	"wswedish swedish sv Swedish ISO-8859-1"
)
codes=()
for entry in "${lists[@]}"; do
	read -r _ _ code _ _ <<<"$entry"
	codes+=("$code")
done
# What info.txt's first line says: files made another way are made again.
format="langid-words 1 seed $seed train $n_train test $n_test"

fail() {
	echo "fetch-words: $*" >&2
	exit 1
}

# Prints what is wrong with the data set in $out, or nothing when it is
# there, whole, made as this script makes it.
problem() {
	local f
	for f in train.txt test.txt info.txt; do
		[ -f "$out/$f" ] || {
			echo "no $out/$f"
			return
		}
	done
	[ "$(head -1 "$out/info.txt")" = "$format" ] || {
		echo "$out/info.txt is of another version or size"
		return
	}
	awk -F'\t' -v codes="${codes[*]}" -v train="$n_train" -v test="$n_test" '
	BEGIN { n = split(codes, c, " "); for (i = 1; i <= n; i++) ok[c[i]] = 1 }
	NF != 2 || !($1 in ok) || $2 == "" {
		print FILENAME ":" FNR ": not CODE<tab>WORD"; bad = 1; exit
	}
	{ count[FILENAME, $1]++ }
	END {
		if (bad) exit
		for (i = 1; i <= n; i++) {
			if (count[ARGV[1], c[i]] != train)
				{ print ARGV[1] ": " count[ARGV[1], c[i]] + 0 " " c[i] " words, not " train; exit }
			if (count[ARGV[2], c[i]] != test)
				{ print ARGV[2] ": " count[ARGV[2], c[i]] + 0 " " c[i] " words, not " test; exit }
		}
	}' "$out/train.txt" "$out/test.txt"
}

if [ -z "$(problem)" ]; then
	echo "$out"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$debs" "$tmp/root" "$tmp/utf8" "$tmp/words" "$tmp/only"

# The packages' .deb files: downloaded when not kept already.
missing=()
for entry in "${lists[@]}"; do
	read -r package _ <<<"$entry"
	compgen -G "$debs/${package}_*.deb" >/dev/null || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ] && [ $offline -eq 1 ]; then
	fail "no .deb of ${missing[*]} in $debs (--offline: nothing" \
		"downloaded)"
fi
if [ ${#missing[@]} -gt 0 ]; then
	apt_download "$tmp" fetch-words "${missing[@]}" ||
		fail "cannot download ${missing[*]} (no network, or no" \
			"Debian package source that has them: they are in" \
			"bookworm's main). apt-get said the above."
	mv "$tmp"/*.deb "$debs/"
fi

echo "fetch-words: packages, encodings and words kept (letters only," \
	"lowercase, at most 20 bytes):" >&2
for entry in "${lists[@]}"; do
	read -r package file code name encoding <<<"$entry"
	deb=$(compgen -G "$debs/${package}_*.deb" | sort | tail -1)
	rm -rf "$tmp/root"
	if ! dpkg-deb -x "$deb" "$tmp/root" 2>"$tmp/dpkg.log"; then
		cat "$tmp/dpkg.log" >&2
		fail "$deb is not a readable .deb (delete it to download it" \
			"again)"
	fi
	list=$tmp/root/usr/share/dict/$file
	[ -f "$list" ] || fail "$(basename "$deb") holds no" \
		"usr/share/dict/$file: not the $name word list this expects"
	# UTF-8 when it decodes as UTF-8; else what the package ships.
	if iconv -f UTF-8 -t UTF-8 "$list" >"$tmp/utf8/$code" 2>/dev/null; then
		found=UTF-8
		LC_ALL=C grep -q '[^[:print:][:space:]]' "$list" || found=ASCII
	elif [ "$encoding" != UTF-8 ] &&
		iconv -f "$encoding" -t UTF-8 "$list" >"$tmp/utf8/$code" \
			2>/dev/null; then
		found=$encoding
	else
		fail "usr/share/dict/$file of $(basename "$deb") is not" \
			"valid $encoding"
	fi
	# Lowercase; letters only (\p{L}: any script's, accented ones
	# too); at most 20 bytes; each word once.
	perl -CSD -ne 'chomp; $_ = lc; my $bytes = $_; utf8::encode($bytes);
		print "$_\n" if /^\p{L}+$/ && length($bytes) <= 20' \
		"$tmp/utf8/$code" | LC_ALL=C sort -u >"$tmp/words/$code"
	printf '  %-2s %-10s %-36s %-10s %8d lines, %8d words\n' "$code" \
		"$name" "$(basename "$deb")" "$found" \
		"$(wc -l <"$tmp/utf8/$code")" "$(wc -l <"$tmp/words/$code")" >&2
	echo "$code $name $(basename "$deb") $found" >>"$tmp/sources"
done

# Words in more than one list (each list has each word once, so a word
# repeated in the merge is in several), then each list without them.
(cd "$tmp/words" && LC_ALL=C sort -m "${codes[@]}" | uniq -d) >"$tmp/shared"
echo "fetch-words: $(wc -l <"$tmp/shared") words are in more than one" \
	"list: dropped" >&2
: >"$tmp/train.txt"
: >"$tmp/test.txt"
for i in "${!codes[@]}"; do
	code=${codes[$i]}
	LC_ALL=C comm -23 "$tmp/words/$code" "$tmp/shared" >"$tmp/only/$code"
	have=$(wc -l <"$tmp/only/$code")
	want=$((n_train + n_test))
	[ "$have" -ge "$want" ] || fail "$code: only $have words are in" \
		"that list alone, of letters, at most 20 bytes; $want wanted"
	# A sample of want of the have lines, in random order: a Fisher-Yates
	# shuffle of the line numbers, stopped after want swaps, which keeps
	# only the swapped places (a hash), not all have of them. xorshift32,
	# seeded by the seed and the language's place, is exact in perl's
	# integers and the same everywhere. Then the lines themselves.
	perl -e '
		my ($have, $want, $x) = @ARGV;
		my (%at, @pick);
		$x = $x * 2654435761 % 4294967296 || 1;
		for my $i (0 .. $want - 1) {
			$x ^= ($x << 13) & 0xffffffff;
			$x ^= $x >> 17;
			$x ^= ($x << 5) & 0xffffffff;
			my $j = $i + $x % ($have - $i);
			my $vi = exists $at{$i} ? $at{$i} : $i;
			my $vj = exists $at{$j} ? $at{$j} : $j;
			$at{$j} = $vi;
			push @pick, $vj;
		}
		print "$_\n" for @pick;' "$have" "$want" $((seed * 16 + i + 1)) \
		>"$tmp/pick"
	# Line numbers (0-based, in sample order) -> the words, in that order.
	awk -v code="$code" -v train="$n_train" -v train_out="$tmp/train.txt" \
		-v test_out="$tmp/test.txt" '
	FNR == NR { rank[$1] = FNR; n++; next }
	(FNR - 1) in rank { word[rank[FNR - 1]] = $0 }
	END {
		for (r = 1; r <= n; r++)
			print code "\t" word[r] >> (r <= train ? train_out : test_out)
	}' "$tmp/pick" "$tmp/only/$code"
	echo "  $code: $have words in that list alone; $n_train training" \
		"and $n_test test words drawn" >&2
done

{
	echo "$format"
	echo "# code language package encoding"
	cat "$tmp/sources"
} >"$tmp/info.txt"
mkdir -p "$out"
mv "$tmp/train.txt" "$tmp/test.txt" "$tmp/info.txt" "$out/"
wrong=$(problem)
[ -z "$wrong" ] || fail "the data set made is not whole: $wrong"
echo "fetch-words: $((n_train * ${#codes[@]})) training and" \
	"$((n_test * ${#codes[@]})) test words in $out" >&2
echo "$out"
