/* Retained backward passes (adg_backward_options.retain): they run the steps
 * they reach and take none, so later passes run them again; while one runs,
 * its nodes cannot be consumed, and every meeting of a retained and a
 * consuming backward ends with one of them refused, nothing taken.
 *
 * Steps that run on other threads count what they find wrong in their
 * probe's bad counter, which the test's own thread checks. */
#include "fixture.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

FIXTURE_SUITE(retain, .timeout = 120);

static void open_balanced(void)
{
	adg_registry_options o = {.size = sizeof o,
				  .checkpointing = ADG_CHECKPOINT_BALANCED};
	fixture_open(&o);
}

TestSuite(retain_ckpt, .init = open_balanced, .timeout = 120);
/* The stress tier (tests/meson.build splits it off). */
FIXTURE_SUITE(retain_stress, .timeout = 600);

/* -------------------------------------------------------------- executors */

/* How a test's backward passes run: on the calling thread, alone on an
 * executor with no worker, or on a pool. */
enum mode { SEQUENTIAL, ALONE, POOL, N_MODES };

struct runner {
	adg_pool *pool;
	adg_executor alone, pool_executor;
};

static int no_submit(void (*fn)(void *), void *arg, void *ctx)
{
	(void)fn, (void)arg, (void)ctx;
	return -1;
}

static void runner_open(struct runner *r, unsigned threads)
{
	cr_assert_eq(adg_pool_new(threads, &r->pool), 0);
	cr_assert_eq(adg_pool_executor(r->pool, &r->pool_executor), 0);
	r->alone = (adg_executor){.submit = no_submit, .n_workers = 0};
}

static void runner_close(struct runner *r)
{
	cr_assert_eq(adg_pool_free(r->pool), 0);
}

static const adg_executor *executor_of(struct runner *r, enum mode m)
{
	return m == SEQUENTIAL ? NULL
	       : m == ALONE    ? &r->alone
			       : &r->pool_executor;
}

/* Backward from root with seed 1, retained or not. */
static int run_backward(adg_node *root, const adg_executor *e, int retain,
			adg_grads **out)
{
	adg_backward_options o = {
		.size = sizeof o, .executor = e, .retain = retain};
	return adg_backward_with(reg, root, scalar_box(1.0), &scalar_ops, &o,
				 out);
}

/* Closed forms are exact to 1e-12. */
#define assert_near(got, want)                                                 \
	cr_assert(fabs((got) - (want)) <= 1e-12, "%s: %.17g, want %.17g",      \
		  #got, (double)(got), (double)(want))

static double grad_of(adg_grads *g, uint64_t id)
{
	void *v = NULL;
	int rc = adg_grads_get(g, id, &v);
	cr_assert_eq(rc, 0, "no gradient for %llu: %s", (unsigned long long)id,
		     adg_strerror(rc));
	return *(double *)v;
}

/* ----------------------------------------------------------------- probes */

/* A gate stops the first step that reaches it until the test opens it, so
 * that the test can act while a backward is inside a step. */
struct gate {
	atomic_int armed;
	atomic_int entered;
	atomic_int open;
};

static void gate_wait_entered(struct gate *g)
{
	while (!atomic_load(&g->entered))
		sched_yield();
}

/* A sum op (each parent gets the node's gradient) that records how it was
 * called. Safe to run on several threads at once. */
struct probe {
	atomic_int runs, retained_runs, consumed_runs, releases, bad;
	int expect_retained; /* -1: either */
	atomic_int fail;     /* nonzero: the step fails with this code */
	struct gate *gate;
};

static int probe_backward(adg_step_call *call, void *user)
{
	struct probe *p = user;
	atomic_fetch_add(&p->runs, 1);
	atomic_fetch_add(call->retained ? &p->retained_runs : &p->consumed_runs,
			 1);
	if (p->expect_retained >= 0 && call->retained != p->expect_retained)
		atomic_fetch_add(&p->bad, 1);
	if (p->gate != NULL && atomic_exchange(&p->gate->armed, 0)) {
		atomic_store(&p->gate->entered, 1);
		while (!atomic_load(&p->gate->open))
			sched_yield();
	}
	int fail = atomic_load(&p->fail);
	return fail != 0 ? fail : s_pass_on(call);
}

static void probe_release(void *user)
{
	struct probe *p = user;
	atomic_fetch_add(&p->releases, 1);
	atomic_fetch_sub(&scalar_steps_live, 1);
}

/* A sum of a and b whose step is p. */
static scalar s_probe(struct probe *p, scalar a, scalar b)
{
	scalar y = {.value = a.value + b.value};
	adg_node *parents[2] = {a.node, b.node};
	atomic_fetch_add(&scalar_steps_live, 1);
	adg_step step = {.backward = probe_backward,
			 .release = probe_release,
			 .user = p,
			 .name = "probe"};
	cr_assert_eq(adg_op(reg, parents, 2, &step, &y.node), 0);
	cr_assert_eq(adg_node_id(y.node, &y.id), 0);
	return y;
}

/* ------------------------------------------------------------------ graph */

/* f = (x*y + x) * y, with a probe for the sum:
 * df/dx = (y + 1) * y, df/dy = x*y + x + x*y. */
struct fgraph {
	scalar x, y, xy, sum, f;
	struct probe probe;
};

static void fgraph_build(struct fgraph *g, double x, double y)
{
	g->probe.expect_retained = -1;
	g->x = s_leaf(reg, x);
	g->y = s_leaf(reg, y);
	g->xy = s_mul(reg, g->x, g->y);
	g->sum = s_probe(&g->probe, g->xy, g->x);
	g->f = s_mul(reg, g->sum, g->y);
}

static void fgraph_check(struct fgraph *g, adg_grads *out)
{
	double x = g->x.value, y = g->y.value;
	assert_near(grad_of(out, g->x.id), (y + 1) * y);
	assert_near(grad_of(out, g->y.id), x * y + x + x * y);
	size_t n = 0;
	cr_assert_eq(adg_grads_count(out, &n), 0);
	cr_assert_eq(n, 2, "only the leaves' gradients are left");
}

static void fgraph_drop(struct fgraph *g)
{
	s_drop(g->x);
	s_drop(g->y);
	s_drop(g->xy);
	s_drop(g->sum);
	s_drop(g->f);
}

/* 2 leaves, 3 ops in one graph, none consumed. */
static void assert_whole(void)
{
	assert_stats(reg, 5, 3, 1);
}

/* ------------------------------------------------------------------ tests */

CHECKED_TEST(retain, runs_again_then_consumes)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		struct fgraph g = {0};
		fgraph_build(&g, 1.5, -0.75);
		uint64_t graph = s_graph(g.f);
		for (int pass = 0; pass < 3; pass++) {
			adg_grads *out;
			cr_assert_eq(run_backward(g.f.node, e, 1, &out), 0);
			fgraph_check(&g, out);
			cr_assert_eq(adg_grads_free(out), 0);
			assert_whole();
			cr_assert_eq(s_graph(g.f), graph);
		}
		cr_assert_eq(atomic_load(&g.probe.retained_runs), 3);
		adg_grads *out;
		cr_assert_eq(run_backward(g.f.node, e, 0, &out), 0);
		fgraph_check(&g, out);
		cr_assert_eq(adg_grads_free(out), 0);
		cr_assert_eq(atomic_load(&g.probe.consumed_runs), 1);
		cr_assert_eq(atomic_load(&g.probe.releases), 1);
		assert_stats(reg, 5, 0, 0);
		/* Consumed: a retained pass finds nothing to run. */
		cr_assert_eq(run_backward(g.f.node, e, 1, &out), ADG_ECONSUMED);
		cr_assert_null(out);
		cr_assert_eq(atomic_load(&g.probe.bad), 0);
		fgraph_drop(&g);
	}
	runner_close(&r);
}

CHECKED_TEST(retain, from_another_node_of_the_graph)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		struct fgraph g = {0};
		fgraph_build(&g, 2.0, 3.0);
		adg_grads *out;
		cr_assert_eq(run_backward(g.f.node, e, 1, &out), 0);
		fgraph_check(&g, out);
		cr_assert_eq(adg_grads_free(out), 0);
		/* d(xy + x)/dx = y + 1, d/dy = x */
		cr_assert_eq(run_backward(g.sum.node, e, 1, &out), 0);
		assert_near(grad_of(out, g.x.id), 4.0);
		assert_near(grad_of(out, g.y.id), 2.0);
		cr_assert_eq(adg_grads_free(out), 0);
		assert_whole();
		/* Consuming the middle leaves f with a consumed parent. */
		cr_assert_eq(run_backward(g.sum.node, e, 0, &out), 0);
		cr_assert_eq(adg_grads_free(out), 0);
		assert_stats(reg, 5, 1, 1);
		cr_assert_eq(run_backward(g.f.node, e, 1, &out),
			     ADG_EUNAVAILABLE);
		cr_assert_null(out);
		assert_stats(reg, 5, 1, 1);
		fgraph_drop(&g);
	}
	runner_close(&r);
}

CHECKED_TEST(retain, a_leaf_root_gives_its_seed)
{
	scalar x = s_leaf(reg, 1.0);
	adg_grads *out;
	cr_assert_eq(run_backward(x.node, NULL, 1, &out), 0);
	assert_near(grad_of(out, x.id), 1.0);
	cr_assert_eq(adg_grads_free(out), 0);
	s_drop(x);
}

CHECKED_TEST(retain, a_failing_step_releases_nothing)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		struct fgraph g = {0};
		fgraph_build(&g, 1.0, 2.0);
		atomic_store(&g.probe.fail, -77);
		adg_grads *out;
		cr_assert_eq(run_backward(g.f.node, e, 1, &out), -77);
		cr_assert_null(out);
		assert_whole();
		cr_assert_eq(scalar_values_live, 0);
		atomic_store(&g.probe.fail, 0);
		cr_assert_eq(run_backward(g.f.node, e, 0, &out), 0);
		fgraph_check(&g, out);
		cr_assert_eq(adg_grads_free(out), 0);
		cr_assert_eq(atomic_load(&g.probe.releases), 1);
		fgraph_drop(&g);
	}
	runner_close(&r);
}

/* Counts on_ready calls by id: f's graph has 5 ids (2 leaves, 3 ops). */
struct ready_count {
	uint64_t ids[5];
	atomic_int calls[5];
	atomic_int unknown;
};

static int count_ready(uint64_t id, void **grad, void *ctx)
{
	struct ready_count *c = ctx;
	(void)grad;
	for (int i = 0; i < 5; i++) {
		if (c->ids[i] == id) {
			atomic_fetch_add(&c->calls[i], 1);
			return 0;
		}
	}
	atomic_fetch_add(&c->unknown, 1);
	return 0;
}

CHECKED_TEST(retain, the_ready_hook_fires_once_per_node_each_pass)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		for (int leaves_only = 0; leaves_only < 2; leaves_only++) {
			struct fgraph g = {0};
			fgraph_build(&g, 0.5, 4.0);
			/* Two retained passes, then a consuming one. */
			for (int pass = 0; pass < 3; pass++) {
				struct ready_count c = {
					.ids = {g.x.id, g.y.id, g.xy.id,
						g.sum.id, g.f.id}};
				adg_backward_options o = {
					.size = sizeof o,
					.on_ready = count_ready,
					.on_ready_ctx = &c,
					.leaves_only = leaves_only,
					.executor =
						executor_of(&r, (enum mode)m),
					.retain = pass < 2,
				};
				adg_grads *out;
				cr_assert_eq(adg_backward_with(reg, g.f.node,
							       scalar_box(1.0),
							       &scalar_ops, &o,
							       &out),
					     0);
				fgraph_check(&g, out);
				cr_assert_eq(adg_grads_free(out), 0);
				for (int i = 0; i < 5; i++)
					cr_assert_eq(c.calls[i],
						     i < 2 || !leaves_only,
						     "node %d: %d calls", i,
						     c.calls[i]);
				cr_assert_eq(c.unknown, 0);
			}
			fgraph_drop(&g);
		}
	}
	runner_close(&r);
}

/* ------------------------------------------------- a retained pass inside */

/* A backward on a thread of its own, from root. */
struct bg {
	pthread_t thread;
	adg_node *root;
	const adg_executor *executor;
	int retain;
	int rc;
	adg_grads *out;
};

static void *bg_run(void *arg)
{
	struct bg *b = arg;
	b->rc = run_backward(b->root, b->executor, b->retain, &b->out);
	return NULL;
}

static void bg_start(struct bg *b)
{
	cr_assert_eq(pthread_create(&b->thread, NULL, bg_run, b), 0);
}

static void bg_join(struct bg *b)
{
	cr_assert_eq(pthread_join(b->thread, NULL), 0);
}

/* f's graph and another child of the probe's node (sum * sum, off f's
 * tape), with a backward from f on a thread of its own, held inside the
 * probe's step. */
struct gated {
	struct fgraph g;
	struct gate gate;
	scalar other;
	struct bg b;
};

static void gated_start(struct gated *x, const adg_executor *e, int retain)
{
	*x = (struct gated){.gate = {.armed = 1}};
	fgraph_build(&x->g, 1.25, 0.5);
	x->g.probe.gate = &x->gate;
	x->other = s_mul(reg, x->g.sum, x->g.sum);
	x->b = (struct bg){
		.root = x->g.f.node, .executor = e, .retain = retain};
	bg_start(&x->b);
	gate_wait_entered(&x->gate);
}

/* Lets the held backward go on; it must succeed, whole. */
static void gated_finish(struct gated *x)
{
	atomic_store(&x->gate.open, 1);
	bg_join(&x->b);
	cr_assert_eq(x->b.rc, 0);
	fgraph_check(&x->g, x->b.out);
	cr_assert_eq(adg_grads_free(x->b.out), 0);
}

static void gated_drop(struct gated *x)
{
	cr_assert_eq(atomic_load(&x->g.probe.bad), 0);
	s_drop(x->other);
	fgraph_drop(&x->g);
}

CHECKED_TEST(retain, a_consuming_backward_is_refused_while_one_runs)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		struct gated x;
		gated_start(&x, e, 1);
		adg_grads *out;
		cr_assert_eq(run_backward(x.g.f.node, e, 0, &out),
			     ADG_EUNAVAILABLE);
		cr_assert_null(out);
		cr_assert_eq(run_backward(x.other.node, e, 0, &out),
			     ADG_EUNAVAILABLE);
		cr_assert_null(out);
		cr_assert_eq(run_backward(x.g.xy.node, NULL, 0, &out),
			     ADG_EUNAVAILABLE);
		/* Nothing taken: 2 leaves, 4 ops, all live. */
		assert_stats(reg, 6, 4, 1);
		/* Another retained pass runs meanwhile, to its end. */
		cr_assert_eq(run_backward(x.g.f.node, e, 1, &out), 0);
		fgraph_check(&x.g, out);
		cr_assert_eq(adg_grads_free(out), 0);
		gated_finish(&x);
		/* Over: the consuming backward goes through. */
		cr_assert_eq(run_backward(x.other.node, e, 0, &out), 0);
		cr_assert_eq(adg_grads_free(out), 0);
		cr_assert_eq(run_backward(x.g.f.node, e, 0, &out),
			     ADG_EUNAVAILABLE, "other took the probe's node");
		gated_drop(&x);
	}
	runner_close(&r);
}

CHECKED_TEST(retain, a_retained_backward_is_refused_by_a_consuming_one)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		struct gated x;
		gated_start(&x, e, 0);
		adg_grads *out;
		cr_assert_eq(run_backward(x.g.f.node, e, 1, &out),
			     ADG_ECONSUMED);
		cr_assert_null(out);
		cr_assert_eq(run_backward(x.other.node, e, 1, &out),
			     ADG_EUNAVAILABLE);
		cr_assert_null(out);
		gated_finish(&x);
		/* other was left as it was: live, its step unrun. */
		assert_stats(reg, 6, 1, 1);
		gated_drop(&x);
	}
	runner_close(&r);
}

/* -------------------------------------------------------- checkpointing */

/* y = x * w whose output is memory bound (the balanced strategy drops it
 * at once), and z = y * y whose step asks for y's output. */
static int rebuild_product(adg_recompute_call *call, void *user)
{
	struct prod_step *s = user;
	call->output = s_output_new(s->values[0] * s->values[1]);
	return 0;
}

static int square_backward(adg_step_call *call, void *user)
{
	struct prod_step *s = user;
	atomic_fetch_add(&s->runs, 1);
	void *y = NULL;
	int rc = adg_output_get(call, call->parent_ids[0], &y);
	if (rc != 0)
		return rc;
	if (call->grad == NULL)
		return 0;
	double g = *(double *)call->grad, v = *(double *)y;
	for (int k = 0; k < 2; k++) {
		rc = adg_step_give(call, k, scalar_box(g * v));
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* z = y * y over y = x * w (x = 3, w = 2), y's output memory bound and
 * asked for by z's step. */
struct squared {
	scalar x, w;
	adg_node *y, *z;
};

static void squared_build_with(struct squared *q, adg_recompute_fn rebuild)
{
	q->x = s_leaf(reg, 3.0);
	q->w = s_leaf(reg, 2.0);
	scalar f[2] = {q->x, q->w};
	adg_output yo = {
		.free = s_output_free, .recompute = rebuild, .memory_bound = 1};
	adg_op_options yopt = {.size = sizeof yopt, .output = &yo};
	adg_step ystep = {.backward = prod_backward,
			  .release = prod_release,
			  .user = prod_step_new(f, 2)};
	adg_node *yparents[2] = {q->x.node, q->w.node};
	cr_assert_eq(adg_op_with(reg, yparents, 2, &ystep, &yopt, &q->y), 0);
	scalar yv = {.node = q->y, .value = 6.0};
	scalar zf[2] = {yv, yv};
	uint32_t want[1] = {0};
	adg_op_options zopt = {
		.size = sizeof zopt, .want_parents = want, .n_want_parents = 1};
	adg_step zstep = {.backward = square_backward,
			  .release = prod_release,
			  .user = prod_step_new(zf, 2)};
	adg_node *zparents[2] = {q->y, q->y};
	cr_assert_eq(adg_op_with(reg, zparents, 2, &zstep, &zopt, &q->z), 0);
	cr_assert_eq(scalar_outputs_live, 0, "dropped at once");
}

static void squared_build(struct squared *q)
{
	squared_build_with(q, rebuild_product);
}

/* A retained backward from z, checked. */
static int squared_backward(struct squared *q, const adg_executor *e,
			    int retain)
{
	adg_grads *out;
	int rc = run_backward(q->z, e, retain, &out);
	if (rc != 0)
		return rc;
	/* z = (xw)^2: dz/dx = 2 x w^2, dz/dw = 2 w x^2 */
	void *gx = NULL, *gw = NULL;
	if (adg_grads_get(out, q->x.id, &gx) != 0 ||
	    adg_grads_get(out, q->w.id, &gw) != 0 ||
	    fabs(*(double *)gx - 24.0) > 1e-12 ||
	    fabs(*(double *)gw - 36.0) > 1e-12)
		rc = -1;
	adg_grads_free(out);
	return rc;
}

static void squared_drop(struct squared *q)
{
	cr_assert_eq(adg_node_unref(q->z), 0);
	cr_assert_eq(adg_node_unref(q->y), 0);
	s_drop(q->x);
	s_drop(q->w);
}

CHECKED_TEST(retain_ckpt, a_rebuilt_output_stays_until_consumed)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		atomic_store(&scalar_outputs_made, 0);
		struct squared q;
		squared_build(&q);
		for (int pass = 0; pass < 3; pass++) {
			cr_assert_eq(squared_backward(&q, e, pass < 2), 0);
			/* Rebuilt once, by the first pass, and held since;
			 * the consuming pass frees it. */
			cr_assert_eq(scalar_outputs_made, 1);
			cr_assert_eq(scalar_outputs_live, pass < 2);
		}
		squared_drop(&q);
	}
	runner_close(&r);
}

CHECKED_TEST(retain_ckpt, a_node_freed_after_retained_passes_frees_its_output)
{
	struct squared q;
	squared_build(&q);
	adg_grads *out;
	cr_assert_eq(run_backward(q.z, NULL, 1, &out), 0);
	cr_assert_eq(adg_grads_free(out), 0);
	cr_assert_eq(scalar_outputs_live, 1);
	/* Never consumed: the nodes' end frees the output (the fixture
	 * checks that nothing is left). */
	squared_drop(&q);
}

/* What nesting_rebuild's backward runs on: set by the test (one thread). */
static struct {
	struct squared inner;
	const adg_executor *executor;
	atomic_int rc;
} nesting;

/* y's rebuild that first runs a retained backward of its own, which
 * rebuilds an output too: no lock may be held across a recompute. */
static int nesting_rebuild(adg_recompute_call *call, void *user)
{
	int rc = squared_backward(&nesting.inner, nesting.executor, 1);
	if (rc != 0)
		atomic_store(&nesting.rc, rc);
	return rc != 0 ? rc : rebuild_product(call, user);
}

CHECKED_TEST(retain_ckpt, a_rebuild_may_run_a_retained_backward)
{
	struct runner r;
	runner_open(&r, 2);
	for (int m = 0; m < N_MODES; m++) {
		const adg_executor *e = executor_of(&r, (enum mode)m);
		struct squared q;
		squared_build(&nesting.inner);
		nesting.executor = e;
		squared_build_with(&q, nesting_rebuild);
		cr_assert_eq(squared_backward(&q, e, 1), 0);
		cr_assert_eq(atomic_load(&nesting.rc), 0);
		cr_assert_eq(scalar_outputs_live, 2, "both rebuilt, held");
		cr_assert_eq(squared_backward(&q, e, 0), 0);
		cr_assert_eq(scalar_outputs_live, 1, "the inner one held");
		squared_drop(&q);
		squared_drop(&nesting.inner);
		cr_assert_eq(scalar_outputs_live, 0);
	}
	runner_close(&r);
}

/* ----------------------------------------------------------------- stress */

/* Four threads start retained passes over one freshly built graph at once,
 * each on its own pool or none: they may all find y's output missing and
 * rebuild it; one copy is kept, the others freed. */
struct rebuild_race {
	struct squared q;
	struct runner runners[4];
	pthread_barrier_t start;
	int round;
	atomic_int wrong;
};

static void *rebuild_racer(void *arg)
{
	struct thread *t = arg;
	struct rebuild_race *s = t->s;
	enum mode m = (enum mode)((s->round + t->i) % N_MODES);
	pthread_barrier_wait(&s->start);
	if (squared_backward(&s->q, executor_of(&s->runners[t->i], m), 1) != 0)
		atomic_fetch_add(&s->wrong, 1);
	return NULL;
}

CHECKED_TEST(retain_stress, retained_passes_rebuild_one_output_at_once)
{
	struct rebuild_race s = {0};
	pthread_barrier_init(&s.start, NULL, 4);
	for (int i = 0; i < 4; i++)
		runner_open(&s.runners[i], 2);
	for (int round = 0; round < 200; round++) {
		s.round = round;
		atomic_store(&scalar_outputs_made, 0);
		squared_build(&s.q);
		run_threads(4, rebuild_racer, &s);
		cr_assert_eq(s.wrong, 0);
		cr_assert_eq(scalar_outputs_live, 1, "one copy kept");
		long made = atomic_load(&scalar_outputs_made);
		cr_assert(made >= 1 && made <= 4, "%ld rebuilds", made);
		cr_assert_eq(squared_backward(&s.q, NULL, 0), 0);
		cr_assert_eq(scalar_outputs_made, made, "the kept one served");
		cr_assert_eq(scalar_outputs_live, 0);
		squared_drop(&s.q);
	}
	for (int i = 0; i < 4; i++)
		runner_close(&s.runners[i]);
	pthread_barrier_destroy(&s.start);
}

/* Threads run retained passes over one graph from two roots at once, each
 * on its own pool or none; every pass must give the whole, right result.
 * Then one consuming pass takes it all. */
struct shared_graph {
	struct fgraph g;
	struct runner runners[4];
	atomic_int wrong;
};

static void *retained_passes(void *arg)
{
	struct thread *t = arg;
	struct shared_graph *s = t->s;
	struct fgraph *g = &s->g;
	for (int i = 0; i < 200; i++) {
		enum mode m = (enum mode)((t->i + i) % N_MODES);
		adg_node *root = i % 2 ? g->f.node : g->sum.node;
		adg_grads *out;
		int rc = run_backward(root, executor_of(&s->runners[t->i], m),
				      1, &out);
		if (rc != 0) {
			atomic_fetch_add(&s->wrong, 1);
			continue;
		}
		double x = g->x.value, y = g->y.value;
		double want_x = i % 2 ? (y + 1) * y : y + 1;
		double want_y = i % 2 ? 2 * x * y + x : x;
		void *gx = NULL, *gy = NULL;
		if (adg_grads_get(out, g->x.id, &gx) != 0 ||
		    adg_grads_get(out, g->y.id, &gy) != 0 ||
		    fabs(*(double *)gx - want_x) > 1e-12 ||
		    fabs(*(double *)gy - want_y) > 1e-12)
			atomic_fetch_add(&s->wrong, 1);
		adg_grads_free(out);
	}
	return NULL;
}

CHECKED_TEST(retain_stress, retained_passes_run_at_once)
{
	struct shared_graph s = {0};
	fgraph_build(&s.g, 0.25, -2.0);
	for (int i = 0; i < 4; i++)
		runner_open(&s.runners[i], 2);
	run_threads(4, retained_passes, &s);
	cr_assert_eq(s.wrong, 0);
	cr_assert_eq(s.g.probe.bad, 0);
	cr_assert_eq(s.g.probe.retained_runs, 4 * 200);
	assert_whole();
	adg_grads *out;
	cr_assert_eq(run_backward(s.g.f.node, NULL, 0, &out), 0);
	fgraph_check(&s.g, out);
	cr_assert_eq(adg_grads_free(out), 0);
	for (int i = 0; i < 4; i++)
		runner_close(&s.runners[i]);
	fgraph_drop(&s.g);
}

/* Every pairing of a retained (R) and a consuming (C) backward, from the
 * same root or from two roots that share nodes, raced on two threads,
 * each on its own pool or none. Each backward either succeeds with the
 * whole result or is refused (ADG_ECONSUMED or ADG_EUNAVAILABLE) with
 * nothing taken: at most one consuming backward goes through, each step
 * is released once, and a retained one that was refused is so only
 * because a consuming one took its nodes. */
struct pairing {
	struct fgraph g;
	scalar other; /* sum * sum: shares sum, xy with f */
	int retain[2];
	int same_root;
	struct runner runners[2];
	int round;
	pthread_barrier_t start;
	int rc[2];
	adg_grads *out[2];
};

static void *pairing_side(void *arg)
{
	struct thread *t = arg;
	struct pairing *p = t->s;
	adg_node *root =
		t->i == 0 || p->same_root ? p->g.f.node : p->other.node;
	enum mode m = (enum mode)((p->round + t->i) % N_MODES);
	pthread_barrier_wait(&p->start);
	p->rc[t->i] = run_backward(root, executor_of(&p->runners[t->i], m),
				   p->retain[t->i], &p->out[t->i]);
	return NULL;
}

CHECKED_TEST(retain_stress, every_pairing_of_retained_and_consuming_races)
{
	struct pairing p = {0};
	pthread_barrier_init(&p.start, NULL, 2);
	for (int i = 0; i < 2; i++)
		runner_open(&p.runners[i], 2);
	for (int round = 0; round < 400; round++) {
		p.round = round;
		p.retain[0] = round & 1;
		p.retain[1] = (round >> 1) & 1;
		p.same_root = (round >> 2) & 1;
		p.g = (struct fgraph){0};
		fgraph_build(&p.g, 1.0 + round % 5, 0.5);
		p.other = s_mul(reg, p.g.sum, p.g.sum);
		run_threads(2, pairing_side, &p);
		int consumed = 0;
		for (int i = 0; i < 2; i++) {
			adg_node *root = i == 0 || p.same_root ? p.g.f.node
							       : p.other.node;
			if (p.rc[i] == 0) {
				consumed += !p.retain[i];
				if (root == p.g.f.node)
					fgraph_check(&p.g, p.out[i]);
				cr_assert_eq(adg_grads_free(p.out[i]), 0);
				continue;
			}
			cr_assert(p.rc[i] == ADG_EUNAVAILABLE ||
					  p.rc[i] == ADG_ECONSUMED,
				  "round %d side %d: %s", round, i,
				  adg_strerror(p.rc[i]));
			cr_assert_null(p.out[i]);
			/* Refused: the other one took or was running over
			 * the nodes, and so went through. */
			cr_assert_eq(p.rc[1 - i], 0, "round %d: both refused",
				     round);
			cr_assert(!p.retain[i] || !p.retain[1 - i],
				  "round %d: a retained pass refused another",
				  round);
		}
		cr_assert(consumed <= 1);
		cr_assert_eq(p.g.probe.bad, 0);
		/* The probe's step ran once per successful pass that holds
		 * it, and was released by the one consuming pass, if any. */
		cr_assert_eq(p.g.probe.releases, consumed);
		/* Take what is left, so that every step ends released. */
		adg_grads *out;
		if (run_backward(p.other.node, NULL, 0, &out) == 0)
			adg_grads_free(out);
		if (run_backward(p.g.f.node, NULL, 0, &out) == 0)
			adg_grads_free(out);
		s_drop(p.other);
		fgraph_drop(&p.g);
		cr_assert_eq(p.g.probe.releases, 1);
	}
	for (int i = 0; i < 2; i++)
		runner_close(&p.runners[i]);
	pthread_barrier_destroy(&p.start);
}
