/* Error names and messages, the version string, and the assertions'
 * report. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

#ifdef ADG_ASSERTIONS
void adg_assert_fail(const char *cond, const char *file, int line)
{
	fprintf(stderr, "libadg: %s:%d: invariant violated: %s\n", file, line,
		cond);
	abort();
}
#endif

const char *adg_version(void)
{
	return ADG_VERSION_STRING; /* meson's project version */
}

const char *adg_strerror(int code)
{
	switch (code) {
	case ADG_OK:
		return "success";
	case ADG_EINVAL:
		return "invalid argument";
	case ADG_ENOMEM:
		return "out of memory";
	case ADG_EFOREIGN:
		return "node belongs to another registry";
	case ADG_ECONSUMED:
		return "root's step was consumed by an earlier backward";
	case ADG_EUNAVAILABLE:
		return "a step the backward needs was consumed by an earlier "
		       "backward";
	case ADG_ENOIDS:
		return "node ids exhausted";
	case ADG_ENOTFOUND:
		return "no gradient for that node id";
	case ADG_EBUSY:
		return "registry still has live nodes";
	case ADG_ECALLBACK:
		return "a callback returned a positive value";
	default:
		return "unknown error";
	}
}
