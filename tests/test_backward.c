/* Backward: the chain rule through products, repeated parents, consumed
 * steps, nested backward, failing steps. */
#include "fixture.h"

#include <stdlib.h>

FIXTURE_SUITE(backward);

static size_t count(const adg_grads *g)
{
	size_t n = 0;
	cr_assert_eq(adg_grads_count(g, &n), 0);
	return n;
}

/* 1. z = (a*b)*(c*d): each leaf gets the product of the other three, and a
 * tree built alongside is untouched by it. */
CHECKED_TEST(backward, product_tree_leaves_get_product_of_the_others)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), c = s_leaf(reg, 5),
	       d = s_leaf(reg, 7);
	scalar ab = s_mul(reg, a, b), cd = s_mul(reg, c, d);
	scalar z = s_mul(reg, ab, cd);
	scalar e = s_leaf(reg, 11), f = s_leaf(reg, 13), g = s_leaf(reg, 17),
	       h = s_leaf(reg, 19);
	scalar ef = s_mul(reg, e, f), gh = s_mul(reg, g, h);
	scalar w = s_mul(reg, ef, gh);
	cr_assert_neq(s_graph(z), s_graph(w), "unrelated trees share a graph");
	assert_stats(reg, 14, 6, 2);

	adg_grads *gz;
	cr_assert_eq(s_backward(reg, z, &gz), 0);
	cr_expect_eq(s_grad(gz, a), 3.0 * 5 * 7);
	cr_expect_eq(s_grad(gz, b), 2.0 * 5 * 7);
	cr_expect_eq(s_grad(gz, c), 2.0 * 3 * 7);
	cr_expect_eq(s_grad(gz, d), 2.0 * 3 * 5);
	cr_expect_eq(count(gz), 4, "only the leaves' gradients remain");
	adg_grads_free(gz);
	/* w's three steps are still there and its graph still stands. */
	assert_stats(reg, 14, 3, 1);
	cr_expect_eq(s_graph(z), 0, "a consumed node is in no graph");
	cr_expect_neq(s_graph(w), 0);

	adg_grads *gw;
	cr_assert_eq(s_backward(reg, w, &gw), 0);
	cr_expect_eq(s_grad(gw, e), 13.0 * 17 * 19);
	cr_expect_eq(s_grad(gw, f), 11.0 * 17 * 19);
	cr_expect_eq(s_grad(gw, g), 11.0 * 13 * 19);
	cr_expect_eq(s_grad(gw, h), 11.0 * 13 * 17);
	cr_expect_eq(count(gw), 4);
	adg_grads_free(gw);
	assert_stats(reg, 14, 0, 0);

	scalar all[] = {a, b, c, d, ab, cd, z, e, f, g, h, ef, gh, w};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		s_drop(all[i]);
	assert_stats(reg, 0, 0, 0);
}

/* 2. y = x*x names x twice: both contributions add up to 2x. */
CHECKED_TEST(backward, parent_named_twice_gives_2x)
{
	scalar x = s_leaf(reg, 3);
	scalar y = s_mul(reg, x, x);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	cr_expect_eq(s_grad(g, x), 6.0);
	cr_expect_eq(count(g), 1);
	adg_grads_free(g);
	s_drop(y);
	s_drop(x);
}

/* 3. x = a*b, y1 = x*c, y2 = x*d; the caller drops x. backward(y1) takes
 * x's step; backward(y2) then fails and changes nothing. */
CHECKED_TEST(backward, consumed_shared_step_fails_and_changes_nothing)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), c = s_leaf(reg, 5),
	       d = s_leaf(reg, 7);
	scalar x = s_mul(reg, a, b);
	scalar y1 = s_mul(reg, x, c), y2 = s_mul(reg, x, d);
	s_drop(x);

	adg_grads *g1;
	cr_assert_eq(s_backward(reg, y1, &g1), 0);
	cr_expect_eq(s_grad(g1, a), 3.0 * 5);
	cr_expect_eq(s_grad(g1, b), 2.0 * 5);
	cr_expect_eq(s_grad(g1, c), 6.0);
	adg_grads_free(g1);
	/* y2's step is left; x lives on, consumed, because y2 names it. */
	assert_stats(reg, 7, 1, 1);
	long values = atomic_load(&scalar_values_live);

	adg_grads *g2 = (adg_grads *)&g2;
	cr_expect_eq(s_backward(reg, y2, &g2), ADG_EUNAVAILABLE);
	cr_expect_null(g2, "no partial gradients");
	cr_expect_eq(atomic_load(&scalar_values_live), values,
		     "the seed was freed, nothing else was made");
	assert_stats(reg, 7, 1, 1);
	cr_expect_neq(s_graph(y2), 0, "y2's step is still registered");
	/* And it stays usable the same way a second time. */
	cr_expect_eq(s_backward(reg, y2, &g2), ADG_EUNAVAILABLE);

	s_drop(y2);
	assert_stats(reg, 5, 0, 0);
	scalar rest[] = {a, b, c, d, y1};
	for (size_t i = 0; i < 5; i++)
		s_drop(rest[i]);
}

CHECKED_TEST(backward, twice_on_the_same_root_is_consumed)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar y = s_mul(reg, a, b);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	adg_grads_free(g);
	g = (adg_grads *)&g;
	cr_expect_eq(s_backward(reg, y, &g), ADG_ECONSUMED);
	cr_expect_null(g);
	s_drop(y);
	s_drop(a);
	s_drop(b);
}

CHECKED_TEST(backward, on_a_leaf_returns_the_seed)
{
	scalar a = s_leaf(reg, 2);
	adg_grads *g;
	cr_assert_eq(
		adg_backward(reg, a.node, scalar_box(4.5), &scalar_ops, &g), 0);
	cr_expect_eq(s_grad(g, a), 4.5);
	cr_expect_eq(count(g), 1);
	adg_grads_free(g);
	/* A leaf is never consumed. */
	cr_assert_eq(s_backward(reg, a, &g), 0);
	adg_grads_free(g);
	s_drop(a);
}

/* A diamond through a sum: every path adds to the shared leaf, and the
 * shared intermediate's step runs once, after both of its children. */
CHECKED_TEST(backward, diamond_runs_shared_step_once_after_its_children)
{
	scalar a = s_leaf(reg, 3), b = s_leaf(reg, 4);
	scalar x = s_mul(reg, a, b); /* 12 */
	scalar p = s_mul(reg, x, a); /* 36 */
	scalar q = s_mul(reg, x, b); /* 48 */
	scalar z = s_add(reg, p, q); /* x*a + x*b = a*a*b + a*b*b */
	adg_grads *g;
	cr_assert_eq(s_backward(reg, z, &g), 0);
	/* dz/da = 2ab + b^2 = 24 + 16; dz/db = a^2 + 2ab = 9 + 24 */
	cr_expect_eq(s_grad(g, a), 40.0);
	cr_expect_eq(s_grad(g, b), 33.0);
	adg_grads_free(g);
	scalar all[] = {a, b, x, p, q, z};
	for (size_t i = 0; i < 6; i++)
		s_drop(all[i]);
}

/* 6. A step that runs backward on another graph, and one that runs
 * backward on a sibling in its own graph, complete without deadlock. */
struct nested {
	struct prod_step *inner; /* the product's own closure */
	adg_node *other_root;	 /* a disjoint graph */
	adg_node *sibling;	 /* a node of the same graph */
	uint64_t other_leaf;
};

/* What the nested step saw; its closure is gone once it has been released. */
static double nested_other_grad;
static int nested_sibling_rc;

static int nested_backward(adg_step_call *call, void *user)
{
	struct nested *n = user;
	adg_grads *g;
	int rc = adg_backward(call->registry, n->other_root, scalar_box(1.0),
			      &scalar_ops, &g);
	if (rc != 0)
		return rc;
	void *v;
	cr_assert_eq(adg_grads_get(g, n->other_leaf, &v), 0);
	nested_other_grad = *(double *)v;
	adg_grads_free(g);
	/* The sibling needs x, which this backward has taken. */
	nested_sibling_rc = adg_backward(call->registry, n->sibling,
					 scalar_box(1.0), &scalar_ops, &g);
	return prod_backward(call, n->inner);
}

static void nested_release(void *user)
{
	struct nested *n = user;
	prod_release(n->inner);
	free(n);
}

CHECKED_TEST(backward, nested_backward_in_a_step_completes)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), c = s_leaf(reg, 5);
	scalar e = s_leaf(reg, 7), f = s_leaf(reg, 11);
	scalar other = s_mul(reg, e, f);
	scalar x = s_mul(reg, a, b);
	scalar sib = s_mul(reg, x, a);

	struct nested *n = calloc(1, sizeof *n);
	scalar factors[2] = {x, c};
	n->inner = prod_step_new(factors, 2);
	n->other_root = other.node;
	n->sibling = sib.node;
	n->other_leaf = e.id;
	adg_step step = {.backward = nested_backward,
			 .release = nested_release,
			 .user = n};
	adg_node *parents[2] = {x.node, c.node};
	scalar y = {.value = x.value * c.value};
	cr_assert_eq(adg_op(reg, parents, 2, &step, &y.node), 0);
	adg_node_id(y.node, &y.id);

	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	cr_expect_eq(nested_other_grad, 11.0, "the nested backward's gradient");
	cr_expect_eq(nested_sibling_rc, ADG_EUNAVAILABLE);
	cr_expect_eq(s_grad(g, a), 15.0);
	cr_expect_eq(s_grad(g, c), 6.0);
	adg_grads_free(g);
	scalar all[] = {a, b, c, e, f, other, x, sib, y};
	for (size_t i = 0; i < 9; i++)
		s_drop(all[i]);
}

/* 7. A failing step stops the backward: its code comes back, every step
 * is released exactly once, no gradient is left. */
struct failing {
	struct prod_step *inner;
	int rc;
};

static int failing_backward(adg_step_call *call, void *user)
{
	struct failing *f = user;
	int rc = prod_backward(call, f->inner);
	return rc != 0 ? rc : f->rc;
}

static void failing_release(void *user)
{
	struct failing *f = user;
	prod_release(f->inner);
	free(f);
}

static void run_failing_chain(int step_rc, int want)
{
	enum { LEN = 10, FAIL_AT = 5 };
	scalar w = s_leaf(reg, 2);
	scalar chain[LEN];
	struct prod_step *steps[LEN];
	scalar prev = s_leaf(reg, 1);
	scalar first = prev;
	for (int i = 0; i < LEN; i++) {
		scalar f[2] = {prev, w};
		if (i == FAIL_AT) {
			struct failing *fl = malloc(sizeof *fl);
			fl->inner = prod_step_new(f, 2);
			fl->rc = step_rc;
			steps[i] = fl->inner;
			adg_step st = {.backward = failing_backward,
				       .release = failing_release,
				       .user = fl};
			adg_node *p[2] = {prev.node, w.node};
			chain[i].value = prev.value * w.value;
			cr_assert_eq(adg_op(reg, p, 2, &st, &chain[i].node), 0);
		} else {
			chain[i] = s_mul(reg, prev, w);
		}
		prev = chain[i];
	}
	(void)steps;
	long values = atomic_load(&scalar_values_live);
	adg_grads *g = (adg_grads *)&g;
	cr_expect_eq(s_backward(reg, chain[LEN - 1], &g), want);
	cr_expect_null(g);
	cr_expect_eq(atomic_load(&scalar_values_live), values,
		     "no gradient left behind");
	cr_expect_eq(atomic_load(&scalar_steps_live), 0, "every step released");
	assert_stats(reg, LEN + 2, 0, 0);
	for (int i = 0; i < LEN; i++)
		adg_node_unref(chain[i].node);
	s_drop(w);
	s_drop(first);
}

CHECKED_TEST(backward, failing_step_returns_its_code_and_releases_the_rest)
{
	run_failing_chain(ADG_EUSER - 7, ADG_EUSER - 7);
}

CHECKED_TEST(backward, positive_step_result_is_ecallback)
{
	run_failing_chain(3, ADG_ECALLBACK);
}

/* Each step runs after its children's (n[0]'s after n[3]'s and n[1]'s),
 * the last readied first: the order is fixed by shape, not timing. */
static int order_log[8];
static atomic_int order_len;

static int logging_backward(adg_step_call *call, void *user)
{
	order_log[atomic_fetch_add(&order_len, 1)] = (int)(intptr_t)user;
	for (size_t i = 0; i < call->n_parents; i++)
		adg_step_give(call, i, scalar_box(1));
	return 0;
}

CHECKED_TEST(backward, steps_run_after_their_children)
{
	scalar a = s_leaf(reg, 1);
	adg_node *n[4];
	adg_step st = {.backward = logging_backward,
		       .release = NULL,
		       .user = (void *)1};
	cr_assert_eq(adg_op(reg, &a.node, 1, &st, &n[0]), 0); /* depth 1 */
	st.user = (void *)2;
	cr_assert_eq(adg_op(reg, &n[0], 1, &st, &n[1]), 0); /* depth 2 */
	st.user = (void *)3;
	cr_assert_eq(adg_op(reg, &n[1], 1, &st, &n[2]), 0); /* depth 3 */
	st.user = (void *)4;
	adg_node *p[2] = {n[2], n[0]};
	cr_assert_eq(adg_op(reg, p, 2, &st, &n[3]), 0); /* depth 4 */
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, n[3], scalar_box(1), &scalar_ops, &g),
		     0);
	cr_assert_eq(atomic_load(&order_len), 4);
	for (int i = 0; i < 4; i++)
		cr_expect_eq(order_log[i], 4 - i);
	/* n[0] got contributions from n[3] and n[1]: both ran before it. */
	cr_expect_eq(s_grad(g, a), 1.0);
	adg_grads_free(g);
	for (int i = 0; i < 4; i++)
		adg_node_unref(n[i]);
	s_drop(a);
}
