/* The out-of-line part of util.h: the assertions' report and the default
 * allocator. */
#include "util.h"

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

static void *util_malloc(size_t size, void *ctx)
{
	(void)ctx;
	return malloc(size);
}

static void util_free(void *ptr, size_t size, void *ctx)
{
	(void)size;
	(void)ctx;
	free(ptr);
}

const adg_allocator adg_default_allocator = {util_malloc, util_free, NULL};
