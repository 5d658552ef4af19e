/* The gradient reducer (issue 19): adg_reducer_*.
 *
 * The trainer here is a small scalar model, four parameters every
 * participant uses, a fifth only the last participant's graph reaches and
 * a sixth no one's, trained on a batch of 12 inputs split across T
 * participants, each a thread that runs a backward of its own graph with
 * the reducer's hook. The reducer's add folds as sum = 0.5 * sum + value:
 * neither commutative nor associative, so that any fold order but the
 * participants' changes the weights. Every result is compared bit for bit
 * with the sequential trainer (reference): each participant's backward in
 * turn on one thread, the gradients folded in participant order with the
 * same add, each applied after. The sums go by the reducer's tree
 * over units (tree_mix): with units given by the test, the same weights
 * at every T.
 *
 * What callbacks find wrong on other threads they count in the model's
 * bad counter, which the test's own thread checks. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

FIXTURE_SUITE(reducer, .timeout = 120);
/* Tests that open no registry. */
TestSuite(reducer_alloc, .timeout = 120);
/* The stress tier (tests/meson.build splits it off). */
FIXTURE_SUITE(reducer_stress, .timeout = 600);

#define NP	  6 /* parameters: w0..w3 everyone's, w4 the last's, w5 none's */
#define BATCH	  12
#define MAXT	  8  /* participants */
#define MAXU	  16 /* units */
#define MAXR	  400
#define LR	  0.01
#define FAIL_CODE (ADG_EUSER - 7)

/* The participant this thread runs, for checking where release runs. */
static __thread int this_participant = -1;

/* ----------------------------------------------------------- perturbing */

static __thread unsigned int jitter_seed;

/* Nothing, a yield or a sleep of up to 200 us, at random: a different
 * schedule on every run. */
static void jitter(void)
{
	if (jitter_seed == 0)
		jitter_seed = (unsigned int)time(NULL) ^
			      (unsigned int)(uintptr_t)&jitter_seed;
	int r = rand_r(&jitter_seed);
	if (r % 8 >= 6) {
		struct timespec ts = {0, (r / 8 % 200) * 1000};
		nanosleep(&ts, NULL);
	} else if (r % 8 >= 4) {
		sched_yield();
	}
}

/* ---------------------------------------------------- values and the ops */

static void value_free(void *value)
{
	free(value);
	atomic_fetch_sub(&scalar_values_live, 1);
}

/* sum = 0.5 * sum + value: the order of the operands shows. Borrows
 * value. */
static int mix_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum = 0.5 * *(double *)*sum + *(const double *)value;
	return 0;
}

/* The reducer's tree over c[0..n), n >= 1, described another way than
 * lib/reducer.c does: the first part is the largest power of two below n
 * leaves, the second the rest; each part's sum (NULL passing the other)
 * folded second into first with mix_add. Returns the leftmost non-NULL,
 * which holds the sum. */
static void *tree_mix(void **c, int n)
{
	if (n == 1)
		return c[0];
	int first = 1;
	while (first * 2 < n)
		first *= 2;
	void *a = tree_mix(c, first), *b = tree_mix(c + first, n - first);
	if (a == NULL)
		return b;
	if (b != NULL)
		mix_add(&a, b, NULL);
	return a;
}

/* ------------------------------------------------------------ the model */

enum fail { NO_FAIL, FAIL_AT_ROOT, FAIL_LATE };

struct model {
	int t, rounds;
	int units; /* U; 0: one per participant */
	double w[NP];
	adg_node *node[NP];
	uint64_t id[NP];
	adg_reducer *red;
	const adg_executor *executor;
	bool perturb, retain, apply_early;
	/* One participant's (with units: unit's) backward fails in one
	 * round: at its root (it gives nothing), or late, at a depth-1
	 * step, once the others have given all they have. */
	int fail_round, fail_participant;
	enum fail fail_kind;
	atomic_int gave[MAXR];	  /* participants done with the backward */
	atomic_int entered[MAXR]; /* participants that called end */
	int result[MAXT][MAXR];	  /* what each end returned */
	atomic_int applies[NP];
	atomic_int released[MAXT];
	atomic_int units_taken[MAXT]; /* with units: per participant */
	atomic_int bad;
	/* A trainer's own ready hook beside the reducer's: the parameter
	 * gradients it saw, by participant (own_hook set). */
	bool own_hook;
	atomic_int own_seen[MAXT];
	/* own_ready's ctx, one per participant: with an executor the hook
	 * runs on the pool's workers, where this_participant is not set. */
	struct own_ctx {
		struct model *m;
		int p;
	} own[MAXT];
};

static double datum(int round, int j)
{
	return (double)((round * 131 + j * 31 + 7) % 97) / 48.5 - 1.0;
}

static void model_open(struct model *m, int t)
{
	static const double w0[NP] = {0.5, -0.25, 0.75, 0.125, 0.3, 0.9};
	memset(m, 0, sizeof *m);
	m->t = t;
	m->fail_round = -1;
	for (int i = 0; i < NP; i++) {
		m->w[i] = w0[i];
		cr_assert_eq(adg_leaf(reg, &m->node[i]), 0);
		cr_assert_eq(adg_node_id(m->node[i], &m->id[i]), 0);
	}
}

static void model_close(struct model *m)
{
	for (int i = 0; i < NP; i++)
		cr_assert_eq(adg_node_unref(m->node[i]), 0);
}

static int nap_backward(adg_step_call *call, void *user)
{
	const struct model *m = user;
	if (m->perturb)
		jitter();
	return s_pass_on(call);
}

static int fail_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return FAIL_CODE;
}

static scalar op1(struct model *m, scalar x, adg_backward_fn fn)
{
	scalar y = {.value = x.value};
	adg_step step = {.backward = fn, .user = m};
	cr_assert_eq(adg_op(reg, &x.node, 1, &step, &y.node), 0);
	cr_assert_eq(adg_node_id(y.node, &y.id), 0);
	return y;
}

/* The batch's shares: the units, or one per participant. */
static int shares_of(const struct model *m)
{
	return m->units != 0 ? m->units : m->t;
}

/* Share p's graph for round k: the squared error of its part of the
 * batch, w2 * (w0 * x + w1) + w3 * x, with a nap on each sample's way (it
 * sleeps when perturbing) and, for the last share's first sample, a
 * factor w4. A share with no samples (units beyond BATCH) is w3 * 0. */
static scalar build(struct model *m, int p, int k, enum fail fail)
{
	scalar w[NP], root = {0};
	for (int i = 0; i < NP; i++)
		w[i] = (scalar){m->node[i], m->w[i], m->id[i]};
	int shares = shares_of(m);
	int lo = p * BATCH / shares, hi = (p + 1) * BATCH / shares;
	if (lo == hi) {
		scalar zero = s_leaf(reg, 0.0);
		root = s_mul(reg, w[3], zero);
		s_drop(zero);
	}
	for (int j = lo; j < hi; j++) {
		scalar x = s_leaf(reg, datum(k, j));
		scalar a = s_mul(reg, w[0], x);
		scalar h = s_add(reg, a, w[1]);
		scalar y = s_mul(reg, h, w[2]);
		scalar b = s_mul(reg, w[3], x);
		scalar e = s_add(reg, y, b);
		scalar n = op1(m, e, nap_backward);
		scalar sq = s_mul(reg, n, n);
		s_drop(x), s_drop(a), s_drop(h), s_drop(y), s_drop(b);
		s_drop(e), s_drop(n);
		if (p == shares - 1 && j == lo) {
			scalar f = s_mul(reg, sq, w[4]);
			s_drop(sq);
			sq = f;
		}
		if (j == lo) {
			root = sq;
		} else {
			scalar s = s_add(reg, root, sq);
			s_drop(root), s_drop(sq);
			root = s;
		}
	}
	if (fail == FAIL_AT_ROOT) {
		scalar f = op1(m, root, fail_backward);
		s_drop(root);
		root = f;
	} else if (fail == FAIL_LATE) {
		/* In the root's first slot, the last on the tape: it runs
		 * after every step that names w1 and w2. */
		scalar x = s_leaf(reg, 1.0);
		scalar f = op1(m, x, fail_backward);
		scalar s = s_add(reg, f, root);
		s_drop(x), s_drop(f), s_drop(root);
		root = s;
	}
	return root;
}

/* The sequential trainer, rounds k0 to k1 - 1 on m->w. */
static void reference(struct model *m, int k0, int k1)
{
	scalar roots[MAXU];
	int n = shares_of(m);
	for (int k = k0; k < k1; k++) {
		void *c[NP][MAXU];
		for (int p = 0; p < n; p++) {
			if (!m->retain || k == k0)
				roots[p] =
					build(m, p, m->retain ? 0 : k, NO_FAIL);
			adg_backward_options o = {.size = sizeof o,
						  .retain = m->retain &&
							    k < k1 - 1};
			adg_grads *g;
			cr_assert_eq(adg_backward_with(reg, roots[p].node,
						       scalar_box(1.0),
						       &scalar_ops, &o, &g),
				     0);
			for (int i = 0; i < NP; i++)
				if (adg_grads_take(g, m->id[i], &c[i][p]) != 0)
					c[i][p] = NULL;
			cr_assert_eq(adg_grads_free(g), 0);
			if (!m->retain || k == k1 - 1)
				s_drop(roots[p]);
		}
		for (int i = 0; i < NP; i++) {
			void *sum = tree_mix(c[i], n);
			if (sum != NULL)
				m->w[i] -= LR * *(double *)sum;
			for (int p = 0; p < n; p++)
				if (c[i][p] != NULL)
					value_free(c[i][p]);
		}
	}
}

/* The SGD step. */
static int apply_sgd(const adg_reduction *red, void *ctx)
{
	struct model *m = ctx;
	if (red->param >= NP || red->id != m->id[red->param] ||
	    red->round >= MAXR) {
		atomic_fetch_add(&m->bad, 1);
		return 0;
	}
	int k = (int)red->round;
	/* All or nothing: after every participant entered end. */
	if (!m->apply_early && atomic_load(&m->entered[k]) != m->t)
		atomic_fetch_add(&m->bad, 1);

	if (m->perturb)
		jitter();
	atomic_fetch_add(&m->applies[red->param], 1);
	if (red->sum != NULL)
		m->w[red->param] -= LR * *(double *)red->sum;
	return 0;
}

static void release_value(void *value, size_t participant, void *ctx)
{
	struct model *m = ctx;
	if (participant >= MAXT || (int)participant != this_participant) {
		atomic_fetch_add(&m->bad, 1);
		return;
	}
	atomic_fetch_add(&m->released[participant], 1);
	value_free(value);
}

/* The trainer's own hook (own_hook): runs before the reducer's, so that
 * it sees each parameter's gradient before the reducer takes it. */
static int own_ready(uint64_t id, void **grad, void *ctx)
{
	const struct own_ctx *own = ctx;
	for (int i = 0; i < NP; i++)
		if (id == own->m->id[i] && *grad != NULL)
			atomic_fetch_add(&own->m->own_seen[own->p], 1);
	return 0;
}

static void *participant(void *arg)
{
	struct thread *th = arg;
	struct model *m = th->s;
	int p = th->i;
	this_participant = p;
	adg_backward_options o = {.size = sizeof o, .executor = m->executor};
	if (m->own_hook) {
		m->own[p] = (struct own_ctx){m, p};
		o.on_ready = own_ready;
		o.on_ready_ctx = &m->own[p];
		o.leaves_only = 1;
	}
	if (adg_reducer_hook(m->red, (size_t)p, &o) != 0 ||
	    o.on_ready == NULL || !o.leaves_only || o.executor != m->executor)
		atomic_fetch_add(&m->bad, 1);
	/* Hooking again (a loop that hooks every round) keeps the kept. */
	if (adg_reducer_hook(m->red, (size_t)p, &o) != 0)
		atomic_fetch_add(&m->bad, 1);
	scalar root = {0};
	for (int k = 0; k < m->rounds; k++) {
		bool last = k == m->rounds - 1;
		bool fails = k == m->fail_round && p == m->fail_participant;
		if (!m->retain || k == 0)
			root = build(m, p, m->retain ? 0 : k,
				     fails ? m->fail_kind : NO_FAIL);
		if (fails && m->fail_kind == FAIL_LATE)
			while (atomic_load(&m->gave[k]) < m->t - 1)
				sched_yield();
		if (m->perturb)
			jitter();
		o.retain = m->retain && !last;
		adg_grads *g = NULL;
		int rc = adg_backward_with(reg, root.node, scalar_box(1.0),
					   &scalar_ops, &o, &g);
		if (!fails && rc != 0)
			atomic_fetch_add(&m->bad, 1);
		/* What is left in the container: the inputs' gradients, none
		 * of a parameter's. */
		for (int i = 0; g != NULL && i < NP; i++) {
			void *v;
			if (adg_grads_get(g, m->id[i], &v) != ADG_ENOTFOUND)
				atomic_fetch_add(&m->bad, 1);
		}
		cr_assert_eq(adg_grads_free(g), 0);
		if (!m->retain || last || rc != 0)
			s_drop(root);
		atomic_fetch_add(&m->gave[k], 1);
		if (m->perturb)
			jitter();
		atomic_fetch_add(&m->entered[k], 1);
		m->result[p][k] = adg_reducer_end(m->red, (size_t)p, rc);
		if (rc != 0 && m->retain)
			break;
	}
	return NULL;
}

/* Units unit's backward in round k, through p's hooked options o, its
 * unit ended when it did not fail. Returns the backward's result. */
static int unit_backward(struct model *m, int p, size_t unit, int k,
			 const adg_backward_options *o)
{
	bool fails = k == m->fail_round && (int)unit == m->fail_participant;
	scalar root = build(m, (int)unit, k, fails ? m->fail_kind : NO_FAIL);
	if (m->perturb)
		jitter();
	adg_grads *g = NULL;
	int rc = adg_backward_with(reg, root.node, scalar_box(1.0), &scalar_ops,
				   o, &g);
	if (!fails && rc != 0)
		atomic_fetch_add(&m->bad, 1);
	if (adg_grads_free(g) != 0)
		atomic_fetch_add(&m->bad, 1);
	s_drop(root);
	atomic_fetch_add(&m->units_taken[p], 1);
	if (rc == 0 && adg_reducer_unit_end(m->red, (size_t)p, 0) != 0)
		atomic_fetch_add(&m->bad, 1);
	return rc;
}

/* A participant with units: as many as it is dealt, a backward each. A
 * failed unit stays open: the participant's end ends it with the
 * error. */
static void *unit_participant(void *arg)
{
	struct thread *th = arg;
	struct model *m = th->s;
	int p = th->i;
	this_participant = p;
	adg_backward_options o = {.size = sizeof o, .executor = m->executor};
	if (adg_reducer_hook(m->red, (size_t)p, &o) != 0)
		atomic_fetch_add(&m->bad, 1);
	for (int k = 0; k < m->rounds; k++) {
		int rc = 0;
		size_t unit;
		while (rc == 0 &&
		       adg_reducer_next_unit(m->red, (size_t)p, &unit) == 0 &&
		       unit != ADG_REDUCER_NO_UNIT)
			rc = unit_backward(m, p, unit, k, &o);
		if (m->perturb)
			jitter();
		atomic_fetch_add(&m->entered[k], 1);
		m->result[p][k] = adg_reducer_end(m->red, (size_t)p, rc);
	}
	return NULL;
}

/* Trains m->rounds rounds on T threads through a new reducer. */
static void train(struct model *m)
{
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = (size_t)m->t,
		.n_units = (size_t)m->units,
		.param_ids = m->id,
		.n_params = NP,
		.ops = {.add = mix_add,
			.apply = apply_sgd,
			.release = release_value,
			.ctx = m},
		.apply_early = m->apply_early,
	};
	cr_assert_eq(adg_reducer_new(&o, &m->red), 0);
	run_threads(m->t, m->units != 0 ? unit_participant : participant, m);

	cr_assert_eq(atomic_load(&m->bad), 0, "%d things went wrong",
		     atomic_load(&m->bad));
	uint64_t rounds = 0;
	cr_assert_eq(adg_reducer_rounds(m->red, &rounds), 0);
	cr_assert_eq(rounds, (uint64_t)m->rounds);
	cr_assert_eq(adg_reducer_free(m->red), 0);
	for (int p = 0; p < m->t; p++)
		for (int k = 0; k < m->rounds; k++)
			cr_assert_eq(m->result[p][k],
				     k == m->fail_round ? FAIL_CODE : 0,
				     "participant %d, round %d: %s", p, k,
				     adg_strerror(m->result[p][k]));
}

static void expect_same_weights(const double *got, const double *want,
				const char *what)
{
	for (int i = 0; i < NP; i++)
		cr_assert(memcmp(&got[i], &want[i], sizeof got[i]) == 0,
			  "%s: w%d is %.17g, want %.17g", what, i, got[i],
			  want[i]);
}

/* The weights after `rounds` rounds of the sequential trainer. */
static void reference_weights(int t, int rounds, bool retain, double *w)
{
	struct model ref;
	model_open(&ref, t);
	ref.retain = retain;
	reference(&ref, 0, rounds);
	memcpy(w, ref.w, sizeof ref.w);
	model_close(&ref);
}

/* ------------------------------------------------------------- one thread */

struct plain {
	const struct model *m;
	double *w;
};

/* The plain trainer's hook: applies a parameter's gradient at once. */
static int plain_hook(uint64_t id, void **grad, void *ctx)
{
	struct plain *pl = ctx;
	for (int i = 0; i < NP; i++)
		if (id == pl->m->id[i] && *grad != NULL)
			pl->w[i] -= LR * *(double *)*grad;
	return 0;
}

CHECKED_TEST(reducer, one_participant_applies_as_a_plain_hook_does)
{
	enum { ROUNDS = 8 };
	adg_pool *pool;
	adg_executor pool_executor;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &pool_executor), 0);

	/* The plain trainer: one backward a round, SGD from the hook. */
	struct model plain;
	model_open(&plain, 1);
	struct plain pl = {&plain, plain.w};
	for (int k = 0; k < ROUNDS; k++) {
		adg_backward_options o = {.size = sizeof o,
					  .on_ready = plain_hook,
					  .on_ready_ctx = &pl,
					  .leaves_only = 1};
		scalar root = build(&plain, 0, k, NO_FAIL);
		adg_grads *g;
		cr_assert_eq(adg_backward_with(reg, root.node, scalar_box(1.0),
					       &scalar_ops, &o, &g),
			     0);
		cr_assert_eq(adg_grads_free(g), 0);
		s_drop(root);
	}

	for (int with_pool = 0; with_pool < 2; with_pool++) {
		struct model m;
		model_open(&m, 1);
		m.rounds = ROUNDS;
		m.executor = with_pool ? &pool_executor : NULL;
		train(&m);
		expect_same_weights(m.w, plain.w,
				    with_pool ? "on a pool" : "alone");
		/* Each parameter once a round, NULL sums included. */
		for (int i = 0; i < NP; i++)
			cr_assert_eq(atomic_load(&m.applies[i]), ROUNDS);
		model_close(&m);
	}
	/* w5 has no gradient: the reducer applied a NULL sum to it. */
	cr_assert_eq(plain.w[5], 0.9);
	model_close(&plain);
	cr_assert_eq(adg_pool_free(pool), 0);
}

/* T = 1..4, each run several times with random sleeps in steps, before
 * backward passes, before ends and in applies. */
static void bitwise_for_1_to_4(const adg_executor *executor, int runs)
{
	enum { ROUNDS = 5 };
	for (int t = 1; t <= 4; t++) {
		double want[NP];
		reference_weights(t, ROUNDS, false, want);
		for (int run = 0; run < runs; run++) {
			struct model m;
			model_open(&m, t);
			m.rounds = ROUNDS;
			m.perturb = true;
			m.executor = executor;
			train(&m);
			char what[64];
			snprintf(what, sizeof what, "T = %d, run %d", t, run);
			expect_same_weights(m.w, want, what);
			/* Each value given was released once, to its
			 * participant: p gave every parameter its graph
			 * reaches, every round. */
			for (int p = 0; p < t; p++)
				cr_assert_eq(atomic_load(&m.released[p]),
					     ROUNDS * (p == t - 1 ? 5 : 4));
			model_close(&m);
		}
	}
}

/* A trainer's own ready hook kept beside the reducer's: it sees every
 * parameter gradient its participant gives, and the weights are the
 * reducer's alone, bitwise, with and without a pool. */
CHECKED_TEST(reducer, a_trainers_hook_runs_beside_the_reducers)
{
	enum { ROUNDS = 4, T = 3 };
	adg_pool *pool;
	adg_executor pool_executor;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &pool_executor), 0);
	double want[NP];
	reference_weights(T, ROUNDS, false, want);
	for (int with_pool = 0; with_pool < 2; with_pool++) {
		struct model m;
		model_open(&m, T);
		m.rounds = ROUNDS;
		m.own_hook = true;
		m.executor = with_pool ? &pool_executor : NULL;
		train(&m);
		expect_same_weights(m.w, want, with_pool ? "pool" : "alone");
		for (int p = 0; p < T; p++)
			cr_assert_eq(atomic_load(&m.own_seen[p]),
				     atomic_load(&m.released[p]),
				     "participant %d's own hook", p);
		model_close(&m);
	}
	cr_assert_eq(adg_pool_free(pool), 0);
}

CHECKED_TEST(reducer, bitwise_the_sequential_trainer_for_1_to_4_participants)
{
	bitwise_for_1_to_4(NULL, 3);
}

CHECKED_TEST(reducer, bitwise_the_sequential_trainer_on_a_pool)
{
	adg_pool *pool;
	adg_executor ex;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	bitwise_for_1_to_4(&ex, 2);
	cr_assert_eq(adg_pool_free(pool), 0);
}

CHECKED_TEST(reducer, retained_passes_reduce_every_round)
{
	enum { ROUNDS = 4 };
	adg_pool *pool;
	adg_executor ex;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	for (int t = 1; t <= 3; t++) {
		double want[NP];
		reference_weights(t, ROUNDS, true, want);
		for (int with_pool = 0; with_pool < 2; with_pool++) {
			struct model m;
			model_open(&m, t);
			m.rounds = ROUNDS;
			m.retain = true;
			m.perturb = true;
			m.executor = with_pool ? &ex : NULL;
			train(&m);
			expect_same_weights(m.w, want, "retained");
			model_close(&m);
		}
	}
	cr_assert_eq(adg_pool_free(pool), 0);
}

/* ---------------------------------------------------------------- failure */

CHECKED_TEST(reducer, failed_backward_abandons_the_round_for_everyone)
{
	struct model m;
	model_open(&m, 3);
	m.rounds = 3;
	m.fail_round = 1;
	m.fail_participant = 1;
	m.fail_kind = FAIL_AT_ROOT;
	m.perturb = true;
	train(&m); /* every end of round 1 returned FAIL_CODE */

	/* Round 1 applied nothing; rounds 0 and 2 as the sequential
	 * trainer's. */
	struct model ref;
	model_open(&ref, 3);
	reference(&ref, 0, 1);
	reference(&ref, 2, 3);
	expect_same_weights(m.w, ref.w, "after a failed round");
	for (int i = 0; i < NP; i++)
		cr_assert_eq(atomic_load(&m.applies[i]), 2);
	/* Participants 0 and 2 gave theirs in round 1, and got them back. */
	cr_assert_eq(atomic_load(&m.released[0]), 3 * 4);
	cr_assert_eq(atomic_load(&m.released[1]), 2 * 4);
	cr_assert_eq(atomic_load(&m.released[2]), 3 * 5);
	model_close(&ref);
	model_close(&m);
}

CHECKED_TEST(reducer, late_failure_applied_early_keeps_what_it_applied)
{
	/* Round 1: participants 0 and 2 give all they have first; then 1's
	 * backward gives w1 and w2 (their steps come before the failing one
	 * on the tape), which completes and applies them, and fails. */
	struct model m;
	model_open(&m, 3);
	m.rounds = 3;
	m.fail_round = 1;
	m.fail_participant = 1;
	m.fail_kind = FAIL_LATE;
	m.apply_early = true;
	train(&m);

	struct model ref, whole;
	model_open(&ref, 3);
	reference(&ref, 0, 1);
	double before[NP];
	memcpy(before, ref.w, sizeof before);
	model_open(&whole, 3);
	memcpy(whole.w, before, sizeof before);
	reference(&whole, 1, 2);
	/* Each parameter of round 1: as the whole round would have left it,
	 * or untouched; w1 and w2 applied, w4 (participant 2's, whose NULL
	 * from 1 never came) and w5 not. */
	double mid[NP];
	for (int i = 0; i < NP; i++) {
		bool applied = atomic_load(&m.applies[i]) == 3;
		cr_assert(applied || atomic_load(&m.applies[i]) == 2);
		mid[i] = applied ? whole.w[i] : before[i];
	}
	cr_assert_eq(atomic_load(&m.applies[1]), 3);
	cr_assert_eq(atomic_load(&m.applies[2]), 3);
	cr_assert_eq(atomic_load(&m.applies[4]), 2);
	cr_assert_eq(atomic_load(&m.applies[5]), 2);
	memcpy(ref.w, mid, sizeof mid);
	reference(&ref, 2, 3);
	expect_same_weights(m.w, ref.w, "after a late failure");
	model_close(&whole);
	model_close(&ref);
	model_close(&m);
}

CHECKED_TEST(reducer, a_failed_round_applies_nothing_by_default)
{
	struct model m;
	model_open(&m, 2);
	m.rounds = 3;
	m.fail_round = 1;
	m.fail_participant = 1;
	m.fail_kind = FAIL_LATE; /* gives w1 and w2, then fails */
	m.perturb = true;
	train(&m);

	struct model ref;
	model_open(&ref, 2);
	reference(&ref, 0, 1);
	reference(&ref, 2, 3);
	expect_same_weights(m.w, ref.w, "all or nothing");
	/* Rounds 0 and 2: every parameter once, after both ends began
	 * (apply_sgd checks); round 1: none, though w1 and w2 were
	 * complete before the failure. */
	for (int i = 0; i < NP; i++)
		cr_assert_eq(atomic_load(&m.applies[i]), 2);
	model_close(&ref);
	model_close(&m);
}

/* ----------------------------------------------------- the API by hand */

/* Gradients given by hand: heap doubles, folded with mix_add. */
struct hand {
	adg_reducer *red;
	uint64_t ids[3];
	int fail_apply; /* the parameter whose apply fails */
	atomic_int applies[3];
	void *applied_sum[3];
	double applied[3];
	atomic_int released[MAXT];
	void *released_ptr[MAXT][8];
	atomic_int bad;
};

static int hand_add(void **sum, const void *value, void *ctx)
{
	struct hand *h = ctx;
	if (*(const double *)value == -1.0 || *(double *)*sum == -1.0)
		return ADG_EUSER - 1; /* a poisoned value */
	(void)h;
	return mix_add(sum, value, NULL);
}

static int hand_apply(const adg_reduction *red, void *ctx)
{
	struct hand *h = ctx;
	if (red->param >= 3 || red->id != h->ids[red->param]) {
		atomic_fetch_add(&h->bad, 1);
		return 0;
	}
	atomic_fetch_add(&h->applies[red->param], 1);
	if ((int)red->param == h->fail_apply)
		return ADG_EUSER - 2;
	h->applied_sum[red->param] = red->sum;
	h->applied[red->param] = red->sum ? *(double *)red->sum : 0;
	return 0;
}

static void hand_release(void *value, size_t participant, void *ctx)
{
	struct hand *h = ctx;
	if (participant >= MAXT) {
		atomic_fetch_add(&h->bad, 1);
		return;
	}
	int n = atomic_fetch_add(&h->released[participant], 1);
	if (n < 8)
		h->released_ptr[participant][n] = value;
	value_free(value);
}

/* A reducer of the three parameters for t participants and units units
 * (0: one per participant). */
static void hand_open_units(struct hand *h, size_t t, size_t units,
			    int apply_early)
{
	memset(h, 0, sizeof *h);
	h->ids[0] = 11, h->ids[1] = 7, h->ids[2] = 1000003;
	h->fail_apply = -1;
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = t,
		.n_units = units,
		.param_ids = h->ids,
		.n_params = 3,
		.ops = {.add = hand_add,
			.apply = hand_apply,
			.release = hand_release,
			.ctx = h},
		.apply_early = apply_early,
	};
	cr_assert_eq(adg_reducer_new(&o, &h->red), 0);
}

static void hand_open(struct hand *h, size_t t, int apply_early)
{
	hand_open_units(h, t, 0, apply_early);
}

static void hand_close(struct hand *h)
{
	cr_assert_eq(atomic_load(&h->bad), 0);
	cr_assert_eq(adg_reducer_free(h->red), 0);
}

/* adg_reducer_end on a thread of its own (it waits for the others). */
struct ender {
	pthread_t thread;
	struct hand *h;
	size_t participant;
	int result, rc;
};

static void *end_thread(void *arg)
{
	struct ender *e = arg;
	e->rc = adg_reducer_end(e->h->red, e->participant, e->result);
	return NULL;
}

static void end_async(struct ender *e, struct hand *h, size_t p, int result)
{
	*e = (struct ender){.h = h, .participant = p, .result = result};
	cr_assert_eq(pthread_create(&e->thread, NULL, end_thread, e), 0);
}

static int end_join(struct ender *e)
{
	pthread_join(e->thread, NULL);
	return e->rc;
}

CHECKED_TEST(reducer, the_first_non_null_contribution_holds_the_sum)
{
	struct hand h;
	hand_open(&h, 3, 1);
	/* Parameter 0: participants 1 and 2; parameter 1: none;
	 * parameter 2: all three. */
	double *a = scalar_box(3), *b = scalar_box(5);
	double *c0 = scalar_box(1), *c1 = scalar_box(2), *c2 = scalar_box(4);
	cr_assert_eq(adg_reducer_give(h.red, 2, 11, b), 0);
	cr_assert_eq(adg_reducer_give(h.red, 1, 11, a), 0);
	cr_assert_eq(adg_reducer_give(h.red, 2, 1000003, c2), 0);
	cr_assert_eq(adg_reducer_give(h.red, 0, 1000003, c0), 0);
	cr_assert_eq(adg_reducer_give(h.red, 1, 1000003, c1), 0);
	/* All three in: applied at once, on this thread. */
	cr_assert_eq(atomic_load(&h.applies[2]), 1);
	cr_assert_eq(h.applied_sum[2], c0);
	cr_assert_eq(h.applied[2], 0.5 * (0.5 * 1 + 2) + 4);
	cr_assert_eq(atomic_load(&h.applies[0]), 0);
	struct ender e0, e1;
	end_async(&e0, &h, 0, 0);
	end_async(&e1, &h, 1, 0);
	cr_assert_eq(adg_reducer_end(h.red, 2, 0), 0);
	cr_assert_eq(end_join(&e0), 0);
	cr_assert_eq(end_join(&e1), 0);
	cr_assert_eq(atomic_load(&h.applies[0]), 1);
	cr_assert_eq(atomic_load(&h.applies[1]), 1);
	cr_assert_null(h.applied_sum[1], "no contribution: a NULL sum");
	cr_assert_eq(h.applied[0], 0.5 * 3 + 5);
	/* Each value back to its giver, the sums too. */
	cr_assert_eq(atomic_load(&h.released[0]), 1);
	cr_assert_eq(atomic_load(&h.released[1]), 2);
	cr_assert_eq(atomic_load(&h.released[2]), 2);
	cr_assert_eq(h.released_ptr[0][0], c0);
	cr_assert(h.released_ptr[1][0] == a || h.released_ptr[1][1] == a);
	uint64_t rounds;
	cr_assert_eq(adg_reducer_rounds(h.red, &rounds), 0);
	cr_assert_eq(rounds, 1);
	hand_close(&h);
}

CHECKED_TEST(reducer, add_or_apply_error_abandons_the_round)
{
	for (int kind = 0; kind < 2; kind++) {
		struct hand h;
		hand_open(&h, 2, 1);
		int code = kind == 0 ? ADG_EUSER - 1 : ADG_EUSER - 2;
		/* Parameter 0 fails when it completes: add on a poisoned
		 * value, or its apply. */
		if (kind == 1)
			h.fail_apply = 0;
		cr_assert_eq(adg_reducer_give(h.red, 0, 11,
					      scalar_box(kind == 0 ? -1 : 1)),
			     0);
		cr_assert_eq(adg_reducer_give(h.red, 0, 7, scalar_box(1)), 0);
		cr_assert_eq(adg_reducer_give(h.red, 1, 11, scalar_box(2)),
			     code, "the error, the value taken");
		/* Complete after the failure: neither folded nor applied. */
		cr_assert_eq(adg_reducer_give(h.red, 1, 7, scalar_box(2)), 0);
		struct ender e0;
		end_async(&e0, &h, 0, 0);
		cr_assert_eq(adg_reducer_end(h.red, 1, 0), code);
		cr_assert_eq(end_join(&e0), code);
		cr_assert_eq(atomic_load(&h.applies[0]), kind);
		cr_assert_eq(atomic_load(&h.applies[1]), 0);
		cr_assert_eq(atomic_load(&h.applies[2]), 0);
		cr_assert_eq(atomic_load(&h.released[0]), 2);
		cr_assert_eq(atomic_load(&h.released[1]), 2);

		/* The next round is clean. */
		h.fail_apply = -1;
		for (size_t p = 0; p < 2; p++)
			for (int i = 0; i < 3; i++)
				cr_assert_eq(adg_reducer_give(
						     h.red, p, h.ids[i],
						     scalar_box((double)p + 1)),
					     0);
		end_async(&e0, &h, 0, 0);
		cr_assert_eq(adg_reducer_end(h.red, 1, 0), 0);
		cr_assert_eq(end_join(&e0), 0);
		for (int i = 0; i < 3; i++) {
			cr_assert_eq(h.applied[i], 0.5 * 1 + 2);
			cr_assert_eq(atomic_load(&h.applies[i]),
				     i == 0 ? kind + 1 : 1);
		}
		hand_close(&h);
	}
}

CHECKED_TEST(reducer, an_apply_error_at_the_end_stops_the_applies)
{
	struct hand h;
	hand_open(&h, 1, 0);
	h.fail_apply = 1;
	for (int i = 0; i < 3; i++)
		cr_assert_eq(
			adg_reducer_give(h.red, 0, h.ids[i], scalar_box(i)), 0);
	cr_assert_eq(atomic_load(&h.applies[0]), 0, "not before the end");
	cr_assert_eq(adg_reducer_end(h.red, 0, 0), ADG_EUSER - 2);
	cr_assert_eq(atomic_load(&h.applies[0]), 1);
	cr_assert_eq(atomic_load(&h.applies[1]), 1);
	cr_assert_eq(atomic_load(&h.applies[2]), 0);
	cr_assert_eq(atomic_load(&h.released[0]), 3);
	/* A failing participant: nothing applied, and a positive result
	 * is ADG_ECALLBACK. */
	h.fail_apply = -1;
	cr_assert_eq(adg_reducer_give(h.red, 0, 7, scalar_box(1)), 0);
	cr_assert_eq(adg_reducer_end(h.red, 0, 3), ADG_ECALLBACK);
	cr_assert_eq(atomic_load(&h.applies[1]), 1);
	cr_assert_eq(atomic_load(&h.released[0]), 4);
	hand_close(&h);
}

/* ------------------------------------------------------------- bad input */

static int noop_apply(const adg_reduction *red, void *ctx)
{
	(void)red, (void)ctx;
	return 0;
}

static void noop_release(void *value, size_t participant, void *ctx)
{
	(void)participant, (void)ctx;
	value_free(value);
}

CHECKED_TEST(reducer, bad_options_are_einval_and_allocate_nothing)
{
	failing_alloc fa = {0};
	uint64_t ids[3] = {4, 5, 6};
	const adg_reducer_options good = {
		.size = sizeof good,
		.n_participants = 2,
		.param_ids = ids,
		.n_params = 3,
		.ops = {.add = mix_add,
			.apply = noop_apply,
			.release = noop_release},
		.allocator = failing_allocator(&fa),
	};
	adg_reducer *r = (adg_reducer *)&r;
	cr_assert_eq(adg_reducer_new(NULL, &r), ADG_EINVAL);
	cr_assert_null(r);
	cr_assert_eq(adg_reducer_new(&good, NULL), ADG_EINVAL);
	adg_reducer_options o[11];
	for (int k = 0; k < 11; k++)
		o[k] = good;
	o[0].n_participants = 0;
	o[1].n_params = 0;
	o[2].param_ids = NULL;
	o[3].ops.add = NULL;
	o[4].ops.apply = NULL;
	o[5].ops.release = NULL;
	o[6].allocator.free = NULL;
	uint64_t zero[3] = {4, 0, 6}, twice[3] = {4, 5, 4};
	o[7].param_ids = zero;
	o[8].param_ids = twice;
	o[9].allocator.alloc = NULL;
	o[10].n_units = ADG_REDUCER_MAX_UNITS + 1;
	for (int k = 0; k < 11; k++) {
		r = (adg_reducer *)&r;
		cr_assert_eq(adg_reducer_new(&o[k], &r), ADG_EINVAL,
			     "options %d", k);
		cr_assert_null(r);
		cr_assert_eq(atomic_load(&fa.live_bytes), 0, "options %d", k);
	}
	cr_assert_eq(adg_reducer_free(NULL), 0);
	cr_assert_eq(adg_reducer_new(&good, &r), 0);
	cr_assert_gt(atomic_load(&fa.live_bytes), 0, "the allocator's");
	cr_assert_eq(adg_reducer_free(r), 0);
	cr_assert_eq(atomic_load(&fa.live_bytes), 0);
}

CHECKED_TEST(reducer, bad_calls_change_nothing)
{
	struct hand h;
	hand_open(&h, 2, 1);
	adg_reducer *r = h.red;
	double *v = scalar_box(8);

	adg_backward_options bo = {
		.size = sizeof bo, .leaves_only = 0, .retain = 1};
	cr_assert_eq(adg_reducer_hook(NULL, 0, &bo), ADG_EINVAL);
	cr_assert_eq(adg_reducer_hook(r, 2, &bo), ADG_EINVAL);
	cr_assert_eq(adg_reducer_hook(r, 0, NULL), ADG_EINVAL);
	cr_assert(bo.on_ready == NULL && bo.on_ready_ctx == NULL &&
		  !bo.leaves_only);
	cr_assert_eq(adg_reducer_hook(r, 1, &bo), 0);
	cr_assert(bo.on_ready != NULL && bo.leaves_only && bo.retain);

	cr_assert_eq(adg_reducer_give(NULL, 0, 11, v), ADG_EINVAL);
	cr_assert_eq(adg_reducer_give(r, 0, 11, NULL), ADG_EINVAL);
	cr_assert_eq(adg_reducer_give(r, 2, 11, v), ADG_EINVAL);
	cr_assert_eq(adg_reducer_give(r, 0, 12, v), ADG_EINVAL, "unknown");
	cr_assert_eq(adg_reducer_give(r, 0, 0, v), ADG_EINVAL);
	cr_assert_eq(adg_reducer_end(NULL, 0, 0), ADG_EINVAL);
	cr_assert_eq(adg_reducer_end(r, 2, 0), ADG_EINVAL);
	cr_assert_eq(adg_reducer_rounds(NULL, &(uint64_t){0}), ADG_EINVAL);
	cr_assert_eq(adg_reducer_rounds(r, NULL), ADG_EINVAL);

	/* Given twice: the second refused, its value not taken. */
	cr_assert_eq(adg_reducer_give(r, 0, 11, v), 0);
	double *again = scalar_box(100);
	cr_assert_eq(adg_reducer_give(r, 0, 11, again), ADG_ESTATE);
	/* Mid-round the reducer cannot go. */
	cr_assert_eq(adg_reducer_free(r), ADG_EBUSY);
	cr_assert_eq(adg_reducer_give(r, 1, 11, scalar_box(1)), 0);
	cr_assert_eq(h.applied[0], 0.5 * 8 + 1, "the refused value stayed out");
	cr_assert_eq(adg_reducer_give(r, 1, 11, again), ADG_ESTATE);
	value_free(again);
	struct ender e0;
	end_async(&e0, &h, 0, 0);
	cr_assert_eq(adg_reducer_end(r, 1, 0), 0);
	cr_assert_eq(end_join(&e0), 0);
	cr_assert_eq(atomic_load(&h.released[0]), 1);
	cr_assert_eq(atomic_load(&h.released[1]), 1);
	uint64_t rounds;
	cr_assert_eq(adg_reducer_rounds(r, &rounds), 0);
	cr_assert_eq(rounds, 1);
	hand_close(&h);
}

/* Inside an apply that participant 0's end brought about: participant 0
 * is ending, 1 has given everything. */
struct out_of_order {
	struct hand h;
	int end_again, give_ending, give_given, calls, end0;
};

static int out_of_order_apply(const adg_reduction *red, void *ctx)
{
	struct out_of_order *o = ctx;
	if (o->calls++ == 0) {
		o->end_again = adg_reducer_end(o->h.red, 0, 0);
		double *v = scalar_box(1);
		o->give_ending = adg_reducer_give(o->h.red, 0, 11, v);
		o->give_given = adg_reducer_give(o->h.red, 1, 11, v);
		value_free(v);
	}
	return hand_apply(red, &o->h);
}

static void *end_0(void *arg)
{
	struct out_of_order *o = arg;
	o->end0 = adg_reducer_end(o->h.red, 0, 0);
	return NULL;
}

CHECKED_TEST(reducer, calls_out_of_order_are_estate)
{
	struct out_of_order o = {0};
	o.h.fail_apply = -1;
	o.h.ids[0] = 11, o.h.ids[1] = 7, o.h.ids[2] = 1000003;
	adg_reducer_options opt = {
		.size = sizeof opt,
		.n_participants = 2,
		.param_ids = o.h.ids,
		.n_params = 3,
		.ops = {.add = hand_add,
			.apply = out_of_order_apply,
			.release = hand_release,
			.ctx = &o},
		.apply_early = 1, /* on participant 0's thread, below */
	};
	cr_assert_eq(adg_reducer_new(&opt, &o.h.red), 0);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(
			adg_reducer_give(o.h.red, 1, o.h.ids[i], scalar_box(i)),
			0);
	/* Participant 0 gives nothing: its end completes every parameter
	 * with NULLs, and applies them, on its thread, whenever 1 ends. */
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, end_0, &o), 0);
	cr_assert_eq(adg_reducer_end(o.h.red, 1, 0), 0);
	pthread_join(t, NULL);
	cr_assert_eq(o.end0, 0, "participant 0's end");
	cr_assert_eq(o.calls, 3);
	cr_assert_eq(o.end_again, ADG_ESTATE, "a second end");
	cr_assert_eq(o.give_ending, ADG_ESTATE, "a give while ending");
	cr_assert_eq(o.give_given, ADG_ESTATE, "a second give");
	for (int i = 0; i < 3; i++)
		cr_assert_eq(o.h.applied[i], (double)i, "nothing else folded");
	cr_assert_eq(atomic_load(&o.h.released[0]), 0);
	cr_assert_eq(atomic_load(&o.h.released[1]), 3);
	hand_close(&o.h);
}

/* ------------------------------------------------------------------ units */

/* The weights after `rounds` rounds of the sequential trainer over units
 * units. */
static void unit_reference_weights(int units, int rounds, double *w)
{
	struct model ref;
	model_open(&ref, 1);
	ref.units = units;
	reference(&ref, 0, rounds);
	memcpy(w, ref.w, sizeof ref.w);
	model_close(&ref);
}

/* U units (1; 5 and 7, whose trees are padded; 16, of which 4 hold no
 * sample) over T = 1 to 8 participants, oversubscribed on two cores,
 * with random sleeps in steps, between units and before ends: the
 * weights are bitwise the same at every T, the sequential trainer's over
 * the units in the tree's order, and every unit is dealt once a round. */
static void units_bitwise_at_every_t(const adg_executor *executor, int runs,
				     bool early)
{
	enum { ROUNDS = 4 };
	static const int units[] = {1, 5, 7, 16};
	for (size_t n = 0; n < sizeof units / sizeof *units; n++) {
		double want[NP];
		unit_reference_weights(units[n], ROUNDS, want);
		for (int t = 1; t <= MAXT; t++)
			for (int run = 0; run < runs; run++) {
				struct model m;
				model_open(&m, t);
				m.units = units[n];
				m.rounds = ROUNDS;
				m.perturb = true;
				m.executor = executor;
				m.apply_early = early;
				train(&m);
				char what[64];
				snprintf(what, sizeof what,
					 "U = %d, T = %d, run %d", units[n], t,
					 run);
				expect_same_weights(m.w, want, what);
				int taken = 0;
				for (int p = 0; p < t; p++)
					taken += atomic_load(&m.units_taken[p]);
				cr_assert_eq(taken, ROUNDS * units[n], "%s",
					     what);
				for (int i = 0; i < NP; i++)
					cr_assert_eq(atomic_load(&m.applies[i]),
						     ROUNDS, "%s", what);
				model_close(&m);
			}
	}
}

CHECKED_TEST(reducer, units_give_the_same_bits_at_every_thread_count)
{
	units_bitwise_at_every_t(NULL, 2, false);
}

CHECKED_TEST(reducer, units_give_the_same_bits_applied_early_on_a_pool)
{
	adg_pool *pool;
	adg_executor ex;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	units_bitwise_at_every_t(&ex, 1, true);
	cr_assert_eq(adg_pool_free(pool), 0);
}

/* A unit that fails, at its root or late (having given w1 and w2): the
 * round applies nothing, every participant's end returns the unit's
 * error, and the rounds before and after are the sequential trainer's. */
CHECKED_TEST(reducer, a_failed_unit_abandons_the_round_whole)
{
	for (int late = 0; late < 2; late++)
		for (int t = 1; t <= 3; t++) {
			struct model m;
			model_open(&m, t);
			m.units = 7;
			m.rounds = 3;
			m.fail_round = 1;
			m.fail_participant = 3; /* the unit */
			m.fail_kind = late ? FAIL_LATE : FAIL_AT_ROOT;
			m.perturb = true;
			train(&m); /* every end of round 1: FAIL_CODE */
			struct model ref;
			model_open(&ref, 1);
			ref.units = 7;
			reference(&ref, 0, 1);
			reference(&ref, 2, 3);
			expect_same_weights(m.w, ref.w, "after a failed unit");
			for (int i = 0; i < NP; i++)
				cr_assert_eq(atomic_load(&m.applies[i]), 2);
			model_close(&ref);
			model_close(&m);
		}
}

CHECKED_TEST(reducer, units_are_dealt_in_order_and_their_calls_checked)
{
	struct hand h;
	hand_open_units(&h, 2, 3, 0); /* units given by hand */
	adg_reducer *r = h.red;
	size_t u = 0;
	double *v = scalar_box(2);
	cr_assert_eq(adg_reducer_give(r, 0, 11, v), ADG_ESTATE, "no unit");
	cr_assert_eq(adg_reducer_unit_end(r, 0, 0), ADG_ESTATE, "no unit");
	cr_assert_eq(adg_reducer_next_unit(NULL, 0, &u), ADG_EINVAL);
	cr_assert_eq(u, ADG_REDUCER_NO_UNIT);
	cr_assert_eq(adg_reducer_next_unit(r, 2, &u), ADG_EINVAL);
	cr_assert_eq(adg_reducer_next_unit(r, 0, NULL), ADG_EINVAL);
	cr_assert_eq(adg_reducer_unit_end(NULL, 0, 0), ADG_EINVAL);
	cr_assert_eq(adg_reducer_unit_end(r, 2, 0), ADG_EINVAL);
	cr_assert_eq(adg_reducer_next_unit(r, 1, &u), 0);
	cr_assert_eq(u, 0);
	cr_assert_eq(adg_reducer_next_unit(r, 1, &u), ADG_ESTATE,
		     "unit 0 not ended");
	cr_assert_eq(u, ADG_REDUCER_NO_UNIT);
	cr_assert_eq(adg_reducer_give(r, 1, 11, v), 0);
	cr_assert_eq(adg_reducer_give(r, 1, 11, v), ADG_ESTATE, "twice");
	cr_assert_eq(adg_reducer_unit_end(r, 1, 0), 0);
	cr_assert_eq(adg_reducer_next_unit(r, 0, &u), 0);
	cr_assert_eq(u, 1);
	cr_assert_eq(adg_reducer_give(r, 0, 11, scalar_box(3)), 0);
	cr_assert_eq(adg_reducer_unit_end(r, 0, 0), 0);
	/* Participant 0 ends the round with unit 2 never dealt: the round
	 * fails for both, and nothing is applied. */
	struct ender e0;
	end_async(&e0, &h, 0, 0);
	cr_assert_eq(adg_reducer_end(r, 1, 0), ADG_ESTATE);
	cr_assert_eq(end_join(&e0), ADG_ESTATE);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(atomic_load(&h.applies[i]), 0);
	cr_assert_eq(atomic_load(&h.released[0]), 1);
	cr_assert_eq(atomic_load(&h.released[1]), 1);

	/* The next round is clean: units 0, 1 and 2 again, 2 by whoever
	 * asks, and the sum of parameter 0 is (u0 (+) u1) (+) u2. */
	for (size_t want = 0; want < 3; want++) {
		size_t p = want % 2;
		cr_assert_eq(adg_reducer_next_unit(r, p, &u), 0);
		cr_assert_eq(u, want);
		cr_assert_eq(adg_reducer_give(r, p, 11,
					      scalar_box((double)want + 1)),
			     0);
		cr_assert_eq(adg_reducer_unit_end(r, p, 0), 0);
	}
	cr_assert_eq(adg_reducer_next_unit(r, 0, &u), 0);
	cr_assert_eq(u, ADG_REDUCER_NO_UNIT, "all dealt");
	cr_assert_eq(atomic_load(&h.applies[0]), 0, "not before the end");
	end_async(&e0, &h, 0, 0);
	cr_assert_eq(adg_reducer_end(r, 1, 0), 0);
	cr_assert_eq(end_join(&e0), 0);
	cr_assert_eq(h.applied[0], 0.5 * (0.5 * 1 + 2) + 3);
	cr_assert_null(h.applied_sum[1], "no unit gave it");
	for (int i = 0; i < 3; i++)
		cr_assert_eq(atomic_load(&h.applies[i]), 1);
	hand_close(&h);

	/* Without units, next_unit and unit_end are refused. */
	hand_open(&h, 1, 0);
	cr_assert_eq(adg_reducer_next_unit(h.red, 0, &u), ADG_ESTATE);
	cr_assert_eq(adg_reducer_unit_end(h.red, 0, 0), ADG_ESTATE);
	hand_close(&h);
}

/* ------------------------------------------------------ allocation failure */

Test(reducer_alloc, every_allocation_fails_in_turn)
{
	uint64_t ids[5] = {9, 3, 27, 81, 1};
	failing_alloc fa = {0};
	struct hand h;
	memset(&h, 0, sizeof h);
	memcpy(h.ids, ids, sizeof h.ids);
	h.fail_apply = -1;
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = 1,
		.param_ids = ids,
		.n_params = 3,
		.ops = {.add = hand_add,
			.apply = hand_apply,
			.release = hand_release,
			.ctx = &h},
		.allocator = failing_allocator(&fa),
	};
	long failures = 0;
	for (long n = 1;; n++) {
		atomic_store(&fa.fail_in, n);
		adg_reducer *r = (adg_reducer *)&r;
		int rc = adg_reducer_new(&o, &r);
		bool failed = atomic_load(&fa.fail_in) == 0;
		atomic_store(&fa.fail_in, 0);
		if (!failed) {
			cr_assert_eq(rc, 0, "N=%ld: %s", n, adg_strerror(rc));
			h.red = r;
			for (int i = 0; i < 3; i++)
				cr_assert_eq(adg_reducer_give(r, 0, ids[i],
							      scalar_box(i)),
					     0);
			cr_assert_eq(adg_reducer_end(r, 0, 0), 0);
			cr_assert_eq(atomic_load(&h.applies[2]), 1);
			cr_assert_eq(adg_reducer_free(r), 0);
			break;
		}
		failures++;
		cr_assert_eq(rc, ADG_ENOMEM, "N=%ld: %s", n, adg_strerror(rc));
		cr_assert_null(r, "N=%ld", n);
		cr_assert_eq(atomic_load(&fa.live_bytes), 0,
			     "N=%ld: %ld bytes kept", n,
			     atomic_load(&fa.live_bytes));
	}
	cr_assert_geq(failures, 3,
		      "the reducer, its parameters, its "
		      "participants' slots and its table");
	cr_assert_eq(atomic_load(&fa.live_bytes), 0);
	cr_assert_eq(atomic_load(&scalar_values_live), 0);
	cr_assert_eq(atomic_load(&h.bad), 0);
}

/* ----------------------------------------------------------------- stress */

CHECKED_TEST(reducer_stress, many_rounds_on_a_shared_pool)
{
	enum { ROUNDS = 300 };
	adg_pool *pool;
	adg_executor ex;
	cr_assert_eq(adg_pool_new(3, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	for (int at_end = 0; at_end < 2; at_end++) {
		double want[NP];
		reference_weights(4, ROUNDS, false, want);
		struct model m;
		model_open(&m, 4);
		m.rounds = ROUNDS;
		m.executor = &ex;
		m.apply_early = !at_end;
		train(&m);
		expect_same_weights(m.w, want,
				    at_end ? "at end" : "overlapped");
		model_close(&m);
	}
	cr_assert_eq(adg_pool_free(pool), 0);
}

/* T participants, each giving from two threads at once (as executor
 * workers do), many rounds; every apply checks its sum. */
#define CROWD_T 4 /* participants */

struct crowd {
	adg_reducer *red;
	uint64_t ids[16];
	double values[CROWD_T][16]; /* participant p's for parameter i */
	atomic_int applies, bad;
};

#define CROWD_ROUNDS 1000

static double crowd_value(int p, int i, uint64_t round)
{
	return (double)((p * 7 + i * 3 + (int)(round % 13)) % 11) - 5.0;
}

static int crowd_apply(const adg_reduction *red, void *ctx)
{
	struct crowd *c = ctx;
	double v[CROWD_T];
	void *c_of[CROWD_T];
	for (int p = 0; p < CROWD_T; p++) {
		v[p] = crowd_value(p, (int)red->param, red->round);
		c_of[p] = &v[p];
	}
	double want = *(double *)tree_mix(c_of, CROWD_T);
	if (red->sum == NULL || *(double *)red->sum != want ||
	    red->id != c->ids[red->param])
		atomic_fetch_add(&c->bad, 1);
	atomic_fetch_add(&c->applies, 1);
	return 0;
}

static void crowd_release(void *value, size_t participant, void *ctx)
{
	struct crowd *c = ctx;
	if ((int)participant != this_participant)
		atomic_fetch_add(&c->bad, 1);
	(void)value;
}

struct half {
	struct crowd *c;
	int p, half;
	uint64_t round;
};

static void *give_half(void *arg)
{
	struct half *hf = arg;
	for (int i = hf->half; i < 16; i += 2) {
		double *v = &hf->c->values[hf->p][i];
		*v = crowd_value(hf->p, i, hf->round);
		if (adg_reducer_give(hf->c->red, (size_t)hf->p, hf->c->ids[i],
				     v) != 0)
			atomic_fetch_add(&hf->c->bad, 1);
	}
	return NULL;
}

static void *crowd_participant(void *arg)
{
	struct thread *th = arg;
	struct crowd *c = th->s;
	this_participant = th->i;
	for (uint64_t k = 0; k < CROWD_ROUNDS; k++) {
		/* Half the parameters from a helper thread, half from this
		 * one, at once. */
		struct half a = {c, th->i, 0, k}, b = {c, th->i, 1, k};
		pthread_t helper;
		bool spawned =
			pthread_create(&helper, NULL, give_half, &a) == 0;
		if (!spawned)
			give_half(&a);
		give_half(&b);
		if (spawned)
			pthread_join(helper, NULL);
		if (adg_reducer_end(c->red, (size_t)th->i, 0) != 0)
			atomic_fetch_add(&c->bad, 1);
	}
	return NULL;
}

CHECKED_TEST(reducer_stress, gives_from_two_threads_per_participant)
{
	struct crowd c = {0};
	for (int i = 0; i < 16; i++)
		c.ids[i] = (uint64_t)(i * 64 + 1); /* collide in the table */
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = CROWD_T,
		.param_ids = c.ids,
		.n_params = 16,
		.ops = {.add = mix_add,
			.apply = crowd_apply,
			.release = crowd_release,
			.ctx = &c},
	};
	cr_assert_eq(adg_reducer_new(&o, &c.red), 0);
	run_threads(CROWD_T, crowd_participant, &c);
	cr_assert_eq(atomic_load(&c.bad), 0);
	cr_assert_eq(atomic_load(&c.applies), CROWD_ROUNDS * 16);
	uint64_t rounds;
	cr_assert_eq(adg_reducer_rounds(c.red, &rounds), 0);
	cr_assert_eq(rounds, CROWD_ROUNDS);
	cr_assert_eq(adg_reducer_free(c.red), 0);
}

/* ------------------------------------------------ parameters in slices */

/* Vector parameters, each cut into slices (reduce-scatter): gradients are
 * heap vectors of VN doubles, folded element-wise as the scalars are
 * (sum = 0.5 * sum + value), one slice of elements at a time. */
#define VN  37 /* not a multiple of any slice count: slices differ */
#define VNP 3
#define VR  12

struct vec {
	double v[VN];
};

struct sliced {
	adg_reducer *red;
	uint64_t ids[VNP];
	size_t slices[VNP];
	double w[VNP][VN];
	atomic_int applies[VNP][8]; /* per slice, over the run */
	atomic_int live;	    /* vectors not yet released */
	atomic_int bad;
	atomic_int helped;  /* slices applied by participant 0 */
	bool wait_for_help; /* participant 1's applies wait for one */
	int t;
};

static void slice_range(size_t k, size_t n_slices, size_t *lo, size_t *hi)
{
	*lo = k * VN / n_slices;
	*hi = (k + 1) * VN / n_slices;
}

static int vec_add_whole(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	struct vec *s = *sum;
	const struct vec *g = value;
	for (size_t e = 0; e < VN; e++)
		s->v[e] = 0.5 * s->v[e] + g->v[e];
	return 0;
}

static int vec_add_slice(void *sum, const void *value, size_t k,
			 size_t n_slices, void *ctx)
{
	(void)ctx;
	struct vec *s = sum;
	const struct vec *g = value;
	size_t lo, hi;
	slice_range(k, n_slices, &lo, &hi);
	jitter();
	for (size_t e = lo; e < hi; e++)
		s->v[e] = 0.5 * s->v[e] + g->v[e];
	return 0;
}

static int vec_apply(const adg_reduction *red, void *ctx)
{
	struct sliced *m = ctx;
	if (red->param >= VNP || red->n_slices != m->slices[red->param] ||
	    red->slice >= red->n_slices) {
		atomic_fetch_add(&m->bad, 1);
		return 0;
	}
	if (this_participant == 0)
		atomic_fetch_add(&m->helped, 1);
	if (m->wait_for_help && this_participant == 1) {
		/* Participant 0 waits in its end: it must take a slice while
		 * this one is held here (10 s is a hang, not a slow run). */
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		do {
			nanosleep(&(struct timespec){0, 100000}, NULL);
			clock_gettime(CLOCK_MONOTONIC, &t);
		} while (atomic_load(&m->helped) == 0 &&
			 t.tv_sec - t0.tv_sec < 10);
		if (atomic_load(&m->helped) == 0)
			atomic_fetch_add(&m->bad, 1);
	}
	atomic_fetch_add(&m->applies[red->param][red->slice], 1);
	const struct vec *s = red->sum;
	size_t lo, hi;
	slice_range(red->slice, red->n_slices, &lo, &hi);
	for (size_t e = lo; s != NULL && e < hi; e++)
		m->w[red->param][e] -= LR * s->v[e];
	return 0;
}

static void vec_release(void *value, size_t participant, void *ctx)
{
	struct sliced *m = ctx;
	if ((int)participant != this_participant)
		atomic_fetch_add(&m->bad, 1);
	free(value);
	atomic_fetch_sub(&m->live, 1);
}

/* Participant p's gradient for parameter i in round k: a fixed function
 * of the three, so the reference can make it again. */
static struct vec *vec_grad(int p, int i, int k)
{
	struct vec *g = malloc(sizeof *g);
	cr_assert_not_null(g);
	for (size_t e = 0; e < VN; e++)
		g->v[e] = (double)((p + 1) * 7 + i * 3 + k) / (double)(e + 1);
	return g;
}

static void sliced_open(struct sliced *m, int t, size_t big, int apply_early)
{
	memset(m, 0, sizeof *m);
	m->t = t;
	m->ids[0] = 5, m->ids[1] = 6, m->ids[2] = 9;
	m->slices[0] = big, m->slices[1] = 1, m->slices[2] = 2;
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = (size_t)t,
		.param_ids = m->ids,
		.n_params = VNP,
		.ops = {.add = vec_add_whole,
			.apply = vec_apply,
			.release = vec_release,
			.ctx = m,
			.add_slice = vec_add_slice},
		.apply_early = apply_early,
		.param_slices = m->slices,
	};
	cr_assert_eq(adg_reducer_new(&o, &m->red), 0);
}

static void *sliced_participant(void *arg)
{
	struct thread *th = arg;
	struct sliced *m = th->s;
	this_participant = th->i;
	for (int k = 0; k < VR; k++) {
		for (int i = VNP - 1; i >= 0; i--) {
			atomic_fetch_add(&m->live, 1);
			jitter();
			if (adg_reducer_give(m->red, (size_t)th->i, m->ids[i],
					     vec_grad(th->i, i, k)) != 0)
				atomic_fetch_add(&m->bad, 1);
		}
		if (adg_reducer_end(m->red, (size_t)th->i, 0) != 0)
			atomic_fetch_add(&m->bad, 1);
	}
	this_participant = -1;
	return NULL;
}

/* The gradients of participants first to first + n - 1 for parameter i
 * in round k folded in tree_mix's order, on one thread. */
static struct vec *vec_tree(int first, int n, int i, int k)
{
	if (n == 1)
		return vec_grad(first, i, k);
	int half = 1;
	while (half * 2 < n)
		half *= 2;
	struct vec *a = vec_tree(first, half, i, k);
	struct vec *b = vec_tree(first + half, n - half, i, k);
	vec_add_whole((void **)&a, b, NULL);
	free(b);
	return a;
}

/* The weights of VR rounds folded in the tree's order on one thread. */
static void sliced_reference(int t, double w[VNP][VN])
{
	memset(w, 0, sizeof(double) * VNP * VN);
	for (int k = 0; k < VR; k++)
		for (int i = 0; i < VNP; i++) {
			struct vec *sum = vec_tree(0, t, i, k);
			for (size_t e = 0; e < VN; e++)
				w[i][e] -= LR * sum->v[e];
			free(sum);
		}
}

/* Slices taken by whichever participant is free, T = 1 to 4, slice counts
 * of 1 to 8, applied as they come or at the end: the weights are bitwise
 * the sequential fold's every time, each slice applied once a round, and
 * every vector handed back to its giver. */
CHECKED_TEST(reducer, slices_are_bitwise_the_sequential_fold)
{
	for (int at_end = 0; at_end < 2; at_end++)
		for (int t = 1; t <= 4; t++)
			for (size_t big = 1; big <= 8; big *= 2) {
				double want[VNP][VN];
				sliced_reference(t, want);
				struct sliced m;
				sliced_open(&m, t, big, !at_end);
				run_threads(t, sliced_participant, &m);
				cr_assert_eq(atomic_load(&m.bad), 0);
				cr_assert_eq(atomic_load(&m.live), 0);
				cr_expect(memcmp(m.w, want, sizeof want) == 0,
					  "T %d, %zu slices, at end %d: "
					  "weights differ",
					  t, big, at_end);
				for (int i = 0; i < VNP; i++)
					for (size_t k = 0; k < m.slices[i]; k++)
						cr_expect_eq(
							atomic_load(
								&m.applies[i]
									  [k]),
							VR);
				cr_assert_eq(adg_reducer_free(m.red), 0);
			}
}

static void *end_of_zero(void *arg)
{
	struct thread *th = arg;
	struct sliced *m = th->s;
	this_participant = 0;
	if (adg_reducer_end(m->red, 0, 0) != 0)
		atomic_fetch_add(&m->bad, 1);
	return NULL;
}

/* Participant 0 has given everything and waits in its end; participant 1
 * brings the last contribution of an 8-slice parameter and holds its own
 * first slice until another thread has applied one: participant 0 must
 * take slices from its end. (With help() disabled, so that the thread
 * that completes a parameter sums and applies it alone, this test failed
 * by Criterion's timeout.) */
CHECKED_TEST(reducer, participants_waiting_at_the_end_take_slices)
{
	struct sliced m;
	sliced_open(&m, 2, 8, 1);
	m.wait_for_help = true;
	struct thread th0 = {&m, 0};
	pthread_t zero;
	this_participant = 1;
	for (int i = 0; i < VNP; i++) {
		atomic_fetch_add(&m.live, 1);
		cr_assert_eq(
			adg_reducer_give(m.red, 0, m.ids[i], vec_grad(0, i, 0)),
			0);
	}
	cr_assert_eq(pthread_create(&zero, NULL, end_of_zero, &th0), 0);
	for (int i = VNP - 1; i >= 0; i--) {
		atomic_fetch_add(&m.live, 1);
		cr_assert_eq(
			adg_reducer_give(m.red, 1, m.ids[i], vec_grad(1, i, 0)),
			0);
	}
	cr_assert_eq(adg_reducer_end(m.red, 1, 0), 0);
	pthread_join(zero, NULL);
	this_participant = -1;
	cr_assert_eq(atomic_load(&m.bad), 0);
	cr_assert_gt(atomic_load(&m.helped), 0);
	cr_assert_eq(atomic_load(&m.live), 0);
	for (size_t k = 0; k < 8; k++)
		cr_assert_eq(atomic_load(&m.applies[0][k]), 1);
	cr_assert_eq(adg_reducer_free(m.red), 0);
}

/* ------------------------------------------------ a job's units in ranks */

#define RANKS	 5
#define PARTIALS 16 /* at most 2 log2(units) per parameter and rank */
#define JOB	 11 /* units: padded to 16, and split unevenly */

/* R reducers, the ranks of a job, each of a contiguous range of its
 * units, run one after the other in one process; each one's partial
 * sums are kept, by parameter, and folded over the job's tree here. */
struct ranked {
	struct model *m;
	adg_reducer *red[RANKS];
	int rank; /* the one running */
	struct part {
		size_t first, count;
		bool has;
		double sum;
	} part[RANKS][NP][PARTIALS];
	atomic_int n_part[RANKS][NP];
	atomic_int bad;
};

static int ranked_apply(const adg_reduction *red, void *ctx)
{
	struct ranked *rk = ctx;
	int i = (int)red->param;
	int j = atomic_fetch_add(&rk->n_part[rk->rank][i], 1);
	if (i >= NP || j >= PARTIALS || red->n_units == 0) {
		atomic_fetch_add(&rk->bad, 1);
		return 0;
	}
	rk->part[rk->rank][i][j] =
		(struct part){red->first_unit, red->n_units, red->sum != NULL,
			      red->sum != NULL ? *(double *)red->sum : 0};
	return 0;
}

/* Parameter i's sum over the job's units first to first + count - 1
 * (count a power of two) in the job's tree: a rank's partial sum where
 * one covers them, else its halves folded. NULL: no unit had one. */
static double *ranked_fold(struct ranked *rk, int ranks, int i, size_t first,
			   size_t count)
{
	size_t end = first + count < JOB ? first + count : JOB;
	if (first >= end)
		return NULL;
	for (int r = 0; r < ranks; r++)
		for (int j = 0; j < atomic_load(&rk->n_part[r][i]); j++) {
			struct part *p = &rk->part[r][i][j];
			if (p->first == first && p->count == end - first)
				return p->has ? &p->sum : NULL;
		}
	cr_assert_gt(count, 1, "unit %zu in no rank's partial sums", first);
	void *a = ranked_fold(rk, ranks, i, first, count / 2);
	void *b = ranked_fold(rk, ranks, i, first + count / 2, count / 2);
	if (a == NULL)
		return b;
	if (b != NULL)
		mix_add(&a, b, NULL);
	return a;
}

static void *ranked_participant(void *arg)
{
	struct thread *th = arg;
	struct ranked *rk = th->s;
	struct model *m = rk->m;
	this_participant = th->i;
	adg_backward_options o = {.size = sizeof o};
	if (adg_reducer_hook(m->red, (size_t)th->i, &o) != 0)
		atomic_fetch_add(&rk->bad, 1);
	size_t unit;
	int k = m->rounds; /* the round under way */
	while (adg_reducer_next_unit(m->red, (size_t)th->i, &unit) == 0 &&
	       unit != ADG_REDUCER_NO_UNIT)
		if (unit_backward(m, th->i, unit, k, &o) != 0)
			atomic_fetch_add(&rk->bad, 1);
	jitter();
	if (adg_reducer_end(m->red, (size_t)th->i, 0) != 0)
		atomic_fetch_add(&rk->bad, 1);
	return NULL;
}

/* ROUNDS rounds of a job of JOB units in R ranks of T threads each. */
static void ranked_train(struct ranked *rk, int ranks, int t, int rounds)
{
	struct model *m = rk->m;
	for (int r = 0; r < ranks; r++) {
		size_t lo = (size_t)(r * JOB / ranks),
		       hi = (size_t)((r + 1) * JOB / ranks);
		adg_reducer_options o = {
			.size = sizeof o,
			.n_participants = (size_t)t,
			.n_units = hi - lo,
			.first_unit = lo,
			.total_units = JOB,
			.param_ids = m->id,
			.n_params = NP,
			.ops = {.add = mix_add,
				.apply = ranked_apply,
				.release = release_value,
				.ctx = rk},
		};
		cr_assert_eq(adg_reducer_new(&o, &rk->red[r]), 0);
	}
	for (m->rounds = 0; m->rounds < rounds; m->rounds++) {
		memset(rk->n_part, 0, sizeof rk->n_part);
		for (rk->rank = 0; rk->rank < ranks; rk->rank++) {
			m->red = rk->red[rk->rank];
			run_threads(t, ranked_participant, rk);
		}
		for (int i = 0; i < NP; i++) {
			double *sum = ranked_fold(rk, ranks, i, 0, 16);
			if (sum != NULL)
				m->w[i] -= LR * *sum;
		}
	}
	for (int r = 0; r < ranks; r++)
		cr_assert_eq(adg_reducer_free(rk->red[r]), 0);
}

/* A job's JOB units in R = 1 to 5 ranks (contiguous ranges, most not
 * subtrees of the job's tree) of T = 1 to 3 threads: the ranks' partial
 * sums folded over the rest of the job's tree give bitwise the weights of
 * one reducer of every unit. */
CHECKED_TEST(reducer, ranks_partial_sums_fold_to_the_same_bits)
{
	enum { ROUNDS = 3 };
	double want[NP];
	unit_reference_weights(JOB, ROUNDS, want);
	for (int ranks = 1; ranks <= RANKS; ranks++)
		for (int t = 1; t <= 3; t++) {
			static struct ranked rk;
			struct model m;
			model_open(&m, t);
			m.units = JOB;
			memset(&rk, 0, sizeof rk);
			rk.m = &m;
			ranked_train(&rk, ranks, t, ROUNDS);
			cr_assert_eq(atomic_load(&rk.bad), 0);
			cr_assert_eq(atomic_load(&m.bad), 0);
			/* Ranges that are not subtrees have more partial
			 * sums than ranks: those of R = 2 to 4 (R = 5's
			 * are [0, 2), [2, 4), [4, 6), [6, 8) and [8, 16)
			 * cut at the job's end). */
			int parts = 0;
			for (int r = 0; r < ranks; r++)
				parts += atomic_load(&rk.n_part[r][0]);
			cr_assert(ranks == 1 || ranks == 5 ? parts == ranks
							   : parts > ranks,
				  "R = %d: %d partial sums", ranks, parts);
			char what[48];
			snprintf(what, sizeof what, "R = %d, T = %d", ranks, t);
			expect_same_weights(m.w, want, what);
			model_close(&m);
		}
}

/* A range that does not fit in the job, or a range without units or with
 * slices, is refused. */
CHECKED_TEST(reducer, ranges_of_units_are_checked)
{
	uint64_t ids[2] = {3, 4};
	size_t slices[2] = {2, 1};
	adg_reducer_options good = {
		.size = sizeof good,
		.n_participants = 1,
		.n_units = 3,
		.first_unit = 5,
		.total_units = 8,
		.param_ids = ids,
		.n_params = 2,
		.ops = {.add = mix_add,
			.apply = noop_apply,
			.release = noop_release,
			.add_slice = vec_add_slice},
	};
	adg_reducer *r;
	cr_assert_eq(adg_reducer_new(&good, &r), 0);
	cr_assert_eq(adg_reducer_free(r), 0);
	adg_reducer_options o[5] = {good, good, good, good, good};
	o[0].first_unit = 6; /* past the job */
	o[1].n_units = 0;    /* a range without units */
	o[2].total_units = ADG_REDUCER_MAX_UNITS + 1; /* too many */
	o[3].param_slices = slices;		      /* slices */
	o[4].total_units = 0;			      /* first_unit alone */
	for (int k = 0; k < 5; k++)
		cr_assert_eq(adg_reducer_new(&o[k], &r), ADG_EINVAL, "%d", k);
}

/* ------------------------------------------------- a failed round's reason */

/* adg_reducer_end_with on a thread of its own, with what it tells. */
struct teller {
	pthread_t thread;
	adg_reducer *red;
	size_t participant;
	const adg_failure *failure;
	int rc;
	adg_reducer_failure round;
	char why[ADG_ERRMSG_MAX];
};

static void *tell_thread(void *arg)
{
	struct teller *t = arg;
	t->rc = adg_reducer_end_with(t->red, t->participant, t->failure,
				     &t->round);
	strcpy(t->why, adg_errmsg());
	return NULL;
}

/* Ends every participant of red's round at once, participant p with
 * failures[p] (NULL: none), into tellers[p]. */
static void tell_all(adg_reducer *red, size_t t, const adg_failure **failures,
		     struct teller *tellers)
{
	for (size_t p = 0; p < t; p++) {
		tellers[p] = (struct teller){
			.red = red,
			.participant = p,
			.failure = failures[p],
			.round = {.size = sizeof tellers[p].round}};
		cr_assert_eq(pthread_create(&tellers[p].thread, NULL,
					    tell_thread, &tellers[p]),
			     0);
	}
	for (size_t p = 0; p < t; p++)
		pthread_join(tellers[p].thread, NULL);
}

/* Every participant of a round that participant 1 failed is told who
 * failed, its code and its step, in its adg_reducer_failure and its
 * thread's reason. */
CHECKED_TEST(reducer, every_participant_is_told_who_failed_and_where)
{
	struct hand h;
	hand_open(&h, 3, 0);
	adg_failure at_mul = {.size = sizeof at_mul,
			      .code = ADG_EVALUE,
			      .site = ADG_FAILED_STEP,
			      .node_id = 17,
			      .name = "mul",
			      .pass_id = 4};
	const adg_failure *failures[3] = {NULL, &at_mul, NULL};
	struct teller tellers[3];
	tell_all(h.red, 3, failures, tellers);
	for (size_t p = 0; p < 3; p++) {
		const struct teller *t = &tellers[p];
		cr_expect_eq(t->rc, ADG_EVALUE, "participant %zu", p);
		cr_expect_str_eq(t->why,
				 "adg_reducer_end_with: round 0 abandoned: "
				 "participant 1 failed with ADG_EVALUE (-12) "
				 "at step 'mul' of node 17",
				 "participant %zu", p);
		cr_expect_eq(t->round.code, ADG_EVALUE);
		cr_expect_eq(t->round.site, ADG_REDUCER_FAILED_RESULT);
		cr_expect_eq(t->round.round, 0);
		cr_expect_eq(t->round.participant, 1);
		cr_expect_eq(t->round.unit, ADG_REDUCER_NO_UNIT);
		cr_expect_eq(t->round.step.node_id, 17);
		cr_expect_str_eq(t->round.step.name, "mul");
		cr_expect_eq(t->round.step.site, ADG_FAILED_STEP);
	}
	/* A round applied whole tells no failure. */
	const adg_failure *none[3] = {NULL, NULL, NULL};
	tell_all(h.red, 3, none, tellers);
	for (size_t p = 0; p < 3; p++) {
		cr_expect_eq(tellers[p].rc, 0);
		cr_expect_eq(tellers[p].round.code, 0);
		cr_expect_eq(tellers[p].round.site, ADG_REDUCER_FAILED_NOWHERE);
		cr_expect_eq(tellers[p].round.round, 1);
		cr_expect_eq(tellers[p].round.participant, SIZE_MAX);
	}
	hand_close(&h);
}

static int mul_fails(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return ADG_EUSER - 3;
}

/* With units: a unit's real backward fails at a named step, and
 * adg_reducer_unit_end_with hands its failure to the reducer. */
CHECKED_TEST(reducer, a_units_backward_failure_names_its_step)
{
	struct hand h;
	hand_open_units(&h, 2, 2, 0);
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	adg_step mul = {.backward = mul_fails, .name = "mul"};
	cr_assert_eq(adg_op(reg, &x, 1, &mul, &y), 0);
	size_t unit;
	cr_assert_eq(adg_reducer_next_unit(h.red, 0, &unit), 0);
	cr_assert_eq(adg_reducer_unit_end_with(h.red, 0, NULL), 0);
	cr_assert_eq(adg_reducer_next_unit(h.red, 1, &unit), 0);
	cr_assert_eq(unit, 1);
	adg_failure why = {.size = sizeof why};
	adg_backward_options o = {.size = sizeof o, .failure = &why};
	cr_assert_eq(adg_reducer_hook(h.red, 1, &o), 0);
	adg_grads *g;
	cr_assert_eq(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		ADG_EUSER - 3);
	cr_assert_eq(adg_reducer_unit_end_with(h.red, 1, &why), 0);
	const adg_failure *failures[2] = {NULL, NULL};
	struct teller tellers[2];
	tell_all(h.red, 2, failures, tellers);
	char want[200];
	snprintf(want, sizeof want,
		 "adg_reducer_end_with: round 0 abandoned: participant 1 "
		 "failed with -1003 in unit 1 at step 'mul' of node %llu",
		 (unsigned long long)why.node_id);
	for (size_t p = 0; p < 2; p++) {
		cr_expect_eq(tellers[p].rc, ADG_EUSER - 3);
		cr_expect_str_eq(tellers[p].why, want);
		cr_expect_eq(tellers[p].round.participant, 1);
		cr_expect_eq(tellers[p].round.unit, 1);
		cr_expect_eq(tellers[p].round.step.node_id, why.node_id);
		cr_expect_eq(tellers[p].round.step.pass_id, why.pass_id);
	}
	adg_node_unref(y);
	adg_node_unref(x);
	hand_close(&h);
}

/* An add's and an apply's failure: which parameter, and (an add) whose
 * contribution. */
CHECKED_TEST(reducer, a_failed_add_or_apply_names_the_parameter)
{
	for (int kind = 0; kind < 2; kind++) {
		struct hand h;
		hand_open(&h, 2, 1);
		if (kind == 1)
			h.fail_apply = 0;
		cr_assert_eq(adg_reducer_give(h.red, 0, 11,
					      scalar_box(kind == 0 ? -1 : 1)),
			     0);
		cr_assert_eq(adg_reducer_give(h.red, 1, 11, scalar_box(2)),
			     kind == 0 ? ADG_EUSER - 1 : ADG_EUSER - 2);
		cr_expect_str_eq(adg_errmsg(),
				 kind == 0
					 ? "adg_reducer_give: folding or "
					   "applying parameter id 11 returned "
					   "-1001: the round is abandoned"
					 : "adg_reducer_give: folding or "
					   "applying parameter id 11 returned "
					   "-1002: the round is abandoned");
		const adg_failure *failures[2] = {NULL, NULL};
		struct teller tellers[2];
		tell_all(h.red, 2, failures, tellers);
		for (size_t p = 0; p < 2; p++) {
			const adg_reducer_failure *f = &tellers[p].round;
			cr_expect_eq(f->param_id, 11);
			if (kind == 0) {
				cr_expect_eq(f->site, ADG_REDUCER_FAILED_ADD);
				cr_expect_eq(f->participant, 1);
				cr_expect_str_eq(
					tellers[p].why,
					"adg_reducer_end_with: round 0 "
					"abandoned: ops.add returned -1001 "
					"folding participant 1's contribution "
					"to parameter id 11");
			} else {
				cr_expect_eq(f->site, ADG_REDUCER_FAILED_APPLY);
				cr_expect_eq(f->participant, SIZE_MAX);
				cr_expect_str_eq(
					tellers[p].why,
					"adg_reducer_end_with: round 0 "
					"abandoned: ops.apply returned -1002 "
					"for parameter id 11");
			}
		}
		hand_close(&h);
	}
}
