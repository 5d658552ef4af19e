# shellcheck shell=bash
# What the trainer scripts (digits.sh, fashion.sh, langid.sh), the
# comparisons with PyTorch (compare-*.sh), the data fetchers (fetch-*.sh)
# and the test steps (consumer-test.sh, rust-test.sh) share. Sourced, from
# the repository's root, where each of them starts.

# Runs a command as one check of a test step: prints "$1 $2: ok" or
# "$1 $2: FAILED" and counts it in the caller's passed or failed. Its one
# local has a name no caller uses: bash's locals are seen by the command
# it runs (a local prefix hid consumer-test.sh's).
count_check() { # step, check's name, then the command
	local count_check_label="$1 $2"
	shift 2
	if "$@"; then
		echo "$count_check_label: ok"
		passed=$((passed + 1))
	else
		echo "$count_check_label: FAILED"
		failed=$((failed + 1))
	fi
}

# Sets each "--NAME VALUE" of the arguments into the variable NAME (a dash
# in NAME becomes an underscore), for the names in $1 only (space
# separated); prints $2, the usage line, and exits 2 on anything else.
# Values are checked by the caller.
parse_options() {
	local names=" $1 " usage=$2 name
	shift 2
	while [ $# -gt 0 ]; do
		name=${1#--}
		if [ "$name" = "$1" ] || [[ $names != *" $name "* ]] || [ $# -lt 2 ]; then
			echo "usage: $usage" >&2
			exit 2
		fi
		printf -v "${name//-/_}" '%s' "$2"
		shift 2
	done
}

# Exits 2 unless $2 (the value of option $1) is a positive whole number.
want_number() {
	if ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
		echo "$1 wants a positive number, not '$2'" >&2
		exit 2
	fi
}

# Exits 2 unless $2 (the value of option $1) is a list like 1,2,8.
want_list() {
	if ! [[ $2 =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]]; then
		echo "$1 wants a list like 1,2, not '$2'" >&2
		exit 2
	fi
}

# Downloads the Debian packages $3... with apt-get into the folder $1
# (not installing them), logging to $1/apt.log; $2 names the caller in
# its messages. When that fails, updates the package lists (a fresh
# machine may have none yet) and tries once more. Returns 0, or 1 after
# printing apt-get's words, indented, for the caller to say what it
# wanted.
apt_download() {
	local dir=$1 who=$2 sudo="" try
	local opts=()
	shift 2
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	# As root, apt-get hands the download to its unprivileged _apt user,
	# which may not write into a private folder: download as root.
	[ "$(id -u)" -ne 0 ] || opts=(-o APT::Sandbox::User=root)
	for try in 1 2; do
		if (cd "$dir" && apt-get "${opts[@]}" download -q "$@") \
			>"$dir/apt.log" 2>&1; then
			return 0
		fi
		[ "$try" -eq 1 ] || break
		echo "$who: apt-get download failed; updating package lists" >&2
		$sudo apt-get update -qq >>"$dir/apt.log" 2>&1 || true
	done
	sed 's/^/    /' "$dir/apt.log" >&2
	return 1
}

# Builds targets $2... in $1, a release build of libadg and its examples
# (no tests, no MPI) that it sets up when it is not one yet.
build_release() {
	local dir=$1
	shift
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" --buildtype=release -Dtests=disabled \
			-Dmpi=disabled >/dev/null
	fi
	ninja -C "$dir" "$@" >/dev/null
}

# Whether $2, compiled from the C++ source $1 with the g++ flags after
# them, is missing or older than $1 or a header it includes: the headers
# g++ -MM names (the project's own and any -I folder's, not the system's),
# so that a change to a trainer's kernels rebuilds every program on them.
needs_build() {
	local src=$1 out=$2 dep
	shift 2
	[ -x "$out" ] || return 0
	for dep in $(g++ -MM -std=c++17 "$@" "$src" | sed 's/^[^:]*://; s/\\$//'); do
		[ "$dep" -nt "$out" ] && return 0
	done
	return 1
}

# Compiles $1, a floor (a trainer's kernels with a backward by hand, on
# OpenBLAS), into $2 when needs_build says so, as meson's release build
# compiles the trainer (-O3, C++17); the rest are more g++ arguments.
build_floor() {
	local src=$1 out=$2 blas libs
	shift 2
	blas=$(pkg-config --cflags openblas)
	libs=$(pkg-config --libs openblas)
	# shellcheck disable=SC2086 # pkg-config's words are meant to split
	if needs_build "$src" "$out" "$@" $blas; then
		g++ -O3 -std=c++17 -Wall -Wextra -Wshadow -Werror "$@" $blas \
			"$src" -o "$out" $libs
	fi
}

# Compiles $1, a program on PyTorch's C++ API, into $2 when needs_build
# says so; the rest are more g++ arguments. Debian's libtorch-dev has no
# pkg-config file: its C++ API's headers are under
# /usr/include/torch/csrc/api/include, the rest in default paths.
build_torch() {
	local src=$1 out=$2 api=/usr/include/torch/csrc/api/include
	shift 2
	if needs_build "$src" "$out" "$@" -isystem "$api"; then
		echo "building $out (libtorch's headers take a minute)" >&2
		g++ -O3 -std=c++17 -Wall -Wextra -Werror "$@" -isystem "$api" \
			"$src" -o "$out" -ltorch -ltorch_cpu -lc10 -pthread
	fi
}

# One line naming the machine and what the comparisons depend on.
describe_machine() {
	local cpu
	cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
	echo "machine: ${cpu:-unknown CPU}, $(nproc) cores (nproc), Debian" \
		"$(cat /etc/debian_version), gcc $(gcc -dumpfullversion)," \
		"libtorch $(package_version libtorch-dev), OpenBLAS" \
		"$(package_version libopenblas0), load average" \
		"$(cut -d' ' -f1-3 /proc/loadavg) at the start"
}

package_version() {
	dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo '?'
}

# Runs a command whose output has a "result key=value..." line, timed, and
# appends "$2 key=value... cpu_over_wall=X" to the file $1: $2 says which
# cell the run is of ("adg-sync 2", say), X is the whole process's CPU time
# over its wall time (how many cores it kept busy). The rest is the
# command. Exits when there is no result line.
timed_result() {
	local results=$1 cell=$2 timing out line
	shift 2
	timing=$(mktemp)
	out=$(/usr/bin/time -f '%e %U %S' -o "$timing" "$@")
	line=$(grep '^result ' <<<"$out") || {
		rm -f "$timing"
		echo "$cell: no result line" >&2
		exit 1
	}
	echo "$cell ${line#result } cpu_over_wall=$(awk \
		'{ printf "%.2f", ($1 > 0 ? ($2 + $3) / $1 : 0) }' "$timing")" \
		>>"$results"
	rm -f "$timing"
}

# awk functions for the comparisons' tables, to put before an awk program:
# median and max_of of a list of numbers separated by spaces, and
# verdict(ok): PASS or MISS.
# shellcheck disable=SC2034 # used by the scripts that source this
stats_awk='
function median(list,   v, n, i, j, t) {
	n = split(list, v, " ")
	for (i = 2; i <= n; i++)
		for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) {
			t = v[j]; v[j] = v[j - 1]; v[j - 1] = t
		}
	return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function max_of(list,   v, n, i, m) {
	n = split(list, v, " "); m = v[1]
	for (i = 2; i <= n; i++) if (v[i] + 0 > m + 0) m = v[i]
	return m
}
function verdict(ok) { return ok ? "PASS" : "MISS" }
'

# awk functions for the comparisons of a trainer with PyTorch by cells
# (compare-langid.sh, compare-tagger.sh), to put after $stats_awk. Each
# line of their results is timed_result's "KIND T key=value ...", KIND
# one of adg-sync, adg-PER (a graph per PER), adg-hogwild, torch-batched,
# torch-PER, floor (T = 1), adg-models (T: the models) and accuracy-*.
#   read_cell(speed)   files the line under (kind, t): its speed (the key
#                      speed, "samples_per_s" say) in rate, per_model,
#                      acc, busy, hash (varies: more than one); the
#                      thread counts, in the order seen, in ts[1..n]
#   speed_table(per)   the table of medians by T (sync, vs_torch, vs_per
#                      and vs_floor kept for the targets)
#   models_table(unit) --models N's total and each model's speed
#   threads_report(kinds)  each kind's CPU / wall time, the most of any
#                      run; at T = 1 PASS when no kind used over 1.10
#   sync_checks()      sync's weights: one hash a T
# shellcheck disable=SC2034,SC2016 # used by the scripts that source this; the $ are awk's
cells_awk='
function read_cell(speed,   i, kv, kind, t) {
	kind = $1; t = $2
	delete f
	for (i = 3; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
	if (kind == "adg-models") {
		models[t] = 1
	} else if (kind !~ /^accuracy/ && !(t in seen)) {
		seen[t] = 1; ts[++n] = t
	}
	rate[kind, t] = rate[kind, t] " " f[speed]
	per_model[kind, t] = per_model[kind, t] " " f["per_model_" speed]
	acc[kind, t] = acc[kind, t] " " f["test_accuracy"]
	busy[kind, t] = busy[kind, t] " " f["cpu_over_wall"]
	if ("weights" in f) {
		if ((kind, t) in hash && hash[kind, t] != f["weights"])
			varies[kind, t] = 1
		hash[kind, t] = f["weights"]
	}
}
function speed_table(per,   i, t, s, w, h, tb, tw, best, fl) {
	print "| T | libadg sync | libadg sync, a graph per " per " | libadg Hogwild | PyTorch batched | PyTorch a graph per " per " (Hogwild) | libadg / PyTorch'"'"'s better | a graph per " per ": libadg / PyTorch | floor | floor / libadg |"
	print "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	for (i = 1; i <= n; i++) {
		t = ts[i]
		s = median(rate["adg-sync", t]); w = median(rate["adg-" per, t])
		h = median(rate["adg-hogwild", t])
		tb = median(rate["torch-batched", t]); tw = median(rate["torch-" per, t])
		best = tb > tw ? tb : tw
		sync[t] = s; vs_torch[t] = s / best; vs_per[t] = w / tw
		fl = t == 1 ? median(rate["floor", 1]) : 0
		if (t == 1) vs_floor = fl / s
		printf "| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f | %s | %s |\n",
			t, s, w, h, tb, tw, s / best, w / tw,
			t == 1 ? sprintf("%.0f", fl) : "-",
			t == 1 ? sprintf("%.2f", fl / s) : "-"
	}
}
function models_table(unit,   m) {
	print "| --models N | total " unit " | each model'"'"'s " unit " |"
	print "|---:|---:|---:|"
	for (m = 1; m <= 1024; m++)
		if (m in models)
			printf "| %d | %.0f | %.0f |\n", m,
				median(rate["adg-models", m]),
				median(per_model["adg-models", m])
}
function threads_report(list,   kinds, k, i, j, t, b, line, ok) {
	print "Threads (CPU time / wall time of the whole process, the most of any run):"
	k = split(list, kinds, " ")
	for (i = 1; i <= n; i++) {
		t = ts[i]; line = ""; ok = 1
		for (j = 1; j <= k; j++)
			if ((kinds[j], t) in busy) {
				b = max_of(busy[kinds[j], t])
				line = line sprintf(" %s %.2f", kinds[j], b)
				if (b > 1.10) ok = 0
			}
		if (t == 1)
			printf "  %s T=1: one core each (at most 1.10):%s\n", verdict(ok), line
		else
			printf "  info T=%d:%s\n", t, line
	}
}
function sync_checks(   i, t) {
	print "Checks:"
	for (i = 1; i <= n; i++) {
		t = ts[i]
		printf "  %s T=%d: sync gives the same weights in every run (%s)\n",
			verdict(!varies["adg-sync", t]), t, hash["adg-sync", t]
	}
}
'

# Draws training loss and test accuracy against training time, side by
# side, into the PNG $1, titled $2, from gnuplot plot clauses $3 (the
# loss) and $4 (the accuracy); $5, more gnuplot settings for the accuracy
# (a yrange, say), and "log" as $6 for a loss on a logarithmic scale.
plot_against_time() {
	local log_on="" log_off=""
	if [ "${6:-}" = log ]; then
		log_on="set logscale y"
		log_off="unset logscale y"
	fi
	gnuplot <<GNUPLOT
set terminal pngcairo size 1000,400 font "sans,10"
set output "$1"
set datafile separator ","
set key autotitle columnhead
set multiplot layout 1,2 title "$2"
set xlabel "training time (s)"
set ylabel "training loss"
$log_on
set grid
plot $3
$log_off
set ylabel "test accuracy (%)"
${5:-}
set key bottom right
plot $4
unset multiplot
GNUPLOT
}
