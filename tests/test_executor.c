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
#include <time.h>

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
	adg_backward_options o = {.size = sizeof o, .executor = exec};
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
	adg_registry_options ro = {.size = sizeof ro,
				   .allocator = failing_allocator(*state)};
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

/* A caller's executor that runs no thread of its own: jobs wait in a list
 * until someone drains it, as a cooperative job system runs queued jobs at
 * its wait points. A recompute that drains it runs steps of its own
 * backward on its own thread, in the middle of adg_output_get. */
struct coop {
	pthread_mutex_t lock;
	size_t n;
	struct {
		void (*fn)(void *);
		void *arg;
	} jobs[256];
};

static int coop_submit(void (*fn)(void *), void *arg, void *ctx)
{
	struct coop *c = ctx;
	pthread_mutex_lock(&c->lock);
	int rc = c->n < 256 ? 0 : ADG_ENOMEM;
	if (rc == 0) {
		c->jobs[c->n].fn = fn;
		c->jobs[c->n++].arg = arg;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Runs queued jobs, newest first, until none is left. */
static void coop_drain(struct coop *c)
{
	for (;;) {
		pthread_mutex_lock(&c->lock);
		if (c->n == 0) {
			pthread_mutex_unlock(&c->lock);
			return;
		}
		c->n--;
		void (*fn)(void *) = c->jobs[c->n].fn;
		void *arg = c->jobs[c->n].arg;
		pthread_mutex_unlock(&c->lock);
		fn(arg);
	}
}

/* The same with an executor that runs nothing until the caller drains it,
 * after the registry and its allocator are gone. */
Test(executor, registry_free_with_deferred_jobs)
{
	failing_alloc *fa;
	adg_registry *r = registry_on_heap_allocator(&fa);
	struct coop d = {.lock = PTHREAD_MUTEX_INITIALIZER};
	adg_executor exec = {coop_submit, &d, 2};

	backward_then_drop(r, &exec);
	backward_then_drop(r, &exec);
	cr_assert_gt(d.n, 0, "no job was submitted: the test tests nothing");
	free_registry_with_jobs_queued(r, fa);
	coop_drain(&d); /* each finds its run closed and returns */
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
}

/* ------------------------------------------ rebuilt outputs on executors */

#define MAX_OUTPUTS  4
#define MAX_BRANCHES 14

/* c0 = op(a) keeps its output, a's value; r_i = op(c0) offers c0's plus
 * 1 + i, memory-bound, so the balanced strategy drops it at once and
 * rebuilds it when asked; branch j is y_j = op(r_{j % k}, w_j), whose step
 * asks for r_{j % k}'s output and checks it; the root is the product of
 * the branches. So k outputs are asked for by several steps at once. */
struct rebuilt {
	int k, branches;
	scalar a, c0, r[MAX_OUTPUTS], w[MAX_BRANCHES], y[MAX_BRANCHES], root;
	atomic_int rebuilds[MAX_OUTPUTS];
	atomic_int bad;	    /* a step got a wrong output */
	struct coop *drain; /* set: each recompute drains it first */
	bool jitter;	    /* recomputes and steps yield at random */
	/* The first recompute waits (10 s at most) until some step has got
	 * its output: one that, without the bounded sleep, would wait for
	 * that very recompute. */
	bool hold_first;
	atomic_bool got_output;
	atomic_bool held_in_vain;
};

/* What a rebuilt output's recompute and its askers' steps hold. */
struct rebuild_user {
	struct rebuilt *g;
	int i; /* which r_i */
	struct prod_step *prod;
};

/* Yields one call in three or so, by a per-thread xorshift: timing
 * perturbed differently on every thread and every run. */
static void maybe_yield(struct rebuilt *g)
{
	static __thread uint32_t x;
	if (!g->jitter)
		return;
	if (x == 0)
		x = (uint32_t)(uintptr_t)&x | 1;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	if (x % 3 == 0)
		sched_yield();
}

static int r_recompute(adg_recompute_call *call, void *user)
{
	struct rebuild_user *u = user;
	int before = atomic_fetch_add(&u->g->rebuilds[u->i], 1);
	if (u->g->hold_first && before == 0) {
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do {
			nanosleep(&(struct timespec){0, 1000000}, NULL);
			clock_gettime(CLOCK_MONOTONIC, &t);
		} while (!atomic_load(&u->g->got_output) &&
			 t.tv_sec - t0.tv_sec < 10);
		if (!atomic_load(&u->g->got_output))
			atomic_store(&u->g->held_in_vain, true);
	}
	if (u->g->drain != NULL)
		coop_drain(u->g->drain); /* runs steps of this very backward */
	maybe_yield(u->g);
	call->output =
		s_output_new(*(double *)call->parent_outputs[0] + 1 + u->i);
	return 0;
}

static int r_backward(adg_step_call *call, void *user)
{
	struct rebuild_user *u = user;
	return prod_backward(call, u->prod);
}

static int asker_backward(adg_step_call *call, void *user)
{
	struct rebuild_user *u = user;
	maybe_yield(u->g);
	void *out;
	int rc = adg_output_get(call, call->parent_ids[0], &out);
	if (rc != 0)
		return rc;
	if (*(double *)out != u->g->c0.value + 1 + u->i)
		atomic_fetch_add(&u->g->bad, 1);
	atomic_store(&u->g->got_output, true);
	return prod_backward(call, u->prod);
}

static void rebuild_user_release(void *user)
{
	struct rebuild_user *u = user;
	prod_release(u->prod);
	free(u);
}

static scalar rebuilt_op(struct rebuilt *g, int i, const scalar *parents,
			 size_t n, adg_backward_fn fn, const adg_op_options *o)
{
	struct rebuild_user *u = malloc(sizeof *u);
	cr_assert_not_null(u);
	*u = (struct rebuild_user){g, i, prod_step_new(parents, n)};
	adg_node *nodes[2];
	scalar y = {.value = 1};
	for (size_t p = 0; p < n; p++) {
		nodes[p] = parents[p].node;
		y.value *= parents[p].value;
	}
	adg_step st = {
		.backward = fn, .release = rebuild_user_release, .user = u};
	cr_assert_eq(adg_op_with(reg, nodes, n, &st, o, &y.node), 0);
	cr_assert_eq(adg_node_id(y.node, &y.id), 0);
	return y;
}

static void rebuilt_build(struct rebuilt *g, int k, int branches)
{
	cr_assert(k <= MAX_OUTPUTS && branches <= MAX_BRANCHES);
	g->k = k;
	g->branches = branches;
	g->a = s_leaf(reg, 2);
	adg_output keep = {s_output_new(g->a.value), s_output_free, NULL, 0,
			   NULL};
	adg_op_options kept = {.size = sizeof kept, .output = &keep};
	g->c0 = rebuilt_op(g, 0, &g->a, 1, r_backward, &kept);
	for (int i = 0; i < k; i++) {
		adg_output o = {s_output_new(g->c0.value + 1 + i),
				s_output_free, r_recompute, 1, NULL};
		adg_op_options dropped = {.size = sizeof dropped, .output = &o};
		g->r[i] = rebuilt_op(g, i, &g->c0, 1, r_backward, &dropped);
	}
	static const uint32_t slot0 = 0;
	adg_op_options asks = {.size = sizeof asks,
			       .want_parents = &slot0,
			       .n_want_parents = 1};
	for (int j = 0; j < branches; j++) {
		g->w[j] = s_leaf(reg, 1.0 + j / 8.0);
		scalar f[2] = {g->r[j % k], g->w[j]};
		g->y[j] = rebuilt_op(g, j % k, f, 2, asker_backward, &asks);
	}
	g->root = s_prod(reg, g->y, (size_t)branches);
}

/* Runs the backward on exec (NULL: sequential), stores the gradients of
 * a and each w_j in out, and drops every node. */
static void rebuilt_run(struct rebuilt *g, const adg_executor *exec,
			double *out)
{
	adg_backward_options o = {.size = sizeof o, .executor = exec};
	adg_grads *grads;
	int rc = adg_backward_with(reg, g->root.node, scalar_box(1),
				   &scalar_ops, &o, &grads);
	cr_assert_eq(rc, 0, "%s", adg_error_name(rc));
	cr_expect_eq(atomic_load(&g->bad), 0, "a step got a wrong output");
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0,
		     "%ld outputs left after the backward",
		     atomic_load(&scalar_outputs_live));
	out[0] = s_grad(grads, g->a);
	for (int j = 0; j < g->branches; j++)
		out[1 + j] = s_grad(grads, g->w[j]);
	adg_grads_free(grads);
	s_drop(g->root);
	for (int j = 0; j < g->branches; j++) {
		s_drop(g->y[j]);
		s_drop(g->w[j]);
	}
	for (int i = 0; i < g->k; i++)
		s_drop(g->r[i]);
	s_drop(g->c0);
	s_drop(g->a);
}

static void open_balanced(void)
{
	adg_registry_options o = {
		.size = sizeof o,
		.allocator = failing_allocator(&fixture_alloc),
		.checkpointing = ADG_CHECKPOINT_BALANCED,
	};
	fixture_open(&o);
}

TestSuite(executor_ckpt, .init = open_balanced, .timeout = 60);
/* The stress tier (tests/meson.build splits it off). */
TestSuite(executor_ckpt_stress, .init = open_balanced, .timeout = 300);

/* The gradients of one build, run sequentially: what every other run of
 * the same build must give, bit for bit. */
static void rebuilt_reference(int k, int branches, double *want)
{
	struct rebuilt g = {0};
	rebuilt_build(&g, k, branches);
	rebuilt_run(&g, NULL, want);
	for (int i = 0; i < k; i++)
		cr_assert_eq(atomic_load(&g.rebuilds[i]), 1);
}

/* A recompute that drains a cooperative executor runs, on its own thread,
 * steps of the same backward that ask for the output it is rebuilding
 * and for others. adg_output_get held the backward's one output lock
 * across the recompute, so the first such step blocked on a lock its own
 * thread held: the test hung until its timeout, 3 runs of 3. Now no lock
 * is held across a recompute, and a thread that is rebuilding builds
 * another copy rather than wait for itself. */
CHECKED_TEST(executor_ckpt, recompute_that_drains_the_executor)
{
	for (int k = 1; k <= 3; k++) {
		double want[1 + MAX_BRANCHES] = {0},
				got[1 + MAX_BRANCHES] = {0};
		rebuilt_reference(k, 12, want);

		struct coop coop = {.lock = PTHREAD_MUTEX_INITIALIZER};
		adg_executor exec = {coop_submit, &coop, 3};
		struct rebuilt g = {.drain = &coop};
		rebuilt_build(&g, k, 12);
		rebuilt_run(&g, &exec, got);
		coop_drain(&coop); /* jobs left find the run closed */
		cr_expect(memcmp(got, want, sizeof want) == 0,
			  "k %d: gradients differ from sequential", k);
		for (int i = 0; i < k; i++)
			cr_expect_geq(atomic_load(&g.rebuilds[i]), 1);
	}
}

/* A step waits for an output whose rebuild waits for that step, as a job
 * system can arrange (the recompute waits for work that, inside a wait
 * of its own, runs the step). The sleeper gives up after a bounded time
 * and builds a copy of its own, so both go on: two rebuilds, the right
 * gradients. An unbounded sleep would hold both until this recompute's
 * own limit of 10 s and fail. */
CHECKED_TEST(executor_ckpt, a_wait_for_a_rebuild_is_bounded)
{
	double want[1 + MAX_BRANCHES] = {0}, got[1 + MAX_BRANCHES] = {0};
	rebuilt_reference(1, 2, want);
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	adg_executor exec;
	cr_assert_eq(adg_pool_executor(pool, &exec), 0);
	struct rebuilt g = {.hold_first = true};
	rebuilt_build(&g, 1, 2);
	rebuilt_run(&g, &exec, got);
	cr_expect(!atomic_load(&g.held_in_vain),
		  "the other step never got the output");
	cr_expect_eq(atomic_load(&g.rebuilds[0]), 2);
	cr_expect(memcmp(got, want, sizeof want) == 0);
	cr_assert_eq(adg_pool_free(pool), 0);
}

/* Several steps ask for the same rebuilt output and for different ones at
 * once, on 1 to 4 of libadg's workers: each output is rebuilt exactly
 * once per backward (a thread that finds one being rebuilt sleeps until
 * it is there), every output is freed by the end, and the gradients are
 * the sequential backward's, bit for bit. */
CHECKED_TEST(executor_ckpt_stress, steps_ask_for_rebuilt_outputs_at_once)
{
	double want[1 + MAX_BRANCHES] = {0}, got[1 + MAX_BRANCHES] = {0};
	for (unsigned workers = 1; workers <= 4; workers++) {
		adg_pool *pool;
		cr_assert_eq(adg_pool_new(workers, &pool), 0);
		adg_executor exec;
		cr_assert_eq(adg_pool_executor(pool, &exec), 0);
		for (int round = 0; round < 60; round++) {
			int k = 1 + round % 3;
			rebuilt_reference(k, 12, want);
			struct rebuilt g = {.jitter = true};
			rebuilt_build(&g, k, 12);
			rebuilt_run(&g, &exec, got);
			cr_expect(memcmp(got, want, sizeof want) == 0,
				  "%u workers, round %d: gradients differ "
				  "from sequential",
				  workers, round);
			for (int i = 0; i < k; i++)
				cr_expect_eq(
					atomic_load(&g.rebuilds[i]), 1,
					"%u workers: r_%d rebuilt %d times",
					workers, i,
					atomic_load(&g.rebuilds[i]));
		}
		cr_assert_eq(adg_pool_free(pool), 0);
	}
}

/* The same in retained passes, which count nothing: steps of one pass
 * that ask for one output at once get one rebuild, which stays held for
 * the consuming pass after (no copy built and freed). Before retained
 * passes claimed their rebuilds, copies raced and the losers were freed:
 * the fuzzer's model saw an output freed in a retained pass. */
CHECKED_TEST(executor_ckpt_stress,
	     retained_steps_ask_for_rebuilt_outputs_at_once)
{
	double want[1 + MAX_BRANCHES] = {0}, got[1 + MAX_BRANCHES] = {0};
	for (unsigned workers = 1; workers <= 4; workers++) {
		adg_pool *pool;
		cr_assert_eq(adg_pool_new(workers, &pool), 0);
		adg_executor exec;
		cr_assert_eq(adg_pool_executor(pool, &exec), 0);
		for (int round = 0; round < 40; round++) {
			int k = 1 + round % 3;
			rebuilt_reference(k, 12, want);
			struct rebuilt g = {.jitter = true};
			rebuilt_build(&g, k, 12);
			long made = atomic_load(&scalar_outputs_made);
			adg_backward_options keep = {.size = sizeof keep,
						     .executor = &exec,
						     .retain = 1};
			adg_grads *grads;
			cr_assert_eq(adg_backward_with(
					     reg, g.root.node, scalar_box(1),
					     &scalar_ops, &keep, &grads),
				     0);
			adg_grads_free(grads);
			for (int i = 0; i < k; i++)
				cr_expect_eq(atomic_load(&g.rebuilds[i]), 1,
					     "%u workers: r_%d rebuilt %d "
					     "times in one retained pass",
					     workers, i,
					     atomic_load(&g.rebuilds[i]));
			cr_expect_eq(atomic_load(&scalar_outputs_made) - made,
				     k, "copies made and freed");
			rebuilt_run(&g, NULL,
				    got); /* consumes; rebuilds none */
			cr_expect(memcmp(got, want, sizeof want) == 0);
		}
		cr_assert_eq(adg_pool_free(pool), 0);
	}
}
