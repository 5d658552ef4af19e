/* adg_step_give: a step hands its gradients back by parent slot, in every
 * mode (no executor, an executor with no worker, libadg's pool), folded in
 * the order given. And the one test of the deprecated path, registering by
 * id on call->grads, until it goes.
 *
 * Gradients are hashed (struct hv, tests/scalar.h), folded as sum =
 * sum * 31 + value: not commutative, so that a change in the order a
 * node's contributions are added in changes the result. */
#include "fixture.h"

#include <stdbool.h>
#include <stdlib.h>

FIXTURE_SUITE(give, .timeout = 120);

/* The modes a backward runs in. */
enum mode { SEQUENTIAL, ALONE, POOL2, N_MODES };

/* One slot given, in a step's order of calls; twice: a second time. */
struct give {
	size_t slot;
	uint64_t h;
};

/* A step that gives the listed gradients, in order, and records each
 * call's result. */
struct giving_step {
	size_t n;
	struct give gives[6];
	int rc[6];
	atomic_int runs;
};

static int giving_backward(adg_step_call *call, void *user)
{
	struct giving_step *s = user;
	atomic_fetch_add(&s->runs, 1);
	for (size_t i = 0; i < s->n; i++) {
		void *v = hv_new(s->gives[i].h);
		size_t slot = s->gives[i].slot;
		s->rc[i] = adg_step_give(call, slot, v);
	}
	return 0;
}

struct run {
	adg_pool *pool;
	adg_executor executor;
};

static int backward_in(enum mode m, struct run *r, adg_node *root,
		       adg_grads **out)
{
	adg_backward_options o = {.size = sizeof o};
	if (m == ALONE) {
		r->executor = (adg_executor){0};
		cr_assert_eq(adg_pool_new(1, &r->pool), 0);
		cr_assert_eq(adg_pool_executor(r->pool, &r->executor), 0);
		r->executor.n_workers = 0;
		o.executor = &r->executor;
	} else if (m == POOL2) {
		cr_assert_eq(adg_pool_new(2, &r->pool), 0);
		cr_assert_eq(adg_pool_executor(r->pool, &r->executor), 0);
		o.executor = &r->executor;
	}
	return adg_backward_with(reg, root, hv_new(1), &hv_ops, &o, out);
}

static uint64_t hv_of(const adg_grads *g, adg_node *n)
{
	void *v;
	cr_assert_eq(adg_grads_get_node(g, n, &v), 0);
	return ((struct hv *)v)->h;
}

/* y = f(x, x, w) whose step gives s->gives, then y's gradients for x and
 * w, in mode m; every give's result in rc. */
static void run_op(enum mode m, const struct giving_step *proto, uint64_t *gx,
		   uint64_t *gw, int *rc)
{
	adg_node *x, *w, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_leaf(reg, &w), 0);
	struct giving_step *s = malloc(sizeof *s);
	cr_assert_not_null(s);
	*s = *proto;
	atomic_init(&s->runs, 0);
	adg_node *parents[3] = {x, x, w};
	adg_step step = {.backward = giving_backward, .user = s};
	cr_assert_eq(adg_op(reg, parents, 3, &step, &y), 0);
	struct run r = {0};
	adg_grads *g;
	cr_assert_eq(backward_in(m, &r, y, &g), 0);
	cr_assert_eq(atomic_load(&s->runs), 1);
	*gx = hv_of(g, x);
	*gw = hv_of(g, w);
	for (size_t i = 0; i < s->n; i++)
		rc[i] = s->rc[i];
	cr_assert_eq(adg_grads_free(g), 0);
	cr_assert_eq(adg_pool_free(r.pool), 0);
	free(s);
	adg_node_unref(y);
	adg_node_unref(x);
	adg_node_unref(w);
}

/* Out of slot order, and the repeated parent x named by its second slot
 * first: x's gradients fold in the order given (3 then 5), in every mode,
 * as registering by id folds them (deprecated_register_by_id, below). */
CHECKED_TEST(give, out_of_order_folds_in_the_order_given_in_every_mode)
{
	const struct giving_step order = {.n = 3,
					  .gives = {{2, 7}, {1, 3}, {0, 5}}};
	for (enum mode m = 0; m < N_MODES; m++) {
		uint64_t gx, gw;
		int rc[6];
		run_op(m, &order, &gx, &gw, rc);
		cr_assert_eq(rc[0] | rc[1] | rc[2], 0, "mode %d", m);
		cr_assert_eq(gx, 3 * 31 + 5, "mode %d: %llu", m,
			     (unsigned long long)gx);
		cr_assert_eq(gw, 7, "mode %d", m);
	}
}

CHECKED_TEST(give, in_slot_order_in_every_mode)
{
	const struct giving_step order = {.n = 3,
					  .gives = {{0, 2}, {1, 9}, {2, 4}}};
	for (enum mode m = 0; m < N_MODES; m++) {
		uint64_t gx, gw;
		int rc[6];
		run_op(m, &order, &gx, &gw, rc);
		cr_assert_eq(rc[0] | rc[1] | rc[2], 0, "mode %d", m);
		cr_assert_eq(gx, 2 * 31 + 9, "mode %d", m);
		cr_assert_eq(gw, 4, "mode %d", m);
	}
}

/* A slot out of range, and a parent whose slots are all given, are
 * refused in every mode, the value freed; what was given before stands. */
CHECKED_TEST(give, refuses_a_bad_slot_in_every_mode)
{
	const struct giving_step bad = {
		.n = 5,
		.gives = {{2, 7}, {3, 1}, {2, 8}, {0, 5}, {1, 6}},
	};
	for (enum mode m = 0; m < N_MODES; m++) {
		uint64_t gx, gw;
		int rc[6];
		run_op(m, &bad, &gx, &gw, rc);
		cr_assert_eq(rc[0], 0);
		cr_assert_eq(rc[1], ADG_EINVAL, "mode %d: slot 3 of 3", m);
		cr_assert_eq(rc[2], ADG_EINVAL, "mode %d: w given twice", m);
		cr_assert_eq(rc[3] | rc[4], 0);
		cr_assert_eq(gx, 5 * 31 + 6, "mode %d", m);
		cr_assert_eq(gw, 7, "mode %d", m);
	}
}

static int give_outside(adg_step_call *call, void *user)
{
	int *rc = user;
	struct hv untouched = {.h = 1}; /* refused before it is taken */
	rc[0] = adg_step_give(NULL, 0, &untouched);
	rc[1] = adg_step_give(call, 0, NULL);
	/* A call that is not libadg's has no backward behind it. */
	adg_step_call fake = *call;
	fake.context = NULL;
	void *v = hv_new(1);
	rc[2] = adg_step_give(&fake, 0, v);
	hv_free(v, NULL); /* refused before it was taken */
	return adg_step_give(call, 0, call->grad) == 0 ? (call->grad = NULL, 0)
						       : -1;
}

CHECKED_TEST(give, null_arguments)
{
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	int rc[3] = {0};
	adg_step step = {.backward = give_outside, .user = rc};
	cr_assert_eq(adg_op(reg, &x, 1, &step, &y), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, hv_new(4), &hv_ops, &g), 0);
	cr_assert_eq(rc[0], ADG_EINVAL);
	cr_assert_eq(rc[1], ADG_EINVAL);
	cr_assert_eq(rc[2], ADG_EINVAL);
	cr_assert_eq(hv_of(g, x), 4);
	cr_assert_eq(adg_grads_free(g), 0);
	adg_node_unref(y);
	adg_node_unref(x);
}

/* ------------------------------------------------------------ give all */

/* The poisoned gradient: the value check rejects it, and the poisoned add
 * fails on it. */
#define POISON 666

/* A step that gives all its slots in one call: hv values of h (0: none
 * for that slot); the call's result in rc. */
struct giving_all {
	uint64_t h[3];
	int rc;
	atomic_int runs;
};

static int giving_all_backward(adg_step_call *call, void *user)
{
	struct giving_all *s = user;
	atomic_fetch_add(&s->runs, 1);
	void *values[3] = {NULL, NULL, NULL};
	for (size_t i = 0; i < call->n_parents; i++)
		values[i] = s->h[i] != 0 ? hv_new(s->h[i]) : NULL;
	s->rc = adg_step_give_all(call, values);
	return s->rc;
}

static int reject_poison(const void *value, void *ctx)
{
	(void)ctx;
	return ((const struct hv *)value)->h == POISON ? ADG_EVALUE : 0;
}

/* hv_add, failing on the poisoned value (which it owns, as any). */
static int hv_add_poisoned(void **sum, void *value, void *ctx)
{
	if (((struct hv *)value)->h == POISON) {
		hv_free(value, ctx);
		return ADG_EUSER - 5;
	}
	return hv_add(sum, value, ctx);
}

/* A backward from root in mode m with ops and an optional value check;
 * its result, *out the gradients on success. */
static int backward_all_in(enum mode m, struct run *r, adg_node *root,
			   const adg_grad_ops *ops, bool check, adg_grads **out)
{
	adg_backward_options o = {.size = sizeof o};
	if (m != SEQUENTIAL) {
		cr_assert_eq(adg_pool_new(m == POOL2 ? 2 : 1, &r->pool), 0);
		cr_assert_eq(adg_pool_executor(r->pool, &r->executor), 0);
		if (m == ALONE)
			r->executor.n_workers = 0;
		o.executor = &r->executor;
	}
	if (check)
		o.value_check = reject_poison;
	return adg_backward_with(reg, root, hv_new(1), ops, &o, out);
}

/* y = f(x, x, w) whose step gives proto's values at once; x's and w's
 * gradients (0: none), and the call's result in *rc. */
static void run_all(enum mode m, const uint64_t h[3], uint64_t *gx,
		    uint64_t *gw, int *rc)
{
	adg_node *x, *w, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_leaf(reg, &w), 0);
	struct giving_all s = {.h = {h[0], h[1], h[2]}};
	adg_node *parents[3] = {x, x, w};
	adg_step step = {.backward = giving_all_backward, .user = &s};
	cr_assert_eq(adg_op(reg, parents, 3, &step, &y), 0);
	struct run r = {0};
	adg_grads *g;
	cr_assert_eq(backward_all_in(m, &r, y, &hv_ops, false, &g), 0);
	cr_assert_eq(atomic_load(&s.runs), 1);
	void *v;
	*gx = adg_grads_get_node(g, x, &v) == 0 ? ((struct hv *)v)->h : 0;
	*gw = adg_grads_get_node(g, w, &v) == 0 ? ((struct hv *)v)->h : 0;
	*rc = s.rc;
	cr_assert_eq(adg_grads_free(g), 0);
	cr_assert_eq(adg_pool_free(r.pool), 0);
	adg_node *all[] = {y, x, w};
	for (int i = 0; i < 3; i++)
		adg_node_unref(all[i]);
}

/* Every slot, or some, in one call: folded as giving them one by one in
 * slot order, in every mode. */
CHECKED_TEST(give, all_at_once_in_every_mode)
{
	for (enum mode m = 0; m < N_MODES; m++) {
		uint64_t gx, gw;
		int rc;
		run_all(m, (const uint64_t[3]){5, 3, 7}, &gx, &gw, &rc);
		cr_assert_eq(rc, 0, "mode %d", m);
		cr_assert_eq(gx, 5 * 31 + 3, "mode %d", m);
		cr_assert_eq(gw, 7, "mode %d", m);
		run_all(m, (const uint64_t[3]){0, 3, 0}, &gx, &gw, &rc);
		cr_assert_eq(rc, 0, "mode %d", m);
		cr_assert_eq(gx, 3, "mode %d: slot 0 gave none", m);
		cr_assert_eq(gw, 0, "mode %d: w got none", m);
	}
}

/* The value check rejects slot 0's value: the call fails with its code,
 * and frees the values of slots 1 and 2, which it had not given yet
 * (fixture's end: no gradient left; ASan: none freed twice). */
CHECKED_TEST(give, all_at_once_frees_the_rest_on_a_rejected_value)
{
	for (enum mode m = 0; m < N_MODES; m++) {
		adg_node *x, *w, *y;
		cr_assert_eq(adg_leaf(reg, &x), 0);
		cr_assert_eq(adg_leaf(reg, &w), 0);
		struct giving_all s = {.h = {POISON, 3, 7}};
		adg_node *parents[3] = {x, x, w};
		adg_step step = {.backward = giving_all_backward, .user = &s};
		cr_assert_eq(adg_op(reg, parents, 3, &step, &y), 0);
		struct run r = {0};
		adg_grads *g = (adg_grads *)&g;
		cr_assert_eq(backward_all_in(m, &r, y, &hv_ops, true, &g),
			     ADG_EVALUE, "mode %d", m);
		cr_assert_null(g);
		cr_assert_eq(s.rc, ADG_EVALUE, "mode %d", m);
		cr_assert_eq(atomic_load(&scalar_values_live), 0, "mode %d", m);
		cr_assert_eq(adg_pool_free(r.pool), 0);
		adg_node *all[] = {y, x, w};
		for (int i = 0; i < 3; i++)
			adg_node_unref(all[i]);
	}
}

/* z = g(y, x) gives x a gradient first; then y = f(x, w) gives x the
 * poisoned one, whose add into it fails. Without an executor the add's
 * failure is the give's: the call returns it and frees w's value. With
 * one it is the backward's (the give succeeds, w's value is given). The
 * backward fails with it either way, and nothing is left. */
CHECKED_TEST(give, all_at_once_frees_the_rest_on_a_failed_add)
{
	const adg_grad_ops poisoned = {hv_add_poisoned, hv_free, NULL};
	for (enum mode m = 0; m < N_MODES; m++) {
		adg_node *x, *w, *y, *z;
		cr_assert_eq(adg_leaf(reg, &x), 0);
		cr_assert_eq(adg_leaf(reg, &w), 0);
		struct giving_all sy = {.h = {POISON, 7}};
		adg_node *py[2] = {x, w};
		adg_step stepy = {.backward = giving_all_backward, .user = &sy};
		cr_assert_eq(adg_op(reg, py, 2, &stepy, &y), 0);
		struct giving_all sz = {.h = {2, 4}};
		adg_node *pz[2] = {y, x};
		adg_step stepz = {.backward = giving_all_backward, .user = &sz};
		cr_assert_eq(adg_op(reg, pz, 2, &stepz, &z), 0);
		struct run r = {0};
		adg_grads *g = (adg_grads *)&g;
		cr_assert_eq(backward_all_in(m, &r, z, &poisoned, false, &g),
			     ADG_EUSER - 5, "mode %d", m);
		cr_assert_null(g);
		cr_assert_eq(sz.rc, 0);
		cr_assert_eq(sy.rc, m == SEQUENTIAL ? ADG_EUSER - 5 : 0,
			     "mode %d", m);
		cr_assert_eq(atomic_load(&scalar_values_live), 0, "mode %d", m);
		cr_assert_eq(adg_pool_free(r.pool), 0);
		adg_node *all[] = {z, y, x, w};
		for (int i = 0; i < 4; i++)
			adg_node_unref(all[i]);
	}
}

/* A slot given before the call: the call fails there, having given the
 * slots before it, and frees the rest. */
static int give_then_all(adg_step_call *call, void *user)
{
	int *rc = user;
	rc[0] = adg_step_give(call, 1, hv_new(3));
	void *values[2] = {hv_new(5), hv_new(9)};
	rc[1] = adg_step_give_all(call, values);
	/* Not a step's call, or nothing to give: nothing taken. */
	void *kept[2] = {hv_new(1), NULL};
	rc[2] = adg_step_give_all(NULL, kept);
	adg_step_call fake = *call;
	fake.context = NULL;
	rc[3] = adg_step_give_all(&fake, kept);
	hv_free(kept[0], NULL);
	rc[4] = adg_step_give_all(call, NULL);
	return 0;
}

CHECKED_TEST(give, all_at_once_refusals)
{
	adg_node *x, *w, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_leaf(reg, &w), 0);
	int rc[5] = {0};
	adg_node *parents[2] = {x, w};
	adg_step step = {.backward = give_then_all, .user = rc};
	cr_assert_eq(adg_op(reg, parents, 2, &step, &y), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, hv_new(1), &hv_ops, &g), 0);
	cr_assert_eq(rc[0], 0);
	cr_assert_eq(rc[1], ADG_EINVAL, "slot 1 was given");
	cr_assert_eq(rc[2], ADG_EINVAL);
	cr_assert_eq(rc[3], ADG_EINVAL);
	cr_assert_eq(rc[4], ADG_EINVAL);
	cr_assert_eq(hv_of(g, x), 5, "slot 0 given before the refusal");
	cr_assert_eq(hv_of(g, w), 3);
	cr_assert_eq(adg_grads_free(g), 0);
	adg_node *all[] = {y, x, w};
	for (int i = 0; i < 3; i++)
		adg_node_unref(all[i]);
}

/* ------------------------------------------------------ deprecated path */

/* What the step of deprecated_register_by_id did, checked on the test's
 * thread. */
struct by_id {
	uint64_t mid; /* a leaf's id inside the tape's span, no parent */
	int order_rc[3], other_rc, self_rc, extra_rc, null_rc, zero_rc;
	int get_rc, take_rc, count_rc, free_rc;
	void *got, *taken;
	size_t count;
	atomic_int runs;
};

/* adg_grads_register on call->grads is deprecated (the field is marked
 * ADG_DEPRECATED in adg.h) in favour of adg_step_give, which every other
 * step of the tests uses. Until the field goes, this step keeps the path
 * covered, so the warning is silenced here alone: on purpose, for as long
 * as the path is there to test. y = f(x, x, w). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static int by_id_backward(adg_step_call *call, void *user)
{
	struct by_id *b = user;
	adg_grads *grads = call->grads;
	const uint64_t *ids = call->parent_ids;
	atomic_fetch_add(&b->runs, 1);
	/* By id, out of slot order: w, then x twice. */
	b->order_rc[0] = adg_grads_register(grads, ids[2], hv_new(7));
	b->order_rc[1] = adg_grads_register(grads, ids[1], hv_new(3));
	b->order_rc[2] = adg_grads_register(grads, ids[0], hv_new(5));
	/* What only an id can name: a node that is no parent, a parent
	 * once more than it has slots. */
	b->other_rc = adg_grads_register(grads, b->mid, hv_new(11));
	b->extra_rc = adg_grads_register(grads, ids[0], hv_new(17));
	b->null_rc = adg_grads_register(grads, ids[0], NULL);
	b->zero_rc = adg_grads_register(grads, 0, hv_new(19));
	/* The container functions, on what the step sees. */
	b->got = &b->got;
	b->get_rc = adg_grads_get(grads, b->mid, &b->got);
	b->count = 12345;
	b->count_rc = adg_grads_count(grads, &b->count);
	return 0;
}

/* With an executor, also what only a view may be given: the step's own
 * id, take and free (on the sequential backward's container they would
 * take and free the backward's own). */
static int by_id_view_backward(adg_step_call *call, void *user)
{
	struct by_id *b = user;
	int rc = by_id_backward(call, user);
	b->self_rc = adg_grads_register(call->grads, call->node_id, hv_new(13));
	b->taken = &b->taken;
	b->take_rc =
		adg_grads_take(call->grads, call->parent_ids[0], &b->taken);
	b->free_rc = adg_grads_free(call->grads);
	return rc;
}
#pragma GCC diagnostic pop

/* In every mode, registering by id folds as giving does. Without an
 * executor call->grads is the backward's own container: any id goes
 * (mid's gradient lands in the window of the tape's ids, and the step
 * reads it back), a parent takes any number of gradients, each added as
 * it comes. With one, it is the step's own view: one gradient per parent
 * slot, ADG_EINVAL and the value freed for anything else (an id that is
 * no parent, the step's own, a parent whose slots are all taken), and
 * the container functions refuse it. A NULL value and id 0 are refused
 * in every mode. */
CHECKED_TEST(give, deprecated_register_by_id_in_every_mode)
{
	for (enum mode m = 0; m < N_MODES; m++) {
		adg_node *x, *w, *mid, *y;
		cr_assert_eq(adg_leaf(reg, &x), 0);
		cr_assert_eq(adg_leaf(reg, &w), 0);
		cr_assert_eq(adg_leaf(reg, &mid), 0); /* between x's and y's */
		struct by_id b = {0};
		cr_assert_eq(adg_node_id(mid, &b.mid), 0);
		atomic_init(&b.runs, 0);
		adg_node *parents[3] = {x, x, w};
		adg_step step = {.backward = m == SEQUENTIAL
						     ? by_id_backward
						     : by_id_view_backward,
				 .user = &b};
		cr_assert_eq(adg_op(reg, parents, 3, &step, &y), 0);
		struct run r = {0};
		adg_grads *g;
		cr_assert_eq(backward_in(m, &r, y, &g), 0, "mode %d", m);
		cr_assert_eq(atomic_load(&b.runs), 1);
		cr_assert_eq(b.order_rc[0] | b.order_rc[1] | b.order_rc[2], 0,
			     "mode %d", m);
		cr_assert_eq(b.null_rc, ADG_EINVAL, "mode %d", m);
		cr_assert_eq(b.zero_rc, ADG_EINVAL, "mode %d", m);
		cr_assert_eq(hv_of(g, w), 7, "mode %d", m);
		void *v = NULL;
		if (m == SEQUENTIAL) {
			cr_assert_eq(b.other_rc, 0);
			cr_assert_eq(b.extra_rc, 0, "added as it comes");
			cr_assert_eq(hv_of(g, x), (3 * 31 + 5) * 31 + 17);
			cr_assert_eq(hv_of(g, mid), 11);
			cr_assert_eq(b.get_rc, 0, "the step sees what it gave");
			cr_assert_eq(((struct hv *)b.got)->h, 11);
			cr_assert_eq(b.count_rc, 0);
			cr_assert_eq(b.count, 3, "x's, w's and mid's");
		} else {
			cr_assert_eq(b.other_rc, ADG_EINVAL, "mode %d", m);
			cr_assert_eq(b.self_rc, ADG_EINVAL, "mode %d", m);
			cr_assert_eq(b.extra_rc, ADG_EINVAL, "mode %d", m);
			cr_assert_eq(hv_of(g, x), 3 * 31 + 5, "mode %d", m);
			cr_assert_eq(adg_grads_get_node(g, mid, &v),
				     ADG_ENOTFOUND, "mode %d", m);
			cr_assert_eq(b.get_rc, ADG_EINVAL, "mode %d", m);
			cr_assert_null(b.got);
			cr_assert_eq(b.count_rc, ADG_EINVAL, "mode %d", m);
			cr_assert_eq(b.count, 12345);
			cr_assert_eq(b.take_rc, ADG_EINVAL, "mode %d", m);
			cr_assert_null(b.taken);
			cr_assert_eq(b.free_rc, ADG_EINVAL, "mode %d", m);
		}
		cr_assert_eq(adg_grads_free(g), 0);
		cr_assert_eq(adg_pool_free(r.pool), 0);
		adg_node *all[] = {x, w, mid, y};
		for (int i = 0; i < 4; i++)
			cr_assert_eq(adg_node_unref(all[i]), 0);
		cr_assert_eq(atomic_load(&scalar_values_live), 0,
			     "mode %d: every value refused was freed", m);
	}
}
