/*
 * libadg's own executor: a fixed set of threads and one queue of jobs.
 *
 * A job here is a worker entering a backward (parallel.c), not a step: a
 * backward submits at most n_workers of them at a time, so a mutex and a
 * condition variable serve, and an idle thread sleeps in the kernel
 * rather than spinning on a core that a step could use.
 */
#include "adg.h"
#include "util.h"

#include <pthread.h>
#include <stdbool.h>

struct job {
	void (*fn)(void *arg);
	void *arg;
};

struct adg_pool {
	adg_allocator allocator; /* the caller's, or malloc's */
	pthread_mutex_t lock;
	pthread_cond_t more; /* a job was queued, or the pool stops */
	/* A ring of jobs, grown by doubling, under lock. */
	struct job *jobs;
	size_t cap, head, count;
	bool stopping;
	unsigned n_threads;
	pthread_t threads[];
};

/* The pool whose thread this is, to refuse adg_pool_free from it. */
static __thread struct adg_pool *this_pool;

static void *pool_thread(void *arg)
{
	struct adg_pool *pool = arg;
	this_pool = pool;
	pthread_mutex_lock(&pool->lock);
	for (;;) {
		while (pool->count == 0 && !pool->stopping)
			pthread_cond_wait(&pool->more, &pool->lock);
		/* Stopping still runs what is queued: a job holds memory
		 * that only running it gives back. */
		if (pool->count == 0)
			break;
		struct job job = pool->jobs[pool->head];
		pool->head = (pool->head + 1) % pool->cap;
		pool->count--;
		pthread_mutex_unlock(&pool->lock);
		job.fn(job.arg);
		pthread_mutex_lock(&pool->lock);
	}
	pthread_mutex_unlock(&pool->lock);
	return NULL;
}

/* Doubles the ring, under lock. */
static bool pool_grow(struct adg_pool *pool)
{
	const adg_allocator *a = &pool->allocator;
	size_t cap = pool->cap ? pool->cap * 2 : 16;
	struct job *jobs = a->alloc(cap * sizeof *jobs, a->ctx);
	if (jobs == NULL)
		return false;
	for (size_t i = 0; i < pool->count; i++)
		jobs[i] = pool->jobs[(pool->head + i) % pool->cap];
	if (pool->jobs != NULL)
		a->free(pool->jobs, pool->cap * sizeof *jobs, a->ctx);
	pool->jobs = jobs;
	pool->cap = cap;
	pool->head = 0;
	return true;
}

static int pool_submit(void (*fn)(void *arg), void *arg, void *ctx)
{
	struct adg_pool *pool = ctx;
	pthread_mutex_lock(&pool->lock);
	if (pool->count == pool->cap && !pool_grow(pool)) {
		pthread_mutex_unlock(&pool->lock);
		return ADG_ENOMEM; /* the backward goes on without it */
	}
	pool->jobs[(pool->head + pool->count) % pool->cap] =
		(struct job){fn, arg};
	pool->count++;
	pthread_cond_signal(&pool->more);
	pthread_mutex_unlock(&pool->lock);
	return 0;
}

static size_t pool_size(unsigned n_threads)
{
	return sizeof(struct adg_pool) +
	       n_threads * sizeof(((struct adg_pool *)0)->threads[0]);
}

/* Stops the first n threads (and frees the pool): nothing is queued or
 * everything queued runs first. */
static void pool_stop(struct adg_pool *pool, unsigned n)
{
	pthread_mutex_lock(&pool->lock);
	pool->stopping = true;
	pthread_cond_broadcast(&pool->more);
	pthread_mutex_unlock(&pool->lock);
	for (unsigned i = 0; i < n; i++)
		pthread_join(pool->threads[i], NULL);
	pthread_cond_destroy(&pool->more);
	pthread_mutex_destroy(&pool->lock);
	adg_allocator a = pool->allocator;
	if (pool->jobs != NULL)
		a.free(pool->jobs, pool->cap * sizeof *pool->jobs, a.ctx);
	a.free(pool, pool_size(pool->n_threads), a.ctx);
}

/* The reason pool_new refuses its arguments. */
static __attribute__((cold, noinline)) int
pool_invalid(const char *func, const adg_pool_options *options, adg_pool **out)
{
	if (out == NULL || options == NULL)
		return adg_fail(ADG_EINVAL, func, "%s is NULL",
				out == NULL ? "out" : "options");
	return adg_fail(ADG_EINVAL, func,
			"n_threads is %u (1 to ADG_EXECUTOR_MAX_WORKERS, %u)",
			options->n_threads, ADG_EXECUTOR_MAX_WORKERS);
}

static int pool_new(const char *func, const adg_pool_options *options,
		    adg_pool **out)
{
	if (out != NULL)
		*out = NULL;
	adg_pool_options o;
	if (out == NULL || options == NULL)
		return pool_invalid(func, options, out);
	int rc = ADG_ABI_READ(func, "options", &o, options,
			      ADG_ABI_FIRST_POOL_OPTIONS);
	if (rc != 0)
		return rc;
	options = &o;
	if (options->n_threads == 0 ||
	    options->n_threads > ADG_EXECUTOR_MAX_WORKERS)
		return pool_invalid(func, options, out);
	rc = adg_allocator_check(func, &options->allocator);
	if (rc != 0)
		return rc;
	adg_allocator a = options->allocator;
	if (a.alloc == NULL)
		a = adg_default_allocator;
	unsigned n_threads = options->n_threads;
	struct adg_pool *pool = a.alloc(pool_size(n_threads), a.ctx);
	if (pool == NULL)
		return adg_fail(ADG_ENOMEM, func,
				"the allocator gave no memory for the pool");
	*pool = (struct adg_pool){.allocator = a, .n_threads = n_threads};
	if (pthread_mutex_init(&pool->lock, NULL) != 0) {
		a.free(pool, pool_size(n_threads), a.ctx);
		return adg_fail(ADG_ENOMEM, func, "no mutex could be made");
	}
	if (pthread_cond_init(&pool->more, NULL) != 0) {
		pthread_mutex_destroy(&pool->lock);
		a.free(pool, pool_size(n_threads), a.ctx);
		return adg_fail(ADG_ENOMEM, func,
				"no condition variable could be made");
	}
	for (unsigned i = 0; i < n_threads; i++) {
		int err = pthread_create(&pool->threads[i], NULL, pool_thread,
					 pool);
		if (err != 0) {
			pool_stop(pool, i);
			return adg_fail(ADG_ENOMEM, func,
					"thread %u of %u could not start "
					"(pthread_create: error %d)",
					i, n_threads, err);
		}
	}
	*out = pool;
	return 0;
}

int adg_pool_new(unsigned n_threads, adg_pool **out)
{
	adg_pool_options o = {.size = sizeof o, .n_threads = n_threads};
	return pool_new(__func__, &o, out);
}

int adg_pool_new_with(const adg_pool_options *options, adg_pool **out)
{
	return pool_new(__func__, options, out);
}

int adg_pool_executor(adg_pool *pool, adg_executor *out)
{
	if (pool == NULL || out == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				pool == NULL ? "pool" : "out");
	*out = (adg_executor){
		.submit = pool_submit,
		.ctx = pool,
		.n_workers = pool->n_threads,
	};
	return 0;
}

int adg_pool_free(adg_pool *pool)
{
	if (pool == NULL)
		return 0;
	if (this_pool == pool) /* it would join itself */
		return ADG_FAIL(ADG_EINVAL,
				"called from one of the pool's own threads");
	pool_stop(pool, pool->n_threads);
	return 0;
}
