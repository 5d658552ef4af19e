/* The gradient-ready hook of adg_backward_with. */
#include "fixture.h"

#include <stdlib.h>

FIXTURE_SUITE(hooks);

/* What the hook saw, in order. */
#define MAX_EVENTS 64
static struct event {
	uint64_t id;
	double value; /* NAN when no gradient */
	int seq;      /* global order among hooks and steps */
} events[MAX_EVENTS];
static int n_events, seq;
static uint64_t take_id; /* the hook takes this id's gradient */
static double taken;
static int fail_on_event = -1;

static int record(uint64_t id, void **grad, void *ctx)
{
	(void)ctx;
	cr_assert_lt(n_events, MAX_EVENTS);
	events[n_events].id = id;
	events[n_events].value = *grad ? *(double *)*grad : -1;
	events[n_events].seq = seq++;
	if (id == take_id && *grad != NULL) {
		taken = *(double *)*grad;
		scalar_ops.free(*grad, NULL);
		*grad = NULL;
	}
	return n_events++ == fail_on_event ? ADG_EUSER - 2 : 0;
}

static void reset(void)
{
	n_events = 0;
	seq = 0;
	take_id = 0;
	fail_on_event = -1;
}

static int index_of(uint64_t id)
{
	for (int i = 0; i < n_events; i++)
		if (events[i].id == id)
			return i;
	return -1;
}

static int count_of(uint64_t id)
{
	int n = 0;
	for (int i = 0; i < n_events; i++)
		n += events[i].id == id;
	return n;
}

static int backward_with(scalar root, int leaves_only, adg_grads **g)
{
	adg_backward_options o = {.size = sizeof o,
				  .on_ready = record,
				  .leaves_only = leaves_only};
	return adg_backward_with(reg, root.node, scalar_box(1), &scalar_ops, &o,
				 g);
}

static void drop_all(scalar *all, int n)
{
	for (int i = 0; i < n; i++)
		s_drop(all[i]);
}

/* A diamond: x = a b, p = x a, q = x b, z = p + q. Each leaf's hook fires
 * once, after x (the last step naming it), with the final gradient. */
CHECKED_TEST(hooks, diamond_fires_once_per_leaf_with_the_final_value)
{
	reset();
	scalar a = s_leaf(reg, 3), b = s_leaf(reg, 4);
	scalar x = s_mul(reg, a, b), p = s_mul(reg, x, a), q = s_mul(reg, x, b);
	scalar z = s_add(reg, p, q);
	adg_grads *g;
	cr_assert_eq(backward_with(z, 1, &g), 0);
	cr_assert_eq(n_events, 2, "leaves only: a and b");
	cr_expect_eq(count_of(a.id), 1);
	cr_expect_eq(count_of(b.id), 1);
	cr_expect_eq(events[index_of(a.id)].value, s_grad(g, a));
	cr_expect_eq(events[index_of(b.id)].value, s_grad(g, b));
	cr_expect_eq(s_grad(g, a), 40.0); /* 2ab + b^2 */
	cr_expect_eq(s_grad(g, b), 33.0); /* a^2 + 2ab */
	adg_grads_free(g);
	scalar all[] = {a, b, x, p, q, z};
	drop_all(all, 6);
}

/* Three layers, loss = (w3 * (w2 * (w1 * x)))^2: a leaf used near the root
 * is final, and fires, before a leaf used deep in the graph. */
CHECKED_TEST(hooks, mlp_near_root_leaf_fires_before_deep_leaf)
{
	reset();
	scalar x = s_leaf(reg, 2), w1 = s_leaf(reg, 3), w1b = s_leaf(reg, 5);
	scalar w2 = s_leaf(reg, 7), w3 = s_leaf(reg, 11);
	scalar h1 = s_mul(reg, w1, x), h1b = s_mul(reg, w1b, x);
	scalar s1 = s_add(reg, h1, h1b);
	scalar h2 = s_mul(reg, s1, w2);
	scalar out = s_mul(reg, h2, w3);
	scalar loss = s_mul(reg, out, out);
	adg_grads *g;
	cr_assert_eq(backward_with(loss, 1, &g), 0);
	cr_assert_eq(n_events, 5);
	scalar leaves[] = {x, w1, w1b, w2, w3};
	for (int i = 0; i < 5; i++) {
		cr_expect_eq(count_of(leaves[i].id), 1, "leaf %d", i);
		cr_expect_eq(events[index_of(leaves[i].id)].value,
			     s_grad(g, leaves[i]), "leaf %d", i);
	}
	cr_expect_lt(index_of(w3.id), index_of(w2.id));
	cr_expect_lt(index_of(w2.id), index_of(w1.id));
	cr_expect_lt(index_of(w2.id), index_of(w1b.id));
	adg_grads_free(g);
	scalar all[] = {x, w1, w1b, w2, w3, h1, h1b, s1, h2, out, loss};
	drop_all(all, 11);
}

/* With every node: the root fires first, with the seed; each node fires
 * once, before its own step runs. */
static int step_seq[16];
static uint64_t step_ids[16];
static int n_steps;

static int logging_prod(adg_step_call *call, void *user)
{
	step_ids[n_steps] = call->node_id;
	step_seq[n_steps++] = seq++;
	return prod_backward(call, user);
}

static scalar logged_mul(scalar a, scalar b)
{
	scalar f[2] = {a, b};
	scalar y = {.value = a.value * b.value};
	adg_node *p[2] = {a.node, b.node};
	adg_step st = {.backward = logging_prod,
		       .release = prod_release,
		       .user = prod_step_new(f, 2)};
	cr_assert_eq(adg_op(reg, p, 2, &st, &y.node), 0);
	adg_node_id(y.node, &y.id);
	return y;
}

CHECKED_TEST(hooks, every_node_fires_before_its_step)
{
	reset();
	n_steps = 0;
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = logged_mul(a, b), y = logged_mul(x, a), z = logged_mul(y, x);
	adg_grads *g;
	cr_assert_eq(backward_with(z, 0, &g), 0);
	cr_assert_eq(n_steps, 3);
	cr_expect_eq(n_events, 5, "z, y, x, then the leaves");
	cr_expect_eq(events[0].id, z.id);
	cr_expect_eq(events[0].value, 1.0, "the seed");
	for (int i = 0; i < n_steps; i++) {
		int e = index_of(step_ids[i]);
		cr_assert_geq(e, 0);
		cr_expect_lt(events[e].seq, step_seq[i], "node %llu",
			     (unsigned long long)step_ids[i]);
		cr_expect_eq(count_of(step_ids[i]), 1);
	}
	adg_grads_free(g);
	scalar all[] = {a, b, x, y, z};
	drop_all(all, 5);
}

/* A hook may keep a leaf's gradient: it then owns it, and the container
 * no longer holds it. */
CHECKED_TEST(hooks, hook_may_take_a_gradient)
{
	reset();
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar y = s_mul(reg, a, b);
	take_id = a.id;
	adg_grads *g;
	cr_assert_eq(backward_with(y, 1, &g), 0);
	cr_expect_eq(taken, 3.0);
	void *v;
	cr_expect_eq(adg_grads_get(g, a.id, &v), ADG_ENOTFOUND);
	cr_expect_eq(s_grad(g, b), 2.0);
	adg_grads_free(g);
	scalar all[] = {a, b, y};
	drop_all(all, 3);
}

/* A failing step: no hook for what never became final. */
struct failing {
	struct prod_step *inner;
};

static int failing_step(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return ADG_EUSER - 1;
}

static void failing_release(void *user)
{
	prod_release(user);
}

CHECKED_TEST(hooks, failing_step_leaves_later_gradients_unannounced)
{
	reset();
	scalar x = s_leaf(reg, 2), w1 = s_leaf(reg, 3), w3 = s_leaf(reg, 5);
	scalar h = s_mul(reg, w1, x); /* its step never runs */
	scalar f[2] = {h, x};
	adg_node *p[2] = {h.node, x.node};
	adg_step st = {.backward = failing_step,
		       .release = failing_release,
		       .user = prod_step_new(f, 2)};
	scalar mid = {.value = h.value * x.value};
	cr_assert_eq(adg_op(reg, p, 2, &st, &mid.node), 0);
	scalar out = s_mul(reg, mid, w3);
	adg_grads *g = (adg_grads *)&g;
	cr_expect_eq(backward_with(out, 1, &g), ADG_EUSER - 1);
	cr_expect_null(g);
	cr_expect_eq(n_events, 1, "only w3 became final");
	cr_expect_eq(events[0].id, w3.id);
	cr_expect_eq(events[0].value, 12.0); /* mid = h x = (3 2) 2 */
	scalar all[] = {x, w1, w3, h, mid, out};
	drop_all(all, 6);
}

/* A hook that fails stops the backward like a failing step. */
CHECKED_TEST(hooks, failing_hook_stops_the_backward)
{
	reset();
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = s_mul(reg, a, b), y = s_mul(reg, x, a);
	fail_on_event = 0;
	adg_grads *g = (adg_grads *)&g;
	cr_expect_eq(backward_with(y, 0, &g), ADG_EUSER - 2);
	cr_expect_null(g);
	cr_expect_eq(n_events, 1, "the root's, then nothing");
	assert_stats(reg, 4, 0, 0);
	scalar all[] = {a, b, x, y};
	drop_all(all, 4);
}

CHECKED_TEST(hooks, leaf_root_fires_once)
{
	reset();
	scalar a = s_leaf(reg, 2);
	adg_grads *g;
	cr_assert_eq(backward_with(a, 1, &g), 0);
	cr_expect_eq(n_events, 1);
	cr_expect_eq(events[0].id, a.id);
	cr_expect_eq(events[0].value, 1.0);
	adg_grads_free(g);
	/* NULL options: a plain backward. */
	cr_assert_eq(adg_backward_with(reg, a.node, scalar_box(1), &scalar_ops,
				       NULL, &g),
		     0);
	cr_expect_eq(n_events, 1);
	adg_grads_free(g);
	s_drop(a);
}
