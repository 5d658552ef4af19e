/* Checkpointing: outputs kept or recomputed for the backward, with counted
 * lifetimes. Outputs here are the scalar backend's heap doubles, counted
 * alive, so that leaks and double frees show (and ASan catches them). */
#include "fixture.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static atomic_long recomputes;

static void open_registry(int strategy)
{
	atomic_store(&recomputes, 0);
	adg_registry_options o = {.size = sizeof o, .checkpointing = strategy};
	fixture_open(&o);
}

/* --------------------------------------------------------------- ops */

/* What the ops' steps and recompute callbacks know. */
struct op {
	double k; /* the constant of y = x + k, or a leaf factor */
	double x; /* the forward value of the op's non-leaf input */
	int fail; /* the step fails */
};

static void *op_new(struct op o)
{
	struct op *p = malloc(sizeof *p);
	cr_assert_not_null(p);
	*p = o;
	atomic_fetch_add(&scalar_steps_live, 1);
	return p;
}

static void op_release(void *user)
{
	free(user);
	atomic_fetch_sub(&scalar_steps_live, 1);
}

static double grad_of(const adg_step_call *call)
{
	return call->grad ? *(double *)call->grad : 0;
}

/* y = x + k: an add, memory-bound; its backward needs nothing. */
static int add_k_backward(adg_step_call *call, void *user)
{
	struct op *o = user;
	if (o->fail)
		return ADG_EUSER - 3;
	return adg_step_give(call, 0, scalar_box(grad_of(call)));
}

static int add_k_recompute(adg_recompute_call *call, void *user)
{
	struct op *o = user;
	atomic_fetch_add(&recomputes, 1);
	cr_assert_not_null(call->parent_outputs[0]);
	call->output = s_output_new(*(double *)call->parent_outputs[0] + o->k);
	return 0;
}

/* y = x * w, w a leaf: compute-bound; its backward needs x's output. */
static int mul_leaf_backward(adg_step_call *call, void *user)
{
	struct op *o = user;
	void *x;
	int rc = adg_output_get(call, call->parent_ids[0], &x);
	if (rc != 0)
		return rc;
	double g = grad_of(call);
	rc = adg_step_give(call, 0, scalar_box(g * o->k));
	if (rc == 0)
		rc = adg_step_give(call, 1, scalar_box(g * *(double *)x));
	return rc;
}

/* y = a * w on two leaves: compute-bound, needs nothing kept. */
static int mul_leaves_backward(adg_step_call *call, void *user)
{
	struct op *o = user;
	double g = grad_of(call);
	int rc = adg_step_give(call, 0, scalar_box(g * o->k));
	if (rc == 0)
		rc = adg_step_give(call, 1, scalar_box(g * o->x));
	return rc;
}

static adg_node *make(adg_node **parents, size_t n, adg_backward_fn fn,
		      struct op o, const adg_output *out, int n_want,
		      const uint32_t *want)
{
	adg_step st = {
		.backward = fn, .release = op_release, .user = op_new(o)};
	adg_op_options opt = {sizeof opt, out, 0, want, (size_t)n_want, 0};
	adg_node *y;
	int rc = adg_op_with(reg, parents, n, &st, &opt, &y);
	cr_assert_eq(rc, 0, "adg_op_with: %s", adg_strerror(rc));
	return y;
}

static void drop_nodes(adg_node **nodes, size_t n)
{
	for (size_t i = 0; i < n; i++)
		adg_node_unref(nodes[i]);
}

/* c0 = a * w, then 64 adds, then c1 = m64 * w2; returns the leaves and
 * nodes it made in *nodes (a, w, w2, c0, m1..m64, c1). */
#define CHAIN 64
static adg_node *chain[CHAIN + 5];
static const double A = 2, W = 3, W2 = 5;

static void build_chain(int fail_at)
{
	adg_node *a, *w, *w2;
	cr_assert_eq(adg_leaf(reg, &a), 0);
	cr_assert_eq(adg_leaf(reg, &w), 0);
	cr_assert_eq(adg_leaf(reg, &w2), 0);
	adg_node *p2[2] = {a, w};
	adg_output out = {s_output_new(A * W), s_output_free, NULL, 0, NULL};
	adg_node *c0 = make(p2, 2, mul_leaves_backward, (struct op){W, A, 0},
			    &out, 0, NULL);
	chain[0] = a, chain[1] = w, chain[2] = w2, chain[3] = c0;
	adg_node *prev = c0;
	double v = A * W;
	for (int i = 1; i <= CHAIN; i++) {
		v += 1;
		adg_output o = {s_output_new(v), s_output_free, add_k_recompute,
				1, NULL};
		prev = make(&prev, 1, add_k_backward,
			    (struct op){1, v - 1, i == fail_at}, &o, 0, NULL);
		chain[3 + i] = prev;
	}
	adg_node *p3[2] = {prev, w2};
	const uint32_t want0 = 0;
	adg_output oc = {s_output_new(v * W2), s_output_free, NULL, 0, NULL};
	chain[CHAIN + 4] = make(p3, 2, mul_leaf_backward, (struct op){W2, v, 0},
				&oc, 1, &want0);
}

static void drop_chain(void)
{
	for (int i = 0; i < CHAIN + 5; i++)
		adg_node_unref(chain[i]);
}

/* Runs the chain's backward; returns the peak of live outputs during it. */
static long chain_backward(double grads_out[3])
{
	atomic_store(&scalar_outputs_peak, atomic_load(&scalar_outputs_live));
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, chain[CHAIN + 4], scalar_box(1),
				  &scalar_ops, &g),
		     0);
	long peak = atomic_load(&scalar_outputs_peak);
	for (int i = 0; i < 3; i++) {
		void *v;
		cr_assert_eq(adg_grads_get_node(g, chain[i], &v), 0);
		grads_out[i] = *(double *)v;
	}
	adg_grads_free(g);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0,
		     "all outputs served");
	return peak;
}

Test(checkpoint, chain_balanced_keeps_a_handful_none_keeps_all)
{
	double want[3] = {W * W2, A * W2, A * W + CHAIN}, got[2][3];
	long peak[2], made_extra[2];
	const int strategies[2] = {ADG_CHECKPOINT_NONE,
				   ADG_CHECKPOINT_BALANCED};
	for (int s = 0; s < 2; s++) {
		open_registry(strategies[s]);
		build_chain(0);
		long made = atomic_load(&scalar_outputs_made);
		peak[s] = chain_backward(got[s]);
		made_extra[s] = atomic_load(&scalar_outputs_made) - made;
		for (int i = 0; i < 3; i++)
			cr_expect_eq(got[s][i], want[i], "strategy %d leaf %d",
				     s, i);
		drop_chain();
		fixture_close();
	}
	fprintf(stderr,
		"checkpoint chain of %d adds: peak live outputs during the "
		"backward %ld (none) vs %ld (balanced); %ld recomputed\n",
		CHAIN, peak[0], peak[1], made_extra[1]);
	cr_expect_geq(peak[0], CHAIN, "none keeps every output");
	cr_expect_leq(peak[1], 4, "balanced keeps a handful");
	cr_expect_eq(made_extra[0], 0, "none recomputes nothing");
	cr_expect_eq(made_extra[1], CHAIN, "each add rebuilt once");
}

static double grad_in(adg_grads *g, adg_node *n);

/* y = c0 + 1, offered memory-bound with a recompute, on a = 2, w = 3:
 * the balanced strategy drops it; returns the node, and the value the
 * forward offered in *value. */
static adg_node *offered_add(adg_node **leaves, adg_node **c0, double **value)
{
	cr_assert_eq(adg_leaf(reg, &leaves[0]), 0);
	cr_assert_eq(adg_leaf(reg, &leaves[1]), 0);
	adg_output oc = {s_output_new(6), s_output_free, NULL, 0, NULL};
	*c0 = make(leaves, 2, mul_leaves_backward, (struct op){3, 2, 0}, &oc, 0,
		   NULL);
	*value = s_output_new(7);
	adg_output oy = {*value, s_output_free, add_k_recompute, 1, NULL};
	return make(c0, 1, add_k_backward, (struct op){1, 6, 0}, &oy, 0, NULL);
}

/* The trap this guards against: the balanced strategy freed a dropped
 * output inside adg_op_with, under the forward that had just computed it
 * and goes on to read it (ASan: a use after free). It stays the forward's
 * until the thread's next op on the registry. */
Test(checkpoint, balanced_output_stays_valid_until_the_next_op)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	adg_node *leaves[2], *c0;
	double *y_value;
	adg_node *y = offered_add(leaves, &c0, &y_value);
	cr_expect_eq(*y_value, 7.0, "the forward reads its own output");
	cr_expect_eq(atomic_load(&scalar_outputs_live), 2, "c0's and y's");

	/* The next op: y's output goes, z's stays the forward's. */
	double *z_value = s_output_new(8);
	adg_output oz = {z_value, s_output_free, add_k_recompute, 1, NULL};
	adg_node *z =
		make(&y, 1, add_k_backward, (struct op){1, 7, 0}, &oz, 0, NULL);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 2, "c0's and z's");
	cr_expect_eq(*z_value, 8.0);

	/* A backward is a next op too; y was dropped from its node, so it is
	 * rebuilt for z's recompute, and everything goes by its end. */
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, z, scalar_box(1), &scalar_ops, &g), 0);
	cr_expect_eq(grad_in(g, leaves[0]), 3.0);
	cr_expect_eq(grad_in(g, leaves[1]), 2.0);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0);
	adg_grads_free(g);
	adg_node *all[] = {leaves[0], leaves[1], c0, y, z};
	drop_nodes(all, 5);
	fixture_close();
}

/* A forward with no op after its last: its nodes go unrun, and the
 * dropped output with the registry. */
static void *forward_alone(void *arg)
{
	double **y_value = arg;
	adg_node *leaves[2], *c0;
	adg_node *y = offered_add(leaves, &c0, y_value);
	adg_node *all[] = {leaves[0], leaves[1], c0, y};
	drop_nodes(all, 4);
	return NULL;
}

/* On this thread, and on one that ends with its output still dropped
 * (a thread's end frees nothing: libadg has no hook there); the
 * registry's end frees both (fixture_close counts every output back). */
Test(checkpoint, balanced_output_goes_with_the_registry)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	double *y_value;
	forward_alone(&y_value);
	cr_expect_eq(*y_value, 7.0, "still the forward's: no op since");
	pthread_t t;
	double *ended_value;
	cr_assert_eq(pthread_create(&t, NULL, forward_alone, &ended_value), 0);
	pthread_join(t, NULL);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 2);
	fixture_close();
}

/* What the other thread's forward and backward work on. */
struct elsewhere {
	adg_node *y, *a;
	double grad_a;
};

/* On another thread, while y's forward still reads its output: q = y * w2,
 * whose step asks for y's output, and a backward from q, which rebuilds it
 * and leaves the forward's alone. */
static void *backward_elsewhere(void *arg)
{
	struct elsewhere *e = arg;
	adg_node *w2;
	cr_assert_eq(adg_leaf(reg, &w2), 0);
	adg_node *pq[2] = {e->y, w2};
	const uint32_t want0 = 0;
	adg_output oq = {s_output_new(35), s_output_free, NULL, 0, NULL};
	adg_node *q = make(pq, 2, mul_leaf_backward, (struct op){5, 7, 0}, &oq,
			   1, &want0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, q, scalar_box(1), &scalar_ops, &g), 0);
	e->grad_a = grad_in(g, e->a);
	adg_grads_free(g);
	adg_node_unref(q);
	adg_node_unref(w2);
	return NULL;
}

Test(checkpoint, balanced_output_outlives_another_threads_backward)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	adg_node *leaves[2], *c0;
	double *y_value;
	adg_node *y = offered_add(leaves, &c0, &y_value);
	struct elsewhere e = {.y = y, .a = leaves[0]};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, backward_elsewhere, &e), 0);
	pthread_join(t, NULL);
	cr_expect_eq(e.grad_a, 5.0 * 3, "dq/da = w2 w");
	cr_expect_eq(atomic_load(&recomputes), 1, "y rebuilt there");
	cr_expect_eq(*y_value, 7.0, "the forward's output is still there");
	adg_node *all[] = {leaves[0], leaves[1], c0, y};
	drop_nodes(all, 4);
	fixture_close();
}

/* Threads that each run forwards on one balanced registry at once, every
 * forward reading each output after registering it and then running its
 * backward, which rebuilds them: each thread's dropped output is its own
 * (TSan: no race; ASan: no use after free). */
#define FORWARDS 40
#define ADDS	 8

static void *forwards_reading_their_outputs(void *arg)
{
	struct thread *t = arg;
	for (int f = 0; f < FORWARDS; f++) {
		adg_node *n[ADDS + 4];
		cr_assert_eq(adg_leaf(reg, &n[0]), 0);
		cr_assert_eq(adg_leaf(reg, &n[1]), 0);
		double a = t->i + 1, v = a * 3;
		adg_output oc = {s_output_new(v), s_output_free, NULL, 0, NULL};
		n[2] = make(n, 2, mul_leaves_backward, (struct op){3, a, 0},
			    &oc, 0, NULL);
		for (int i = 0; i < ADDS; i++) {
			double *out = s_output_new(v + 1);
			adg_output o = {out, s_output_free, add_k_recompute, 1,
					NULL};
			n[3 + i] = make(&n[2 + i], 1, add_k_backward,
					(struct op){1, v, 0}, &o, 0, NULL);
			v = *out; /* the forward goes on with what it made */
		}
		adg_node *w2;
		cr_assert_eq(adg_leaf(reg, &w2), 0);
		adg_node *pq[2] = {n[ADDS + 2], w2};
		const uint32_t want0 = 0;
		adg_output oq = {s_output_new(v * 5), s_output_free, NULL, 0,
				 NULL};
		adg_node *q = make(pq, 2, mul_leaf_backward,
				   (struct op){5, v, 0}, &oq, 1, &want0);
		adg_grads *g;
		cr_assert_eq(
			adg_backward(reg, q, scalar_box(1), &scalar_ops, &g),
			0);
		void *dw2;
		cr_assert_eq(adg_grads_get_node(g, w2, &dw2), 0);
		cr_assert_eq(*(double *)dw2, a * 3 + ADDS, "dq/dw2 = y");
		adg_grads_free(g);
		adg_node_unref(q);
		adg_node_unref(w2);
		drop_nodes(n, ADDS + 3);
	}
	return NULL;
}

Test(checkpoint, balanced_forwards_on_threads_read_their_outputs)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	run_threads(4, forwards_reading_their_outputs, NULL);
	cr_expect_eq(atomic_load(&recomputes), 4 * FORWARDS * ADDS,
		     "every add rebuilt once");
	fixture_close();
}

/* z = y1 + y2 + ...: a sum, whose backward needs nothing. */
static int sum_backward(adg_step_call *call, void *user)
{
	(void)user;
	for (size_t i = 0; i < call->n_parents; i++) {
		int rc = adg_step_give(call, i, scalar_box(grad_of(call)));
		if (rc != 0)
			return rc;
	}
	return 0;
}

static adg_node *sum(adg_node **parents, size_t n)
{
	adg_step st = {.backward = sum_backward, .release = NULL, .user = NULL};
	adg_node *z;
	cr_assert_eq(adg_op(reg, parents, n, &st, &z), 0);
	return z;
}

static double grad_in(adg_grads *g, adg_node *n)
{
	void *v;
	cr_assert_eq(adg_grads_get_node(g, n, &v), 0);
	return *(double *)v;
}

/* r = c0 + 1 asked for by two steps: it is rebuilt once. */
Test(checkpoint, diamond_recomputes_a_shared_output_once)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	adg_node *a, *w, *w1, *w2;
	adg_leaf(reg, &a);
	adg_leaf(reg, &w);
	adg_leaf(reg, &w1);
	adg_leaf(reg, &w2);
	adg_node *p[2] = {a, w};
	adg_output oc = {s_output_new(6), s_output_free, NULL, 0, NULL};
	adg_node *c0 = make(p, 2, mul_leaves_backward, (struct op){3, 2, 0},
			    &oc, 0, NULL);
	adg_output orr = {s_output_new(7), s_output_free, add_k_recompute, 1,
			  NULL};
	adg_node *r = make(&c0, 1, add_k_backward, (struct op){1, 6, 0}, &orr,
			   0, NULL);
	const uint32_t want0 = 0;
	adg_node *pr1[2] = {r, w1}, *pr2[2] = {r, w2};
	adg_output o1 = {s_output_new(7 * 4), s_output_free, NULL, 0, NULL};
	adg_output o2 = {s_output_new(7 * 5), s_output_free, NULL, 0, NULL};
	adg_node *y1 = make(pr1, 2, mul_leaf_backward, (struct op){4, 7, 0},
			    &o1, 1, &want0);
	adg_node *y2 = make(pr2, 2, mul_leaf_backward, (struct op){5, 7, 0},
			    &o2, 1, &want0);
	adg_node *ys[2] = {y1, y2};
	adg_node *z = sum(ys, 2);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, z, scalar_box(1), &scalar_ops, &g), 0);
	cr_expect_eq(atomic_load(&recomputes), 1, "rebuilt once, used twice");
	cr_expect_eq(grad_in(g, w1), 7.0);
	cr_expect_eq(grad_in(g, w2), 7.0);
	cr_expect_eq(grad_in(g, a), 3.0 * (4 + 5)); /* (a w + 1)(w1 + w2) */
	adg_grads_free(g);
	adg_node *all[] = {a, w, w1, w2, c0, r, y1, y2, z};
	drop_nodes(all, 9);
	fixture_close();
}

/* A recompute callback that runs a forward and a backward of its own on a
 * fresh graph, as activation checkpointing does. */
static int nested_recompute(adg_recompute_call *call, void *user)
{
	(void)user;
	adg_node *u, *v;
	cr_assert_eq(adg_leaf(reg, &u), 0);
	scalar su = {.node = u, .value = 3};
	adg_node_id(u, &su.id);
	scalar sv = s_mul(reg, su, su);
	v = sv.node;
	adg_grads *g;
	cr_assert_eq(s_backward(reg, sv, &g), 0);
	double du = s_grad(g, su); /* 2u = 6 */
	adg_grads_free(g);
	adg_node_unref(v);
	adg_node_unref(u);
	atomic_fetch_add(&recomputes, 1);
	call->output =
		s_output_new(*(double *)call->parent_outputs[0] + du - 5);
	return 0;
}

/* Leaves a = 2, w = 3, w2 = 5; c0 = a * w (output 6 kept); m = c0 + 1
 * (output 7, memory-bound, rebuilt by recompute); y = m * w2 (output 35
 * kept), whose step, y_backward, asks for m's output. */
enum { SMALL_A, SMALL_W, SMALL_W2, SMALL_C0, SMALL_M, SMALL_Y, SMALL_NODES };

static void build_small_chain(adg_recompute_fn recompute,
			      adg_backward_fn y_backward,
			      adg_node *n[SMALL_NODES])
{
	adg_leaf(reg, &n[SMALL_A]);
	adg_leaf(reg, &n[SMALL_W]);
	adg_leaf(reg, &n[SMALL_W2]);
	adg_output oc = {s_output_new(6), s_output_free, NULL, 0, NULL};
	n[SMALL_C0] = make(&n[SMALL_A], 2, mul_leaves_backward, /* a, w */
			   (struct op){3, 2, 0}, &oc, 0, NULL);
	adg_output om = {s_output_new(7), s_output_free, recompute, 1, NULL};
	n[SMALL_M] = make(&n[SMALL_C0], 1, add_k_backward, (struct op){1, 6, 0},
			  &om, 0, NULL);
	const uint32_t want0 = 0;
	adg_node *pm[2] = {n[SMALL_M], n[SMALL_W2]};
	adg_output oy = {s_output_new(35), s_output_free, NULL, 0, NULL};
	n[SMALL_Y] =
		make(pm, 2, y_backward, (struct op){5, 7, 0}, &oy, 1, &want0);
}

Test(checkpoint, recompute_may_run_a_nested_backward)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	/* m is rebuilt by the nested callback as c0 + 6 - 5. */
	adg_node *n[SMALL_NODES];
	build_small_chain(nested_recompute, mul_leaf_backward, n);
	adg_grads *g;
	cr_assert_eq(
		adg_backward(reg, n[SMALL_Y], scalar_box(1), &scalar_ops, &g),
		0);
	cr_expect_eq(atomic_load(&recomputes), 1);
	cr_expect_eq(grad_in(g, n[SMALL_W2]), 7.0);
	adg_grads_free(g);
	drop_nodes(n, SMALL_NODES);
	fixture_close();
}

/* A failing step in the middle of the chain: the backward stops, and every
 * output, kept or rebuilt, is freed exactly once. */
Test(checkpoint, failing_backward_frees_every_output_once)
{
	for (int s = 0; s < 2; s++) {
		open_registry(s);
		build_chain(CHAIN / 2);
		adg_grads *g = (adg_grads *)&g;
		cr_expect_eq(adg_backward(reg, chain[CHAIN + 4], scalar_box(1),
					  &scalar_ops, &g),
			     ADG_EUSER - 3);
		cr_expect_null(g);
		cr_expect_eq(atomic_load(&scalar_outputs_live), 0,
			     "strategy %d", s);
		drop_chain();
		fixture_close();
	}
}

/* A graph freed unrun frees the outputs it kept. */
Test(checkpoint, graph_freed_unrun_frees_its_outputs)
{
	for (int s = 0; s < 2; s++) {
		open_registry(s);
		build_chain(0);
		cr_expect_eq(atomic_load(&scalar_outputs_live),
			     s == 0 ? CHAIN + 2 : 2,
			     "kept after the forward, strategy %d", s);
		drop_chain();
		fixture_close();
	}
}

/* Outputs no step of the tape asks for go when the tape is taken: by the
 * time the first step runs, only those asked for are left. */
static long live_at_first_step = -1;

static int observing_backward(adg_step_call *call, void *user)
{
	if (live_at_first_step < 0)
		live_at_first_step = atomic_load(&scalar_outputs_live);
	return mul_leaf_backward(call, user);
}

Test(checkpoint, unrequested_outputs_go_when_the_tape_is_taken)
{
	open_registry(ADG_CHECKPOINT_NONE);
	adg_node *n[SMALL_NODES];
	build_small_chain(add_k_recompute, observing_backward, n);
	cr_assert_eq(atomic_load(&scalar_outputs_live), 3);
	adg_grads *g;
	cr_assert_eq(
		adg_backward(reg, n[SMALL_Y], scalar_box(1), &scalar_ops, &g),
		0);
	cr_expect_eq(live_at_first_step, 1, "only m's, which y asks for");
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0);
	adg_grads_free(g);
	drop_nodes(n, SMALL_NODES);
	fixture_close();
}

/* Bad options and bad calls. */
static int noop_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static int asks_for_a_leaf(adg_step_call *call, void *user)
{
	(void)user;
	void *v = &v;
	int *rc = user;
	*rc = adg_output_get(call, call->parent_ids[1], &v);
	if (v != NULL)
		*rc = 99;
	int r2 = adg_output_get(NULL, call->parent_ids[0], &v);
	int r3 = adg_output_get(call, call->parent_ids[0], NULL);
	if (r2 != ADG_EINVAL || r3 != ADG_EINVAL)
		*rc = 98;
	return 0;
}

Test(checkpoint, bad_options_and_calls)
{
	open_registry(ADG_CHECKPOINT_NONE);
	adg_registry *bad;
	adg_registry_options ro = {.size = sizeof ro, .checkpointing = 7};
	cr_expect_eq(adg_registry_new(&ro, &bad), ADG_EINVAL);

	adg_node *a, *w, *none_offered, *y = (adg_node *)&y;
	adg_leaf(reg, &a);
	adg_leaf(reg, &w);
	adg_node *p[2] = {a, w};
	adg_step st = {
		.backward = noop_backward, .release = NULL, .user = NULL};
	cr_assert_eq(adg_op(reg, p, 2, &st, &none_offered), 0);
	double *v = s_output_new(1);
	adg_output no_free = {v, NULL, NULL, 0, NULL};
	adg_output nothing = {NULL, s_output_free, NULL, 0, NULL};
	adg_output fine = {v, s_output_free, NULL, 0, NULL};
	adg_output rebuild = {v, s_output_free, add_k_recompute, 1, NULL};
	const uint32_t want0 = 0, want1 = 1, want5 = 5;
	const size_t sz = sizeof(adg_op_options);
	adg_op_options bad_opts[] = {
		{sz, &no_free, 0, NULL, 0, 0}, /* no free */
		{sz, &nothing, 0, NULL, 0, 0}, /* neither value nor recompute */
		{sz, NULL, 1, NULL, 0, 0},     /* its own output, not offered */
		{sz, NULL, 0, NULL, 1, 0},     /* wants without the array */
		{sz, &fine, 0, &want5, 1, 0},  /* slot out of range */
		{sz, &fine, 0, &want0, 1, 0},  /* a leaf: offers nothing */
	};
	for (size_t i = 0; i < sizeof bad_opts / sizeof *bad_opts; i++) {
		cr_expect_eq(adg_op_with(reg, p, 2, &st, &bad_opts[i], &y),
			     ADG_EINVAL, "options %zu", i);
		cr_expect_null(y);
	}
	/* a parent that offers no output: neither wanted nor rebuilt from */
	adg_node *q[2] = {none_offered, w};
	adg_op_options want_none = {sizeof want_none, &fine, 0, &want0, 1, 0};
	adg_op_options rebuild_none = {
		sizeof rebuild_none, &rebuild, 0, NULL, 0, 0};
	cr_expect_eq(adg_op_with(reg, q, 2, &st, &want_none, &y), ADG_EINVAL);
	cr_expect_eq(adg_op_with(reg, q, 2, &st, &rebuild_none, &y),
		     ADG_EINVAL);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 1,
		     "the caller's still");

	/* asking for what the step did not ask for */
	adg_node *c;
	adg_op_options keep = {sizeof keep, &fine, 0, NULL, 0, 0};
	cr_assert_eq(adg_op_with(reg, p, 2, &st, &keep, &c), 0);
	int seen = 0;
	adg_node *cw[2] = {c, w};
	adg_step ask = {
		.backward = asks_for_a_leaf, .release = NULL, .user = &seen};
	adg_op_options want_c = {sizeof want_c, NULL, 0, &want0, 1, 0};
	adg_node *z;
#if SIZE_MAX > UINT32_MAX
	/* more wants than the record counts in 32 bits; the check comes
	 * before any is read */
	adg_op_options too_many = {.size = sizeof too_many,
				   .want_parents = &want0,
				   .n_want_parents = (size_t)UINT32_MAX + 1};
	cr_expect_eq(adg_op_with(reg, cw, 2, &ask, &too_many, &y), ADG_EINVAL);
	cr_expect_null(y);
#endif
	cr_assert_eq(adg_op_with(reg, cw, 2, &ask, &want_c, &z), 0);
	(void)want1;
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, z, scalar_box(1), &scalar_ops, &g), 0);
	cr_expect_eq(seen, ADG_EINVAL);
	adg_grads_free(g);
	adg_node *all[] = {a, w, none_offered, c, z};
	drop_nodes(all, 5);
	fixture_close();
}

/* Allocation failure while attaching: nothing is taken, the caller keeps
 * the value. */
Test(checkpoint, out_of_memory_keeps_the_callers_value)
{
	adg_registry_options o = {.size = sizeof o,
				  .allocator =
					  failing_allocator(&fixture_alloc),
				  .checkpointing = ADG_CHECKPOINT_BALANCED};
	fixture_open(&o);
	adg_node *a, *w, *y = (adg_node *)&y;
	adg_leaf(reg, &a);
	adg_leaf(reg, &w);
	adg_node *p[2] = {a, w};
	adg_step st = {
		.backward = noop_backward, .release = NULL, .user = NULL};
	double *v = s_output_new(1);
	adg_output fine = {v, s_output_free, NULL, 0, NULL};
	adg_op_options keep = {sizeof keep, &fine, 0, NULL, 0, 0};
	int failures = 0;
	for (int k = 1;; k++) {
		atomic_store(&fixture_alloc.fail_in, k);
		int rc = adg_op_with(reg, p, 2, &st, &keep, &y);
		atomic_store(&fixture_alloc.fail_in, 0);
		if (rc == 0)
			break;
		cr_assert_eq(rc, ADG_ENOMEM);
		cr_expect_eq(atomic_load(&scalar_outputs_live), 1);
		failures++;
	}
	cr_expect_gt(failures, 0);
	adg_node_unref(y); /* frees v with the node */
	adg_node_unref(a);
	adg_node_unref(w);
	fixture_close(); /* and fixture_alloc holds nothing */
}

/* Outputs follow their nodes through merges: two threads build
 * checkpointed chains in graphs of their own, one op joins them and asks
 * for both outputs, and the merged graph's backward rebuilds what it
 * needs. */
static adg_node *halves[2][8];

static void *build_half(void *arg)
{
	intptr_t h = (intptr_t)arg;
	adg_node *a;
	cr_assert_eq(adg_leaf(reg, &a), 0);
	adg_node *p[2] = {a, a};
	adg_output oc = {s_output_new(4), s_output_free, NULL, 0, NULL};
	adg_node *prev = make(p, 2, mul_leaves_backward, (struct op){2, 2, 0},
			      &oc, 0, NULL);
	halves[h][0] = a;
	halves[h][1] = prev;
	double v = 4;
	for (int i = 2; i < 8; i++) {
		v += 1;
		adg_output o = {s_output_new(v), s_output_free, add_k_recompute,
				1, NULL};
		prev = make(&prev, 1, add_k_backward, (struct op){1, v - 1, 0},
			    &o, 0, NULL);
		halves[h][i] = prev;
	}
	/* One more op, let go of at once: the last add's output, dropped by
	 * the balanced strategy, was this forward's until then. */
	adg_step st = {.backward = add_k_backward,
		       .release = op_release,
		       .user = op_new((struct op){1, v, 0})};
	adg_node *spare;
	cr_assert_eq(adg_op(reg, &prev, 1, &st, &spare), 0);
	adg_node_unref(spare);
	return NULL;
}

static int join_backward(adg_step_call *call, void *user)
{
	(void)user;
	void *x, *y;
	int rc = adg_output_get(call, call->parent_ids[0], &x);
	if (rc == 0)
		rc = adg_output_get(call, call->parent_ids[1], &y);
	if (rc != 0)
		return rc;
	double g = grad_of(call); /* z = x * y */
	rc = adg_step_give(call, 0, scalar_box(g * *(double *)y));
	if (rc == 0)
		rc = adg_step_give(call, 1, scalar_box(g * *(double *)x));
	return rc;
}

Test(checkpoint, outputs_follow_nodes_through_a_merge)
{
	open_registry(ADG_CHECKPOINT_BALANCED);
	pthread_t t[2];
	for (intptr_t h = 0; h < 2; h++)
		pthread_create(&t[h], NULL, build_half, (void *)h);
	for (int h = 0; h < 2; h++)
		pthread_join(t[h], NULL);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 2, "the two products");
	adg_node *ends[2] = {halves[0][7], halves[1][7]};
	const uint32_t both[2] = {0, 1};
	adg_step st = {.backward = join_backward,
		       .release = op_release,
		       .user = op_new((struct op){0})};
	adg_op_options opt = {sizeof opt, NULL, 0, both, 2, 0};
	adg_node *z;
	cr_assert_eq(adg_op_with(reg, ends, 2, &st, &opt, &z), 0);
	struct adg_stats stats = {.size = sizeof stats};
	adg_registry_stats(reg, &stats);
	cr_expect_eq(stats.merges, 1);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, z, scalar_box(1), &scalar_ops, &g), 0);
	/* z = (a0^2 + 6)(a1^2 + 6) at a = 2: dz/da0 = 2 a0 (a1^2 + 6) */
	cr_expect_eq(grad_in(g, halves[0][0]), 2 * 2.0 * 10);
	cr_expect_eq(atomic_load(&recomputes), 12, "six adds a side");
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0);
	adg_grads_free(g);
	adg_node_unref(z);
	for (int h = 0; h < 2; h++)
		for (int i = 0; i < 8; i++)
			adg_node_unref(halves[h][i]);
	fixture_close();
}
