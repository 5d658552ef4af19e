#!/usr/bin/env bash
# scripts/fetch-words.sh on fake packages, with no network (--offline): a
# good set of nine tiny word lists gives the data set the script promises
# (lowercase, letters only, ISO-8859-1 decoded, words of two lists
# dropped, the same files twice), and each way a fetch goes wrong (a
# package missing, one without its list, a list in another encoding, an
# unreadable .deb, too few words) fails with a message that names it.
# Usage: fetch-words.sh (meson runs it; needs dpkg-deb, iconv and perl).
set -uo pipefail
script=$(cd "$(dirname "$0")/.." && pwd)/scripts/fetch-words.sh
# shellcheck source=tests/checks.sh
. "$(dirname "$0")/checks.sh"

# A .deb of package $1 in folder $2 holding usr/share/dict/$3, whose
# lines are the remaining arguments (bytes as printf %b reads them).
fake_deb() {
	local package=$1 dir=$2 file=$3 root
	shift 3
	root=$tmp/build/$package
	rm -rf "$root"
	mkdir -p "$root/DEBIAN" "$root/usr/share/dict" "$dir"
	printf 'Package: %s\nVersion: 1.0\nArchitecture: all\nMaintainer: test <t@example.org>\nDescription: fake word list\n' \
		"$package" >"$root/DEBIAN/control"
	printf '%b\n' "$@" >"$root/usr/share/dict/$file"
	dpkg-deb --root-owner-group -Zgzip -b "$root" \
		"$dir/${package}_1.0_all.deb" >/dev/null
}

# Nine lists of three words that are theirs alone, once lowercased, plus
# words the rules drop: "taxi" (in every list), symbols, digits, one of
# 21 bytes; the Swedish list in ISO-8859-1 (\xe4 is a-umlaut).
long=abcdefghijabcdefghijk
good_set() {
	local dir=$1
	fake_deb wamerican "$dir" american-english Cat dog "dog's" house taxi
	fake_deb wfrench "$dir" french chat chien maison taxi "aujourd'hui"
	fake_deb wngerman "$dir" ngerman Katze Hund Haus taxi e-mail
	fake_deb wspanish "$dir" spanish gato perro casa taxi a1
	fake_deb witalian "$dir" italian gatta cane "citt\xc3\xa0" taxi $long
	fake_deb wportuguese "$dir" portuguese gatinho "c\xc3\xa3o" casinha taxi
	fake_deb wdutch "$dir" dutch kat hond huis taxi 06-nummer
	fake_deb wpolish "$dir" polish kot pies dom taxi
	fake_deb wswedish "$dir" swedish katt "hund\xe4" "\xe4pple" taxi
}
fetch() { # debs folder, out folder, more options
	local debs=$1 out=$2
	shift 2
	"$script" --offline --debs "$debs" --out "$out" --train 2 --test 1 \
		"$@" >"$tmp/stdout" 2>"$tmp/stderr"
}

good_set "$tmp/good"
fetch "$tmp/good" "$tmp/out1"
check "a good set is fetched" [ $? -eq 0 ]
check "prints the folder" [ "$(cat "$tmp/stdout")" = "$tmp/out1" ]
check "2 training words per language" [ "$(wc -l <"$tmp/out1/train.txt")" -eq 18 ]
check "1 test word per language" [ "$(wc -l <"$tmp/out1/test.txt")" -eq 9 ]
words=$(cut -f2 "$tmp/out1/train.txt" "$tmp/out1/test.txt" | sort | tr '\n' ' ')
check "every word of one list alone, lowercase, none other" [ "$words" = \
	"$(printf '%b\n' cat dog house chat chien maison katze hund haus \
		gato perro casa gatta cane "citt\xc3\xa0" gatinho "c\xc3\xa3o" \
		casinha kat hond huis kot pies dom katt "hund\xc3\xa4" \
		"\xc3\xa4pple" | sort | tr '\n' ' ')" ]
check "Swedish decoded from ISO-8859-1" grep -q "$(printf 'sv\t\xc3\xa4pple')" \
	"$tmp/out1/train.txt" "$tmp/out1/test.txt"
check "the encodings are printed" said "wswedish_1.0_all.deb *ISO-8859-1"
check "shared words are counted" said "1 words are in more than one list"
fetch "$tmp/good" "$tmp/out2"
check "the same files twice" cmp -s "$tmp/out1/train.txt" "$tmp/out2/train.txt"
check "the same test files twice" cmp -s "$tmp/out1/test.txt" "$tmp/out2/test.txt"
fetch "$tmp/good" "$tmp/out1"
check "a good data set is left alone" [ $? -eq 0 ]
check "without a word on it" [ ! -s "$tmp/stderr" ]

# Each failure: exit 1 and a message naming what is wrong.
cp -r "$tmp/good" "$tmp/missing"
rm "$tmp/missing"/wswedish_*.deb
fetch "$tmp/missing" "$tmp/out3"
check "a missing package fails" [ $? -eq 1 ]
check "and is named" said "no .deb of wswedish in"
check "and nothing is written" [ ! -e "$tmp/out3/train.txt" ]

cp -r "$tmp/good" "$tmp/nofile"
fake_deb wfrench "$tmp/nofile" francais chat chien maison
fetch "$tmp/nofile" "$tmp/out4"
check "a package without its list fails" [ $? -eq 1 ]
check "and says which file" said "holds no usr/share/dict/french"

cp -r "$tmp/good" "$tmp/latin1"
fake_deb wspanish "$tmp/latin1" spanish gato perro "ni\xf1o" casa
fetch "$tmp/latin1" "$tmp/out5"
check "a list not in its encoding fails" [ $? -eq 1 ]
check "and says so" said "spanish of wspanish_1.0_all.deb is not valid UTF-8"

cp -r "$tmp/good" "$tmp/broken"
echo "not a package" >"$tmp/broken/wpolish_1.0_all.deb"
fetch "$tmp/broken" "$tmp/out6"
check "an unreadable .deb fails" [ $? -eq 1 ]
check "and is named" said "wpolish_1.0_all.deb is not a readable .deb"

fetch "$tmp/good" "$tmp/out7" --train 3
check "too few words fails" [ $? -eq 1 ]
check "and says how many" said "en: only 3 words are in that list alone"

checks_done fetch-words
