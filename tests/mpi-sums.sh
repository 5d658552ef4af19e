#!/usr/bin/env bash
# The promise of examples/mpi_data_parallel's sums across ranks (issue 31).
#
# algorithms MPIRUN EXE R T: trains R ranks x T threads with Open MPI's
# all-reduce algorithm forced in turn (libnbc's for MPI_Iallreduce, 1 to
# 4, tuned's for MPI_Allreduce, 1 to 6, and neither), and fails unless
# every run prints the same weights fingerprint, and that fingerprint is
# the one of the same fold simulated in one process (--simulate-ranks R).
#
# ranks MPIRUN EXE: trains R ranks x T threads for R x T in 1 x 4, 2 x 2,
# 4 x 1, 3 x 1 and 5 x 3, and one process of one thread, and fails unless
# every run prints the same weights fingerprint: the job's units are
# fixed (16 of 4 samples), and the ranks' partial sums are folded over
# the job's tree, so neither R nor T changes a bit (issue 42).
#
# failure MPIRUN EXE: rank 1 of 2 fails step 5 on purpose; fails unless
# the job stops with a non-zero status within 60 s, the agreed message
# names the step and the rank, and the weights it reports are those of a
# clean run of 4 steps (no rank applied step 5).
#
# Open MPI asks for OMPI_ALLOW_RUN_AS_ROOT* as root; meson sets them.
set -euo pipefail
steps=20

# The fingerprint a run prints; the run's output on a failure.
fingerprint() {
	local out
	if ! out=$(timeout 120 "$@" 2>&1); then
		echo "failed: $*" >&2
		echo "$out" >&2
		return 1
	fi
	grep -o 'weights fingerprint [0-9a-f]*' <<<"$out" | cut -d' ' -f3
}

algorithms() {
	local mpirun=$1 exe=$2 ranks=$3 threads=$4 want got a bad=0
	# shellcheck disable=SC2054 # the comma is mpirun's, in one word
	local run=("$mpirun" --oversubscribe --mca btl self,vader -np "$ranks")
	local train=("$exe" --threads "$threads" "$steps")
	want=$(fingerprint "$mpirun" -np 1 "$exe" --simulate-ranks "$ranks" \
		--threads "$threads" "$steps")
	echo "simulated in one process: $want"
	local settings=("")
	for a in 1 2 3 4; do
		settings+=("--mca coll_libnbc_iallreduce_algorithm $a")
	done
	for a in 1 2 3 4 5 6; do
		settings+=("--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm $a")
	done
	local setting
	for setting in "${settings[@]}"; do
		# shellcheck disable=SC2086 # the setting is words for mpirun
		got=$(fingerprint "${run[@]}" $setting "${train[@]}")
		echo "${setting:-default}: $got"
		[ "$got" = "$want" ] || bad=$((bad + 1))
	done
	if [ $bad -ne 0 ]; then
		echo "FAIL: $bad of ${#settings[@]} runs at $ranks x $threads" \
			"differ from the fold simulated in one process" >&2
		return 1
	fi
	echo "PASS: $ranks ranks x $threads threads, the same bits with every" \
		"algorithm (${#settings[@]} runs)"
}

ranks() {
	local mpirun=$1 exe=$2 want got run bad=0
	want=$(fingerprint "$mpirun" -np 1 "$exe" --threads 1 "$steps")
	echo "1 process x 1 thread: $want"
	for run in 1x4 2x2 4x1 3x1 5x3; do
		got=$(fingerprint "$mpirun" --oversubscribe --mca btl self,vader \
			-np "${run%x*}" "$exe" --threads "${run#*x}" "$steps")
		echo "$run: $got"
		[ "$got" = "$want" ] || bad=$((bad + 1))
	done
	if [ $bad -ne 0 ]; then
		echo "FAIL: $bad of 5 ranks x threads differ from one thread" >&2
		return 1
	fi
	echo "PASS: one fingerprint over 1 x 1, 1 x 4, 2 x 2, 4 x 1, 3 x 1, 5 x 3"
}

failure() {
	local mpirun=$1 exe=$2 out status=0 clean
	# shellcheck disable=SC2054 # the comma is mpirun's, in one word
	local run=("$mpirun" --oversubscribe --mca btl self,vader -np 2 "$exe"
		--threads 2)
	clean=$(fingerprint "${run[@]}" 4)
	out=$(timeout 60 "${run[@]}" --fail-rank 1 --fail-step 5 "$steps" 2>&1) ||
		status=$?
	echo "$out" | grep -v '^---\|^ \|^$' || true
	if [ $status -eq 124 ] || [ $status -eq 137 ]; then
		echo "FAIL: the job hung (killed after 60 s)" >&2
		return 1
	fi
	if [ $status -eq 0 ]; then
		echo "FAIL: the job exited 0 with a failed step" >&2
		return 1
	fi
	local agreed="step 5 failed on rank 1; no rank applied it; the weights are those after step 4 on every rank, fingerprint $clean"
	if ! grep -qF "$agreed" <<<"$out"; then
		echo "FAIL: no line '$agreed'" >&2
		return 1
	fi
	if ! grep -qF "rank 1: step 5: failed on purpose" <<<"$out"; then
		echo "FAIL: rank 1 did not say why" >&2
		return 1
	fi
	echo "PASS: every rank stopped at step 5 (status $status), the weights" \
		"of 4 clean steps ($clean)"
}

case ${1:-} in
algorithms) [ $# -eq 5 ] && algorithms "${@:2}" ;;
ranks) [ $# -eq 3 ] && ranks "${@:2}" ;;
failure) [ $# -eq 3 ] && failure "${@:2}" ;;
*)
	echo "usage: $0 algorithms MPIRUN EXE R T | ranks MPIRUN EXE |" \
		"failure MPIRUN EXE" >&2
	exit 2
	;;
esac
