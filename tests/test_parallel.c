/* Parallel backward (issue 12): adg_backward_options.executor, libadg's
 * pool, and executors of the caller's own.
 *
 * Gradients here are hashed (struct hv, tests/scalar.h): heap objects
 * holding a hash, h, and the add folds them as sum = sum * 31 + value:
 * neither commutative nor associative, so that any change in the order a
 * node's contributions are folded in changes the leaves' results. Each
 * step's contribution to its parent slot k is h_in * 1000003 + label * 7
 * + k, where label is the node's place in its graph (ids differ from one
 * build to the next; labels do not), so that a change anywhere upstream
 * shows in every leaf below it.
 *
 * What steps, hooks and recompute callbacks find wrong on other threads
 * they count in their graph's bad counter, which the test's own thread
 * checks once the backward has returned. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

FIXTURE_SUITE(parallel, .timeout = 120);

static void open_balanced(void)
{
	adg_registry_options o = {.size = sizeof o,
				  .checkpointing = ADG_CHECKPOINT_BALANCED};
	fixture_open(&o);
}

/* Checkpointed graphs: a registry with the balanced strategy. */
TestSuite(parallel_ckpt, .init = open_balanced, .timeout = 120);
/* Tests that open a registry of their own. */
TestSuite(parallel_alloc, .timeout = 120);
/* The stress tier (tests/meson.build splits it off). */
TestSuite(parallel_stress, .init = open_balanced, .timeout = 600);

/* ------------------------------------------------------ hashed gradients */

/* struct hv, hv_new, hv_free, hv_add and hv_ops: tests/scalar.h. */

/* A value poison_ops' add fails on, whether it is the sum or the value. */
#define POISON UINT64_C(0xdeadbeefdeadbeef)

static int hv_add_poisoned(void **sum, void *value, void *ctx)
{
	if (((struct hv *)*sum)->h == POISON ||
	    ((struct hv *)value)->h == POISON) {
		hv_free(value, ctx);
		return ADG_EUSER - 5;
	}
	return hv_add(sum, value, ctx);
}

static const adg_grad_ops poison_ops = {hv_add_poisoned, hv_free, NULL};

/* ---------------------------------------------------------------- graphs */

/* c0's output in build_ckpt; r's is one more, which steps check. */
#define CKPT_C0_VALUE 10.0

/* A leaf that got no gradient, in a results array. */
#define NO_GRAD UINT64_MAX

enum nest_mode {
	NEST_OFF,
	NEST_SEQUENTIAL,    /* a nested backward without executor */
	NEST_OWN_POOL,	    /* ... on a pool the step starts */
	NEST_SAME_EXECUTOR, /* ... on the outer backward's executor */
};

/* What one node's step does besides the usual registrations. */
struct spec {
	int rc;	     /* fail with this code, registering nothing */
	bool nap;    /* sleep 2 ms first: run late, whatever the tape says */
	int nest;    /* enum nest_mode: run a backward of its own first */
	bool want;   /* read parent slot 0's output, add it to contributions */
	bool poison; /* contribute POISON, which poison_ops refuse to add */
	int hook_rc; /* the hook returns this for this node */
};

/* A graph of the test, each node known by its label: its index here, in
 * the order made. */
struct graph {
	int n, cap, root;
	adg_node **node;
	uint64_t *id;
	bool *leaf;
	struct spec *spec;
	atomic_int *runs, *releases, *fired;
	/* The hook's record: the gradient's hash when it fired (NO_GRAD for
	 * none), and that of the gradients it took. */
	uint64_t *fired_h, *taken;
	bool *take;	/* the hook takes this node's gradient */
	bool *saw_null; /* the step ran with no gradient */
	/* The shape, for the model of the tape (g_tape). */
	int **parents, *n_parents;
	/* Ticks of clock when each step started, and when a failing one
	 * returned. */
	atomic_int clock;
	int *start, *end;
	struct byid {
		uint64_t id;
		int label;
	} * by_id;
	/* Steps check that their node's hook fired first, with what they
	 * get. */
	bool check_fired;
	atomic_int seq;
	int root_seq;
	bool root_on_caller;
	pthread_t caller;
	/* What went wrong on another thread. */
	atomic_int bad;
	atomic_int recomputes;
	/* For nested steps: the outer executor, how deep to nest again, and
	 * the results a nested graph must give. */
	const adg_executor *outer;
	int nest_depth;
	const uint64_t *nest_want;
};

struct hstep {
	struct graph *g;
	int label;
};

static void g_init(struct graph *g, int cap)
{
	memset(g, 0, sizeof *g);
	g->cap = cap;
	g->root = -1;
	g->node = calloc(cap, sizeof *g->node);
	g->id = calloc(cap, sizeof *g->id);
	g->leaf = calloc(cap, sizeof *g->leaf);
	g->spec = calloc(cap, sizeof *g->spec);
	g->runs = calloc(cap, sizeof *g->runs);
	g->releases = calloc(cap, sizeof *g->releases);
	g->fired = calloc(cap, sizeof *g->fired);
	g->fired_h = calloc(cap, sizeof *g->fired_h);
	g->taken = calloc(cap, sizeof *g->taken);
	g->take = calloc(cap, sizeof *g->take);
	g->saw_null = calloc(cap, sizeof *g->saw_null);
	g->by_id = calloc(cap, sizeof *g->by_id);
	g->parents = calloc(cap, sizeof *g->parents);
	g->n_parents = calloc(cap, sizeof *g->n_parents);
	g->start = calloc(cap, sizeof *g->start);
	g->end = calloc(cap, sizeof *g->end);
	cr_assert(g->node && g->id && g->leaf && g->spec && g->runs &&
		  g->releases && g->fired && g->fired_h && g->taken &&
		  g->take && g->saw_null && g->by_id && g->parents &&
		  g->n_parents && g->start && g->end);
	for (int i = 0; i < cap; i++)
		g->taken[i] = NO_GRAD;
}

/* Drops the graph's nodes (steps not taken are released here) and frees
 * its arrays. */
static void g_free(struct graph *g)
{
	for (int i = 0; i < g->n; i++)
		cr_assert_eq(adg_node_unref(g->node[i]), 0);
	free(g->node);
	free(g->id);
	free(g->leaf);
	free(g->spec);
	free((void *)g->runs);
	free((void *)g->releases);
	free((void *)g->fired);
	free(g->fired_h);
	free(g->taken);
	free(g->take);
	free(g->saw_null);
	free(g->by_id);
	for (int i = 0; i < g->n; i++)
		free(g->parents[i]);
	free(g->parents);
	free(g->n_parents);
	free(g->start);
	free(g->end);
}

static int g_label(const struct graph *g, uint64_t id)
{
	int lo = 0, hi = g->n;
	while (lo < hi) {
		int mid = lo + (hi - lo) / 2;
		if (g->by_id[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < g->n && g->by_id[lo].id == id ? g->by_id[lo].label : -1;
}

static int g_add(struct graph *g, adg_node *node, bool leaf)
{
	int i = g->n++;
	g->node[i] = node;
	g->leaf[i] = leaf;
	cr_assert_eq(adg_node_id(node, &g->id[i]), 0);
	g->by_id[i] = (struct byid){g->id[i], i};
	/* kept sorted as it grows: ids mostly grow, so this is cheap */
	for (int k = i; k > 0 && g->by_id[k - 1].id > g->by_id[k].id; k--) {
		struct byid t = g->by_id[k];
		g->by_id[k] = g->by_id[k - 1];
		g->by_id[k - 1] = t;
	}
	return i;
}

static int g_leaf(struct graph *g)
{
	cr_assert_lt(g->n, g->cap);
	adg_node *x;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	return g_add(g, x, true);
}

static int h_step(adg_step_call *call, void *user);
static void h_release(void *user);

#define MAX_PARENTS 128

/* An op on the labelled parents, with options o (NULL: adg_op). */
static int g_op_with(struct graph *g, const int *parents, int n,
		     const adg_op_options *o)
{
	cr_assert_lt(g->n, g->cap);
	cr_assert(n >= 1 && n <= MAX_PARENTS);
	adg_node *p[MAX_PARENTS];
	for (int k = 0; k < n; k++)
		p[k] = g->node[parents[k]];
	struct hstep *s = malloc(sizeof *s);
	cr_assert_not_null(s);
	*s = (struct hstep){g, g->n};
	atomic_fetch_add(&scalar_steps_live, 1);
	adg_step st = {.backward = h_step, .release = h_release, .user = s};
	adg_node *y;
	int rc = o != NULL ? adg_op_with(reg, p, (size_t)n, &st, o, &y)
			   : adg_op(reg, p, (size_t)n, &st, &y);
	cr_assert_eq(rc, 0, "adg_op: %s", adg_strerror(rc));
	int i = g_add(g, y, false);
	g->parents[i] = malloc(n * sizeof *g->parents[i]);
	cr_assert_not_null(g->parents[i]);
	memcpy(g->parents[i], parents, n * sizeof *parents);
	g->n_parents[i] = n;
	return i;
}

static int g_op(struct graph *g, const int *parents, int n)
{
	return g_op_with(g, parents, n, NULL);
}

/* The model of the tape: fills pos[label] with the position of each step
 * reachable from the root (-1 for the others): the walk, breadth first
 * from the root through parent slots in order, counts each node's links
 * (the slots of reachable steps that name it); then from the root, each
 * node is placed once its last link is met, the placed waiting on a
 * stack, last in, first out, a node's parents pushed in slot order. */
static void g_tape(const struct graph *g, int *pos)
{
	int *links = calloc(g->n, sizeof *links);
	int *walk = malloc(g->n * sizeof *walk);
	cr_assert(links && walk);
	for (int i = 0; i < g->n; i++)
		pos[i] = -1;
	int n = 0;
	walk[n++] = g->root;
	pos[g->root] = 0; /* seen */
	for (int w = 0; w < n; w++) {
		int i = walk[w];
		for (int k = 0; k < g->n_parents[i]; k++) {
			int p = g->parents[i][k];
			if (g->leaf[p])
				continue;
			links[p]++;
			if (pos[p] < 0) {
				pos[p] = 0;
				walk[n++] = p;
			}
		}
	}
	/* The walk's array is the stack: each node is pushed once. */
	int top = 0, at = 0;
	walk[top++] = g->root;
	while (top > 0) {
		int i = walk[--top];
		pos[i] = at++;
		for (int k = 0; k < g->n_parents[i]; k++) {
			int p = g->parents[i][k];
			if (!g->leaf[p] && --links[p] == 0)
				walk[top++] = p;
		}
	}
	cr_assert_eq(at, n);
	free(links);
	free(walk);
}

static void nap(void)
{
	struct timespec ts = {0, 2 * 1000 * 1000};
	nanosleep(&ts, NULL);
}

static void nest_run(struct graph *g, int mode);

static int h_step(adg_step_call *call, void *user)
{
	struct hstep *s = user;
	struct graph *g = s->g;
	int i = s->label;
	const struct spec *sp = &g->spec[i];
	g->start[i] = atomic_fetch_add(&g->clock, 1);
	if (atomic_fetch_add(&g->runs[i], 1) != 0 || call->node_id != g->id[i])
		atomic_fetch_add(&g->bad, 1);
	if (g->check_fired) {
		/* the hook's writes come before its count (seq_cst) */
		if (atomic_load(&g->fired[i]) != 1)
			atomic_fetch_add(&g->bad, 1);
		else if ((call->grad ? ((struct hv *)call->grad)->h
				     : NO_GRAD) !=
			 (g->take[i] ? NO_GRAD : g->fired_h[i]))
			atomic_fetch_add(&g->bad, 1);
	}
	if (sp->nap)
		nap();
	if (sp->rc != 0) {
		g->end[i] = atomic_fetch_add(&g->clock, 1);
		return sp->rc;
	}
	if (sp->nest != NEST_OFF)
		nest_run(g, sp->nest);
	uint64_t extra = 0;
	if (sp->want) {
		void *out = NULL;
		int rc = adg_output_get(call, call->parent_ids[0], &out);
		if (rc != 0) {
			atomic_fetch_add(&g->bad, 1);
			return rc;
		}
		double r = *(double *)out;
		if (r != CKPT_C0_VALUE + 1)
			atomic_fetch_add(&g->bad, 1);
		extra = (uint64_t)r;
	}
	if (call->grad == NULL) {
		g->saw_null[i] = true;
		return 0;
	}
	uint64_t h = ((struct hv *)call->grad)->h;
	for (size_t k = 0; k < call->n_parents; k++) {
		uint64_t c =
			sp->poison ? POISON
				   : h * 1000003 + (uint64_t)i * 7 + k + extra;
		int rc = adg_step_give(call, k, hv_new(c));
		if (rc != 0) {
			atomic_fetch_add(&g->bad, 1);
			return rc;
		}
	}
	return 0;
}

static void h_release(void *user)
{
	struct hstep *s = user;
	atomic_fetch_add(&s->g->releases[s->label], 1);
	atomic_fetch_sub(&scalar_steps_live, 1);
	free(s);
}

/* The hook: records what it saw, takes what g->take names. */
static int h_ready(uint64_t id, void **grad, void *ctx)
{
	struct graph *g = ctx;
	int i = g_label(g, id);
	if (i < 0) {
		atomic_fetch_add(&g->bad, 1);
		return 0;
	}
	int seq = atomic_fetch_add(&g->seq, 1);
	if (i == g->root) {
		g->root_seq = seq;
		g->root_on_caller = pthread_equal(pthread_self(), g->caller);
	}
	struct hv *v = *grad;
	g->fired_h[i] = v != NULL ? v->h : NO_GRAD;
	if (g->take[i] && v != NULL) {
		g->taken[i] = v->h;
		hv_free(v, NULL);
		*grad = NULL;
	}
	atomic_fetch_add(&g->fired[i], 1);
	return g->spec[i].hook_rc;
}

/* How a backward runs: ex NULL is the sequential backward. */
struct how {
	const adg_executor *ex;
	bool hook;
	bool leaves_only;
	const adg_grad_ops *ops; /* NULL: hv_ops */
};

static int g_backward(struct graph *g, struct how how, adg_grads **out)
{
	adg_backward_options o = {
		.size = sizeof o,
		.on_ready = how.hook ? h_ready : NULL,
		.on_ready_ctx = g,
		.leaves_only = how.leaves_only,
		.executor = how.ex,
	};
	g->caller = pthread_self();
	g->check_fired = how.hook && !how.leaves_only;
	return adg_backward_with(reg, g->node[g->root], hv_new(1),
				 how.ops != NULL ? how.ops : &hv_ops, &o, out);
}

/* Fills res[label] with each leaf's gradient (the container's, or what the
 * hook took), NO_GRAD for none, 0 for the other nodes. */
static void g_results(struct graph *g, const adg_grads *grads, uint64_t *res)
{
	for (int i = 0; i < g->n; i++) {
		res[i] = 0;
		if (!g->leaf[i])
			continue;
		void *v;
		if (adg_grads_get(grads, g->id[i], &v) == 0) {
			res[i] = ((struct hv *)v)->h;
			if (g->taken[i] != NO_GRAD)
				atomic_fetch_add(&g->bad, 1); /* taken, held */
		} else {
			res[i] = g->taken[i];
		}
	}
}

/* ---------------------------------------------------------------- shapes */

enum shape_kind { WIDE, DIAMOND, CKPT };

/* WIDE: a shared leaf s and a leaf per branch; branch b is a chain of len
 * ops, the first on {l_b, s}, the others on {previous, l_b}, and every
 * 8th of them on s too; the root names every branch's last op.
 * DIAMOND: 6 leaves, then layers of width nodes, each on the node of the
 * previous layer below it and 1 or 2 more of that layer (repeats kept),
 * a fifth of them squares (x * x), a quarter also on a leaf; the root
 * names the last layer.
 * CKPT: see build_ckpt. */
struct shape {
	int kind;
	int a, b; /* WIDE: branches, len; DIAMOND: width, layers; CKPT:
		     branches, len */
};

static const struct shape wide_64x50 = {WIDE, 64, 50};
static const struct shape diamond_12x25 = {DIAMOND, 12, 25};

static int wide_op_label(int branches, int len, int b, int j)
{
	return 1 + branches + b * len + j;
}

static void build_wide(struct graph *g, int branches, int len)
{
	cr_assert_leq(branches, MAX_PARENTS);
	g_init(g, 2 + branches + branches * len);
	int s = g_leaf(g);
	for (int b = 0; b < branches; b++)
		g_leaf(g);
	int tops[MAX_PARENTS];
	for (int b = 0; b < branches; b++) {
		int lb = 1 + b;
		int prev = g_op(g, (int[]){lb, s}, 2);
		for (int j = 1; j < len; j++) {
			int p[3] = {prev, lb, s};
			prev = g_op(g, p, j % 8 == 0 ? 3 : 2);
		}
		cr_assert_eq(prev, wide_op_label(branches, len, b, len - 1));
		tops[b] = prev;
	}
	g->root = g_op(g, tops, branches);
}

static void build_diamond(struct graph *g, int width, int layers)
{
	enum { LEAVES = 6 };
	cr_assert_leq(width, MAX_PARENTS);
	g_init(g, LEAVES + width * layers + 1);
	uint32_t rnd = 12345;
#define NEXT() (rnd = rnd * 1103515245u + 12345u, (rnd >> 16) & 0x7fff)
	int prev[MAX_PARENTS], cur[MAX_PARENTS], n_prev = LEAVES;
	for (int i = 0; i < LEAVES; i++)
		prev[i] = g_leaf(g);
	for (int l = 0; l < layers; l++) {
		for (int i = 0; i < width; i++) {
			int p[4], n = 0;
			p[n++] = prev[i % n_prev];
			if (NEXT() % 5 == 0) {
				p[n++] = p[0];
			} else {
				int more = 1 + (int)(NEXT() % 2);
				for (int k = 0; k < more; k++)
					p[n++] = prev[NEXT() % n_prev];
				if (NEXT() % 4 == 0)
					p[n++] = (int)(NEXT() % LEAVES);
			}
			cur[i] = g_op(g, p, n);
		}
		memcpy(prev, cur, sizeof cur);
		n_prev = width;
	}
#undef NEXT
	g->root = g_op(g, prev, n_prev);
}

/* Recomputes r's output: c0's plus 1. */
static int g_recompute(adg_recompute_call *call, void *user)
{
	struct hstep *s = user;
	atomic_fetch_add(&s->g->recomputes, 1);
	if (call->n_parents != 1 || call->parent_outputs[0] == NULL) {
		atomic_fetch_add(&s->g->bad, 1);
		return ADG_EUSER - 9;
	}
	call->output = s_output_new(*(double *)call->parent_outputs[0] + 1);
	return 0;
}

/* Leaves a and w_0..w_{branches-1}; c0 = op(a) keeps its output (10);
 * r = op(c0) offers 11, memory-bound, recomputed from c0's; branch j
 * starts with y_j = op(r, w_j), whose step reads r's output, then a chain
 * of len ops on {previous, w_j}; the root names every branch's last op.
 * Under the balanced strategy r's output is dropped at once and rebuilt
 * when the first y_j asks. */
static int ckpt_r_label(int branches)
{
	return 2 + branches;
}

static void build_ckpt(struct graph *g, int branches, int len)
{
	cr_assert_leq(branches, MAX_PARENTS);
	g_init(g, 4 + branches * (len + 2));
	int a = g_leaf(g);
	for (int j = 0; j < branches; j++)
		g_leaf(g);
	adg_output oc = {s_output_new(CKPT_C0_VALUE), s_output_free, NULL, 0,
			 NULL};
	adg_op_options keep = {.size = sizeof keep, .output = &oc};
	int c0 = g_op_with(g, &a, 1, &keep);
	adg_output orr = {s_output_new(CKPT_C0_VALUE + 1), s_output_free,
			  g_recompute, 1, NULL};
	adg_op_options rebuilt = {.size = sizeof rebuilt, .output = &orr};
	int r = g_op_with(g, &c0, 1, &rebuilt);
	cr_assert_eq(r, ckpt_r_label(branches));
	static const uint32_t slot0 = 0;
	adg_op_options want_r = {.size = sizeof want_r,
				 .want_parents = &slot0,
				 .n_want_parents = 1};
	int tops[MAX_PARENTS];
	for (int j = 0; j < branches; j++) {
		int wj = 1 + j;
		int prev = g_op_with(g, (int[]){r, wj}, 2, &want_r);
		g->spec[prev].want = true;
		for (int k = 0; k < len; k++)
			prev = g_op(g, (int[]){prev, wj}, 2);
		tops[j] = prev;
	}
	g->root = g_op(g, tops, branches);
}

static void build(struct graph *g, const struct shape *sh)
{
	switch (sh->kind) {
	case WIDE:
		build_wide(g, sh->a, sh->b);
		break;
	case DIAMOND:
		build_diamond(g, sh->a, sh->b);
		break;
	default:
		build_ckpt(g, sh->a, sh->b);
		break;
	}
}

static int shape_nodes(const struct shape *sh)
{
	switch (sh->kind) {
	case WIDE:
		return 2 + sh->a + sh->a * sh->b;
	case DIAMOND:
		return 6 + sh->a * sh->b + 1;
	default:
		return 4 + sh->a * (sh->b + 2);
	}
}

/* Checks on the test's thread, after a successful backward: every step
 * ran and was released exactly once, and nothing went wrong elsewhere. */
static void g_check_ran(struct graph *g, const char *what)
{
	for (int i = 0; i < g->n; i++) {
		if (g->leaf[i])
			continue;
		cr_assert_eq(atomic_load(&g->runs[i]), 1,
			     "%s: step %d ran %d times", what, i,
			     atomic_load(&g->runs[i]));
		cr_assert_eq(atomic_load(&g->releases[i]), 1,
			     "%s: step %d released %d times", what, i,
			     atomic_load(&g->releases[i]));
	}
	cr_assert_eq(atomic_load(&g->bad), 0, "%s: %d wrong on other threads",
		     what, atomic_load(&g->bad));
}

/* Builds sh afresh, runs its backward as how says, and fills res (one
 * entry per node) with the leaves' gradients. */
static void run_shape(const struct shape *sh, struct how how, uint64_t *res,
		      const char *what)
{
	struct graph g;
	build(&g, sh);
	adg_grads *out = (adg_grads *)&out;
	int rc = g_backward(&g, how, &out);
	cr_assert_eq(rc, 0, "%s: %s", what, adg_error_name(rc));
	cr_assert_not_null(out);
	g_results(&g, out, res);
	g_check_ran(&g, what);
	cr_assert_eq(adg_grads_free(out), 0);
	g_free(&g);
	cr_assert_eq(atomic_load(&scalar_values_live), 0, "%s: gradients left",
		     what);
	cr_assert_eq(atomic_load(&scalar_steps_live), 0, "%s: steps left",
		     what);
}

/* W workers: a pool of W - 1 threads (W = 1: a pool's executor offering
 * none of its threads). */
struct workers {
	adg_pool *pool;
	adg_executor ex;
};

static void workers_open(struct workers *w, int n)
{
	w->pool = NULL;
	cr_assert_eq(adg_pool_new(n > 1 ? (unsigned)n - 1 : 1, &w->pool), 0);
	cr_assert_not_null(w->pool);
	cr_assert_eq(adg_pool_executor(w->pool, &w->ex), 0);
	cr_assert_not_null(w->ex.submit);
	if (n == 1)
		w->ex.n_workers = 0;
	else
		cr_assert_eq(w->ex.n_workers, (unsigned)n - 1);
}

static void workers_close(struct workers *w)
{
	cr_assert_eq(adg_pool_free(w->pool), 0);
}

static void expect_same(const uint64_t *got, const uint64_t *want, int n,
			const char *what)
{
	for (int i = 0; i < n; i++)
		cr_assert_eq(got[i], want[i], "%s: node %d got %llx, want %llx",
			     what, i, (unsigned long long)got[i],
			     (unsigned long long)want[i]);
}

static const int worker_counts[] = {1, 2, 4, 8};
#define N_WORKER_COUNTS 4

/* ----------------------------------------------------------- determinism */

/* The sequential backward's results, then those of 1, 2, 4 and 8 workers,
 * bitwise, each on a fresh build of the same shape. */
static void same_for_every_worker_count(const struct shape *sh, int rounds)
{
	int n = shape_nodes(sh);
	uint64_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	cr_assert(want && got);
	run_shape(sh, (struct how){0}, want, "sequential");
	int leaves_with_grad = 0;
	for (int i = 0; i < n; i++)
		leaves_with_grad += want[i] != 0 && want[i] != NO_GRAD;
	cr_assert_gt(leaves_with_grad, 1);
	for (int c = 0; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		workers_open(&w, worker_counts[c]);
		for (int r = 0; r < rounds; r++) {
			char what[64];
			snprintf(what, sizeof what, "%d workers, round %d",
				 worker_counts[c], r);
			run_shape(sh, (struct how){.ex = &w.ex}, got, what);
			expect_same(got, want, n, what);
		}
		workers_close(&w);
	}
	free(want);
	free(got);
}

CHECKED_TEST(parallel, wide_graph_is_bitwise_the_same_for_1_2_4_8_workers)
{
	same_for_every_worker_count(&wide_64x50, 2);
}

/* Shared parents, repeated parents (x * x) and leaves named from every
 * depth. */
CHECKED_TEST(parallel, diamonds_are_bitwise_the_same_for_1_2_4_8_workers)
{
	same_for_every_worker_count(&diamond_12x25, 4);
}

/* The fold order is not a detail the tests above could miss: the same
 * contributions folded in another order give other results. */
CHECKED_TEST(parallel, the_hash_add_sees_the_fold_order)
{
	struct hv *a = hv_new(5), *b = hv_new(7), *c = hv_new(11);
	struct hv *x = hv_new(5), *y = hv_new(7), *z = hv_new(11);
	void *s1 = a, *s2 = x, *s4 = y;
	hv_add(&s1, b, NULL);
	hv_add(&s1, c, NULL); /* (a b) c */
	hv_add(&s4, z, NULL);
	hv_add(&s2, s4, NULL); /* a (b c) */
	cr_expect_neq(((struct hv *)s1)->h, ((struct hv *)s2)->h);
	struct hv *p = hv_new(5), *q = hv_new(7);
	void *s3 = q;
	hv_add(&s3, p, NULL); /* b a */
	cr_expect_neq(((struct hv *)s3)->h, 5 * 31 + 7);
	hv_free(s1, NULL);
	hv_free(s2, NULL);
	hv_free(s3, NULL);
}

/* --------------------------------------------------------------- on_ready */

/* Runs sh with the hook, as how says, taking the gradients of every third
 * leaf and, unless leaves_only, of one inner node (whose step then gets
 * none); checks the hook's counts and fills res. */
static void hooked_run(const struct shape *sh, struct how how, int take_inner,
		       uint64_t *res, const char *what)
{
	struct graph g;
	build(&g, sh);
	for (int i = 0; i < g.n; i++)
		g.take[i] = g.leaf[i] && i % 3 == 0;
	if (!how.leaves_only)
		g.take[take_inner] = true;
	adg_grads *out;
	int rc = g_backward(&g, how, &out);
	cr_assert_eq(rc, 0, "%s: %s", what, adg_error_name(rc));
	g_results(&g, out, res);
	g_check_ran(&g, what);
	int fired = 0;
	for (int i = 0; i < g.n; i++) {
		int want = g.leaf[i] || !how.leaves_only;
		cr_assert_eq(atomic_load(&g.fired[i]), want,
			     "%s: hook for node %d called %d times", what, i,
			     atomic_load(&g.fired[i]));
		fired += want;
		if (g.leaf[i] && !g.take[i])
			cr_assert_eq(g.fired_h[i], res[i],
				     "%s: leaf %d's hook saw another value",
				     what, i);
	}
	if (!how.leaves_only)
		cr_assert(g.saw_null[take_inner], "%s: the hook took it", what);
	cr_assert_eq(atomic_load(&g.seq), fired);
	if (!how.leaves_only) {
		cr_assert_eq(g.root_seq, 0, "%s: the root's hook comes first",
			     what);
		cr_assert(g.root_on_caller,
			  "%s: the root's hook runs on the calling thread",
			  what);
	}
	cr_assert_eq(adg_grads_free(out), 0);
	g_free(&g);
	cr_assert_eq(atomic_load(&scalar_values_live), 0);
}

static void hooks_for_every_worker_count(const struct shape *sh, int take_inner,
					 bool leaves_only)
{
	int n = shape_nodes(sh);
	uint64_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	cr_assert(want && got);
	hooked_run(sh, (struct how){.hook = true, .leaves_only = leaves_only},
		   take_inner, want, "sequential");
	for (int c = 0; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		workers_open(&w, worker_counts[c]);
		char what[64];
		snprintf(what, sizeof what, "%d workers", worker_counts[c]);
		hooked_run(sh,
			   (struct how){.ex = &w.ex,
					.hook = true,
					.leaves_only = leaves_only},
			   take_inner, got, what);
		expect_same(got, want, n, what);
		workers_close(&w);
	}
	free(want);
	free(got);
}

/* Every node's hook once, before its step, with the gradient the step
 * gets; the root's first, on the calling thread; a hook that takes an
 * inner node's gradient leaves its step none. */
CHECKED_TEST(parallel, on_ready_fires_once_per_node_root_first_on_the_caller)
{
	const struct shape wide = {WIDE, 16, 12};
	hooks_for_every_worker_count(&wide, wide_op_label(16, 12, 5, 6), false);
	hooks_for_every_worker_count(&diamond_12x25, 6 + 12 * 10 + 3, false);
}

CHECKED_TEST(parallel, on_ready_leaves_only_fires_once_per_leaf)
{
	const struct shape wide = {WIDE, 16, 12};
	hooks_for_every_worker_count(&wide, 0, true);
	hooks_for_every_worker_count(&diamond_12x25, 0, true);
}

/* ---------------------------------------------------------- checkpointing */

/* r's output, dropped at once, is asked for by the first step of each of 8
 * branches that run at once: it is rebuilt exactly once, and every output
 * is freed by the time the backward returns. */
CHECKED_TEST(parallel_ckpt, shared_output_is_recomputed_once_with_workers)
{
	const struct shape sh = {CKPT, 8, 6};
	int n = shape_nodes(&sh);
	uint64_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	cr_assert(want && got);
	for (int c = -1; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		struct how how = {0};
		if (c >= 0) {
			workers_open(&w, worker_counts[c]);
			how.ex = &w.ex;
		}
		for (int round = 0; round < 4; round++) {
			struct graph g;
			build(&g, &sh);
			cr_assert_eq(atomic_load(&scalar_outputs_live), 1,
				     "c0's kept, r's dropped");
			adg_grads *out;
			int rc = g_backward(&g, how, &out);
			cr_assert_eq(rc, 0, "%s", adg_error_name(rc));
			cr_expect_eq(atomic_load(&g.recomputes), 1,
				     "workers %d: r rebuilt %d times",
				     c < 0 ? 0 : worker_counts[c],
				     atomic_load(&g.recomputes));
			cr_expect_eq(atomic_load(&scalar_outputs_live), 0,
				     "outputs left after the backward");
			g_results(&g, out, c < 0 && round == 0 ? want : got);
			g_check_ran(&g, "checkpointed");
			adg_grads_free(out);
			g_free(&g);
			if (c >= 0 || round > 0)
				expect_same(got, want, n, "checkpointed");
		}
		if (c >= 0)
			workers_close(&w);
	}
	cr_assert_neq(want[1], NO_GRAD, "w_0 got its gradient");
	free(want);
	free(got);
}

/* --------------------------------------------------------------- nesting */

static const struct shape nested_shape = {WIDE, 4, 4};

/* A step's own backward, on a graph it builds, as mode says; its results
 * must be those of the same shape run sequentially. */
static void nest_run(struct graph *g, int mode)
{
	struct graph *ng = malloc(sizeof *ng);
	cr_assert_not_null(ng);
	build(ng, &nested_shape);
	ng->outer = g->outer;
	ng->nest_want = g->nest_want;
	ng->nest_depth = g->nest_depth - 1;
	if (ng->nest_depth > 0)
		ng->spec[wide_op_label(4, 4, 1, 2)].nest = mode;
	adg_pool *pool = NULL;
	adg_executor own;
	struct how how = {0};
	if (mode == NEST_OWN_POOL) {
		if (adg_pool_new(2, &pool) != 0 ||
		    adg_pool_executor(pool, &own) != 0)
			atomic_fetch_add(&g->bad, 1);
		else
			how.ex = &own;
	} else if (mode == NEST_SAME_EXECUTOR) {
		how.ex = g->outer;
	}
	adg_grads *out = NULL;
	if (g_backward(ng, how, &out) != 0) {
		atomic_fetch_add(&g->bad, 1);
	} else {
		uint64_t *res = calloc(ng->n, sizeof *res);
		cr_assert_not_null(res);
		g_results(ng, out, res);
		if (memcmp(res, g->nest_want, ng->n * sizeof *res) != 0)
			atomic_fetch_add(&g->bad, 1);
		for (int i = 0; i < ng->n; i++)
			if (!ng->leaf[i] &&
			    (atomic_load(&ng->runs[i]) != 1 ||
			     atomic_load(&ng->releases[i]) != 1))
				atomic_fetch_add(&g->bad, 1);
		free(res);
	}
	atomic_fetch_add(&g->bad, atomic_load(&ng->bad));
	adg_grads_free(out);
	g_free(ng);
	free(ng);
	if (pool != NULL && adg_pool_free(pool) != 0)
		atomic_fetch_add(&g->bad, 1);
}

/* Steps in six branches run backwards of their own: without an executor,
 * on a pool of their own, and on the outer backward's pool (whose threads
 * may all be busy running the steps that wait), twice nested. */
static void nested_on_a_pool_of(unsigned threads)
{
	const struct shape outer = {WIDE, 6, 6};
	int n = shape_nodes(&outer), nn = shape_nodes(&nested_shape);
	uint64_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	uint64_t *nest_want = calloc(nn, sizeof *nest_want);
	cr_assert(want && got && nest_want);
	run_shape(&outer, (struct how){0}, want, "sequential");
	run_shape(&nested_shape, (struct how){0}, nest_want, "nested shape");
	adg_pool *pool;
	adg_executor ex;
	cr_assert_eq(adg_pool_new(threads, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	for (int round = 0; round < 3; round++) {
		struct graph g;
		build(&g, &outer);
		g.outer = &ex;
		g.nest_want = nest_want;
		g.nest_depth = 2;
		static const int modes[3] = {NEST_SEQUENTIAL, NEST_OWN_POOL,
					     NEST_SAME_EXECUTOR};
		for (int b = 0; b < 6; b++)
			g.spec[wide_op_label(6, 6, b, 3)].nest = modes[b % 3];
		adg_grads *out;
		int rc = g_backward(&g, (struct how){.ex = &ex}, &out);
		cr_assert_eq(rc, 0, "%s", adg_error_name(rc));
		g_results(&g, out, got);
		g_check_ran(&g, "nested");
		adg_grads_free(out);
		g_free(&g);
		expect_same(got, want, n, "outer, with nested backwards");
	}
	cr_assert_eq(adg_pool_free(pool), 0);
	free(want);
	free(got);
	free(nest_want);
}

CHECKED_TEST(parallel, nested_backwards_in_steps_on_a_pool_of_1)
{
	nested_on_a_pool_of(1);
}

CHECKED_TEST(parallel, nested_backwards_in_steps_on_a_pool_of_3)
{
	nested_on_a_pool_of(3);
}

/* ------------------------------------------------------------- failures */

/* Leaves a, b; chain A of la ops from a, chain B of lb ops from b; the
 * root names their tops, A's first unless b_first. A_k (depth k) is label
 * 1 + k, B_k is 1 + la + k. */
struct two_chains {
	int la, lb;
	bool b_first;
	int fail_a, rc_a; /* A_{fail_a} fails with rc_a */
	int fail_b, rc_b;
	int want; /* the code of the one first on the tape */
	bool a_first_on_tape;
};

static void build_two_chains(struct graph *g, const struct two_chains *c)
{
	g_init(g, 3 + c->la + c->lb);
	int a = g_leaf(g), b = g_leaf(g);
	int ta = a, tb = b;
	for (int k = 1; k <= c->la; k++)
		ta = g_op(g, (int[]){ta, a}, 2);
	for (int k = 1; k <= c->lb; k++)
		tb = g_op(g, (int[]){tb, b}, 2);
	g->root = g_op(g, c->b_first ? (int[]){tb, ta} : (int[]){ta, tb}, 2);
	int fa = 1 + c->fail_a, fb = 1 + c->la + c->fail_b;
	g->spec[fa].rc = c->rc_a;
	g->spec[fb].rc = c->rc_b;
	/* The one first on the tape fails late, if timing decided. */
	g->spec[c->a_first_on_tape ? fa : fb].nap = true;
}

/* The failing step first on the tape, by the model. */
static int first_failing(const struct graph *g, const int *pos)
{
	int first = -1;
	for (int i = 0; i < g->n; i++)
		if (g->spec[i].rc != 0 && pos[i] >= 0 &&
		    (first < 0 || pos[i] < pos[first]))
			first = i;
	return first;
}

/* How the failing backwards run: sequentially (workers 0); with 1 to 8
 * workers, a pool's; or ONE_THREAD, an executor that takes no work, so
 * that the calling thread runs every step, in whatever order the
 * scheduler picks. */
#define ONE_THREAD (-1)

/* Every step before the first failing one on the tape ran (its children
 * all did, and none failed). With workers, steps after it may have run
 * before its failure was seen; sequentially, and on the calling thread
 * alone with n_workers 0 (in tape order), none did; on the calling thread
 * alone with workers that never come, none started once it had
 * returned. */
static void tape_order_checks(struct graph *g, const struct two_chains *c,
			      int workers, const char *what)
{
	int *pos = malloc(g->n * sizeof *pos);
	cr_assert_not_null(pos);
	g_tape(g, pos);
	int first = first_failing(g, pos);
	cr_assert_eq(first,
		     c->a_first_on_tape ? 1 + c->fail_a : 1 + c->la + c->fail_b,
		     "%s: the test's model of the tape", what);
	cr_assert_eq(atomic_load(&g->runs[first]), 1);
	for (int i = 0; i < g->n; i++) {
		if (g->leaf[i])
			continue;
		int ran = atomic_load(&g->runs[i]);
		if (pos[i] < pos[first])
			cr_assert_eq(ran, 1,
				     "%s, %d workers: step %d, before "
				     "the failure, ran %d times",
				     what, workers, i, ran);
		if (pos[i] <= pos[first] || !ran)
			continue;
		if (workers == ONE_THREAD)
			cr_assert_lt(g->start[i], g->end[first],
				     "%s, one thread: step %d started after "
				     "the failure",
				     what, i);
		else
			cr_assert_gt(workers, 1,
				     "%s, %d workers: step %d ran after the "
				     "failure",
				     what, workers, i);
	}
	free(pos);
}

static int never_submit(void (*fn)(void *), void *arg, void *ctx);

static void run_two_chains(const struct two_chains *c, const char *what)
{
	atomic_int submits = 0;
	const adg_executor none_come = {never_submit, &submits, 4};
	for (int cw = -2; cw < N_WORKER_COUNTS; cw++) {
		struct workers w;
		struct how how = {0};
		int workers = cw == -2 ? ONE_THREAD : 0;
		if (cw == -2) {
			how.ex = &none_come;
		} else if (cw >= 0) {
			workers_open(&w, worker_counts[cw]);
			how.ex = &w.ex;
			workers = worker_counts[cw];
		}
		for (int round = 0; round < (cw < 0 ? 1 : 5); round++) {
			struct graph g;
			build_two_chains(&g, c);
			adg_grads *out = (adg_grads *)&out;
			int rc = g_backward(&g, how, &out);
			cr_assert_eq(rc, c->want, "%s, %d workers: %s, want %s",
				     what, workers, adg_error_name(rc),
				     adg_error_name(c->want));
			cr_assert_null(out);
			cr_assert_eq(atomic_load(&scalar_values_live), 0,
				     "%s: gradients left", what);
			cr_assert_eq(atomic_load(&scalar_steps_live), 0,
				     "%s: steps not released", what);
			for (int i = 0; i < g.n; i++) {
				if (g.leaf[i])
					continue;
				cr_assert_eq(atomic_load(&g.releases[i]), 1,
					     "%s: step %d released %d times",
					     what, i,
					     atomic_load(&g.releases[i]));
				cr_assert_leq(atomic_load(&g.runs[i]), 1);
			}
			tape_order_checks(&g, c, workers, what);
			cr_assert_eq(atomic_load(&g.bad), 0);
			g_free(&g);
		}
		if (cw >= 0)
			workers_close(&w);
	}
}

/* Two steps in different branches fail; the result is the code of the one
 * earlier on the tape (each node after its children; of two branches, the
 * last parent slot's first, whole), whichever failed first in time, for
 * any number of workers. */
CHECKED_TEST(parallel, failing_steps_give_the_code_first_in_tape_order)
{
	const int E1 = ADG_EUSER - 1, E2 = ADG_EUSER - 2;
	/* B in the root's last slot: all of B runs before A's top, so B_10
	 * comes first, though A_100 is deeper. */
	struct two_chains b_last = {300, 10, false, 100, E1, 10, E2, E2, false};
	run_two_chains(&b_last, "B in the last slot");
	struct two_chains swap = {300, 10, false, 100, E2, 10, E1, E1, false};
	run_two_chains(&swap, "B in the last slot, codes swapped");
	/* A in the last slot: A_100 comes first, though B_10 is the top of
	 * B, ready from the start. */
	struct two_chains a_last = {300, 10, true, 100, E1, 10, E2, E1, true};
	run_two_chains(&a_last, "A in the last slot");
	/* Chains of one length: the slot decides alone. */
	struct two_chains even = {30, 30, false, 15, E1, 15, E2, E2, false};
	run_two_chains(&even, "same length, B in the last slot");
	even.b_first = true;
	even.want = E1;
	even.a_first_on_tape = true;
	run_two_chains(&even, "same length, A in the last slot");
}

/* A positive code from a step is ADG_ECALLBACK, with workers too. */
CHECKED_TEST(parallel, positive_step_result_is_ecallback)
{
	struct two_chains c = {
		20, 20, true, 5, 7, 3, ADG_EUSER - 1, ADG_ECALLBACK, true};
	run_two_chains(&c, "positive code");
}

/* A failing hook, or a failing add in a fold, stops the backward as a
 * failing step does: its code, every step released once, nothing left. */
CHECKED_TEST(parallel, failing_hook_or_add_stops_the_backward)
{
	enum { B = 16, L = 10 };
	const int inner = wide_op_label(B, L, 3, 5);
	const int leaf = 1 + 9;
	for (int c = 0; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		workers_open(&w, worker_counts[c]);
		for (int v = 0; v < 3; v++) {
			struct graph g;
			build_wide(&g, B, L);
			struct how how = {.ex = &w.ex};
			int want;
			if (v == 0) { /* the hook, on an inner node */
				how.hook = true;
				g.spec[inner].hook_rc = want = ADG_EUSER - 3;
			} else if (v == 1) { /* the hook, on a leaf */
				how.hook = how.leaves_only = true;
				g.spec[leaf].hook_rc = want = ADG_EUSER - 4;
			} else { /* the add, folding l_3's gradient */
				how.ops = &poison_ops;
				g.spec[inner].poison = true;
				want = ADG_EUSER - 5;
			}
			adg_grads *out = (adg_grads *)&out;
			int rc = g_backward(&g, how, &out);
			cr_assert_eq(rc, want, "%d workers, case %d: %s",
				     worker_counts[c], v, adg_error_name(rc));
			cr_assert_null(out);
			for (int i = 0; i < g.n; i++)
				cr_assert_eq(atomic_load(&g.releases[i]),
					     !g.leaf[i], "case %d, step %d", v,
					     i);
			cr_assert_eq(atomic_load(&scalar_values_live), 0,
				     "case %d: gradients left", v);
			cr_assert_eq(atomic_load(&g.bad), 0);
			if (v == 0)
				cr_assert_eq(atomic_load(&g.runs[inner]), 0,
					     "its step never runs");
			g_free(&g);
		}
		workers_close(&w);
	}
}

/* -------------------------------------------------------- EUNAVAILABLE */

/* y2's tape needs x, whose step y1's backward consumed: nothing is taken,
 * the seed is freed, the hook never runs, and y2 stays as it was. */
CHECKED_TEST(parallel, consumed_step_gives_eunavailable_with_an_executor)
{
	struct workers w;
	workers_open(&w, 4);
	struct graph g;
	g_init(&g, 8);
	int a = g_leaf(&g), c = g_leaf(&g), d = g_leaf(&g);
	int x = g_op(&g, (int[]){a, a}, 2);
	int y1 = g_op(&g, (int[]){x, c}, 2);
	int x2 = g_op(&g, (int[]){x, d}, 2);
	int y2 = g_op(&g, (int[]){x2, d}, 2);
	g.root = y1;
	adg_grads *out;
	cr_assert_eq(g_backward(&g, (struct how){.ex = &w.ex}, &out), 0);
	adg_grads_free(out);
	assert_stats(reg, 7, 2, 1);
	g.root = y2;
	for (int round = 0; round < 2; round++) {
		out = (adg_grads *)&out;
		cr_expect_eq(g_backward(&g,
					(struct how){.ex = &w.ex, .hook = true},
					&out),
			     ADG_EUNAVAILABLE);
		cr_expect_null(out);
		cr_expect_eq(atomic_load(&scalar_values_live), 0,
			     "the seed was freed");
		cr_expect_eq(atomic_load(&g.seq), 0, "no hook");
		cr_expect_eq(atomic_load(&g.runs[x2]), 0);
		cr_expect_eq(atomic_load(&g.runs[y2]), 0);
		assert_stats(reg, 7, 2, 1);
	}
	uint64_t graph_id;
	cr_assert_eq(adg_node_graph_id(g.node[y2], &graph_id), 0);
	cr_expect_neq(graph_id, 0, "y2's step is still registered");
	cr_expect_eq(atomic_load(&g.bad), 0);
	g_free(&g);
	workers_close(&w);
}

/* ---------------------------------------------------- a step's output */

/* What became of a step's second gift for one slot. */
struct second_seen {
	int rc;
	atomic_int freed;
};

/* Gives const values: first (and then second, if non-zero) for slot 0,
 * then 1 for every other slot. */
struct const_step {
	uint64_t first, second;
	/* non-NULL: the second gift's result goes here, not to the
	 * backward */
	struct second_seen *seen;
};

static int const_backward(adg_step_call *call, void *user)
{
	struct const_step *s = user;
	int rc = adg_step_give(call, 0, hv_new(s->first));
	if (rc == 0 && s->second != 0) {
		struct hv *v = hv_new(s->second);
		if (s->seen != NULL)
			v->freed = &s->seen->freed;
		rc = adg_step_give(call, 0, v);
		if (s->seen != NULL) {
			s->seen->rc = rc;
			rc = 0;
		}
	}
	for (size_t k = 1; rc == 0 && k < call->n_parents; k++)
		rc = adg_step_give(call, k, hv_new(1));
	return rc;
}

static void const_release(void *user)
{
	free(user);
	atomic_fetch_sub(&scalar_steps_live, 1);
}

static adg_node *const_op(adg_node **parents, size_t n, uint64_t first,
			  uint64_t second, struct second_seen *seen)
{
	struct const_step *s = malloc(sizeof *s);
	cr_assert_not_null(s);
	*s = (struct const_step){first, second, seen};
	atomic_fetch_add(&scalar_steps_live, 1);
	adg_step st = {.backward = const_backward,
		       .release = const_release,
		       .user = s};
	adg_node *y;
	cr_assert_eq(adg_op(reg, parents, n, &st, &y), 0);
	return y;
}

static uint64_t id_of(adg_node *n)
{
	uint64_t id;
	cr_assert_eq(adg_node_id(n, &id), 0);
	return id;
}

/* root = op(first, second) on X and Y, both children of the leaf p:
 * X = op(p) gives 2 then 3 for p (twice for one slot; what became of
 * the 3 goes to *seen), Y = op(p) gives 5. Returns p's gradient. */
static uint64_t twice_for_one_slot(const adg_executor *ex, bool x_first,
				   struct second_seen *seen)
{
	adg_node *p;
	cr_assert_eq(adg_leaf(reg, &p), 0);
	adg_node *x = const_op(&p, 1, 2, 3, seen);
	adg_node *y = const_op(&p, 1, 5, 0, NULL);
	/* The root's last slot's branch comes first on the tape. */
	adg_node *top[2] = {x_first ? y : x, x_first ? x : y};
	adg_node *root = const_op(top, 2, 1, 0, NULL);
	adg_backward_options o = {.size = sizeof o, .executor = ex};
	adg_grads *out;
	cr_assert_eq(adg_backward_with(reg, root, hv_new(1), &hv_ops, &o, &out),
		     0);
	void *v;
	cr_assert_eq(adg_grads_get(out, id_of(p), &v), 0);
	uint64_t h = ((struct hv *)v)->h;
	adg_grads_free(out);
	adg_node *all[] = {p, x, y, root};
	for (int i = 0; i < 4; i++)
		cr_assert_eq(adg_node_unref(all[i]), 0);
	return h;
}

/* Twice for one slot: a step's output takes one gift per slot, so the
 * second is ADG_EINVAL, its value freed, and the first alone takes the
 * step's place in the fold, without an executor (c = -1) as with any
 * number of workers. (Registering by id on the sequential backward's
 * container added the second as it came: tests/test_give.c keeps that
 * deprecated path covered.) */
CHECKED_TEST(parallel, a_second_give_for_a_slot_is_refused)
{
	for (int c = -1; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		const adg_executor *ex = NULL;
		if (c >= 0) {
			workers_open(&w, worker_counts[c]);
			ex = &w.ex;
		}
		for (int x_first = 1; x_first >= 0; x_first--) {
			struct second_seen seen = {0};
			uint64_t h = twice_for_one_slot(ex, x_first, &seen);
			cr_expect_eq(h, x_first ? 2 * 31 + 5 : 5 * 31 + 2,
				     "%d workers, X %s on the tape",
				     c >= 0 ? worker_counts[c] : 0,
				     x_first ? "first" : "second");
			cr_expect_eq(seen.rc, ADG_EINVAL, "%s",
				     adg_error_name(seen.rc));
			cr_expect_eq(atomic_load(&seen.freed), 1,
				     "the value refused is freed");
		}
		if (c >= 0)
			workers_close(&w);
	}
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
}

/* A parent named in two slots (x * x) takes one gift per slot, folded by
 * slot: as the sequential backward folds them. */
CHECKED_TEST(parallel, a_repeated_parent_folds_per_slot)
{
	uint64_t want = 0;
	for (int c = -1; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		const adg_executor *ex = NULL;
		if (c >= 0) {
			workers_open(&w, worker_counts[c]);
			ex = &w.ex;
		}
		/* root = op(Z, Y), whose last slot comes first on the
		 * tape: Y = op(p) gives 5, then Z = op(p, p) gives 2 for
		 * slot 0 and 1 for slot 1. */
		adg_node *p;
		cr_assert_eq(adg_leaf(reg, &p), 0);
		adg_node *y = const_op(&p, 1, 5, 0, NULL);
		adg_node *pp[2] = {p, p};
		adg_node *z = const_op(pp, 2, 2, 0, NULL);
		adg_node *top[2] = {z, y};
		adg_node *root = const_op(top, 2, 1, 0, NULL);
		adg_backward_options o = {.size = sizeof o, .executor = ex};
		adg_grads *out;
		cr_assert_eq(adg_backward_with(reg, root, hv_new(1), &hv_ops,
					       &o, &out),
			     0);
		void *v;
		cr_assert_eq(adg_grads_get(out, id_of(p), &v), 0);
		uint64_t h = ((struct hv *)v)->h;
		if (c < 0) {
			want = h;
			cr_expect_eq(want, (5 * 31 + 2) * 31 + 1);
		} else {
			cr_expect_eq(h, want, "%d workers: %llu, want %llu",
				     worker_counts[c], (unsigned long long)h,
				     (unsigned long long)want);
		}
		adg_grads_free(out);
		adg_node *all[] = {p, y, z, root};
		for (int i = 0; i < 4; i++)
			cr_assert_eq(adg_node_unref(all[i]), 0);
		if (c >= 0)
			workers_close(&w);
	}
}

/* ------------------------------------------------------ the allocator */

/* An allocator whose blocks start 16 bytes past a 64-byte boundary: as
 * aligned as malloc's must be, no more. Behind each block lies a canary
 * that its free checks. */
struct edge_alloc {
	atomic_long live_bytes;
	atomic_int overruns;
};

enum { CANARY = 64, CANARY_BYTE = 0xa5 };

static void *edge_alloc_fn(size_t size, void *ctx)
{
	(void)ctx;
	char *raw = malloc(size + 96 + CANARY);
	if (raw == NULL)
		return NULL;
	uintptr_t at = ((uintptr_t)raw + 16 + 63) / 64 * 64 + 16;
	char *p = (char *)at;
	((void **)p)[-2] = raw;
	((size_t *)p)[-1] = size;
	memset(p + size, CANARY_BYTE, CANARY);
	atomic_fetch_add(&((struct edge_alloc *)ctx)->live_bytes, (long)size);
	return p;
}

static void edge_free_fn(void *ptr, size_t size, void *ctx)
{
	struct edge_alloc *st = ctx;
	char *p = ptr;
	if (((size_t *)p)[-1] != size)
		atomic_fetch_add(&st->overruns, 1000);
	for (size_t i = 0; i < CANARY; i++)
		if ((unsigned char)p[size + i] != CANARY_BYTE) {
			atomic_fetch_add(&st->overruns, 1);
			break;
		}
	atomic_fetch_sub(&st->live_bytes, (long)size);
	free(((void **)p)[-2]);
}

/* Backwards one after another on one thread reuse its scratch, with more
 * workers each time: what libadg allocates for them must hold what it
 * writes, whatever malloc-aligned address the allocator returns. */
Test(parallel_alloc, scratch_fits_blocks_with_only_mallocs_alignment)
{
	struct edge_alloc st = {0};
	adg_registry_options o = {
		.size = sizeof o,
		.allocator = {edge_alloc_fn, edge_free_fn, &st}};
	fixture_open(&o);
	const struct shape sh = {WIDE, 4, 3};
	uint64_t want[2 + 4 + 12], got[2 + 4 + 12];
	run_shape(&sh, (struct how){0}, want, "sequential");
	for (int c = 0; c < N_WORKER_COUNTS; c++) {
		struct workers w;
		workers_open(&w, worker_counts[c]);
		run_shape(&sh, (struct how){.ex = &w.ex}, got,
			  "edge allocator");
		expect_same(got, want, shape_nodes(&sh), "edge allocator");
		workers_close(&w);
	}
	fixture_close(); /* frees the scratch: the canaries are checked */
	cr_expect_eq(atomic_load(&st.live_bytes), 0);
	cr_expect_eq(atomic_load(&st.overruns), 0,
		     "%d blocks written past their end",
		     atomic_load(&st.overruns));
}

/* ------------------------------------------------------------ bad input */

static int never_submit(void (*fn)(void *), void *arg, void *ctx)
{
	(void)fn;
	(void)arg;
	atomic_fetch_add((atomic_int *)ctx, 1);
	return -1;
}

CHECKED_TEST(parallel, bad_executor_is_einval_and_frees_the_seed)
{
	struct graph g;
	build_wide(&g, 4, 3);
	atomic_int submits = 0;
	const adg_executor bad[] = {
		{NULL, NULL, 2},
		{NULL, NULL, 0},
		{never_submit, &submits, ADG_EXECUTOR_MAX_WORKERS + 1},
		{never_submit, &submits, UINT32_MAX},
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		adg_grads *out = (adg_grads *)&out;
		cr_expect_eq(g_backward(&g, (struct how){.ex = &bad[i]}, &out),
			     ADG_EINVAL, "executor %zu", i);
		cr_expect_null(out);
		cr_expect_eq(atomic_load(&scalar_values_live), 0,
			     "executor %zu: the seed was freed", i);
		assert_stats(reg, (uint64_t)g.n, (uint64_t)(g.n - 5), 1);
	}
	cr_expect_eq(atomic_load(&submits), 0);
	/* The most workers there may be: fine, and nothing was taken. */
	const adg_executor most = {never_submit, &submits,
				   ADG_EXECUTOR_MAX_WORKERS};
	adg_grads *out;
	cr_assert_eq(g_backward(&g, (struct how){.ex = &most}, &out), 0);
	g_check_ran(&g, "most workers");
	adg_grads_free(out);
	g_free(&g);
}

/* A leaf root with an executor gives the seed, and its hook fires once. */
CHECKED_TEST(parallel, leaf_root_with_an_executor_gives_the_seed)
{
	struct workers w;
	workers_open(&w, 2);
	struct graph g;
	g_init(&g, 1);
	g.root = g_leaf(&g);
	adg_grads *out;
	cr_assert_eq(g_backward(&g,
				(struct how){.ex = &w.ex,
					     .hook = true,
					     .leaves_only = true},
				&out),
		     0);
	void *v;
	cr_assert_eq(adg_grads_get(out, g.id[0], &v), 0);
	cr_expect_eq(((struct hv *)v)->h, 1);
	cr_expect_eq(atomic_load(&g.fired[0]), 1);
	adg_grads_free(out);
	g_free(&g);
	workers_close(&w);
}

CHECKED_TEST(parallel, pool_bad_arguments)
{
	adg_pool *p = (adg_pool *)&p;
	cr_expect_eq(adg_pool_new(0, &p), ADG_EINVAL);
	cr_expect_null(p);
	p = (adg_pool *)&p;
	cr_expect_eq(adg_pool_new(ADG_EXECUTOR_MAX_WORKERS + 1, &p),
		     ADG_EINVAL);
	cr_expect_null(p);
	cr_expect_eq(adg_pool_new(1, NULL), ADG_EINVAL);
	adg_executor e = {never_submit, NULL, 7};
	cr_expect_eq(adg_pool_executor(NULL, &e), ADG_EINVAL);
	cr_expect_eq(adg_pool_free(NULL), 0);
	cr_assert_eq(adg_pool_new(3, &p), 0);
	cr_expect_eq(adg_pool_executor(p, NULL), ADG_EINVAL);
	cr_assert_eq(adg_pool_executor(p, &e), 0);
	cr_expect_eq(e.n_workers, 3, "all of its threads");
	cr_expect_not_null(e.submit);
	cr_expect_eq(adg_pool_free(p), 0);
}

/* What a pool thread's job did. */
struct pool_job {
	adg_pool *pool;
	atomic_int runs;
	atomic_int free_rc; /* of adg_pool_free from the pool's thread */
	atomic_bool done;
};

static void count_job(void *arg)
{
	atomic_fetch_add(&((struct pool_job *)arg)->runs, 1);
}

static void self_free_job(void *arg)
{
	struct pool_job *j = arg;
	atomic_store(&j->free_rc, adg_pool_free(j->pool));
	atomic_store(&j->done, true);
}

/* adg_pool_free runs what was submitted first; from one of the pool's own
 * threads it is ADG_EINVAL. */
CHECKED_TEST(parallel, pool_runs_what_was_submitted_and_refuses_its_own_free)
{
	adg_pool *pool;
	adg_executor e;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &e), 0);
	struct pool_job j = {.pool = pool, .free_rc = 1};
	cr_assert_eq(e.submit(self_free_job, &j, e.ctx), 0);
	while (!atomic_load(&j.done))
		sched_yield();
	cr_expect_eq(atomic_load(&j.free_rc), ADG_EINVAL);
	for (int i = 0; i < 100; i++)
		cr_assert_eq(e.submit(count_job, &j, e.ctx), 0);
	cr_assert_eq(adg_pool_free(pool), 0);
	cr_expect_eq(atomic_load(&j.runs), 100);
}

/* ------------------------------------------------ the caller's executors */

/* A tiny executor: a mutex, a condition variable, a stack of jobs and
 * threads that run them; or none, and jobs wait for qexec_drain. */
struct qexec {
	pthread_mutex_t lock;
	pthread_cond_t wake;
	struct job {
		void (*fn)(void *);
		void *arg;
	} * jobs;
	size_t n, cap;
	bool stopping;
	int n_threads;
	pthread_t threads[4];
	atomic_int submits;
};

static int qexec_submit(void (*fn)(void *), void *arg, void *ctx)
{
	struct qexec *q = ctx;
	pthread_mutex_lock(&q->lock);
	if (q->n == q->cap) {
		size_t cap = q->cap ? 2 * q->cap : 16;
		struct job *j = realloc(q->jobs, cap * sizeof *j);
		if (j == NULL) {
			pthread_mutex_unlock(&q->lock);
			return -1;
		}
		q->jobs = j;
		q->cap = cap;
	}
	q->jobs[q->n++] = (struct job){fn, arg};
	atomic_fetch_add(&q->submits, 1);
	pthread_cond_signal(&q->wake);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static void *qexec_thread(void *arg)
{
	struct qexec *q = arg;
	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (q->n == 0 && !q->stopping)
			pthread_cond_wait(&q->wake, &q->lock);
		if (q->n == 0)
			break; /* stopping, and nothing left to run */
		struct job j = q->jobs[--q->n];
		pthread_mutex_unlock(&q->lock);
		j.fn(j.arg);
		pthread_mutex_lock(&q->lock);
	}
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

static void qexec_open(struct qexec *q, int threads)
{
	memset(q, 0, sizeof *q);
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->wake, NULL);
	q->n_threads = threads;
	for (int i = 0; i < threads; i++)
		cr_assert_eq(
			pthread_create(&q->threads[i], NULL, qexec_thread, q),
			0);
}

/* Runs what is left on this thread, jobs they submit included. */
static int qexec_drain(struct qexec *q)
{
	int ran = 0;
	pthread_mutex_lock(&q->lock);
	while (q->n > 0) {
		struct job j = q->jobs[--q->n];
		pthread_mutex_unlock(&q->lock);
		j.fn(j.arg);
		ran++;
		pthread_mutex_lock(&q->lock);
	}
	pthread_mutex_unlock(&q->lock);
	return ran;
}

static void qexec_close(struct qexec *q)
{
	pthread_mutex_lock(&q->lock);
	q->stopping = true;
	pthread_cond_broadcast(&q->wake);
	pthread_mutex_unlock(&q->lock);
	for (int i = 0; i < q->n_threads; i++)
		pthread_join(q->threads[i], NULL);
	cr_assert_eq(q->n, 0);
	free(q->jobs);
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->wake);
}

/* (a) The caller's own threads give the sequential results. */
CHECKED_TEST(parallel, own_threads_executor_gives_the_same_gradients)
{
	const struct shape *shapes[2] = {&wide_64x50, &diamond_12x25};
	for (int s = 0; s < 2; s++) {
		int n = shape_nodes(shapes[s]);
		uint64_t *want = calloc(n, sizeof *want),
			 *got = calloc(n, sizeof *got);
		cr_assert(want && got);
		run_shape(shapes[s], (struct how){0}, want, "sequential");
		struct qexec q;
		qexec_open(&q, 3);
		adg_executor ex = {qexec_submit, &q, 3};
		for (int round = 0; round < 2; round++) {
			run_shape(shapes[s], (struct how){.ex = &ex}, got,
				  "own threads");
			expect_same(got, want, n, "own threads");
		}
		qexec_close(&q);
		cr_expect_gt(atomic_load(&q.submits), 0);
		free(want);
		free(got);
	}
}

/* (b) An executor that never takes work: the calling thread does it all. */
CHECKED_TEST(parallel, executor_whose_submit_fails_runs_on_the_caller)
{
	int n = shape_nodes(&wide_64x50);
	uint64_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	cr_assert(want && got);
	run_shape(&wide_64x50, (struct how){0}, want, "sequential");
	atomic_int submits = 0;
	adg_executor ex = {never_submit, &submits, 4};
	run_shape(&wide_64x50, (struct how){.ex = &ex}, got, "failing submit");
	expect_same(got, want, n, "failing submit");
	/* 64 branches ready at once and 4 workers offered: it asked. */
	cr_expect_gt(atomic_load(&submits), 0);
	free(want);
	free(got);
}

/* (c) An executor that runs nothing until the backward has returned: the
 * backward completes on the calling thread, and the jobs, run afterwards
 * (after the graph, its gradients and its steps are gone), return at once
 * and leave nothing behind (AddressSanitizer sees the rest). */
CHECKED_TEST(parallel, jobs_run_after_the_backward_returned_do_nothing)
{
	int n = shape_nodes(&wide_64x50);
	uint64_t *want = calloc(n, sizeof *want), *got = calloc(n, sizeof *got);
	cr_assert(want && got);
	run_shape(&wide_64x50, (struct how){0}, want, "sequential");
	struct qexec q;
	qexec_open(&q, 0);
	adg_executor ex = {qexec_submit, &q, 4};
	for (int round = 0; round < 3; round++) {
		run_shape(&wide_64x50, (struct how){.ex = &ex}, got,
			  "deferred");
		expect_same(got, want, n, "deferred");
		/* Two rounds' jobs wait together before the last drain. */
		if (round != 0) {
			int submitted = atomic_load(&q.submits);
			cr_expect_eq(qexec_drain(&q), submitted);
			atomic_store(&q.submits, 0);
		}
	}
	qexec_close(&q);
	free(want);
	free(got);
}

/* ---------------------------------------------------------------- stress */

/* Threads that each run many backwards, on graphs of their own, over one
 * pool: plain, with the hook, checkpointed, with nested backwards on the
 * same pool, and failing. The results they must give were computed
 * sequentially first; what a thread finds wrong it counts. */
struct stress {
	adg_executor ex;
	int rounds;
	int first, kinds; /* rounds cycle through these kinds of round */
	/* wide, ckpt, the nesting graph and the nested one */
	uint64_t *want[4];
	atomic_int wrong;
	atomic_int backwards;
};

static const struct shape stress_wide = {WIDE, 8, 6};
static const struct shape stress_ckpt = {CKPT, 6, 4};
static const struct shape stress_outer = {WIDE, 6, 4};

/* Every step ran and was released once, nothing went wrong elsewhere, and
 * the leaves' results are want's. */
static bool stress_check(struct graph *g, adg_grads *out, const uint64_t *want)
{
	bool ok = atomic_load(&g->bad) == 0;
	for (int i = 0; i < g->n; i++)
		if (!g->leaf[i] && (atomic_load(&g->runs[i]) != 1 ||
				    atomic_load(&g->releases[i]) != 1))
			ok = false;
	uint64_t *res = calloc(g->n, sizeof *res);
	cr_assert_not_null(res);
	g_results(g, out, res);
	ok = ok && memcmp(res, want, g->n * sizeof *res) == 0 &&
	     atomic_load(&g->bad) == 0;
	free(res);
	return ok;
}

static bool stress_round(struct stress *s, int kind, int i)
{
	struct graph g;
	adg_grads *out = NULL;
	struct how how = {.ex = &s->ex};
	bool ok;
	int rc;
	switch (kind) {
	case 0: /* plain */
		build(&g, &stress_wide);
		ok = g_backward(&g, how, &out) == 0 &&
		     stress_check(&g, out, s->want[0]);
		break;
	case 1: /* with the hook */
		build(&g, &stress_wide);
		how.hook = true;
		how.leaves_only = i % 2;
		ok = g_backward(&g, how, &out) == 0 &&
		     stress_check(&g, out, s->want[0]);
		for (int k = 0; ok && k < g.n; k++)
			ok = atomic_load(&g.fired[k]) ==
			     (g.leaf[k] || !how.leaves_only);
		ok = ok &&
		     (how.leaves_only || (g.root_seq == 0 && g.root_on_caller));
		break;
	case 2: /* checkpointed */
		build(&g, &stress_ckpt);
		ok = g_backward(&g, how, &out) == 0 &&
		     stress_check(&g, out, s->want[1]) &&
		     atomic_load(&g.recomputes) == 1;
		break;
	case 3: /* nested, on the same pool and otherwise */
		build(&g, &stress_outer);
		g.outer = &s->ex;
		g.nest_want = s->want[3];
		g.nest_depth = 1 + i % 2;
		for (int b = 0; b < 6; b += 2)
			g.spec[wide_op_label(6, 4, b, 2)].nest =
				b == 4 ? NEST_SEQUENTIAL : NEST_SAME_EXECUTOR;
		ok = g_backward(&g, how, &out) == 0 &&
		     stress_check(&g, out, s->want[2]);
		break;
	default: { /* failing, in two branches at once */
		/* A in the root's last slot: first on the tape. */
		const struct two_chains c = {12,
					     4,
					     true,
					     6,
					     ADG_EUSER - 1,
					     4,
					     ADG_EUSER - 2,
					     ADG_EUSER - 1,
					     true};
		build_two_chains(&g, &c);
		g.spec[1 + c.fail_a].nap = false; /* no sleeping here */
		out = (adg_grads *)&out;
		rc = g_backward(&g, how, &out);
		ok = rc == c.want && out == NULL && atomic_load(&g.bad) == 0;
		for (int k = 0; k < g.n; k++)
			if (!g.leaf[k] && atomic_load(&g.releases[k]) != 1)
				ok = false;
		out = NULL;
		break;
	}
	}
	adg_grads_free(out);
	g_free(&g);
	atomic_fetch_add(&s->backwards, 1);
	return ok;
}

static void *stress_worker(void *arg)
{
	const struct thread *t = arg;
	struct stress *s = t->s;
	for (int r = 0; r < s->rounds; r++)
		if (!stress_round(s, s->first + (r + t->i) % s->kinds, r))
			atomic_fetch_add(&s->wrong, 1);
	return NULL;
}

static void stress_run(int threads, int rounds, int first, int kinds)
{
	struct stress s = {.rounds = rounds, .first = first, .kinds = kinds};
	const struct shape *shapes[4] = {&stress_wide, &stress_ckpt,
					 &stress_outer, &nested_shape};
	for (int k = 0; k < 4; k++) {
		s.want[k] = calloc(shape_nodes(shapes[k]), sizeof *s.want[k]);
		cr_assert_not_null(s.want[k]);
		run_shape(shapes[k], (struct how){0}, s.want[k], "sequential");
	}
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(3, &pool), 0);
	cr_assert_eq(adg_pool_executor(pool, &s.ex), 0);
	run_threads(threads, stress_worker, &s);
	cr_assert_eq(adg_pool_free(pool), 0);
	cr_expect_eq(atomic_load(&s.wrong), 0, "%d of %d backwards wrong",
		     atomic_load(&s.wrong), atomic_load(&s.backwards));
	cr_expect_eq(atomic_load(&s.backwards), threads * rounds);
	assert_stats(reg, 0, 0, 0);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	cr_expect_eq(atomic_load(&scalar_outputs_live), 0);
	for (int k = 0; k < 4; k++)
		free(s.want[k]);
}

CHECKED_TEST(parallel_stress, mixed_backwards_on_one_shared_pool)
{
	stress_run(6, 1500, 0, 5);
}

/* Nested backwards only: every thread's steps wait on backwards that need
 * the same three threads. */
CHECKED_TEST(parallel_stress, nested_backwards_on_one_shared_pool)
{
	stress_run(4, 1000, 3, 1);
}
