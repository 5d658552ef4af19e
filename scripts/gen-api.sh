#!/bin/sh
# Writes docs/api.md from include/adg.h: every declaration with the comment
# above it, in the header's order, under the header's section rules. The
# header is the source; docs/api.md is generated and checked against it
# (tests: api-doc), so the two cannot drift.
# Usage: gen-api.sh [header] > docs/api.md
#        gen-api.sh --check header docs/api.md   (fails when they differ)
if [ "${1:-}" = --check ]; then
	"$0" "$2" | diff -u "$3" - >&2 || {
		echo "$3 is out of date: run scripts/gen-api.sh > $3" >&2
		exit 1
	}
	echo "$3 matches $2"
	exit 0
fi
header=${1:-include/adg.h}
awk '
function flush_comment(   t) {
	t = comment
	gsub(/^\/\* ?/, "", t); gsub(/ ?\*\/$/, "", t)
	gsub(/\n \* ?/, "\n", t); gsub(/\n \*$/, "", t)
	return t
}
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
NR == 1, /^#ifndef ADG_H/ {
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
/^\/\* -+ [a-z-]+ \*\/$/ {
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
/^(ADG_API|typedef|struct|enum|#define ADG_[A-Z])/ {
	if ($0 ~ /^#define ADG_(H|API)/) next
	decl = $0; depth = gsub(/\{/, "{") - gsub(/\}/, "}")
	if ($0 ~ /^#define/ && $0 ~ /\\$/) { in_macro = 1; next }
	if ($0 ~ /^#define/ || (depth <= 0 && $0 ~ /;/)) { emit(); next }
	in_decl = 1
	next
}
/^$/ { if (pending != "") { body[nsec] = body[nsec] pending "\n\n"; pending = "" } }
function emit(   d) {
	d = decl; gsub(/ADG_API /, "", d)
	body[nsec] = body[nsec] "### `" name_of(d) "`\n\n```c\n" d "\n```\n\n"
	if (pending != "") body[nsec] = body[nsec] pending "\n\n"
	pending = ""; in_decl = 0; decl = ""
}
END {
	print "# libadg API reference"
	print ""
	print "Generated from `include/adg.h` by `scripts/gen-api.sh`; do not edit."
	print "The header is the reference; this page is the same text, laid out."
	print ""
	print intro
	print ""
	for (i = 0; i <= nsec; i++) {
		if (body[i] == "") continue
		if (i > 0) { print "## " sections[i]; print "" }
		printf "%s", body[i]
	}
}' "$header"
