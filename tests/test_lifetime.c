/* Node lifetime: references decide what is freed, and memory stays bounded
 * over a training loop of any length. */
#include "fixture.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

FIXTURE_SUITE(lifetime);

/* One training iteration: 20 ops on the 4 parameters, backward, drop. */
static void iteration(scalar params[4], double *loss_grad_sum)
{
	scalar x[20];
	x[0] = s_mul(reg, params[0], params[1]);
	for (int i = 1; i < 20; i++)
		x[i] = i % 3 == 0 ? s_add(reg, x[i - 1], params[i % 4])
				  : s_mul(reg, x[i - 1], params[i % 4]);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, x[19], &g), 0);
	*loss_grad_sum += s_grad(g, params[0]);
	adg_grads_free(g);
	for (int i = 0; i < 20; i++)
		s_drop(x[i]);
}

/* 8. 100000 iterations: the live counts at iteration 1000 and at the end
 * are the same, and are what the 4 kept leaves account for. */
CHECKED_TEST(lifetime, training_loop_stays_bounded, .timeout = 600)
{
	scalar params[4];
	for (int k = 0; k < 4; k++)
		params[k] = s_leaf(reg, 1.0 + k / 1000.0);
	double sum = 0;
	struct adg_stats at1000 = {.size = sizeof at1000},
			 end = {.size = sizeof end};
	for (int it = 1; it <= 100000; it++) {
		iteration(params, &sum);
		if (it == 1000)
			adg_registry_stats(reg, &at1000);
	}
	adg_registry_stats(reg, &end);
	cr_expect_eq(end.live_nodes, at1000.live_nodes);
	cr_expect_eq(end.live_steps, at1000.live_steps);
	cr_expect_eq(end.live_graphs, at1000.live_graphs);
	cr_expect_eq(end.live_nodes, 4);
	cr_expect_eq(end.live_steps, 0);
	cr_expect_eq(end.live_graphs, 0);
	cr_expect_eq(end.nodes_freed, 100000ull * 20);
	cr_expect_gt(sum, 0);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	for (int k = 0; k < 4; k++)
		s_drop(params[k]);
}

/* A graph dropped without backward frees its nodes and releases its steps
 * unrun, whichever order the handles go in. */
CHECKED_TEST(lifetime, unrun_graph_is_freed_root_first)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = s_mul(reg, a, b), y = s_mul(reg, x, a), z = s_mul(reg, y, b);
	assert_stats(reg, 5, 3, 1);
	s_drop(z);
	assert_stats(reg, 4, 2, 1);
	s_drop(y);
	s_drop(x);
	assert_stats(reg, 2, 0, 0);
	s_drop(a);
	s_drop(b);
}

CHECKED_TEST(lifetime, unrun_graph_is_freed_by_its_last_handle)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = s_mul(reg, a, b), y = s_mul(reg, x, a), z = s_mul(reg, y, b);
	s_drop(x);
	s_drop(y);
	s_drop(a);
	s_drop(b);
	/* z keeps every op ancestor, whose steps a backward from z could
	 * still run; a leaf has no step and goes with its last handle. */
	assert_stats(reg, 3, 3, 1);
	s_drop(z);
	assert_stats(reg, 0, 0, 0);
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(reg, &st);
	cr_expect_eq(st.nodes_freed, 5);
}

/* Children use a leaf's id, not its node: a leaf whose handle went still
 * gets its gradient. */
CHECKED_TEST(lifetime, dropped_leaf_still_gets_its_gradient)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar y = s_mul(reg, a, b);
	s_drop(a);
	assert_stats(reg, 2, 1, 1);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	cr_expect_eq(s_grad(g, a), 3.0);
	cr_expect_eq(s_grad(g, b), 2.0);
	adg_grads_free(g);
	s_drop(y);
	s_drop(b);
}

CHECKED_TEST(lifetime, references_add_up)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = s_mul(reg, a, b);
	cr_assert_eq(adg_node_ref(x.node), 0);
	cr_assert_eq(adg_node_ref(x.node), 0);
	s_drop(x);
	s_drop(x);
	assert_stats(reg, 3, 1, 1);
	s_drop(x);
	assert_stats(reg, 2, 0, 0);
	s_drop(a);
	s_drop(b);
}

/* A backward from an intermediate node consumes only its ancestors: the
 * child's step is released unrun when it is dropped. */
CHECKED_TEST(lifetime, partial_backward_then_drop)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), c = s_leaf(reg, 5);
	scalar x = s_mul(reg, a, b), y = s_mul(reg, x, c);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, x, &g), 0);
	cr_expect_eq(s_grad(g, a), 3.0);
	adg_grads_free(g);
	assert_stats(reg, 5, 1, 1);
	cr_expect_eq(s_backward(reg, y, &g), ADG_EUNAVAILABLE);
	s_drop(y);
	assert_stats(reg, 4, 0, 0);
	s_drop(x);
	s_drop(a);
	s_drop(b);
	s_drop(c);
}

/* Long chains are walked and freed without recursion. */
CHECKED_TEST(lifetime, million_node_chain_backward_and_free, .timeout = 600)
{
	enum { LEN = 1000000 };
	scalar a = s_leaf(reg, 1);
	scalar prev = a;
	for (int i = 0; i < LEN; i++) {
		scalar next = s_mul(reg, prev, a);
		if (i > 0)
			s_drop(prev);
		prev = next;
	}
	assert_stats(reg, LEN + 1, LEN, 1);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, prev, &g), 0);
	/* d a^(LEN+1) / da at a = 1 */
	cr_expect_eq(s_grad(g, a), LEN + 1.0);
	adg_grads_free(g);
	assert_stats(reg, 2, 0, 0);
	s_drop(prev);

	prev = a;
	for (int i = 0; i < LEN; i++) {
		scalar next = s_mul(reg, prev, a);
		if (i > 0)
			s_drop(prev);
		prev = next;
	}
	s_drop(prev); /* frees the whole unrun chain at once */
	assert_stats(reg, 1, 0, 0);
	s_drop(a);
}

/* Threads that exit hand their shards back; counts survive them. */
static void *short_lived(void *arg)
{
	scalar *leaf = arg;
	scalar y = s_mul(reg, *leaf, *leaf);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	adg_grads_free(g);
	s_drop(y);
	return NULL;
}

CHECKED_TEST(lifetime, counts_survive_exited_threads)
{
	scalar a = s_leaf(reg, 2);
	for (int i = 0; i < 200; i++) {
		pthread_t t;
		pthread_create(&t, NULL, short_lived, &a);
		pthread_join(t, NULL);
	}
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(reg, &st);
	cr_expect_eq(st.nodes_freed, 200);
	cr_expect_eq(st.live_nodes, 1);
	cr_expect_eq(st.live_graphs, 0);
	s_drop(a);
}

/* A registry freed while another thread still caches its shard; a new
 * registry, possibly at the same address, starts from zero. */
static void *use_registry(void *arg)
{
	adg_registry *r = arg;
	adg_node *n;
	cr_assert_eq(adg_leaf(r, &n), 0);
	adg_node_unref(n);
	return NULL;
}

CHECKED_TEST(lifetime, registries_are_independent)
{
	adg_registry *r2;
	cr_assert_eq(adg_registry_new(NULL, &r2), 0);
	scalar a = s_leaf(reg, 1);
	adg_node *n;
	cr_assert_eq(adg_leaf(r2, &n), 0);
	assert_stats(r2, 1, 0, 0);
	assert_stats(reg, 1, 0, 0);
	adg_node_unref(n);
	use_registry(r2);
	cr_assert_eq(adg_registry_free(r2), 0);
	for (int i = 0; i < 20; i++) {
		cr_assert_eq(adg_registry_new(NULL, &r2), 0);
		use_registry(r2);
		pthread_t t;
		pthread_create(&t, NULL, use_registry, r2);
		pthread_join(t, NULL);
		struct adg_stats st = {.size = sizeof st};
		adg_registry_stats(r2, &st);
		cr_expect_eq(st.nodes_freed, 2);
		cr_assert_eq(adg_registry_free(r2), 0);
	}
	s_drop(a);
}

/* More graphs retired on one thread than its pool keeps: the rest go back
 * to the allocator after a grace period, ADG_GRAPH_LIMBO_MAX at a time, and
 * adg_registry_free frees those still waiting (the allocator's byte count
 * comes back to zero). */
CHECKED_TEST(lifetime, retired_graphs_past_the_pool_are_freed)
{
	failing_alloc fa = {0};
	adg_registry_options o = {.size = sizeof o,
				  .allocator = failing_allocator(&fa)};
	adg_registry *r;
	cr_assert_eq(adg_registry_new(&o, &r), 0);
	enum { GRAPHS = 5000 };
	static scalar roots[GRAPHS];
	scalar a = s_leaf(r, 2);
	for (int i = 0; i < GRAPHS; i++)
		roots[i] = s_mul(r, a, a);
	assert_stats(r, GRAPHS + 1, GRAPHS, GRAPHS);
	for (int i = 0; i < GRAPHS; i++)
		s_drop(roots[i]);
	assert_stats(r, 1, 0, 0);
	s_drop(a);
	cr_assert_eq(adg_registry_free(r), 0);
	cr_expect_eq(atomic_load(&fa.live_bytes), 0, "graphs not freed");
}

/* The read side's membarrier registration (lib/readside.c) is paid in
 * adg_registry_new, not in the first graph op: a private expedited
 * membarrier, which fails with EPERM in a process not registered, succeeds
 * right after it. Each test runs in a child process of its own, which
 * has made no registry before. TSan builds never register (TSan does not
 * know membarrier); a kernel without the command has nothing to register. */
#if defined(__SANITIZE_THREAD__)
#define LIFETIME_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LIFETIME_TSAN 1
#endif
#endif

#ifndef LIFETIME_TSAN
static long membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

Test(readside, registry_new_registers_for_membarrier)
{
	long cmds = membarrier(MEMBARRIER_CMD_QUERY);
	if (cmds <= 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED))
		cr_skip_test("no private expedited membarrier here");
	cr_assert_eq(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), -1,
		     "registered before any registry");
	cr_assert_eq(errno, EPERM);
	adg_registry *r;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_expect_eq(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED), 0,
		     "adg_registry_new registered the process");
	cr_assert_eq(adg_registry_free(r), 0);
}
#endif
