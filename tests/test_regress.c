/* Regressions: use-after-free bugs between a backward and the nodes it
 * takes. Plain builds fail these tests by their assertions; AddressSanitizer
 * and ThreadSanitizer builds also report the bad access. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

FIXTURE_SUITE(regress, .timeout = 120);

static int output_rebuild(adg_recompute_call *call, void *user)
{
	(void)user;
	call->output = s_output_new(*(double *)call->parent_outputs[0]);
	return 0;
}

/* ------------------------------------------- outputs of consumed parents */

/* p = a (a product of one factor) that offers its value as its output. */
static scalar offering(scalar a)
{
	adg_output out = {s_output_new(a.value), s_output_free, NULL, 0, NULL};
	adg_op_options opt = {.size = sizeof opt, .output = &out};
	adg_step st = {.backward = prod_backward,
		       .release = prod_release,
		       .user = prod_step_new(&a, 1)};
	scalar p = {.value = a.value};
	cr_assert_eq(adg_op_with(reg, &a.node, 1, &st, &opt, &p.node), 0);
	cr_assert_eq(adg_node_id(p.node, &p.id), 0);
	return p;
}

static int want_backward(adg_step_call *call, void *user)
{
	void *x;
	int rc = adg_output_get(call, call->parent_ids[0], &x);
	return rc != 0 ? rc : prod_backward(call, user);
}

/* A child of p that needs p's output: one whose step asks for it, or one
 * whose own output is rebuilt from it. On error, frees what it made. */
static int child_of(scalar p, bool rebuild, adg_node **out)
{
	static const uint32_t slot0 = 0;
	adg_output o = {NULL, s_output_free, output_rebuild, 0, NULL};
	adg_op_options opt = {.size = sizeof opt,
			      .want_parents = &slot0,
			      .n_want_parents = 1};
	adg_step st = {.backward = want_backward,
		       .release = prod_release,
		       .user = prod_step_new(&p, 1)};
	if (rebuild) {
		o.value = s_output_new(p.value);
		opt = (adg_op_options){.size = sizeof(adg_op_options),
				       .output = &o};
		st.backward = prod_backward;
	}
	int rc = adg_op_with(reg, &p.node, 1, &st, &opt, out);
	if (rc != 0) {
		prod_release(st.user);
		if (o.value != NULL)
			s_output_free(o.value, NULL);
	}
	return rc;
}

/* Whether a node offers an output is fixed when it is registered: naming a
 * parent whose step was consumed is accepted, as adg_op accepts one, and
 * only the child's backward fails. adg_op_with read the parent's record,
 * which the consuming backward had freed. */
CHECKED_TEST(regress, op_with_accepts_a_consumed_parent)
{
	scalar a = s_leaf(reg, 3);
	scalar p = offering(a);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, p, &g), 0);
	cr_expect_eq(s_grad(g, a), 1);
	adg_grads_free(g);
	for (int rebuild = 0; rebuild < 2; rebuild++) {
		adg_node *c;
		int rc = child_of(p, rebuild, &c);
		cr_expect_eq(rc, 0, "rebuild %d: %s", rebuild,
			     adg_strerror(rc));
		if (rc != 0)
			continue;
		cr_expect_eq(
			adg_backward(reg, c, scalar_box(1), &scalar_ops, &g),
			ADG_EUNAVAILABLE);
		assert_stats(reg, 3, 1, 1); /* nothing taken */
		cr_expect_eq(adg_node_unref(c), 0);
	}
	s_drop(p);
	s_drop(a);
	assert_stats(reg, 0, 0, 0);
}

/* The same while the backward runs: each round, one thread makes children
 * of p until the other's backward, which consumes p, has returned. Both
 * wait for each other before starting, so that they overlap. */
#ifdef __SANITIZE_THREAD__
#define RACE_ROUNDS 10000
#else
#define RACE_ROUNDS 20000
#endif
#define RACE_KIDS 16

/* One round hands p to the maker through go and the kids back through
 * made: those stores and loads order the plain fields. */
struct race {
	scalar p;
	adg_node *kids[RACE_KIDS];
	int n_kids;
	atomic_int go, ready, made;
	atomic_bool consumed;
	atomic_long refused, wrong;
};

static void *race_maker(void *arg)
{
	struct race *r = arg;
	for (int round = 1; round <= RACE_ROUNDS; round++) {
		while (atomic_load(&r->go) != round)
			sched_yield();
		atomic_store(&r->ready, round);
		int n = 0;
		bool done;
		do {
			/* Read first: the last child comes after the backward
			 * returned, the others while it may still run. Relaxed,
			 * so that nothing orders the backward before the
			 * children and ThreadSanitizer sees what the library
			 * leaves unordered. The yield lets the backward run
			 * when both threads share a CPU. */
			done = atomic_load_explicit(&r->consumed,
						    memory_order_relaxed);
			if (child_of(r->p, n % 2, &r->kids[n]) != 0)
				atomic_fetch_add(&r->refused, 1);
			n++;
			sched_yield();
		} while (!done && n < RACE_KIDS);
		r->n_kids = n;
		atomic_store(&r->made, round);
	}
	return NULL;
}

CHECKED_TEST(regress, op_with_races_the_backward_that_consumes_a_parent)
{
	struct race *r = calloc(1, sizeof *r);
	cr_assert_not_null(r);
	pthread_t maker;
	cr_assert_eq(pthread_create(&maker, NULL, race_maker, r), 0);
	for (int round = 1; round <= RACE_ROUNDS; round++) {
		scalar a = s_leaf(reg, 3);
		r->p = offering(a);
		/* p itself, or a child of p made before the round: both tapes
		 * take p's step. */
		bool from_child = round % 2;
		scalar c0 = from_child ? s_mul(reg, r->p, a) : r->p;
		atomic_store(&r->consumed, false);
		atomic_store(&r->go, round);
		while (atomic_load(&r->ready) != round)
			sched_yield();
		adg_grads *g;
		void *v;
		int rc = s_backward(reg, c0, &g);
		atomic_store(&r->consumed, true);
		if (rc != 0 || adg_grads_get(g, a.id, &v) != 0 ||
		    *(double *)v != (from_child ? 2 * a.value : 1))
			atomic_fetch_add(&r->wrong, 1);
		adg_grads_free(g);
		while (atomic_load(&r->made) != round)
			sched_yield();
		for (int i = 0; i < r->n_kids; i++) {
			if (r->kids[i] == NULL)
				continue;
			if (adg_backward(reg, r->kids[i], scalar_box(1),
					 &scalar_ops, &g) != ADG_EUNAVAILABLE)
				atomic_fetch_add(&r->wrong, 1);
			adg_grads_free(g);
			adg_node_unref(r->kids[i]);
		}
		if (from_child)
			s_drop(c0);
		s_drop(r->p);
		s_drop(a);
	}
	pthread_join(maker, NULL);
	cr_expect_eq(atomic_load(&r->refused), 0,
		     "adg_op_with refused a consumed parent %ld times",
		     atomic_load(&r->refused));
	cr_expect_eq(atomic_load(&r->wrong), 0, "%ld wrong backward results",
		     atomic_load(&r->wrong));
	assert_stats(reg, 0, 0, 0);
	free(r);
}

/* ------------------------------------------ a step drops its root's handle */

/* The root's step: root = 2 * (the sum of its parents). It registers the
 * gradients, drops the caller's only handle to the root, then at once makes
 * a node of the root's size, which takes the root's memory if the root was
 * freed. A root that offers an output (2) checks it last. */
struct self_drop {
	adg_node **root;
	adg_node *const *parents;
	size_t n;
	bool offers;
	adg_node *made;
	atomic_int runs, releases, made_releases;
};

static int noop_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static void count_release(void *user)
{
	atomic_fetch_add((atomic_int *)user, 1);
}

static void self_drop_release(void *user)
{
	struct self_drop *d = user;
	atomic_fetch_add(&d->releases, 1);
}

static int self_drop_backward(adg_step_call *call, void *user)
{
	struct self_drop *d = user;
	void *k = NULL;
	atomic_fetch_add(&d->runs, 1);
	if (d->offers && adg_output_get(call, call->node_id, &k) != 0)
		return ADG_EUSER;
	double g = call->grad ? *(double *)call->grad : 0;
	for (size_t i = 0; i < call->n_parents; i++) {
		int rc = adg_step_give(call, i, scalar_box(2 * g));
		if (rc != 0)
			return rc;
	}
	cr_assert_eq(adg_node_unref(*d->root), 0);
	*d->root = NULL;
	adg_step st = {.backward = noop_backward,
		       .release = count_release,
		       .user = &d->made_releases};
	cr_assert_eq(adg_op(call->registry, d->parents, d->n, &st, &d->made),
		     0);
	/* The output stays valid until the step returns. */
	return k != NULL && *(double *)k != 2 ? ADG_EUSER - 1 : 0;
}

/* The backward holds the root to its end: the step's drop is not the last,
 * and the root goes when adg_backward returns. run() used to go on with the
 * root after its step: with fewer than 4 parents the freed root went to the
 * node cache and the step's new node took it, so run() released the new
 * node's step (and never the root's); with more it read freed memory; and
 * the root's output, which the step still reads, went with the root. */
static void step_drops_root(size_t n, bool offers)
{
	scalar x[6];
	adg_node *parents[6], *root;
	cr_assert(n <= 6);
	for (size_t i = 0; i < n; i++) {
		x[i] = s_leaf(reg, (double)i + 1);
		parents[i] = x[i].node;
	}
	struct self_drop d = {
		.root = &root, .parents = parents, .n = n, .offers = offers};
	adg_step st = {.backward = self_drop_backward,
		       .release = self_drop_release,
		       .user = &d};
	if (offers) {
		adg_output out = {s_output_new(2), s_output_free, NULL, 0,
				  NULL};
		adg_op_options opt = {
			.size = sizeof opt, .output = &out, .want_self = 1};
		cr_assert_eq(adg_op_with(reg, parents, n, &st, &opt, &root), 0);
	} else {
		cr_assert_eq(adg_op(reg, parents, n, &st, &root), 0);
	}
	adg_grads *g;
	int rc = adg_backward(reg, root, scalar_box(1), &scalar_ops, &g);
	cr_expect_eq(rc, 0, "backward: %d (%s)", rc, adg_strerror(rc));
	cr_expect_null(root, "the step dropped the caller's handle");
	cr_expect_eq(atomic_load(&d.runs), 1);
	cr_expect_eq(atomic_load(&d.releases), 1, "root's step released %d",
		     atomic_load(&d.releases));
	cr_expect_eq(atomic_load(&d.made_releases), 0,
		     "the new node's step released while it lives");
	assert_stats(reg, n + 1, 1, 1); /* the leaves and the new node */
	for (size_t i = 0; rc == 0 && i < n; i++)
		cr_expect_eq(s_grad(g, x[i]), 2);
	adg_grads_free(g);
	cr_assert_not_null(d.made);
	cr_expect_eq(adg_node_unref(d.made), 0);
	cr_expect_eq(atomic_load(&d.made_releases), 1,
		     "the new node's step released %d times",
		     atomic_load(&d.made_releases));
	for (size_t i = 0; i < n; i++)
		s_drop(x[i]);
	assert_stats(reg, 0, 0, 0);
}

CHECKED_TEST(regress, step_drops_last_handle_of_one_parent_root)
{
	step_drops_root(1, false);
}

CHECKED_TEST(regress, step_drops_last_handle_of_six_parent_root)
{
	step_drops_root(6, false);
}

CHECKED_TEST(regress, step_drops_last_handle_of_root_with_output)
{
	step_drops_root(1, true);
}

/* ------------------------------------------ found by the fuzzer's model */

/* A refused call changes nothing, node ids included: op_new took the new
 * node's id before checking the options (or placing the node), and a
 * refused adg_op_with, or an adg_op whose placement ran out of memory,
 * used one up. */
/* Reopens reg on fixture_alloc, with a strategy. */
static void reopen(int checkpointing)
{
	fixture_close();
	fixture_open(&(adg_registry_options){
		.size = sizeof(adg_registry_options),
		.checkpointing = checkpointing,
		.allocator = failing_allocator(&fixture_alloc)});
}

CHECKED_TEST(regress, refused_op_takes_no_node_id)
{
	reopen(ADG_CHECKPOINT_NONE);
	adg_node *leaves[9], *a, *b, *y = NULL;
	for (int i = 0; i < 9; i++)
		cr_assert_eq(adg_leaf(reg, &leaves[i]), 0);
	adg_step st = {
		.backward = noop_backward, .release = NULL, .user = NULL};
	cr_assert_eq(adg_op(reg, &leaves[0], 1, &st, &a), 0);
	cr_assert_eq(adg_op(reg, &leaves[1], 1, &st, &b), 0);
	uint64_t b_id, y_id;
	adg_node_id(b, &b_id);

	/* want_self without an output */
	adg_op_options self = {.size = sizeof self, .want_self = 1};
	cr_assert_eq(adg_op_with(reg, &a, 1, &st, &self, &y), ADG_EINVAL);
	/* nine parents in two graphs: the node (not cached: 4 or more
	 * parents) is the first allocation, placement's scratch the second */
	adg_node *nine[9] = {a, b};
	for (int i = 2; i < 9; i++)
		nine[i] = leaves[i];
	atomic_store(&fixture_alloc.fail_in, 2);
	cr_assert_eq(adg_op(reg, nine, 9, &st, &y), ADG_ENOMEM);
	cr_assert_eq(atomic_load(&fixture_alloc.fail_in), 0, "it failed");

	cr_assert_eq(adg_op(reg, &a, 1, &st, &y), 0);
	adg_node_id(y, &y_id);
	cr_expect_eq(y_id, b_id + 1, "the next id after %llu is %llu",
		     (unsigned long long)b_id, (unsigned long long)y_id);
	adg_node *all[] = {a, b, y};
	for (int i = 0; i < 3; i++)
		adg_node_unref(all[i]);
	for (int i = 0; i < 9; i++)
		adg_node_unref(leaves[i]);
}

/* The balanced strategy's graph for the two tests below: b keeps its value
 * (3, from leaf a), m's memory-bound output is rebuilt from b's, and c's
 * step asks for m's output; c's and m's steps are the caller's. */
struct rebuilt {
	scalar a;
	adg_node *b, *m, *c;
};

static struct rebuilt rebuilt_graph(adg_recompute_fn rebuild, adg_step mst,
				    adg_step cst)
{
	static const uint32_t slot0 = 0;
	struct rebuilt g = {.a = s_leaf(reg, 3)};
	adg_output bo = {s_output_new(3), s_output_free, NULL, 0, NULL};
	adg_op_options bopt = {.size = sizeof bopt, .output = &bo};
	adg_step bst = {.backward = prod_backward,
			.release = prod_release,
			.user = prod_step_new(&g.a, 1)};
	cr_assert_eq(adg_op_with(reg, &g.a.node, 1, &bst, &bopt, &g.b), 0);
	adg_output mo = {s_output_new(3), s_output_free, rebuild, 1, NULL};
	adg_op_options mopt = {.size = sizeof mopt, .output = &mo};
	cr_assert_eq(adg_op_with(reg, &g.b, 1, &mst, &mopt, &g.m), 0);
	adg_op_options copt = {.size = sizeof copt,
			       .want_parents = &slot0,
			       .n_want_parents = 1};
	cr_assert_eq(adg_op_with(reg, &g.m, 1, &cst, &copt, &g.c), 0);
	return g;
}

static void rebuilt_drop(struct rebuilt g)
{
	adg_node *all[] = {g.c, g.m, g.b, g.a.node};
	for (int i = 0; i < 4; i++)
		adg_node_unref(all[i]);
}

/* A recompute callback that sets an output and then fails: libadg owns the
 * output from the moment it is set (adg.h), so it frees it; materialise
 * returned the callback's code and dropped the output on the floor. */
static int sets_then_fails(adg_recompute_call *call, void *user)
{
	(void)user;
	call->output = s_output_new(*(double *)call->parent_outputs[0]);
	return ADG_EUSER - 1;
}

CHECKED_TEST(regress, recompute_that_sets_then_fails_frees_its_output)
{
	reopen(ADG_CHECKPOINT_BALANCED);
	adg_step noop = {
		.backward = noop_backward, .release = NULL, .user = NULL};
	adg_step asks = {
		.backward = want_backward, .release = NULL, .user = NULL};
	struct rebuilt g = rebuilt_graph(sets_then_fails, noop, asks);
	adg_grads *grads;
	cr_expect_eq(adg_backward(reg, g.c, scalar_box(1), &scalar_ops, &grads),
		     ADG_EUSER - 1);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0,
		     "outputs alive after the backward: %ld",
		     atomic_load(&scalar_outputs_live));
	rebuilt_drop(g);
}

/* A step that asks for a rebuilt output and returns without getting it:
 * the rebuild will not happen, so b's output, which only the rebuild would
 * have read, goes when c's step returns, before m's step runs; it stayed
 * to the end of the backward. */
static int counts_live_outputs(adg_step_call *call, void *user)
{
	(void)call;
	*(long *)user = atomic_load(&scalar_outputs_live);
	return 0;
}

CHECKED_TEST(regress, rebuild_no_step_got_frees_what_it_would_read)
{
	reopen(ADG_CHECKPOINT_BALANCED);
	long live_in_m = -1;
	adg_step counts = {.backward = counts_live_outputs,
			   .release = NULL,
			   .user = &live_in_m};
	adg_step asks_only = {
		.backward = noop_backward, .release = NULL, .user = NULL};
	struct rebuilt g = rebuilt_graph(output_rebuild, counts, asks_only);
	cr_assert_eq(atomic_load(&scalar_outputs_live), 1, "b's, kept");
	adg_grads *grads;
	cr_assert_eq(adg_backward(reg, g.c, scalar_box(1), &scalar_ops, &grads),
		     0);
	adg_grads_free(grads);
	cr_expect_eq(live_in_m, 0, "outputs alive when m's step ran: %ld",
		     live_in_m);
	rebuilt_drop(g);
}
