/* Who owns what (adg.h, the conventions' table), row by row, on success
 * and on each error; and the calls that spare a trainer boilerplate: the
 * registry's default gradient ops, gradients by handle, the registry's
 * allocator for a pool, an output's free with its context. */
#include "fixture.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

FIXTURE_SUITE(ownership, .timeout = 60);

static void open_with_ops(void)
{
	adg_registry_options o = {.size = sizeof o, .grad_ops = &scalar_ops};
	fixture_open(&o);
}

/* Tests that open registries of their own, or none. */
TestSuite(ownership_own, .timeout = 60);

/* A registry whose backward passes need no ops. */
TestSuite(default_ops, .init = open_with_ops, .timeout = 60);

CHECKED_TEST(default_ops, a_backward_without_ops_uses_the_registrys)
{
	scalar a = s_leaf(reg, 3), b = s_leaf(reg, 4), y = s_mul(reg, a, b);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y.node, scalar_box(1), NULL, &g), 0);
	void *da, *db;
	cr_assert_eq(adg_grads_get_node(g, a.node, &da), 0);
	cr_assert_eq(adg_grads_take_node(g, b.node, &db), 0);
	cr_assert_eq(*(double *)da, 4);
	cr_assert_eq(*(double *)db, 3);
	scalar_ops.free(db, NULL);
	cr_assert_eq(adg_grads_take_node(g, b.node, &db), ADG_ENOTFOUND);
	cr_assert_null(db);
	cr_assert_eq(adg_grads_free(g), 0);
	/* And on error the seed goes with the registry's free. */
	long before = atomic_load(&scalar_values_live);
	cr_assert_eq(adg_backward(reg, y.node, scalar_box(1), NULL, &g),
		     ADG_ECONSUMED);
	cr_assert_eq(atomic_load(&scalar_values_live), before);
	s_drop(y);
	s_drop(a);
	s_drop(b);
}

CHECKED_TEST(ownership, without_ops_anywhere_the_seed_stays_the_callers)
{
	scalar a = s_leaf(reg, 3), y = s_mul(reg, a, a);
	adg_grads *g;
	double *seed = scalar_box(1);
	cr_assert_eq(adg_backward(reg, y.node, seed, NULL, &g), ADG_EINVAL);
	cr_assert_null(g);
	cr_assert_eq(atomic_load(&scalar_values_live), 1);
	/* Still a registry with no ops: the same seed, with ops now. */
	cr_assert_eq(adg_backward(reg, y.node, seed, &scalar_ops, &g), 0);
	cr_assert_eq(adg_grads_free(g), 0);
	s_drop(y);
	s_drop(a);
}

Test(ownership_own, registry_ops_must_be_whole)
{
	adg_grad_ops half = {.add = scalar_ops.add};
	adg_registry_options o = {.size = sizeof o, .grad_ops = &half};
	adg_registry *r = (adg_registry *)&r;
	cr_assert_eq(adg_registry_new(&o, &r), ADG_EINVAL);
	cr_assert_null(r);
	half = (adg_grad_ops){.free = scalar_ops.free};
	cr_assert_eq(adg_registry_new(&o, &r), ADG_EINVAL);
}

CHECKED_TEST(ownership, grads_by_handle_refuse_bad_input)
{
	scalar a = s_leaf(reg, 3), y = s_mul(reg, a, a);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y.node, scalar_box(1), &scalar_ops, &g),
		     0);
	void *v = &v;
	cr_assert_eq(adg_grads_get_node(g, NULL, &v), ADG_EINVAL);
	cr_assert_null(v);
	v = &v;
	cr_assert_eq(adg_grads_take_node(g, NULL, &v), ADG_EINVAL);
	cr_assert_null(v);
	cr_assert_eq(adg_grads_get_node(NULL, a.node, &v), ADG_EINVAL);
	cr_assert_eq(adg_grads_get_node(g, a.node, NULL), ADG_EINVAL);
	/* y's own gradient is freed once its step has run. */
	cr_assert_eq(adg_grads_get_node(g, y.node, &v), ADG_ENOTFOUND);
	cr_assert_eq(adg_grads_get_node(g, a.node, &v), 0);
	cr_assert_eq(*(double *)v, 6);
	cr_assert_eq(adg_grads_free(g), 0);
	s_drop(y);
	s_drop(a);
}

/* Ids are unique in a registry only: the first leaves of two registries
 * are both id 1. By handle, the other's leaf names nothing in the first's
 * container: not a wrong gradient, not one taken out (issue 28). The
 * container outlives its registry, and a registry made after it (perhaps
 * at its address) is foreign to it too. */
Test(ownership_own, grads_by_handle_refuse_another_registrys_node)
{
	adg_registry *first, *other, *later;
	cr_assert_eq(adg_registry_new(NULL, &first), 0);
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	scalar a = s_leaf(first, 3), b = s_leaf(other, 5);
	cr_assert_eq(a.id, b.id, "the case needs one id in both");
	adg_grads *g;
	cr_assert_eq(
		adg_backward(first, a.node, scalar_box(3), &scalar_ops, &g), 0);
	void *v = &v;
	cr_assert_eq(adg_grads_get_node(g, b.node, &v), ADG_EFOREIGN);
	cr_assert_null(v);
	v = &v;
	cr_assert_eq(adg_grads_take_node(g, b.node, &v), ADG_EFOREIGN);
	cr_assert_null(v);
	size_t n;
	cr_assert_eq(adg_grads_count(g, &n), 0);
	cr_assert_eq(n, 1, "a foreign node took nothing out");
	cr_assert_eq(adg_grads_get_node(g, a.node, &v), 0);
	cr_assert_eq(*(double *)v, 3);
	s_drop(a);
	s_drop(b);
	cr_assert_eq(adg_registry_free(other), 0);
	cr_assert_eq(adg_registry_free(first), 0); /* g outlives it */

	cr_assert_eq(adg_registry_new(NULL, &later), 0);
	scalar c = s_leaf(later, 7);
	cr_assert_eq(c.id, 1);
	cr_assert_eq(adg_grads_get_node(g, c.node, &v), ADG_EFOREIGN);
	cr_assert_eq(adg_grads_take_node(g, c.node, &v), ADG_EFOREIGN);
	s_drop(c);
	cr_assert_eq(adg_registry_free(later), 0);
	cr_assert_eq(adg_grads_free(g), 0);
	cr_assert_eq(atomic_load(&scalar_values_live), 0);
}

/* ------------------------------------------------- the parts of a node */

struct owned_user {
	atomic_int releases;
};

static void owned_release(void *user)
{
	atomic_fetch_add(&((struct owned_user *)user)->releases, 1);
}

static int noop_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

/* adg_op: on error there is no node, and the step's user is still the
 * caller's (release never runs); on success release runs once. */
CHECKED_TEST(ownership, a_step_user_is_handed_over_with_the_node)
{
	adg_registry *other;
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	adg_node *a, *foreign, *y = (adg_node *)&y;
	cr_assert_eq(adg_leaf(reg, &a), 0);
	cr_assert_eq(adg_leaf(other, &foreign), 0);
	struct owned_user u = {0};
	adg_step step = {.backward = noop_backward,
			 .release = owned_release,
			 .user = &u};
	adg_node *mixed[2] = {a, foreign};
	cr_assert_eq(adg_op(reg, mixed, 2, &step, &y), ADG_EFOREIGN);
	cr_assert_null(y);
	cr_assert_eq(adg_op(reg, &a, 0, &step, &y), ADG_EINVAL);
	cr_assert_eq(adg_op(reg, NULL, 1, &step, &y), ADG_EINVAL);
	cr_assert_eq(atomic_load(&u.releases), 0, "still the caller's");
	cr_assert_eq(adg_op(reg, &a, 1, &step, &y), 0);
	cr_assert_eq(adg_node_unref(y), 0);
	cr_assert_eq(atomic_load(&u.releases), 1, "released once, by libadg");
	adg_node_unref(a);
	adg_node_unref(foreign);
	cr_assert_eq(adg_registry_free(other), 0);
}

struct freed {
	atomic_int count;
	void *last_ctx;
};

static void counted_free(void *value, void *ctx)
{
	struct freed *f = ctx;
	atomic_fetch_add(&f->count, 1);
	f->last_ctx = ctx;
	free(value);
}

/* adg_op_with: on error the offered output is still the caller's; on
 * success libadg frees it, once, passing the output's ctx. */
CHECKED_TEST(ownership, an_offered_output_is_handed_over_with_the_node)
{
	adg_node *a, *y = NULL;
	cr_assert_eq(adg_leaf(reg, &a), 0);
	struct freed f = {0};
	adg_output out = {.value = malloc(8), .free = counted_free, .ctx = &f};
	const uint32_t bad_want = 5;
	adg_op_options opt = {.size = sizeof opt,
			      .output = &out,
			      .want_parents = &bad_want,
			      .n_want_parents = 1};
	struct owned_user u = {0};
	adg_step step = {.backward = noop_backward,
			 .release = owned_release,
			 .user = &u};
	cr_assert_eq(adg_op_with(reg, &a, 1, &step, &opt, &y), ADG_EINVAL);
	cr_assert_null(y);
	cr_assert_eq(atomic_load(&f.count), 0, "still the caller's");
	cr_assert_eq(atomic_load(&u.releases), 0);
	opt.n_want_parents = 0;
	cr_assert_eq(adg_op_with(reg, &a, 1, &step, &opt, &y), 0);
	cr_assert_eq(adg_node_unref(y), 0);
	cr_assert_eq(atomic_load(&f.count), 1);
	cr_assert_eq(f.last_ctx, &f, "free gets the output's ctx");
	cr_assert_eq(atomic_load(&u.releases), 1);
	adg_node_unref(a);
}

/* ------------------------------------------------------------- a pool */

static void count_job(void *arg)
{
	atomic_fetch_add((atomic_int *)arg, 1);
}

/* Holds a pool thread until *arg is set. */
static void gate_job(void *arg)
{
	while (!atomic_load((atomic_bool *)arg))
		sched_yield();
}

/* A pool on the registry's allocator: every byte comes back, its job
 * queue's growth included. */
Test(ownership_own, a_pool_on_the_registrys_allocator)
{
	failing_alloc fa = {0};
	adg_registry_options ro = {.size = sizeof ro,
				   .allocator = failing_allocator(&fa)};
	adg_registry *r;
	cr_assert_eq(adg_registry_new(&ro, &r), 0);
	adg_pool_options o = {.size = sizeof o, .n_threads = 2};
	cr_assert_eq(adg_registry_allocator(r, &o.allocator), 0);
	cr_assert_eq(o.allocator.ctx, &fa);
	long before = atomic_load(&fa.live_bytes);
	adg_pool *pool;
	cr_assert_eq(adg_pool_new_with(&o, &pool), 0);
	cr_assert_gt(atomic_load(&fa.live_bytes), before);
	adg_executor ex;
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	/* Both threads held: the 100 jobs queue up, and the ring grows from
	 * 16 to 128 entries. */
	atomic_bool open = false;
	atomic_int ran = 0;
	cr_assert_eq(ex.submit(gate_job, &open, ex.ctx), 0);
	cr_assert_eq(ex.submit(gate_job, &open, ex.ctx), 0);
	long one_ring = atomic_load(&fa.live_bytes);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(ex.submit(count_job, &ran, ex.ctx), 0);
	cr_assert_gt(atomic_load(&fa.live_bytes), one_ring, "grown");
	atomic_store(&open, true);
	cr_assert_eq(adg_pool_free(pool), 0);
	cr_assert_eq(atomic_load(&ran), 100);
	cr_assert_eq(atomic_load(&fa.live_bytes), before);
	cr_assert_eq(adg_registry_free(r), 0);
	cr_assert_eq(atomic_load(&fa.live_bytes), 0);
}

Test(ownership_own, pool_and_allocator_bad_input)
{
	adg_pool *pool = (adg_pool *)&pool;
	adg_pool_options o = {.size = sizeof o, .n_threads = 1};
	cr_assert_eq(adg_pool_new_with(NULL, &pool), ADG_EINVAL);
	cr_assert_null(pool);
	cr_assert_eq(adg_pool_new_with(&o, NULL), ADG_EINVAL);
	o.n_threads = 0;
	cr_assert_eq(adg_pool_new_with(&o, &pool), ADG_EINVAL);
	o.n_threads = ADG_EXECUTOR_MAX_WORKERS + 1;
	cr_assert_eq(adg_pool_new_with(&o, &pool), ADG_EINVAL);
	failing_alloc fa = {0};
	o = (adg_pool_options){.size = sizeof(adg_pool_options),
			       .n_threads = 1,
			       .allocator = failing_allocator(&fa)};
	o.allocator.free = NULL;
	cr_assert_eq(adg_pool_new_with(&o, &pool), ADG_EINVAL);
	o.allocator = failing_allocator(&fa);
	atomic_store(&fa.fail_in, 1);
	cr_assert_eq(adg_pool_new_with(&o, &pool), ADG_ENOMEM);
	cr_assert_null(pool);
	cr_assert_eq(atomic_load(&fa.live_bytes), 0);
	adg_allocator a;
	cr_assert_eq(adg_registry_allocator(NULL, &a), ADG_EINVAL);
	adg_registry *r;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_assert_eq(adg_registry_allocator(r, NULL), ADG_EINVAL);
	cr_assert_eq(adg_registry_allocator(r, &a), 0);
	cr_assert_not_null(a.alloc, "malloc's when none was given");
	cr_assert_eq(adg_registry_free(r), 0);
}

/* ------------------------------------------------- moved parents */

/* adg_op_moving: a chain x = x * c that moves x's handle into each new
 * node is the chain that drops it after each adg_op: the same live
 * counts along the way, the same gradients, and everything freed with the
 * tip. */
CHECKED_TEST(ownership, a_moved_chain_is_the_chain_that_drops_its_handles)
{
	enum { K = 10 };
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), c = s_leaf(reg, 1.5);
	scalar x = s_mul(reg, a, b), y = s_mul(reg, a, b);
	for (int i = 0; i < K; i++) {
		scalar fx[2] = {x, c};
		x = s_prod_moving(reg, fx, 2, 1);
		scalar ny = s_mul(reg, y, c);
		s_drop(y);
		y = ny;
	}
	/* 3 leaves, and two chains of K + 1 nodes, each held by its tip. */
	assert_stats(reg, 3 + 2 * (K + 1), 2 * (K + 1), 2);
	adg_grads *gx, *gy;
	cr_assert_eq(s_backward(reg, x, &gx), 0);
	cr_assert_eq(s_backward(reg, y, &gy), 0);
	cr_assert_eq(s_grad(gx, a), s_grad(gy, a));
	cr_assert_eq(s_grad(gx, c), s_grad(gy, c));
	cr_assert_eq(s_grad(gx, a), 3 * 57.6650390625); /* exact: 1.5^10 */
	adg_grads_free(gx);
	adg_grads_free(gy);
	s_drop(x);
	s_drop(y);
	assert_stats(reg, 3, 0, 0);
	/* Unrun, the tip's drop frees the whole moved chain too. */
	x = s_mul(reg, a, b);
	for (int i = 0; i < K; i++) {
		scalar fx[2] = {x, c};
		x = s_prod_moving(reg, fx, 2, 1);
	}
	s_drop(x);
	assert_stats(reg, 3, 0, 0);
	s_drop(a);
	s_drop(b);
	s_drop(c);
}

/* A moved leaf has no slot to take its handle (children keep a leaf's id
 * only): the op drops it, and the backward still gives its id a
 * gradient. A parent named twice and moved once keeps one reference of
 * the new node's and takes one more. */
CHECKED_TEST(ownership, moved_leaves_are_dropped_and_repeats_counted)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 5);
	scalar fy[2] = {a, b};
	scalar y = s_prod_moving(reg, fy, 2, 1); /* a's only handle */
	assert_stats(reg, 2, 1, 1);		 /* b and y: a is gone */
	scalar fz[2] = {y, y};
	scalar z = s_prod_moving(reg, fz, 2, 2); /* y * y, y's handle moved */
	assert_stats(reg, 3, 2, 1);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, z, &g), 0);
	cr_assert_eq(s_grad(g, a), 2 * 10 * 5); /* d(ab)^2/da */
	cr_assert_eq(s_grad(g, b), 2 * 10 * 2);
	adg_grads_free(g);
	s_drop(z);
	assert_stats(reg, 1, 0, 0);
	s_drop(b);
}

static int moved_noop_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

/* On error nothing moved: the handles are the caller's to use and drop. */
CHECKED_TEST(ownership, a_refused_move_leaves_the_handles_the_callers)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), p = s_mul(reg, a, b);
	adg_node *parents[2] = {p.node, a.node}, *out = NULL;
	adg_step step = {.backward = moved_noop_backward};
	cr_assert_eq(adg_op_moving(reg, parents, 2, 4, &step, &out),
		     ADG_EINVAL); /* a bit past the parents */
	cr_assert_null(out);
	cr_assert_eq(adg_op_moving(reg, parents, 2, UINT64_MAX, &step, &out),
		     ADG_EINVAL);
	adg_node *none[2] = {p.node, NULL};
	cr_assert_eq(adg_op_moving(reg, none, 2, 1, &step, &out), ADG_EINVAL);
	assert_stats(reg, 3, 1, 1);
	/* A registry out of ids refuses after the parents were looked at. */
	adg_registry_options o = {.size = sizeof o, .max_node_id = 3};
	adg_registry *small;
	cr_assert_eq(adg_registry_new(&o, &small), 0);
	adg_node *l1, *l2, *q;
	cr_assert_eq(adg_leaf(small, &l1), 0);
	cr_assert_eq(adg_leaf(small, &l2), 0);
	adg_node *lp[2] = {l1, l2};
	cr_assert_eq(adg_op(small, lp, 2, &step, &q), 0);
	adg_node *qp[2] = {q, l1};
	cr_assert_eq(adg_op_moving(small, qp, 2, 3, &step, &out), ADG_ENOIDS);
	cr_assert_null(out);
	uint64_t id;
	cr_assert_eq(adg_node_id(q, &id), 0); /* still the caller's */
	cr_assert_eq(adg_node_unref(q), 0);
	cr_assert_eq(adg_node_unref(l1), 0);
	cr_assert_eq(adg_node_unref(l2), 0);
	cr_assert_eq(adg_registry_free(small), 0);
	s_drop(p);
	s_drop(a);
	s_drop(b);
}

/* adg_op_with moves the parents that options->moved names, as
 * adg_op_moving does: the op's drop then frees the moved parent, whose
 * only reference was the caller's. A bit past the parents is refused and
 * moves nothing. */
CHECKED_TEST(ownership, options_move_as_adg_op_moving_does)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), p = s_mul(reg, a, b);
	adg_node *parents[2] = {p.node, a.node}, *out = NULL;
	adg_step step = {.backward = moved_noop_backward};
	adg_op_options o = {.size = sizeof o, .moved = 4};
	cr_assert_eq(adg_op_with(reg, parents, 2, &step, &o, &out), ADG_EINVAL);
	cr_assert_null(out);
	cr_assert(strstr(adg_errmsg(), "moved has bit 2 set") != NULL, "%s",
		  adg_errmsg());
	assert_stats(reg, 3, 1, 1);
	o.moved = 1; /* p's handle, the only one */
	cr_assert_eq(adg_op_with(reg, parents, 2, &step, &o, &out), 0);
	assert_stats(reg, 4, 2, 1);
	cr_assert_eq(adg_node_unref(out), 0);
	assert_stats(reg, 2, 0, 0); /* out and p: the leaves are left */
	s_drop(a);
	s_drop(b);
}
