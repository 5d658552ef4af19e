#!/bin/sh
# Writes docs/api.md from include/adg.h: every declaration with the comment
# above it, in the header's order, under the header's section rules; then,
# when adg.hpp sits next to the header, the C++ layer's the same way. A part
# of the API in a header of its own, which adg.h includes (#include
# "adg/NAME.h": an annex's), gets a page of its own, docs/api-NAME.md, which
# docs/api.md links to where the header is included. The headers are the
# source; the pages are generated and checked against them (tests:
# api-doc), so they cannot drift.
# Usage: gen-api.sh [header] > page    (one header's page)
#        gen-api.sh --write [header page]    (its page and its parts';
#                                             include/adg.h, docs/api.md)
#        gen-api.sh --check header page    (fails when one of them differs)

# Each page of header $1, whose own page is $2: "header<TAB>page" lines.
pages() {
	printf '%s\t%s\n' "$1" "$2"
	sed -n 's|^#include "adg/\([a-z_]*\)\.h"$|\1|p' "$1" | while read -r part; do
		printf '%s\t%s\n' "$(dirname "$1")/adg/$part.h" \
			"$(dirname "$2")/api-$part.md"
	done
}
tab=$(printf '\t')
case ${1:-} in
--check)
	pages "$2" "$3" | {
		status=0
		while IFS=$tab read -r h page; do
			if "$0" "$h" | diff -u "$page" - >&2; then
				cpp_header=$(dirname "$h")/adg.hpp
				case $h in
				*/adg/*.h) cpp_header=${h%.h}.hpp ;;
				esac
				if [ -f "$cpp_header" ]; then
					echo "$page matches $h and $cpp_header"
				else
					echo "$page matches $h"
				fi
			else
				echo "$page is out of date: run scripts/gen-api.sh --write" >&2
				status=1
			fi
		done
		exit $status
	}
	exit
	;;
--write)
	pages "${2:-include/adg.h}" "${3:-docs/api.md}" |
		while IFS=$tab read -r h page; do
			"$0" "$h" >"$page" || exit 1
			echo "wrote $page"
		done
	exit
	;;
esac
header=${1:-include/adg.h}
# The header as the page names it, from include/ on, and its part's name
# (NAME of include/adg/NAME.h; empty for adg.h).
origin=include/${header##*include/}
part=
case $origin in
include/adg/*.h) part=${origin#include/adg/} part=${part%.h} ;;
esac
# What both headers' pages share: a comment's text, and the page laid out
# from the introduction (intro) and the sections' bodies.
common='
function flush_comment(   t) {
	t = comment
	gsub(/^\/\* ?/, "", t); gsub(/ ?\*\/$/, "", t)
	gsub(/\n \* ?/, "\n", t); gsub(/\n \*$/, "", t)
	return t
}
function print_page(title, note,   i) {
	print title
	print ""
	print note
	print ""
	print intro
	print ""
	for (i = 0; i <= nsec; i++) {
		if (body[i] == "") continue
		if (i > 0) { print "## " sections[i]; print "" }
		printf "%s", body[i]
	}
}
'
# The C++ beside it: adg.hpp for adg.h, adg/NAME.hpp for a part.
cpp_header=$(dirname "$header")/${part:-adg}.hpp
cpp_origin=include/${cpp_header##*include/}
awk -v origin="$origin" -v part="$part" "$common"'
function last_ident(t,   n, w) {
	n = split(t, w, /[^A-Za-z0-9_]+/)
	while (n > 0 && w[n] == "") n--
	return w[n]
}
function name_of(d,   t) {
	if (d ~ /^#define/) { split(d, w, /[ (]/); return w[2] }
	if (d ~ /^typedef/ && d !~ /\{/ && d ~ /\(\*/) {
		t = d; sub(/^[^(]*\(\*/, "", t); sub(/\).*/, "", t); return t
	}
	if (d ~ /^typedef/) { t = d; sub(/;[^;]*$/, "", t); return last_ident(t) }
	if (d ~ /^(struct|enum) /) { split(d, w, /[ {]+/); return w[1] " " w[2] }
	t = d; sub(/\(.*/, "", t)
	return last_ident(t)
}
BEGIN { in_comment = 0; in_decl = 0; in_macro = 0; depth = 0; comment = ""; nsec = 0 }
# the file banner (before the include guard) is the introduction
NR == 1, /^#ifndef ADG_([A-Z]+_)?H$/ {
	if ($0 ~ /^#ifndef/) { intro = flush_comment(); comment = ""; next }
	comment = comment (comment == "" ? "" : "\n") $0
	next
}
# a macro continued with backslashes (ADG_ERROR_MAP) is shown whole
in_macro {
	decl = decl "\n" $0
	if ($0 !~ /\\$/) { in_macro = 0; emit() }
	next
}
in_decl {
	decl = decl "\n" $0
	depth += gsub(/\{/, "{") - gsub(/\}/, "}")
	if (depth <= 0 && $0 ~ /;/) emit()
	next
}
/^\/\* -+ [a-z -]+ \*\/$/ {
	s = $0; gsub(/^\/\* -+ | \*\/$/, "", s)
	sections[++nsec] = s; body[nsec] = ""
	next
}
/^\/\*/ {
	comment = $0; in_comment = ($0 !~ /\*\//)
	if (!in_comment) pending = flush_comment()
	next
}
in_comment {
	comment = comment "\n" $0
	if ($0 ~ /\*\//) { in_comment = 0; pending = flush_comment() }
	next
}
# a part in a header of its own: a link to its page
/^#include "adg\/[a-z_]+\.h"$/ {
	p = $0; gsub(/^#include "adg\/|\.h"$/, "", p)
	body[nsec] = body[nsec] "In a header of its own, `<adg/" p ".h>`, which `<adg.h>` includes: [api-" p ".md](api-" p ".md).\n\n"
	next
}
/^(ADG_API|typedef|struct|enum|#define ADG_[A-Z])/ {
	if ($0 ~ /^#define ADG_(([A-Z]+_)?H$|API)/) next
	decl = $0; depth = gsub(/\{/, "{") - gsub(/\}/, "}")
	if ($0 ~ /^#define/ && $0 ~ /\\$/) { in_macro = 1; next }
	if ($0 ~ /^#define/ || (depth <= 0 && $0 ~ /;/)) { emit(); next }
	in_decl = 1
	next
}
/^$/ { if (pending != "") { body[nsec] = body[nsec] pending "\n\n"; pending = "" } }
function emit(   d, n) {
	d = decl; gsub(/ADG_API /, "", d)
	n = name_of(d)
	# a macro defined in each branch of an #if (ADG_DEPRECATED) is shown
	# once, as the first defines it: its comment says what the others do
	if (d ~ /^#define/ && (n in shown)) { in_decl = 0; decl = ""; return }
	shown[n] = 1
	body[nsec] = body[nsec] "### `" name_of(d) "`\n\n```c\n" d "\n```\n\n"
	if (pending != "") body[nsec] = body[nsec] pending "\n\n"
	pending = ""; in_decl = 0; decl = ""
}
END {
	note = "Generated from `" origin "` by `scripts/gen-api.sh`; do not edit.\nThe header is the reference; this page is the same text, laid out."
	if (part == "")
		print_page("# libadg API reference", note)
	else
		print_page("# libadg API reference: `<adg/" part ".h>`", note "\nPart of [the API reference](api.md).")
}' "$header"
[ -f "$cpp_header" ] || exit 0

# The C++ header as one text: an annex's (adg/NAME.hpp) as it is; adg.hpp
# as its introduction, then, in the order it includes them, its parts'
# (adg/NAME.hpp with no adg/NAME.h beside it: an annex's has a page of its
# own) declarations, each part's up to its implementation section. A part
# without one (fwd.hpp) declares nothing of its own.
cpp_text() {
	if [ -n "$part" ]; then
		cat "$1"
		return
	fi
	sed -n '1,/^#ifndef ADG_HPP$/p' "$1"
	dir=$(dirname "$1")
	sed -n 's|^#include "adg/\([a-z_]*\)\.hpp"$|\1|p' "$1" |
		while read -r p; do
			[ -f "$dir/adg/$p.h" ] && continue
			grep -q '^/\* -* implementation \*/$' "$dir/adg/$p.hpp" ||
				continue
			sed -n '/^namespace adg$/,/^\/\* -* implementation \*\/$/p' \
				"$dir/adg/$p.hpp" | grep -v '^/\* -* implementation \*/$'
		done
	echo '/* ---------------------------------------------------------- implementation */'
}

# What comes before the implementation section is the reference: at
# namespace scope, each comment, then the declarations after it up to a
# blank line, private sections and bodies left out. Classes and functions
# are declared there and defined below, so nothing else needs parsing.
cpp_text "$cpp_header" | awk "$common"'
function name_of(d,   t) {
	t = d
	sub(/^template <[^>]*>[ \n]*/, "", t)
	if (t ~ /^(class|struct) /) { split(t, w, /[ \n{:;]+/); return w[2] }
	sub(/[(=].*/, "", t)
	n = split(t, w, /[^A-Za-z0-9_]+/)
	while (n > 0 && w[n] == "") n--
	return w[n]
}
# braces outside comments
function braces(line,   t) {
	t = line
	gsub(/\/\*.*\*\//, "", t)
	if (t ~ /^[ \t]*(\/\*|\*)/) return 0
	return gsub(/\{/, "{", t) - gsub(/\}/, "}", t)
}
function emit() {
	if (decl != "" && decl !~ /^(template <[^>]*> )?(class|struct) [a-z_]+;$/) {
		body[nsec] = body[nsec] "### `" name_of(decl) "`\n\n```cpp\n" decl "\n```\n\n"
		if (pending != "") body[nsec] = body[nsec] pending "\n\n"
	}
	pending = ""; decl = ""; depth = 0; hiding = 0
}
BEGIN { comment = ""; nsec = 0; in_comment = 0; decl = ""; depth = 0; started = 0 }
NR == 1, /^#ifndef ADG_[A-Z_]*HPP$/ {
	if ($0 ~ /^#ifndef/) { intro = flush_comment(); comment = ""; next }
	comment = comment (comment == "" ? "" : "\n") $0
	next
}
!started { if ($0 ~ /^namespace adg$/) started = 1; next }
/^namespace adg$/ { next } # where the next part begins
/^\/\* -+ implementation \*\/$/ { emit(); exit }
skipping { if ($0 ~ /^} \/\/ namespace/) skipping = 0; next }
decl != "" {
	if ($0 == "" && depth <= 0) { emit(); next }
	if (hiding) {
		if ($0 !~ /^}/) { depth += braces($0); next }
		hiding = 0
	} else if ($0 ~ /^[ \t]*private:/) {
		hiding = 1
		sub(/\n[ \t]*$/, "", decl) # the blank line before it
		next
	}
	decl = decl "\n" $0
	depth += braces($0)
	next
}
/^namespace detail/ { skipping = 1; next }
/^(#|\{$)/ { next }
/^\/\* -+ [a-z -]+ \*\/$/ {
	s = $0; gsub(/^\/\* -+ | \*\/$/, "", s)
	sections[++nsec] = s; body[nsec] = ""
	next
}
in_comment {
	comment = comment "\n" $0
	if ($0 ~ /\*\//) { in_comment = 0; pending = flush_comment() }
	next
}
/^\/\*/ {
	comment = $0; in_comment = ($0 !~ /\*\//)
	if (!in_comment) pending = flush_comment()
	next
}
/^$/ { if (pending != "") { body[nsec] = body[nsec] pending "\n\n"; pending = "" } next }
{ decl = $0; depth = braces($0) }
END {
	print_page("# C++ layer: `" cpp_origin "`", "Generated from `" cpp_origin "` by `scripts/gen-api.sh`; do not edit.")
}' cpp_origin="$cpp_origin"
