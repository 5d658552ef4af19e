/* The fixture most tests share: see fixture.h. */
#include "fixture.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

adg_registry *reg;
failing_alloc fixture_alloc;

void fixture_open(const adg_registry_options *o)
{
	atomic_store(&scalar_values_live, 0);
	atomic_store(&scalar_steps_live, 0);
	atomic_store(&scalar_outputs_live, 0);
	atomic_store(&scalar_outputs_made, 0);
	atomic_store(&scalar_outputs_peak, 0);
	memset(&fixture_alloc, 0, sizeof fixture_alloc);
	cr_assert_eq(adg_registry_new(o, &reg), 0);
}

void fixture_open_default(void)
{
	fixture_open(NULL);
}

void fixture_close(void)
{
	cr_assert_eq(adg_registry_free(reg), 0, "nodes left alive");
	reg = NULL;
	cr_assert_eq(atomic_load(&scalar_values_live), 0, "gradients leaked");
	cr_assert_eq(atomic_load(&scalar_steps_live), 0, "steps leaked");
	cr_assert_eq(atomic_load(&scalar_outputs_live), 0,
		     "outputs leaked: %ld of %ld made",
		     atomic_load(&scalar_outputs_live),
		     atomic_load(&scalar_outputs_made));
	/* adg_registry_free frees what waits for a grace period */
	cr_assert_eq(atomic_load(&fixture_alloc.live_bytes), 0,
		     "the allocator still holds %ld bytes",
		     atomic_load(&fixture_alloc.live_bytes));
#if defined(__SANITIZE_ADDRESS__)
	cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "heap leak");
#endif
}

void run_threads(int n, void *(*fn)(void *), void *s)
{
	pthread_t *t = malloc(n * sizeof *t);
	struct thread *arg = malloc(n * sizeof *arg);
	cr_assert(t != NULL && arg != NULL);
	for (int i = 0; i < n; i++) {
		arg[i] = (struct thread){s, i};
		cr_assert_eq(pthread_create(&t[i], NULL, fn, &arg[i]), 0);
	}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	free(t);
	free(arg);
}
