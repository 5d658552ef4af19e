/* The gradient container against a plain array model. */
#include "fixture.h"

#include <stdlib.h>

FIXTURE_SUITE(grads);

/* An empty container: a leaf's backward, less the seed. The container
 * outlives the leaf's handle. */
static adg_grads *container(void)
{
	scalar leaf = s_leaf(reg, 0);
	adg_grads *g;
	cr_assert_eq(
		adg_backward(reg, leaf.node, scalar_box(0), &scalar_ops, &g),
		0);
	void *seed;
	cr_assert_eq(adg_grads_take(g, leaf.id, &seed), 0);
	scalar_ops.free(seed, NULL);
	s_drop(leaf);
	return g;
}

CHECKED_TEST(grads, register_adds_into_one_id)
{
	adg_grads *g = container();
	cr_assert_eq(adg_grads_register(g, 7, scalar_box(1.5)), 0);
	cr_assert_eq(adg_grads_register(g, 7, scalar_box(2.0)), 0);
	void *v;
	cr_assert_eq(adg_grads_get(g, 7, &v), 0);
	cr_expect_eq(*(double *)v, 3.5);
	size_t n;
	adg_grads_count(g, &n);
	cr_expect_eq(n, 1);
	cr_assert_eq(adg_grads_take(g, 7, &v), 0);
	cr_expect_eq(*(double *)v, 3.5);
	scalar_ops.free(v, NULL);
	cr_expect_eq(adg_grads_get(g, 7, &v), ADG_ENOTFOUND);
	adg_grads_free(g);
}

/* Random registers and takes over clustered ids, checked after every
 * operation against an array indexed by id. */
CHECKED_TEST(grads, random_operations_match_a_model)
{
	enum { IDS = 3000, OPS = 200000 };
	double *model = calloc(IDS, sizeof *model);
	bool *held = calloc(IDS, sizeof *held);
	size_t held_count = 0;
	adg_grads *g = container();
	unsigned int seed = 12345;
	for (int op = 0; op < OPS; op++) {
		/* Ids in runs, so that probe sequences collide. */
		uint64_t id = 1 + (uint64_t)(rand_r(&seed) % IDS);
		void *v;
		if (rand_r(&seed) % 3 != 0) {
			double x = (double)(rand_r(&seed) % 7);
			cr_assert_eq(adg_grads_register(g, id, scalar_box(x)),
				     0);
			if (!held[id - 1])
				held_count++;
			held[id - 1] = true;
			model[id - 1] += x;
		} else {
			int rc = adg_grads_take(g, id, &v);
			if (held[id - 1]) {
				cr_assert_eq(rc, 0);
				cr_assert_eq(*(double *)v, model[id - 1]);
				scalar_ops.free(v, NULL);
				held[id - 1] = false;
				model[id - 1] = 0;
				held_count--;
			} else {
				cr_assert_eq(rc, ADG_ENOTFOUND);
			}
		}
		if (op % 997 == 0) {
			for (uint64_t k = 1; k <= IDS; k++) {
				int rc = adg_grads_get(g, k, &v);
				cr_assert_eq(rc == 0, held[k - 1], "id %llu",
					     (unsigned long long)k);
				if (rc == 0)
					cr_assert_eq(*(double *)v,
						     model[k - 1]);
			}
		}
		size_t n;
		adg_grads_count(g, &n);
		cr_assert_eq(n, held_count);
	}
	adg_grads_free(g);
	free(model);
	free(held);
}

/* A step may keep its node's gradient by taking it out of the call. */
static void *kept;

static int keeping_backward(adg_step_call *call, void *user)
{
	(void)user;
	kept = call->grad;
	call->grad = NULL;
	return adg_step_give(call, 0, scalar_box(1));
}

CHECKED_TEST(grads, step_may_take_its_gradient)
{
	scalar leaf = s_leaf(reg, 1);
	adg_node *y;
	adg_step st = {
		.backward = keeping_backward, .release = NULL, .user = NULL};
	cr_assert_eq(adg_op(reg, &leaf.node, 1, &st, &y), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, scalar_box(9), &scalar_ops, &g), 0);
	cr_assert_not_null(kept);
	cr_expect_eq(*(double *)kept, 9.0);
	scalar_ops.free(kept, NULL);
	adg_grads_free(g);
	adg_node_unref(y);
	s_drop(leaf);
}

/* ---------------------------------------------------------------- window */

/* On one thread, a tape whose ids are dense keeps its gradients in a
 * window indexed by id (lib/grads.c): what it holds at the end moves to
 * the container's entries. (A step that registers by id on call->grads,
 * the deprecated path, sees the window as the container: tests/test_give.c
 * covers that.) */
FIXTURE_SUITE(window);

static int failing_after_giving(adg_step_call *call, void *user)
{
	(void)user;
	int rc = s_pass_on(call);
	return rc != 0 ? rc : ADG_EUSER - 1;
}

/* A failed backward leaves the window empty for the next one on this
 * thread: the next gradients are right and nothing is freed twice. */
CHECKED_TEST(window, a_failed_backward_leaves_it_empty)
{
	for (int round = 0; round < 3; round++) {
		scalar w = s_leaf(reg, 3);
		scalar x = s_mul(reg, w, w);
		scalar z = s_mul(reg, x, w);
		adg_node *y;
		adg_step st = {.backward = failing_after_giving};
		cr_assert_eq(adg_op(reg, &z.node, 1, &st, &y), 0);
		adg_grads *g;
		cr_assert_eq(
			adg_backward(reg, y, scalar_box(1), &scalar_ops, &g),
			ADG_EUSER - 1);
		adg_node_unref(y);
		s_drop(z);
		s_drop(x);
		cr_assert_eq(atomic_load(&scalar_values_live), 0);
		/* Again, on the same thread's tape: w^3 at 3. */
		x = s_mul(reg, w, w);
		z = s_mul(reg, x, w);
		cr_assert_eq(s_backward(reg, z, &g), 0);
		cr_assert_eq(s_grad(g, w), 27);
		cr_assert_eq(adg_grads_free(g), 0);
		s_drop(z);
		s_drop(x);
		s_drop(w);
	}
}

/* Ids far apart (other work made ids in between): no window, the same
 * gradients. */
CHECKED_TEST(window, sparse_ids_go_to_the_entries)
{
	scalar w = s_leaf(reg, 2);
	scalar y = w;
	for (int i = 0; i < 4; i++) {
		for (int k = 0; k < 100; k++)
			s_drop(s_leaf(reg, 0)); /* ids used up */
		scalar next = s_mul(reg, y, w);
		if (i > 0)
			s_drop(y);
		y = next;
	}
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	cr_assert_eq(s_grad(g, w), 5 * 16); /* d(w^5)/dw at 2 */
	cr_assert_eq(adg_grads_free(g), 0);
	s_drop(y);
	s_drop(w);
}
