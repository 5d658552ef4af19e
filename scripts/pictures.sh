#!/usr/bin/env bash
# Draws docs/guide.md's pictures of examples/trace.c's graph and of its
# threaded backward: the graph with Graphviz (dot -Tpng, the DOT that
# adg_graph_write_dot wrote), the trace-event file as a timeline with
# gnuplot (a row per thread, a bar per step). Writes docs/images/graph.png,
# docs/images/trace.png and docs/images/trace.json (which chrome://tracing
# and Perfetto open). Installs graphviz and gnuplot when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh pictures
dir=build-pictures
if [ ! -f "$dir/build.ninja" ]; then
	meson setup "$dir" --buildtype=release -Dtests=disabled >/dev/null
fi
ninja -C "$dir" examples/trace >/dev/null
out=docs/images
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$dir/examples/trace" "$out/trace.json" "$tmp/graph.dot"
dot -Tpng -Gdpi=80 "$tmp/graph.dot" -o "$out/graph.png"
# One event a line: name, tid, ts and dur (us) -> "tid start end name".
sed -n 's/.*"name": "\([^"]*\)", "ph": "X", "ts": \([0-9.]*\), "dur": \([0-9.]*\), "pid": 1, "tid": \([0-9]*\).*/\4 \2 \3 \1/p' \
	"$out/trace.json" | awk '{ print $1, $2, $2 + $3, $4 }' >"$tmp/bars"
threads=$(awk 'BEGIN { n = 0 } $1 + 1 > n { n = $1 + 1 } END { print n }' "$tmp/bars")
gnuplot <<GNUPLOT
set terminal pngcairo size 900,$((120 + 60 * threads)) font "sans,10"
set output "$out/trace.png"
set title "examples/trace.c: a backward on libadg's pool, one row per thread"
set xlabel "microseconds since the backward began"
set ytics 1
set yrange [-0.6:$threads - 0.4]
set ylabel "thread"
set style fill solid 0.6 border lc rgb "black"
unset key
plot "$tmp/bars" using (\$2 + \$3) / 2:1:2:3:(\$1 - 0.35):(\$1 + 0.35) \
	with boxxyerror lc rgb "#4878a8"
GNUPLOT
echo "wrote $out/graph.png, $out/trace.png, $out/trace.json"
