/*
 * The size rule of the structs a caller allocates and libadg reads (the
 * options) or fills (adg_stats, adg_failure): include/adg.h, "ABI". A
 * caller's struct starts with its size; libadg takes or writes only the
 * bytes both sides know, so a binary built against an older or a newer
 * header works with this library as long as it leaves the fields it knows
 * and libadg does not at zero.
 */
#include "util.h"

#include <string.h>

int adg_abi_check(const char *func, const char *what, const void *given,
		  size_t own, size_t first)
{
	const unsigned char *bytes = given;
	size_t size;

	memcpy(&size, bytes, sizeof size);
	if (size == 0)
		return adg_fail(ADG_EINVAL, func,
				"%s->size is 0: set it to sizeof the struct "
				"(adg.h, \"ABI\")",
				what);
	if (size < first)
		return adg_fail(ADG_EINVAL, func,
				"%s->size is %zu, below the struct's %zu bytes",
				what, size, first);
	/* Past libadg's own size: fields of a newer header, which libadg
	 * cannot honour, so they must be unset. */
	for (size_t i = own; i < size; i++)
		if (bytes[i] != 0)
			return adg_fail(
				ADG_EINVAL, func,
				"%s->size is %zu, past libadg %s's %zu bytes, "
				"and byte %zu is set: a field this library "
				"does not know",
				what, size, adg_version(), own, i);
	return 0;
}

int adg_abi_read(const char *func, const char *what, void *local, size_t own,
		 size_t first, const void *given)
{
	int rc = adg_abi_check(func, what, given, own, first);
	if (rc != 0)
		return rc;
	size_t size;
	memcpy(&size, given, sizeof size);
	size_t n = size < own ? size : own;
	/* Fields the caller's header lacks read as zero. */
	memcpy(local, given, n);
	memset((unsigned char *)local + n, 0, own - n);
	return 0;
}

void adg_abi_write(void *given, const void *local, size_t own)
{
	size_t size;

	memcpy(&size, given, sizeof size);
	size_t n = size < own ? size : own;
	/* The caller's size stays; of the rest, only the fields it knows. */
	memcpy((unsigned char *)given + sizeof size,
	       (const unsigned char *)local + sizeof size, n - sizeof size);
}
