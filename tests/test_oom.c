/* Out-of-memory injection, as SQLite tests it: one scripted workload runs
 * again and again, each time on fresh registries whose allocator fails the
 * Nth allocation it is asked for (N = 1, 2, ...), until a run in which no
 * allocation failed. Every library call of the workload, inside steps too,
 * must return 0 or ADG_ENOMEM; after ADG_ENOMEM nothing has changed (adg.h's
 * convention), and the same call on the same registry then succeeds. At the
 * end every step was released once, every output freed once, every
 * gradient checked, and the allocator holds nothing.
 *
 * The allocator fails one allocation only: after a failure the rest of the
 * run goes on with injection disarmed, so that each run tests one failure
 * and the recovery from it. Allocations are counted, never named: the
 * library may allocate more or less than it does today, and through the
 * allocator or not. */
#include "scalar.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

/* ---------------------------------------------------------- the allocator */

static struct {
	long fail_at;	    /* the allocation to fail, from 1; 0: none */
	atomic_long seen;   /* allocations asked for, the failed one too */
	atomic_bool failed; /* fail_at was reached */
	atomic_long live_bytes;
	atomic_long bad_frees; /* told another size than alloc was */
} oom;

/* Where a block keeps its size, for checking free's; 16 keeps malloc's
 * alignment. */
#define HEADER 16

static void *oom_alloc(size_t size, void *ctx)
{
	(void)ctx;
	if (atomic_fetch_add(&oom.seen, 1) + 1 == oom.fail_at) {
		atomic_store(&oom.failed, true);
		return NULL;
	}
	size_t *p = malloc(size + HEADER);
	if (p == NULL)
		return NULL;
	p[0] = size;
	atomic_fetch_add(&oom.live_bytes, (long)size);
	return (char *)p + HEADER;
}

static void oom_free(void *ptr, size_t size, void *ctx)
{
	(void)ctx;
	size_t *p = (size_t *)((char *)ptr - HEADER);
	/* Counted, not asserted: every thread that retires a graph frees. */
	if (p[0] != size)
		atomic_fetch_add(&oom.bad_frees, 1);
	atomic_fetch_sub(&oom.live_bytes, (long)size);
	free(p);
}

/* --------------------------------------------- what the callbacks did */

/* The workload runs on this thread only, and so do its callbacks. */
static long step_runs, step_releases, outputs_made, outputs_freed, recomputes,
	hook_calls;
/* Over all runs, for the summary. */
static long enomem_calls, absorbed_failures;

#define MAX_PARENTS  10
#define MAX_CLOSURES 40
#define MAX_OUTPUTS  16

enum kind { PROD, SUM };

/* A step's closure: its op, and its parents' forward values. */
struct closure {
	enum kind kind;
	size_t n;
	double x[MAX_PARENTS];
	bool leaf[MAX_PARENTS];
	double value; /* the op's forward value */
	bool want_self;
	int want_parent; /* a slot whose output the step asks for; -1: none */
	bool nested;	 /* the step runs a forward and backward of its own */
	bool unrun;	 /* no backward reaches it: freed unrun */
	int runs, releases;
	int retained_runs; /* of runs, those in a retained backward */
};
static struct closure closures[MAX_CLOSURES];
static size_t n_closures;

/* A forward output: heap memory, so that ASan and valgrind see it. */
struct output {
	double value;
	long index;
};
static int output_frees[MAX_OUTPUTS];

static void *output_new(double value)
{
	cr_assert_lt(outputs_made, MAX_OUTPUTS);
	struct output *o = malloc(sizeof *o);
	cr_assert_not_null(o);
	*o = (struct output){value, outputs_made++};
	return o;
}

static void output_free(void *value, void *ctx)
{
	(void)ctx;
	struct output *o = value;
	int frees = output_frees[o->index]++;
	cr_assert_eq(frees, 0, "N=%ld: output %ld freed twice", oom.fail_at,
		     o->index);
	outputs_freed++;
	free(o);
}

/* ---------------------------------------------- calls and their checks */

/* What a failed call must leave as it was. */
struct snap {
	adg_registry *r; /* NULL: no registry to ask */
	struct adg_stats st;
	long values, runs, releases, outputs_freed, recomputes, hook_calls;
	bool failed;
};

static struct snap snap(adg_registry *r)
{
	struct snap s = {
		.r = r,
		.st = {.size = sizeof s.st},
		.values = atomic_load(&scalar_values_live),
		.runs = step_runs,
		.releases = step_releases,
		.outputs_freed = outputs_freed,
		.recomputes = recomputes,
		.hook_calls = hook_calls,
		.failed = atomic_load(&oom.failed),
	};
	if (r != NULL)
		cr_assert_eq(adg_registry_stats(r, &s.st), 0);
	return s;
}

#define SAME(field)                                                            \
	cr_assert_eq(now.field, before->field,                                 \
		     "N=%ld: %s(%s) failed and changed " #field                \
		     ": %lld, was %lld",                                       \
		     oom.fail_at, call, what, (long long)now.field,            \
		     (long long)before->field)

/* Whether call (on what) failed for lack of memory. It may return 0 or
 * ADG_ENOMEM only, and ADG_ENOMEM only when an allocation failed during it;
 * then nothing changed since before: no count moved and no callback ran
 * (a value handed over with the call was freed, which before counted).
 * The allocator fails once, so the caller's retry runs disarmed.
 * all_callbacks false: a recompute may have built and freed outputs on
 * the way (adg_output_get: a cache that moved, not a change of state). */
static bool out_of_memory(const char *call, const char *what, int rc,
			  const struct snap *before, bool all_callbacks)
{
	cr_assert(rc == 0 || rc == ADG_ENOMEM, "N=%ld: %s(%s) returned %d (%s)",
		  oom.fail_at, call, what, rc, adg_strerror(rc));
	if (rc == 0)
		return false;
	cr_assert(!before->failed && atomic_load(&oom.failed),
		  "N=%ld: %s(%s): ADG_ENOMEM, but no allocation failed in it",
		  oom.fail_at, call, what);
	enomem_calls++;
	struct snap now = snap(before->r);
	SAME(st.live_nodes);
	SAME(st.live_steps);
	SAME(st.live_graphs);
	SAME(st.merges);
	SAME(st.nodes_freed);
	SAME(values);
	SAME(runs);
	SAME(releases);
	SAME(hook_calls);
	if (all_callbacks) {
		SAME(outputs_freed);
		SAME(recomputes);
	}
	return true;
}

/* A node the workload made, and what the checks need of it. */
struct var {
	const char *name;
	adg_node *node;
	uint64_t id;
	double value;
	bool leaf;
};

/* A registry and the handles the workload holds on it. */
struct reg {
	adg_registry *r;
	struct var vars[32];
	size_t n;
};

static adg_registry *registry_new(int checkpointing)
{
	adg_registry_options o = {
		.size = sizeof o,
		.allocator = {oom_alloc, oom_free, NULL},
		.checkpointing = checkpointing,
	};
	adg_registry *r;
	for (;;) {
		struct snap s = snap(NULL);
		r = (adg_registry *)&r;
		int rc = adg_registry_new(&o, &r);
		if (!out_of_memory("adg_registry_new", "", rc, &s, true))
			break;
		cr_assert_null(r);
	}
	return r;
}

static struct var keep(struct reg *g, struct var v)
{
	cr_assert_eq(adg_node_id(v.node, &v.id), 0);
	cr_assert_lt(g->n, sizeof g->vars / sizeof *g->vars);
	g->vars[g->n++] = v;
	return v;
}

static struct var leaf(struct reg *g, const char *name, double value)
{
	struct var v = {.name = name, .value = value, .leaf = true};
	for (;;) {
		struct snap s = snap(g->r);
		v.node = (adg_node *)&v;
		int rc = adg_leaf(g->r, &v.node);
		if (!out_of_memory("adg_leaf", name, rc, &s, true))
			break;
		cr_assert_null(v.node);
	}
	return keep(g, v);
}

static int step_backward(adg_step_call *call, void *user);
static int recompute(adg_recompute_call *call, void *user);

static void step_release(void *user)
{
	struct closure *c = user;
	c->releases++;
	step_releases++;
}

/* What an op offers and asks for; NULL: a plain adg_op. */
struct spec {
	bool output;	   /* offers its forward value */
	bool recompute;	   /* ... and can rebuild it */
	bool memory_bound; /* ... cheaply */
	bool want_self;
	bool want_parent;
	uint32_t want_slot; /* the parent whose output the step asks for */
	bool nested;
	bool unrun;
};

static struct var op(struct reg *g, const char *name, enum kind kind,
		     const struct var *parents, size_t n,
		     const struct spec *spec)
{
	static const struct spec plain = {0};
	const struct spec *sp = spec != NULL ? spec : &plain;
	cr_assert(n <= MAX_PARENTS && n_closures < MAX_CLOSURES);
	struct closure *c = &closures[n_closures++];
	*c = (struct closure){
		.kind = kind,
		.n = n,
		.value = kind == PROD ? 1 : 0,
		.want_self = sp->want_self,
		.want_parent = sp->want_parent ? (int)sp->want_slot : -1,
		.nested = sp->nested,
		.unrun = sp->unrun,
	};
	adg_node *nodes[MAX_PARENTS];
	for (size_t i = 0; i < n; i++) {
		nodes[i] = parents[i].node;
		c->x[i] = parents[i].value;
		c->leaf[i] = parents[i].leaf;
		c->value =
			kind == PROD ? c->value * c->x[i] : c->value + c->x[i];
	}
	adg_step step = {
		.backward = step_backward, .release = step_release, .user = c};
	adg_output out = {
		sp->output ? output_new(c->value) : NULL,
		output_free,
		sp->recompute ? recompute : NULL,
		sp->memory_bound,
		NULL,
	};
	adg_op_options opt = {
		.size = sizeof opt,
		.output = sp->output ? &out : NULL,
		.want_self = sp->want_self,
		.want_parents = &sp->want_slot,
		.n_want_parents = sp->want_parent ? 1 : 0,
	};
	struct var y = {.name = name, .value = c->value};
	for (;;) {
		struct snap s = snap(g->r);
		y.node = (adg_node *)&y;
		int rc = spec != NULL ? adg_op_with(g->r, nodes, n, &step, &opt,
						    &y.node)
				      : adg_op(g->r, nodes, n, &step, &y.node);
		/* On failure the closure and the offered output are still
		 * ours (the snapshot saw no release, no output freed): the
		 * retry hands over the same ones. */
		if (!out_of_memory(spec != NULL ? "adg_op_with" : "adg_op",
				   name, rc, &s, true))
			break;
		cr_assert_null(y.node);
	}
	return keep(g, y);
}

static uint64_t graph_id(struct var v)
{
	uint64_t id = UINT64_MAX;
	cr_assert_eq(adg_node_graph_id(v.node, &id), 0);
	return id;
}

/* A backward from root with seed 1. Nothing is taken when it fails: the
 * snapshot sees no step run or released, and root stays in its graph. */
static adg_grads *backward(struct reg *g, struct var root,
			   const adg_backward_options *options)
{
	const char *call = options ? "adg_backward_with" : "adg_backward";
	adg_grads *out;
	for (;;) {
		struct snap s = snap(g->r);
		uint64_t graph = graph_id(root);
		out = (adg_grads *)&out;
		void *seed = scalar_box(1);
		int rc = options ? adg_backward_with(g->r, root.node, seed,
						     &scalar_ops, options, &out)
				 : adg_backward(g->r, root.node, seed,
						&scalar_ops, &out);
		if (!out_of_memory(call, root.name, rc, &s, true))
			break;
		cr_assert_null(out);
		cr_assert_eq(graph_id(root), graph,
			     "N=%ld: %s(%s) failed and took the root",
			     oom.fail_at, call, root.name);
	}
	cr_assert_not_null(out);
	return out;
}

static size_t grads_count(const adg_grads *grads)
{
	size_t n = SIZE_MAX;
	cr_assert_eq(adg_grads_count(grads, &n), 0);
	return n;
}

/* Adds v to id's gradient. A failure frees the value and keeps the rest. */
static void grads_register(adg_grads *grads, uint64_t id, double v)
{
	for (;;) {
		struct snap s = snap(NULL);
		size_t count = grads_count(grads);
		void *held = NULL;
		bool had = adg_grads_get(grads, id, &held) == 0;
		double old = had ? *(double *)held : 0;
		int rc = adg_grads_register(grads, id, scalar_box(v));
		if (!out_of_memory("adg_grads_register", "", rc, &s, true))
			break;
		cr_assert_eq(grads_count(grads), count);
		held = NULL;
		cr_assert_eq(adg_grads_get(grads, id, &held) == 0, had);
		if (had)
			cr_assert_eq(*(double *)held, old);
	}
}

/* A step's gradient for its parent at slot. It allocates nothing, so it
 * cannot fail: with an executor it lands in the step's own slot, and on
 * one thread in the backward's table, sized for the tape (lib/run.c). */
static void step_give(adg_step_call *call, size_t slot, double v)
{
	int rc = adg_step_give(call, slot, scalar_box(v));
	cr_assert_eq(rc, 0, "N=%ld: adg_step_give: %s", oom.fail_at,
		     adg_strerror(rc));
}

static double grad_of(const adg_grads *grads, uint64_t id)
{
	void *v = NULL;
	int rc = adg_grads_get(grads, id, &v);
	cr_assert_eq(rc, 0, "N=%ld: no gradient for %llu: %s", oom.fail_at,
		     (unsigned long long)id, adg_strerror(rc));
	return *(double *)v;
}

static void expect_grad(const adg_grads *grads, struct var v, double want)
{
	double got = grad_of(grads, v.id);
	cr_assert_eq(got, want, "N=%ld: gradient of %s is %g, want %g",
		     oom.fail_at, v.name, got, want);
}

static void grads_free(adg_grads *grads)
{
	cr_assert_eq(adg_grads_free(grads), 0);
}

static void drop_all(struct reg *g)
{
	while (g->n > 0)
		cr_assert_eq(adg_node_unref(g->vars[--g->n].node), 0);
}

static void registry_free(struct reg *g)
{
	drop_all(g);
	cr_assert_eq(adg_registry_free(g->r), 0, "N=%ld", oom.fail_at);
	g->r = NULL;
}

/* ------------------------------------------------------------ the steps */

/* Borrows an output the step asked for and checks its value. */
static void expect_output(adg_step_call *call, uint64_t id, double want)
{
	void *v;
	for (;;) {
		struct snap s = snap(call->registry);
		v = &v;
		int rc = adg_output_get(call, id, &v);
		if (!out_of_memory("adg_output_get", "", rc, &s, false))
			break;
		cr_assert_null(v);
	}
	cr_assert_not_null(v);
	cr_assert_eq(((struct output *)v)->value, want, "N=%ld: output of %llu",
		     oom.fail_at, (unsigned long long)id);
}

/* A forward and a backward of the step's own, on a fresh graph: the
 * nested backward needs a tape of its own. */
static void nested(adg_registry *r)
{
	struct reg g = {.r = r};
	struct var u = leaf(&g, "nested u", 3);
	struct var uu[2] = {u, u};
	struct var v = op(&g, "nested v", PROD, uu, 2, NULL);
	adg_grads *grads = backward(&g, v, NULL);
	expect_grad(grads, u, 6);
	grads_free(grads);
	drop_all(&g);
}

static int step_backward(adg_step_call *call, void *user)
{
	struct closure *c = user;
	c->runs++;
	c->retained_runs += call->retained != 0;
	step_runs++;
	cr_assert_eq(call->n_parents, c->n);
	cr_assert_not_null(call->grad, "N=%ld: node %llu got no gradient",
			   oom.fail_at, (unsigned long long)call->node_id);
	if (c->want_self)
		expect_output(call, call->node_id, c->value);
	if (c->want_parent >= 0)
		expect_output(call, call->parent_ids[c->want_parent],
			      c->x[c->want_parent]);
	if (c->nested)
		nested(call->registry);
	double g = *(double *)call->grad;
	for (size_t i = 0; i < c->n; i++) {
		double d = g;
		for (size_t k = 0; c->kind == PROD && k < c->n; k++)
			if (k != i)
				d *= c->x[k];
		step_give(call, i, d);
	}
	return 0;
}

static int recompute(adg_recompute_call *call, void *user)
{
	struct closure *c = user;
	recomputes++;
	cr_assert_eq(call->n_parents, c->n);
	double v = c->kind == PROD ? 1 : 0;
	for (size_t k = 0; k < c->n; k++) {
		const struct output *o = call->parent_outputs[k];
		/* A leaf's slot is NULL; every other parent offers one. */
		cr_assert_eq(o == NULL, c->leaf[k]);
		double x = o != NULL ? o->value : c->x[k];
		cr_assert_eq(x, c->x[k]);
		v = c->kind == PROD ? v * x : v + x;
	}
	call->output = output_new(v);
	return 0;
}

/* The ready hook: logs what became final, and keeps one leaf's
 * gradient. */
static struct hook {
	uint64_t take;
	double taken;
	size_t n;
	uint64_t ids[40];
	double grads[40]; /* -1: none */
} hook;

static int on_ready(uint64_t id, void **grad, void *ctx)
{
	struct hook *h = ctx;
	hook_calls++;
	cr_assert_lt(h->n, sizeof h->ids / sizeof *h->ids);
	h->ids[h->n] = id;
	h->grads[h->n++] = *grad != NULL ? *(double *)*grad : -1;
	if (id == h->take && *grad != NULL) {
		h->taken = *(double *)*grad;
		scalar_ops.free(*grad, NULL);
		*grad = NULL;
	}
	return 0;
}

static void expect_stats(adg_registry *r, uint64_t nodes, uint64_t steps,
			 uint64_t graphs, uint64_t merges)
{
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(r, &st), 0);
	cr_assert(st.live_nodes == nodes && st.live_steps == steps &&
			  st.live_graphs == graphs && st.merges == merges,
		  "N=%ld: stats %llu nodes, %llu steps, %llu graphs, %llu "
		  "merges; want %llu, %llu, %llu, %llu",
		  oom.fail_at, (unsigned long long)st.live_nodes,
		  (unsigned long long)st.live_steps,
		  (unsigned long long)st.live_graphs,
		  (unsigned long long)st.merges, (unsigned long long)nodes,
		  (unsigned long long)steps, (unsigned long long)graphs,
		  (unsigned long long)merges);
}

/* --------------------------------------------------------- the workload */

/* Executors that run nothing while the backward runs: deferred's jobs
 * wait until run_deferred, as a busy pool's would, so the backward runs
 * every step on this thread and the workload stays deterministic, while
 * the run's scratch and the jobs' ticket are allocated as with threads.
 * solo offers no worker: the scheduler runs alone. */
static struct {
	void (*fn)(void *arg);
	void *arg;
} deferred[8];
static int n_deferred;

static int defer(void (*fn)(void *arg), void *arg, void *ctx)
{
	(void)ctx;
	if (n_deferred == 8)
		return -1;
	deferred[n_deferred].fn = fn;
	deferred[n_deferred++].arg = arg;
	return 0;
}

/* The jobs find their backward over and return, freeing the ticket. */
static void run_deferred(void)
{
	for (int i = 0; i < n_deferred; i++)
		deferred[i].fn(deferred[i].arg);
	n_deferred = 0;
}

static const adg_executor solo = {.submit = defer, .n_workers = 0};
static const adg_executor lazy = {.submit = defer, .n_workers = 2};

/* Plain ops and merges on a registry without checkpointing, and a backward
 * with a ready hook, run by the scheduler alone (solo). Leaves a = 2, b = 3, c
 * = 1/2, d = 4, x0 = 2, x8 = 1/2, the other x 1; p = a b; q = p c; r = c d; s =
 * a + d (output kept, asked for by m); m = q r s merges three graphs; t_i =
 * x_i^2, one graph each; big = t0 ... t8 m merges ten. big = 36 and t0 ... t8 =
 * 1, so dbig/da = r s c b + q r = 24, dbig/db = r s c a = 12, dbig/dc = r s p +
 * q s d = 144, dbig/dd = q s c + q r = 15, dbig/dx_i = 72 / x_i. The hook takes
 * a's gradient. Returns the container, which outlives the registry. */
static adg_grads *plain_ops(struct reg *g)
{
	g->r = registry_new(ADG_CHECKPOINT_NONE);
	struct var a = leaf(g, "a", 2), b = leaf(g, "b", 3);
	struct var c = leaf(g, "c", 0.5), d = leaf(g, "d", 4);
	struct var x[9], t[10];
	static const char *const names[9][2] = {
		{"x0", "t0"}, {"x1", "t1"}, {"x2", "t2"},
		{"x3", "t3"}, {"x4", "t4"}, {"x5", "t5"},
		{"x6", "t6"}, {"x7", "t7"}, {"x8", "t8"},
	};
	for (int i = 0; i < 9; i++)
		x[i] = leaf(g, names[i][0], i == 0 ? 2 : i == 8 ? 0.5 : 1);

	struct var ab[2] = {a, b};
	struct var p = op(g, "p", PROD, ab, 2, NULL);
	struct var pc[2] = {p, c};
	struct var q = op(g, "q", PROD, pc, 2, NULL);
	struct var cd[2] = {c, d};
	struct var r = op(g, "r", PROD, cd, 2, NULL);
	struct var ad[2] = {a, d};
	struct var s = op(g, "s", SUM, ad, 2,
			  &(struct spec){.output = true,
					 .recompute = true,
					 .memory_bound = true});
	struct var qrs[3] = {q, r, s};
	struct var m = op(g, "m", PROD, qrs, 3,
			  &(struct spec){.want_parent = true, .want_slot = 2});
	for (int i = 0; i < 9; i++) {
		struct var xx[2] = {x[i], x[i]};
		t[i] = op(g, names[i][1], PROD, xx, 2, NULL);
	}
	t[9] = m;
	struct var big = op(g, "big", PROD, t, 10, NULL);
	/* 13 leaves, 15 ops, all in one graph: 2 merges for m, 9 for big. */
	expect_stats(g->r, 28, 15, 1, 11);
	cr_assert_eq(graph_id(big), p.id, "the smallest origin");
	static const double want[13] = {24, 12, 144, 15, 36, 72, 72,
					72, 72, 72,  72, 72, 144};

	/* A retained pass first, with the hook, on this thread: its counts
	 * key the tape's nodes in the table, which is larger. It takes
	 * nothing and gives the same gradients. */
	hook = (struct hook){.take = a.id};
	adg_grads *grads = backward(
		g, big,
		&(adg_backward_options){.size = sizeof(adg_backward_options),
					.on_ready = on_ready,
					.on_ready_ctx = &hook,
					.retain = 1});
	expect_stats(g->r, 28, 15, 1, 11);
	cr_assert_eq(hook.n, g->n);
	cr_assert_eq(hook.taken, 24);
	for (size_t i = 1; i < 13; i++)
		expect_grad(grads, g->vars[i], want[i]);
	grads_free(grads);

	hook = (struct hook){.take = a.id};
	adg_backward_options o = {.size = sizeof o,
				  .on_ready = on_ready,
				  .on_ready_ctx = &hook,
				  .executor = &solo};
	grads = backward(g, big, &o);
	expect_stats(g->r, 28, 0, 0, 11);
	/* Every node and leaf of the tape became final once. */
	cr_assert_eq(hook.n, g->n);
	for (size_t i = 0; i < g->n; i++) {
		size_t seen = 0, at = 0;
		for (size_t k = 0; k < hook.n; k++)
			if (hook.ids[k] == g->vars[i].id)
				seen++, at = k;
		cr_assert_eq(seen, 1, "N=%ld: hook saw %s %zu times",
			     oom.fail_at, g->vars[i].name, seen);
		if (i < 13)
			cr_assert_eq(hook.grads[at], want[i],
				     "N=%ld: hook saw %s's gradient %g",
				     oom.fail_at, g->vars[i].name,
				     hook.grads[at]);
	}
	cr_assert_eq(hook.taken, 24);
	void *none = &none;
	cr_assert_eq(adg_grads_get(grads, a.id, &none), ADG_ENOTFOUND);
	for (size_t i = 1; i < 13; i++)
		expect_grad(grads, g->vars[i], want[i]);
	cr_assert_eq(grads_count(grads), 12);
	return grads;
}

/* Checkpointing, balanced, the backward on an executor (lazy). Leaves e = 2, f
 * = 1/2, g = 4, y0 = 2, y1 = 1/2, the other y 1. c0 = e f keeps its output and
 * asks for it; m1 = c0 + g and m2 = m1 e are memory-bound and dropped at once;
 * h = m2 f keeps its output, asks for m2's and runs a nested backward; bm = y0
 * ... y8 m2 is memory-bound too (ten parents: recompute's scratch is large);
 * root = h bm asks for bm's. Its backward rebuilds m1, m2 and bm. root =
 * 50: droot/de = 60, /df = 140, /dg = 20, /dy_i = 50 / y_i. A dead op
 * keeps an output, and no backward reaches it. Returns a leaf-root
 * backward's container, which outlives the registry. */
static adg_grads *checkpointed_ops(struct reg *g)
{
	g->r = registry_new(ADG_CHECKPOINT_BALANCED);
	struct var e = leaf(g, "e", 2), f = leaf(g, "f", 0.5);
	struct var gl = leaf(g, "g", 4);
	struct var y[10];
	static const char *const names[9] = {"y0", "y1", "y2", "y3", "y4",
					     "y5", "y6", "y7", "y8"};
	for (int i = 0; i < 9; i++)
		y[i] = leaf(g, names[i], i == 0 ? 2 : i == 1 ? 0.5 : 1);

	const struct spec rebuilt = {
		.output = true, .recompute = true, .memory_bound = true};
	struct var ef[2] = {e, f};
	struct var c0 = op(g, "c0", PROD, ef, 2,
			   &(struct spec){.output = true, .want_self = true});
	struct var c0g[2] = {c0, gl};
	struct var m1 = op(g, "m1", SUM, c0g, 2, &rebuilt);
	struct var m1e[2] = {m1, e};
	struct var m2 = op(g, "m2", PROD, m1e, 2, &rebuilt);
	struct var m2f[2] = {m2, f};
	struct var h = op(g, "h", PROD, m2f, 2,
			  &(struct spec){.output = true,
					 .want_parent = true,
					 .want_slot = 0,
					 .nested = true});
	y[9] = m2;
	struct var bm = op(g, "bm", PROD, y, 10, &rebuilt);
	struct var hb[2] = {h, bm};
	struct var root =
		op(g, "root", PROD, hb, 2,
		   &(struct spec){.want_parent = true, .want_slot = 1});
	struct var eg[2] = {e, gl};
	op(g, "dead", PROD, eg, 2,
	   &(struct spec){.output = true, .unrun = true});
	/* 12 leaves, 7 ops; dead in a graph of its own. */
	expect_stats(g->r, 19, 7, 2, 0);

	/* A retained pass first: it rebuilds m1, m2 and bm, and keeps them
	 * for the consuming pass, which then rebuilds nothing. */
	adg_grads *grads = backward(
		g, root,
		&(adg_backward_options){.size = sizeof(adg_backward_options),
					.executor = &lazy,
					.retain = 1});
	run_deferred();
	cr_assert_eq(recomputes, 3, "N=%ld: m1, m2, bm once each", oom.fail_at);
	expect_stats(g->r, 19, 7, 2, 0);
	expect_grad(grads, e, 60);
	grads_free(grads);

	grads = backward(
		g, root,
		&(adg_backward_options){.size = sizeof(adg_backward_options),
					.executor = &lazy});
	run_deferred();
	cr_assert_eq(recomputes, 3, "N=%ld: held since", oom.fail_at);
	expect_stats(g->r, 19, 1, 1, 0);
	expect_grad(grads, e, 60);
	expect_grad(grads, f, 140);
	expect_grad(grads, gl, 20);
	for (int i = 0; i < 9; i++)
		expect_grad(grads, y[i], 50 / y[i].value);
	cr_assert_eq(grads_count(grads), 12);
	grads_free(grads);

	/* A leaf root: a container holding just the seed. */
	adg_grads *seed_only = backward(g, e, NULL);
	expect_grad(seed_only, e, 1);
	cr_assert_eq(grads_count(seed_only), 1);
	return seed_only;
}

/* The container of plain_ops, its registry gone: get, take, register
 * (adding to a held gradient, and past its capacity, so that it grows
 * with the allocator it copied), count. */
static void grads_after_registry(adg_grads *grads, const struct reg *g)
{
	const struct var *b = &g->vars[1], *c = &g->vars[2];
	void *v = NULL;
	cr_assert_eq(adg_grads_take(grads, b->id, &v), 0);
	cr_assert_eq(*(double *)v, 12);
	scalar_ops.free(v, NULL);
	cr_assert_eq(grads_count(grads), 11);
	grads_register(grads, c->id, 1);
	cr_assert_eq(grad_of(grads, c->id), 145);
	grads_register(grads, b->id, 12);
	/* Sized for the tape (64 slots for 40 entries); 72 need more. */
	const uint64_t base = UINT64_C(1) << 40;
	for (uint64_t i = 0; i < 60; i++)
		grads_register(grads, base + i, (double)i);
	cr_assert_eq(grads_count(grads), 72);
	for (uint64_t i = 0; i < 60; i++)
		cr_assert_eq(grad_of(grads, base + i), (double)i);
	cr_assert_eq(grad_of(grads, b->id), 12);
}

/* One run of the workload, failing the fail_at-th allocation. Returns
 * whether that allocation came. */
static bool run_workload(long fail_at)
{
	oom.fail_at = fail_at;
	atomic_store(&oom.seen, 0);
	atomic_store(&oom.failed, false);
	atomic_store(&oom.live_bytes, 0);
	atomic_store(&oom.bad_frees, 0);
	atomic_store(&scalar_values_live, 0);
	step_runs = step_releases = outputs_made = outputs_freed = 0;
	recomputes = hook_calls = 0;
	n_closures = 0;
	memset(output_frees, 0, sizeof output_frees);
	long enomem_before = enomem_calls;

	struct reg plain = {0}, ckpt = {0};
	adg_grads *kept = plain_ops(&plain);
	adg_grads *seed_only = checkpointed_ops(&ckpt);
	/* Each op that a backward reaches runs twice (retained, then
	 * consumed); h's nested backward runs each time, its one op once. */
	cr_assert_eq(step_runs, 2 * (15 + 6) + 2, "N=%ld", fail_at);

	/* Teardown, each container after its registry. */
	struct reg gone = plain;
	registry_free(&plain);
	grads_after_registry(kept, &gone);
	registry_free(&ckpt);
	grads_free(kept);
	grads_free(seed_only);

	int retained_runs = 0;
	for (size_t i = 0; i < n_closures; i++) {
		const struct closure *c = &closures[i];
		cr_assert_eq(c->releases, 1,
			     "N=%ld: closure %zu released %d times", fail_at, i,
			     c->releases);
		cr_assert_eq(c->runs, c->unrun ? 0 : 1 + c->retained_runs,
			     "N=%ld: closure %zu ran %d times", fail_at, i,
			     c->runs);
		cr_assert_leq(c->retained_runs, 1,
			      "N=%ld: closure %zu ran retained %d times",
			      fail_at, i, c->retained_runs);
		retained_runs += c->retained_runs;
	}
	cr_assert_eq(retained_runs, 15 + 6, "N=%ld", fail_at);
	for (long i = 0; i < outputs_made; i++)
		cr_assert_eq(output_frees[i], 1,
			     "N=%ld: output %ld freed %d times", fail_at, i,
			     output_frees[i]);
	cr_assert_eq(atomic_load(&scalar_values_live), 0,
		     "N=%ld: gradients leaked", fail_at);
	cr_assert_eq(atomic_load(&oom.live_bytes), 0,
		     "N=%ld: the allocator still holds %ld bytes", fail_at,
		     atomic_load(&oom.live_bytes));
	cr_assert_eq(atomic_load(&oom.bad_frees), 0,
		     "N=%ld: free told another size than alloc", fail_at);

	bool failed = atomic_load(&oom.failed);
	if (failed && enomem_calls == enomem_before)
		absorbed_failures++;
	return failed;
}

Test(oom, every_allocation_fails_in_turn)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long n = 1;
	while (run_workload(n)) {
		n++;
		cr_assert_lt(n, 100000, "the workload never ran clean");
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_gt(n, 1, "the workload allocated nothing");
	fprintf(stderr,
		"oom: %ld runs in %.2f s; the clean run made %ld "
		"allocations; %ld calls returned ADG_ENOMEM, %ld failures "
		"were absorbed\n",
		n,
		(double)(t1.tv_sec - t0.tv_sec) +
			(double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
		atomic_load(&oom.seen), enomem_calls, absorbed_failures);
#if defined(__SANITIZE_ADDRESS__)
	cr_assert_eq(__lsan_do_recoverable_leak_check(), 0, "heap leak");
#endif
}
