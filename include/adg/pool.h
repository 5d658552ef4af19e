/*
 * libadg's thread pool: an executor (adg_executor) of its own threads. An
 * annex (lib/pool.c): built on the public API alone. Part of <adg.h>, which
 * includes it where its section stands; including this header alone
 * includes <adg.h>.
 */
#ifndef ADG_POOL_H
#define ADG_POOL_H

#include "../adg.h" /* beside this one, whatever the include path */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct adg_pool adg_pool; /* libadg's own worker threads */

/* Set size (adg.h, "ABI"), zero the rest, then set what you need. */
typedef struct adg_pool_options {
	size_t size;	    /* sizeof the caller's struct (adg.h, "ABI") */
	unsigned n_threads; /* 1 to ADG_EXECUTOR_MAX_WORKERS */
	/* Both callbacks, or neither (malloc and free): the pool's own
	 * memory, its job queue included. A registry's (see
	 * adg_registry_allocator) keeps a trainer's memory in one place;
	 * the allocator must then outlive the pool. */
	adg_allocator allocator;
} adg_pool_options;

/* Starts options->n_threads threads that run submitted work and sleep,
 * without spinning, while there is none. A pool belongs to no registry.
 * Errors: ADG_EINVAL (NULL argument, n_threads out of range, one
 * allocator callback), ADG_ENOMEM (no memory or no thread could start;
 * nothing is left running). */
ADG_API int adg_pool_new_with(const adg_pool_options *options, adg_pool **out);

/* adg_pool_new_with with n_threads and malloc. */
ADG_API int adg_pool_new(unsigned n_threads, adg_pool **out);

/* Fills *out with an executor that submits to pool, offering all of its
 * threads to each backward. The pool must outlive every backward that
 * uses it. Errors: ADG_EINVAL (NULL argument). */
ADG_API int adg_pool_executor(adg_pool *pool, adg_executor *out);

/* Runs what was submitted and not yet run, stops the threads and frees
 * the pool. NULL is a no-op that returns 0. Must not be called while a
 * backward uses the pool, nor from one of its threads (ADG_EINVAL). */
ADG_API int adg_pool_free(adg_pool *pool);

#ifdef __cplusplus
}
#endif

#endif /* ADG_POOL_H */
