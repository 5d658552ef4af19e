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

int adg_allocator_check(const char *func, const adg_allocator *a)
{
	if ((a->alloc == NULL) == (a->free == NULL))
		return 0;
	return adg_fail(
		ADG_EINVAL, func, "options->allocator has %s without %s",
		a->alloc ? "alloc" : "free", a->alloc ? "free" : "alloc");
}
