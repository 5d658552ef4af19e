# shellcheck shell=bash
# Sourced by scripts/many-cores.sh: what it packs for a machine that
# cannot build libadg.
#
# pack_libs STAGE WHO BINARY... copies every shared library the binaries
# load (ldd follows them through each other), by the name they ask for,
# into STAGE/lib, and glibc's own libraries and loader into STAGE/glibc: a
# fallback, as the target machine has a glibc of its own. Fails, naming
# them, when a library is missing here; WHO prefixes the message.

# glibc's libraries and loader, as ldd names them.
pack_glibc_re='^(ld-linux.*|lib(c|m|mvec|pthread|dl|rt|resolv|util|anl|nsl|BrokenLocale|thread_db|nss_[a-z0-9]+|c_malloc_debug))[.]so'

pack_libs() {
	local stage=$1 who=$2 libs name path
	shift 2
	mkdir -p "$stage/lib" "$stage/glibc"
	libs=$(ldd "$@")
	if grep -q 'not found' <<<"$libs"; then
		grep 'not found' <<<"$libs" >&2
		echo "$who: a library above is missing here" >&2
		return 1
	fi
	while read -r name path; do
		if [[ $name =~ $pack_glibc_re ]]; then
			cp -L "$path" "$stage/glibc/$name"
		else
			cp -L "$path" "$stage/lib/$name"
		fi
	done < <(awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }
		$1 ~ /^\/.*ld-linux/ { n = $1; sub(/.*\//, "", n); print n, $1 }' \
		<<<"$libs" | sort -u)
}
