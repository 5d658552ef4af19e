/* What an executor's jobs may and may not outlive, and the locks a
 * backward on an executor holds across user code (issue 23): a job still
 * queued when the caller frees the registry, a recompute that lets the
 * executor run steps of its own backward, and several steps asking for
 * rebuilt outputs at once. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------ jobs that outlive a backward */

/* A gate a job waits at, so that libadg's pool is busy while a backward
 * runs and the backward's own job stays queued behind it. */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t changed;
	bool entered, open;
};

static void gate_job(void *arg)
{
	struct gate *g = arg;
	pthread_mutex_lock(&g->lock);
	g->entered = true;
	pthread_cond_broadcast(&g->changed);
	while (!g->open)
		pthread_cond_wait(&g->changed, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static void gate_wait_entered(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	while (!g->entered)
		pthread_cond_wait(&g->changed, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static void gate_open(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->open = true;
	pthread_cond_broadcast(&g->changed);
	pthread_mutex_unlock(&g->lock);
}

/* y = (a * b) * (a * c): the root has two parents that are ops, so the
 * caller makes two steps ready at once and offers the second to a job. */
static scalar two_branches(adg_registry *r, scalar *leaves)
{
	leaves[0] = s_leaf(r, 2);
	leaves[1] = s_leaf(r, 3);
	leaves[2] = s_leaf(r, 5);
	scalar ab = s_mul(r, leaves[0], leaves[1]);
	scalar ac = s_mul(r, leaves[0], leaves[2]);
	scalar y = s_mul(r, ab, ac);
	s_drop(ab);
	s_drop(ac);
	return y;
}

/* Runs two_branches' backward on exec, checks its gradients, and drops
 * every node and the container: the registry then has nothing alive. */
static void backward_then_drop(adg_registry *r, const adg_executor *exec)
{
	scalar l[3];
	scalar y = two_branches(r, l);
	adg_backward_options o = {.executor = exec};
	adg_grads *g;
	cr_assert_eq(adg_backward_with(r, y.node, scalar_box(1), &scalar_ops,
				       &o, &g),
		     0);
	cr_expect_eq(s_grad(g, l[0]), 2 * 2 * 3 * 5);
	cr_expect_eq(s_grad(g, l[1]), 2 * 2 * 5);
	cr_expect_eq(s_grad(g, l[2]), 2 * 2 * 3);
	cr_assert_eq(adg_grads_free(g), 0);
	s_drop(y);
	for (int i = 0; i < 3; i++)
		s_drop(l[i]);
}

/* A registry whose allocator's state is on the heap, as a caller's that
 * lets it go after adg_registry_free: AddressSanitizer then sees a late
 * job that still uses it. */
static adg_registry *registry_on_heap_allocator(failing_alloc **state)
{
	*state = calloc(1, sizeof **state);
	cr_assert_not_null(*state);
	adg_registry_options ro = {.allocator = failing_allocator(*state)};
	adg_registry *r;
	cr_assert_eq(adg_registry_new(&ro, &r), 0);
	return r;
}

/* Frees r while jobs of its backward passes are still queued: every byte
 * is back by then, and the caller lets its allocator go before the jobs
 * run. Before the fix the job's 48-byte ticket was still out ('48 bytes
 * left'), and AddressSanitizer reported the late job's free through the
 * allocator as a heap-use-after-free. */
static void free_registry_with_jobs_queued(adg_registry *r, failing_alloc *fa)
{
	cr_assert_eq(adg_registry_free(r), 0);
	cr_expect_eq(atomic_load(&fa->live_bytes), 0,
		     "%ld bytes left with the registry freed",
		     atomic_load(&fa->live_bytes));
	free(fa);
}

/* libadg's pool of 1 thread, busy with another job while the backward
 * runs: the backward's job is still queued when the registry is freed. */
Test(executor, registry_free_with_a_job_queued_on_the_pool)
{
	failing_alloc *fa;
	adg_registry *r = registry_on_heap_allocator(&fa);
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(1, &pool), 0);
	adg_executor exec;
	cr_assert_eq(adg_pool_executor(pool, &exec), 0);

	struct gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
			    false, false};
	cr_assert_eq(exec.submit(gate_job, &gate, exec.ctx), 0);
	gate_wait_entered(&gate); /* the pool's one thread is busy */
	backward_then_drop(r, &exec);
	free_registry_with_jobs_queued(r, fa);

	gate_open(&gate);
	cr_assert_eq(adg_pool_free(pool), 0); /* runs the late job */
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
}

/* A caller's executor that runs jobs later, when the caller says. */
struct deferred {
	size_t n;
	struct {
		void (*fn)(void *);
		void *arg;
	} jobs[64];
	pthread_mutex_t lock;
};

static int deferred_submit(void (*fn)(void *), void *arg, void *ctx)
{
	struct deferred *d = ctx;
	pthread_mutex_lock(&d->lock);
	int rc = d->n < 64 ? 0 : ADG_ENOMEM;
	if (rc == 0) {
		d->jobs[d->n].fn = fn;
		d->jobs[d->n++].arg = arg;
	}
	pthread_mutex_unlock(&d->lock);
	return rc;
}

static void deferred_run_all(struct deferred *d)
{
	for (size_t i = 0; i < d->n; i++)
		d->jobs[i].fn(d->jobs[i].arg);
	d->n = 0;
}

/* The same with an executor that runs nothing until the caller drains it,
 * after the registry and its allocator are gone. */
Test(executor, registry_free_with_deferred_jobs)
{
	failing_alloc *fa;
	adg_registry *r = registry_on_heap_allocator(&fa);
	struct deferred d = {.lock = PTHREAD_MUTEX_INITIALIZER};
	adg_executor exec = {deferred_submit, &d, 2};

	backward_then_drop(r, &exec);
	backward_then_drop(r, &exec);
	cr_assert_gt(d.n, 0, "no job was submitted: the test tests nothing");
	free_registry_with_jobs_queued(r, fa);
	deferred_run_all(&d); /* each finds its run closed and returns */
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
}
