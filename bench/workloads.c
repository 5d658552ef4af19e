/*
 * The workloads: the same code drives every implementation. Each thread
 * loops until told to stop, counting what it registered and ran. Step
 * closures live in per-thread arrays that each iteration reuses: an
 * iteration's steps have all run or gone before the next begins.
 */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: per thread, deterministic by thread index */
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(2685821657736338717);
}

static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * 0x1p-53;
}

/* ------------------------------------------------------------ the steps */

/* y = a * b */
struct mul_step {
	bench_step base;
	double a, b;
};

static int mul_run(const bench_call *c, const bench_step *s)
{
	const struct mul_step *m = (const struct mul_step *)s;
	c->impl->add_grad(c, 0, c->grad * m->b);
	c->impl->add_grad(c, 1, c->grad * m->a);
	return 0;
}

/* y = sum of the parents */
static int sum_run(const bench_call *c, const bench_step *s)
{
	(void)s;
	for (size_t i = 0; i < c->n_parents; i++)
		c->impl->add_grad(c, i, c->grad);
	return 0;
}

const bench_step bench_sum_step = {sum_run};

/* y = f(x) for one parent, with f'(x) = slope */
struct unary_step {
	bench_step base;
	double slope;
};

static int unary_run(const bench_call *c, const bench_step *s)
{
	const struct unary_step *u = (const struct unary_step *)s;
	c->impl->add_grad(c, 0, c->grad * u->slope);
	return 0;
}

struct value {
	void *node;
	double v;
};

/* An op that also drops the caller's handles on the parents whose bit is
 * set in moved, as a temporary's last use does: in one call where the
 * implementation has one (adg_op_moving), else the op and the drops. */
static void *op_moving(const bench_impl *impl, void *reg, void *const *parents,
		       size_t n, uint64_t moved, const bench_step *step)
{
	if (impl->op_moving != NULL)
		return impl->op_moving(reg, parents, n, moved, step);
	void *out = impl->op(reg, parents, n, step);
	for (size_t i = 0; i < n; i++)
		if (moved >> i & 1)
			impl->unref(reg, parents[i]);
	return out;
}

static struct value mul(const bench_impl *impl, void *reg,
			struct mul_step *closure, struct value a,
			struct value b, uint64_t moved)
{
	*closure = (struct mul_step){{mul_run}, a.v, b.v};
	void *parents[2] = {a.node, b.node};
	return (struct value){
		op_moving(impl, reg, parents, 2, moved, &closure->base),
		a.v * b.v};
}

static struct value sum2(const bench_impl *impl, void *reg, struct value a,
			 struct value b, uint64_t moved)
{
	void *parents[2] = {a.node, b.node};
	return (struct value){
		op_moving(impl, reg, parents, 2, moved, &bench_sum_step),
		a.v + b.v};
}

static struct value unary(const bench_impl *impl, void *reg,
			  struct unary_step *closure, struct value x, double y,
			  double slope, uint64_t moved)
{
	*closure = (struct unary_step){{unary_run}, slope};
	return (struct value){
		op_moving(impl, reg, &x.node, 1, moved, &closure->base), y};
}

/* ----------------------------------------------- shared per-run state */

struct run {
	const bench_impl *impl;
	void *reg;
	bench_params p;
	int threads;
	struct value *params; /* shared leaves */
	int n_params;
};

static struct run *run_new(const bench_impl *impl, void *reg,
			   const bench_params *p, int threads, int n_params)
{
	struct run *r = calloc(1, sizeof *r);
	r->impl = impl;
	r->reg = reg;
	r->p = *p;
	r->threads = threads;
	r->n_params = n_params;
	r->params = calloc(n_params ? n_params : 1, sizeof *r->params);
	for (int i = 0; i < n_params; i++)
		r->params[i] =
			(struct value){impl->leaf(reg), 0.5 + 0.01 * (i % 13)};
	return r;
}

static void run_free(void *shared)
{
	struct run *r = shared;
	for (int i = 0; i < r->n_params; i++)
		r->impl->unref(r->reg, r->params[i].node);
	free(r->params);
	free(r);
}

/* Backward from root, one gradient read, everything dropped. */
static void finish(struct run *r, struct value root, void *probe,
		   bench_counts *out, uint64_t steps)
{
	void *grads;
	if (r->impl->backward(r->reg, root.node, &grads) == 0) {
		out->steps += steps;
		volatile double g = r->impl->grad(grads, r->impl->id(probe));
		(void)g;
	}
	r->impl->grads_free(grads);
	r->impl->unref(r->reg, root.node);
}

/* ------------------------------------------------------------- disjoint */

static void *disjoint_setup(const bench_impl *impl, void *reg,
			    const bench_params *p, int threads)
{
	return run_new(impl, reg, p, threads, 0);
}

/* A chain of k products over the leaves; intermediates dropped as they
 * are used, the way a trainer's temporaries go out of scope. */
static struct value chain(struct run *r, struct value *leaves, int n_leaves,
			  int k, struct mul_step *closures)
{
	struct value x = mul(r->impl, r->reg, &closures[0], leaves[0],
			     leaves[1 % n_leaves], 0);
	for (int i = 1; i < k; i++)
		x = mul(r->impl, r->reg, &closures[i], x,
			leaves[(i + 1) % n_leaves], 1); /* x's last use */
	return x;
}

/* A fan-in-2 tree of products with k - 1 nodes (k a power of two). */
static struct value tree(struct run *r, struct value *leaves, int n_leaves,
			 int k, struct mul_step *closures, struct value *level)
{
	int width = k / 2, used = 0;
	for (int i = 0; i < width; i++)
		level[i] = mul(r->impl, r->reg, &closures[used++],
			       leaves[i % n_leaves], leaves[(i + 1) % n_leaves],
			       0);
	while (width > 1) {
		for (int i = 0; i < width / 2; i++) {
			level[i] = mul(r->impl, r->reg, &closures[used++],
				       level[2 * i], level[2 * i + 1], 3);
		}
		width /= 2;
	}
	return level[0];
}

static void disjoint_thread(void *shared, int index, const atomic_int *stop,
			    bench_counts *out)
{
	struct run *r = shared;
	int k = r->p.chain, nl = r->p.leaves;
	int tk = 2;
	while (tk < k)
		tk *= 2;
	struct value *leaves = calloc(nl, sizeof *leaves);
	struct mul_step *closures = calloc(k + tk, sizeof *closures);
	struct value *level = calloc(tk, sizeof *level);
	for (int i = 0; i < nl; i++)
		leaves[i] = (struct value){r->impl->leaf(r->reg),
					   1.0 + 0.001 * (i + index)};
	out->start_ns = bench_now_ns();
	while (!atomic_load_explicit(stop, memory_order_relaxed)) {
		uint64_t t0 = bench_now_ns();
		struct value c = chain(r, leaves, nl, k, closures);
		struct value t = tree(r, leaves, nl, tk, closures + k, level);
		uint64_t t1 = bench_now_ns();
		finish(r, c, leaves[0].node, out, (uint64_t)k);
		finish(r, t, leaves[0].node, out, (uint64_t)tk - 1);
		uint64_t t2 = bench_now_ns();
		out->nodes += (uint64_t)(k + tk - 1);
		out->ops++;
		out->build_ns += t1 - t0;
		out->backward_ns += t2 - t1;
	}
	for (int i = 0; i < nl; i++)
		r->impl->unref(r->reg, leaves[i].node);
	free(leaves);
	free(closures);
	free(level);
}

/* ------------------------------------------------------- shared-params */

/* A 4-4-1 MLP on P shared parameters: 16 first-layer weights, then the
 * second layer's 4 (P is rounded up to 20), and a squared loss. */
#define MLP_IN	   4
#define MLP_HIDDEN 4

static void *shared_setup(const bench_impl *impl, void *reg,
			  const bench_params *p, int threads)
{
	int n = p->params < 20 ? 20 : p->params;
	return run_new(impl, reg, p, threads, n);
}

static void shared_thread(void *shared, int index, const atomic_int *stop,
			  bench_counts *out)
{
	struct run *r = shared;
	const bench_impl *impl = r->impl;
	uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(index + 1);
	struct mul_step muls[MLP_IN * MLP_HIDDEN + MLP_HIDDEN];
	struct unary_step acts[MLP_HIDDEN + 1];
	/* parameters used this iteration: rotate through all P */
	int offset = 0;
	out->start_ns = bench_now_ns();
	while (!atomic_load_explicit(stop, memory_order_relaxed)) {
		uint64_t t0 = bench_now_ns();
		struct value x[MLP_IN], a[MLP_HIDDEN];
		for (int i = 0; i < MLP_IN; i++)
			x[i] = (struct value){impl->leaf(r->reg),
					      rng_unit(&seed)};
		int used = 0, nodes = 0;
		for (int j = 0; j < MLP_HIDDEN; j++) {
			struct value h = {0};
			for (int i = 0; i < MLP_IN; i++) {
				struct value w = r->params[(offset + used) %
							   r->n_params];
				struct value m = mul(impl, r->reg, &muls[used],
						     w, x[i], 0);
				used++;
				nodes++;
				if (i == 0) {
					h = m;
					continue;
				}
				h = sum2(impl, r->reg, h, m, 3);
				nodes++;
			}
			double t = tanh(h.v);
			a[j] = unary(impl, r->reg, &acts[j], h, t, 1 - t * t,
				     1);
			nodes++;
		}
		struct value o = {0};
		for (int j = 0; j < MLP_HIDDEN; j++) {
			struct value w =
				r->params[(offset + used) % r->n_params];
			struct value m =
				mul(impl, r->reg, &muls[used], w, a[j], 2);
			used++;
			nodes++;
			if (j == 0) {
				o = m;
				continue;
			}
			o = sum2(impl, r->reg, o, m, 3);
			nodes++;
		}
		struct value loss = unary(impl, r->reg, &acts[MLP_HIDDEN], o,
					  o.v * o.v, 2 * o.v, 1);
		nodes++;
		for (int i = 0; i < MLP_IN; i++)
			impl->unref(r->reg, x[i].node);
		uint64_t t1 = bench_now_ns();
		finish(r, loss, r->params[offset % r->n_params].node, out,
		       (uint64_t)nodes);
		uint64_t t2 = bench_now_ns();
		offset = (offset + used) % r->n_params;
		out->nodes += (uint64_t)nodes;
		out->ops++;
		out->build_ns += t1 - t0;
		out->backward_ns += t2 - t1;
	}
}

/* ---------------------------------------------------------------- merge */

/* Four chains of four, each its own graph, joined pairwise: three merges
 * per iteration, then backward from the join. */
static void merge_thread(void *shared, int index, const atomic_int *stop,
			 bench_counts *out)
{
	struct run *r = shared;
	const bench_impl *impl = r->impl;
	struct value leaves[2] = {{impl->leaf(r->reg), 1.0 + 0.001 * index},
				  {impl->leaf(r->reg), 1.0}};
	struct mul_step closures[4 * 4 + 3];
	out->start_ns = bench_now_ns();
	while (!atomic_load_explicit(stop, memory_order_relaxed)) {
		uint64_t t0 = bench_now_ns();
		struct value part[4];
		for (int g = 0; g < 4; g++)
			part[g] = chain(r, leaves, 2, 4, &closures[4 * g]);
		struct value j1 =
			mul(impl, r->reg, &closures[16], part[0], part[1], 0);
		struct value j2 =
			mul(impl, r->reg, &closures[17], part[2], part[3], 0);
		struct value root = mul(impl, r->reg, &closures[18], j1, j2, 0);
		for (int g = 0; g < 4; g++)
			impl->unref(r->reg, part[g].node);
		impl->unref(r->reg, j1.node);
		impl->unref(r->reg, j2.node);
		uint64_t t1 = bench_now_ns();
		finish(r, root, leaves[0].node, out, 19);
		uint64_t t2 = bench_now_ns();
		out->nodes += 19;
		out->merges += 3;
		out->ops++;
		out->build_ns += t1 - t0;
		out->backward_ns += t2 - t1;
	}
	impl->unref(r->reg, leaves[0].node);
	impl->unref(r->reg, leaves[1].node);
}

static void *plain_setup(const bench_impl *impl, void *reg,
			 const bench_params *p, int threads)
{
	return run_new(impl, reg, p, threads, 0);
}

/* --------------------------------------------------------------- lookup */

/* Readers look up the graphs of probe nodes while writers merge probes
 * pairwise, run backward on the join (consuming both) and put fresh
 * probes in their slots. A replaced probe stays alive until the run ends,
 * so readers need no reference of their own. Every probe and join is
 * 1 * 1, so all of them share one read-only closure. */
#define PROBES 256

static const struct mul_step unit_product = {{mul_run}, 1.0, 1.0};

struct retired {
	void **nodes;
	size_t len, cap;
};

struct lookup_run {
	struct run base;
	void *leaf;
	_Atomic(void *) probe[PROBES];
	struct retired *retired; /* per writer */
};

static void *product(struct lookup_run *l, void *a, void *b)
{
	void *parents[2] = {a, b};
	return l->base.impl->op(l->base.reg, parents, 2, &unit_product.base);
}

static void *lookup_setup(const bench_impl *impl, void *reg,
			  const bench_params *p, int threads)
{
	struct lookup_run *l = calloc(1, sizeof *l);
	l->base = (struct run){impl, reg, *p, threads, NULL, 0};
	l->leaf = impl->leaf(reg);
	l->retired = calloc(threads, sizeof *l->retired);
	for (int i = 0; i < PROBES; i++)
		atomic_init(&l->probe[i], product(l, l->leaf, l->leaf));
	return l;
}

static void lookup_teardown(void *shared)
{
	struct lookup_run *l = shared;
	const bench_impl *impl = l->base.impl;
	for (int i = 0; i < PROBES; i++)
		impl->unref(l->base.reg, atomic_load(&l->probe[i]));
	for (int t = 0; t < l->base.threads; t++) {
		for (size_t i = 0; i < l->retired[t].len; i++)
			impl->unref(l->base.reg, l->retired[t].nodes[i]);
		free(l->retired[t].nodes);
	}
	impl->unref(l->base.reg, l->leaf);
	free(l->retired);
	free(l);
}

static void retire(struct retired *r, void *node)
{
	if (r->len == r->cap) {
		r->cap = r->cap ? 2 * r->cap : 1024;
		r->nodes = realloc(r->nodes, r->cap * sizeof *r->nodes);
		if (r->nodes == NULL)
			abort();
	}
	r->nodes[r->len++] = node;
}

static int lookup_readers(int threads)
{
	return threads == 1 ? 1 : threads / 2;
}

static void lookup_thread(void *shared, int index, const atomic_int *stop,
			  bench_counts *out)
{
	struct lookup_run *l = shared;
	const bench_impl *impl = l->base.impl;
	void *reg = l->base.reg;
	uint64_t seed = 0x2545f4914f6cdd1dull * (uint64_t)(index + 1);
	if (index < lookup_readers(l->base.threads)) {
		uint64_t sum = 0;
		out->start_ns = bench_now_ns();
		while (!atomic_load_explicit(stop, memory_order_relaxed)) {
			for (int i = 0; i < 64; i++) {
				void *n = atomic_load_explicit(
					&l->probe[rng_next(&seed) % PROBES],
					memory_order_acquire);
				sum += impl->graph_id(reg, n);
			}
			out->ops += 64;
		}
		volatile uint64_t keep = sum;
		(void)keep;
		return;
	}
	out->start_ns = bench_now_ns();
	while (!atomic_load_explicit(stop, memory_order_relaxed)) {
		int slot[2] = {(int)(rng_next(&seed) % PROBES),
			       (int)(rng_next(&seed) % PROBES)};
		if (slot[0] == slot[1])
			continue;
		uint64_t t0 = bench_now_ns();
		void *join = product(l, atomic_load(&l->probe[slot[0]]),
				     atomic_load(&l->probe[slot[1]]));
		uint64_t t1 = bench_now_ns();
		void *grads;
		if (impl->backward(reg, join, &grads) == 0)
			out->steps += 3;
		impl->grads_free(grads);
		impl->unref(reg, join);
		for (int s = 0; s < 2; s++)
			retire(&l->retired[index],
			       atomic_exchange(&l->probe[slot[s]],
					       product(l, l->leaf, l->leaf)));
		uint64_t t2 = bench_now_ns();
		out->nodes += 3;
		out->merges++;
		out->build_ns += t1 - t0;
		out->backward_ns += t2 - t1;
	}
}

/* -------------------------------------------------------------- trainer */

/* A 2-layer MLP (4 inputs, H tanh units, 1 output) learns a synthetic
 * regression target by SGD. The parameters are leaves shared by every
 * thread, updated Hogwild-style: each thread reads them when it builds its
 * graph and subtracts its gradient with plain atomic loads and stores. */
#define TR_IN 4

struct trainer_run {
	struct run base;
	int hidden;
	_Atomic double *w; /* values of base.params, in the same order */
};

static double target(const double *x)
{
	return 0.5 * sin(2 * x[0]) + 0.3 * x[1] * x[2] - 0.2 * x[3];
}

static void *trainer_setup(const bench_impl *impl, void *reg,
			   const bench_params *p, int threads)
{
	int h = p->trainer_hidden;
	int n = h * TR_IN + 2 * h + 1; /* W1, b1, W2, b2 */
	struct trainer_run *t = calloc(1, sizeof *t);
	struct run *base = run_new(impl, reg, p, threads, n);
	t->base = *base;
	free(base);
	t->hidden = h;
	t->w = calloc(n, sizeof *t->w);
	uint64_t seed = 42;
	for (int i = 0; i < n; i++)
		atomic_init(&t->w[i], (rng_unit(&seed) - 0.5) *
					      (i < h * TR_IN ? 1.0 : 0.5));
	return t;
}

static void trainer_teardown(void *shared)
{
	struct trainer_run *t = shared;
	for (int i = 0; i < t->base.n_params; i++)
		t->base.impl->unref(t->base.reg, t->base.params[i].node);
	free(t->base.params);
	free(t->w);
	free(t);
}

static void trainer_thread(void *shared, int index, const atomic_int *stop,
			   bench_counts *out)
{
	struct trainer_run *t = shared;
	const bench_impl *impl = t->base.impl;
	void *reg = t->base.reg;
	int h = t->hidden, np = t->base.n_params;
	struct value *p = t->base.params;
	double *w = calloc(np, sizeof *w);
	struct value *pv = calloc(np, sizeof *pv); /* this thread's view */
	struct unary_step *un = calloc((size_t)h * (TR_IN + 1) + 1, sizeof *un);
	struct mul_step *mu = calloc(h, sizeof *mu);
	uint64_t seed = 7 + (uint64_t)index * 7919;
	const double lr = 0.02;
	double ema = 0;
	uint64_t steps = 0;
	out->start_ns = bench_now_ns();
	while (!atomic_load_explicit(stop, memory_order_relaxed)) {
		uint64_t t0 = bench_now_ns();
		for (int i = 0; i < np; i++) {
			w[i] = atomic_load_explicit(&t->w[i],
						    memory_order_relaxed);
			pv[i] = (struct value){p[i].node, w[i]};
		}
		double x[TR_IN];
		for (int i = 0; i < TR_IN; i++)
			x[i] = 2 * rng_unit(&seed) - 1;
		const struct value *w1 = pv, *b1 = pv + h * TR_IN, *w2 = b1 + h,
				   *b2 = w2 + h;
		int nodes = 0, nu = 0;
		struct value o = {0};
		for (int j = 0; j < h; j++) {
			/* z_j = sum_i w1[j][i] x_i + b1[j] */
			struct value z = b1[j];
			bool owned = false;
			for (int i = 0; i < TR_IN; i++) {
				struct value wx = w1[j * TR_IN + i];
				wx = unary(impl, reg, &un[nu++], wx,
					   wx.v * x[i], x[i], 0);
				struct value s = sum2(impl, reg, z, wx, 0);
				nodes += 2;
				if (owned)
					impl->unref(reg, z.node);
				impl->unref(reg, wx.node);
				z = s;
				owned = true;
			}
			double a = tanh(z.v);
			struct value av =
				unary(impl, reg, &un[nu++], z, a, 1 - a * a, 0);
			impl->unref(reg, z.node);
			struct value m = mul(impl, reg, &mu[j], w2[j], av, 0);
			impl->unref(reg, av.node);
			nodes += 2;
			if (j == 0) {
				o = sum2(impl, reg, m, b2[0], 0);
			} else {
				struct value s = sum2(impl, reg, o, m, 0);
				impl->unref(reg, o.node);
				o = s;
			}
			impl->unref(reg, m.node);
			nodes++;
		}
		double err = o.v - target(x);
		struct value loss =
			unary(impl, reg, &un[nu++], o, err * err, 2 * err, 0);
		impl->unref(reg, o.node);
		nodes++;
		uint64_t t1 = bench_now_ns();
		void *grads;
		if (impl->backward(reg, loss.node, &grads) == 0) {
			for (int i = 0; i < np; i++) {
				double g =
					impl->grad(grads, impl->id(p[i].node));
				atomic_store_explicit(&t->w[i], w[i] - lr * g,
						      memory_order_relaxed);
			}
			out->steps += (uint64_t)nodes;
		}
		impl->grads_free(grads);
		impl->unref(reg, loss.node);
		uint64_t t2 = bench_now_ns();
		steps++;
		ema = steps == 1 ? err * err : 0.99 * ema + 0.01 * err * err;
		if (steps == 200)
			out->loss_first = ema;
		out->nodes += (uint64_t)nodes;
		out->ops++;
		out->build_ns += t1 - t0;
		out->backward_ns += t2 - t1;
	}
	out->loss_last = ema;
	if (steps < 200)
		out->loss_first = out->loss_last = 0; /* too short to say */
	free(w);
	free(pv);
	free(un);
	free(mu);
}

/* ---------------------------------------------------------------- idle */

double bench_idle_backward_ns(const bench_impl *impl, int idle, int ms,
			      const bench_params *p)
{
	void *reg = impl->open();
	impl->thread_begin(reg);
	struct run *r = run_new(impl, reg, p, 1, 0);
	struct value leaf = {impl->leaf(reg), 1.0};
	struct mul_step one = {{mul_run}, 1.0, 1.0};
	void **idle_nodes = calloc(idle ? idle : 1, sizeof *idle_nodes);
	for (int i = 0; i < idle; i++) {
		void *parents[2] = {leaf.node, leaf.node};
		idle_nodes[i] = impl->op(reg, parents, 2, &one.base);
	}
	int k = p->chain, nl = p->leaves;
	struct value *leaves = calloc(nl, sizeof *leaves);
	struct mul_step *closures = calloc(k, sizeof *closures);
	for (int i = 0; i < nl; i++)
		leaves[i] = (struct value){impl->leaf(reg), 1.0};
	uint64_t spent = 0, passes = 0,
		 deadline = bench_now_ns() + (uint64_t)ms * 1000000;
	bench_counts dummy = {0};
	while (passes < 3 || bench_now_ns() < deadline) {
		struct value c = chain(r, leaves, nl, k, closures);
		uint64_t t0 = bench_now_ns();
		finish(r, c, leaves[0].node, &dummy, (uint64_t)k);
		spent += bench_now_ns() - t0;
		passes++;
	}
	for (int i = 0; i < nl; i++)
		impl->unref(reg, leaves[i].node);
	for (int i = 0; i < idle; i++)
		impl->unref(reg, idle_nodes[i]);
	impl->unref(reg, leaf.node);
	free(idle_nodes);
	free(leaves);
	free(closures);
	run_free(r);
	impl->thread_end(reg);
	impl->close(reg);
	return (double)spent / (double)passes;
}

/* -------------------------------------------------------------- overlap */

/* How early parameter gradients become final, for a data-parallel
 * trainer that sends each one as soon as it is (libadg only: the hook of
 * adg_backward_with). The shared-params graph, one thread: the fraction of
 * its parameters whose gradient was final while steps were still left to
 * run, which is what an all-reduce started from the hook overlaps. */
struct overlap_count {
	int steps_run, total_steps;
	int params_ready, params_early;
	double remaining; /* sum over parameters of the steps left, as a
			     fraction of all */
	const uint64_t *param_ids;
	int n_params;
};

static struct overlap_count *overlap_now;

static int overlap_ready(uint64_t id, void **grad, void *ctx)
{
	(void)grad;
	struct overlap_count *c = ctx;
	for (int i = 0; i < c->n_params; i++)
		if (c->param_ids[i] == id) {
			c->params_ready++;
			c->params_early += c->steps_run < c->total_steps;
			c->remaining +=
				(double)(c->total_steps - c->steps_run) /
				c->total_steps;
		}
	return 0;
}

static int counting_mul_run(const bench_call *c, const bench_step *s)
{
	overlap_now->steps_run++;
	return mul_run(c, s);
}

static int counting_sum_run(const bench_call *c, const bench_step *s)
{
	overlap_now->steps_run++;
	return sum_run(c, s);
}

static int counting_unary_run(const bench_call *c, const bench_step *s)
{
	overlap_now->steps_run++;
	return unary_run(c, s);
}

double bench_overlap_fraction(const bench_params *p, int iterations,
			      double *mean_remaining)
{
	const bench_impl *impl = &bench_adg;
	void *reg = impl->open();
	struct run *r = shared_setup(impl, reg, p, 1);
	uint64_t *ids = calloc(r->n_params, sizeof *ids);
	for (int i = 0; i < r->n_params; i++)
		ids[i] = impl->id(r->params[i].node);
	struct mul_step muls[MLP_IN * MLP_HIDDEN + MLP_HIDDEN];
	struct unary_step acts[MLP_HIDDEN + 1];
	static const bench_step counting_sum = {counting_sum_run};
	int early = 0, ready = 0;
	double remaining = 0;
	for (int it = 0; it < iterations; it++) {
		/* The same MLP as shared_thread, with counting steps. */
		struct overlap_count count = {.param_ids = ids,
					      .n_params = r->n_params};
		overlap_now = &count;
		struct value x[MLP_IN], a[MLP_HIDDEN], o = {0};
		void *temps[64];
		int nt = 0, used = 0;
		for (int i = 0; i < MLP_IN; i++)
			temps[nt++] =
				(x[i] = (struct value){impl->leaf(reg), 0.5})
					.node;
		for (int j = 0; j < MLP_HIDDEN; j++) {
			struct value h = {0};
			for (int i = 0; i < MLP_IN; i++) {
				struct value m = mul(
					impl, reg, &muls[used],
					r->params[used % r->n_params], x[i], 0);
				muls[used++].base.run = counting_mul_run;
				temps[nt++] = m.node;
				count.total_steps++;
				if (i == 0) {
					h = m;
					continue;
				}
				void *pp[2] = {h.node, m.node};
				h = (struct value){
					impl->op(reg, pp, 2, &counting_sum),
					h.v + m.v};
				temps[nt++] = h.node;
				count.total_steps++;
			}
			double t = tanh(h.v);
			a[j] = unary(impl, reg, &acts[j], h, t, 1 - t * t, 0);
			acts[j].base.run = counting_unary_run;
			temps[nt++] = a[j].node;
			count.total_steps++;
		}
		for (int j = 0; j < MLP_HIDDEN; j++) {
			struct value m =
				mul(impl, reg, &muls[used],
				    r->params[used % r->n_params], a[j], 0);
			muls[used++].base.run = counting_mul_run;
			temps[nt++] = m.node;
			count.total_steps++;
			if (j == 0) {
				o = m;
				continue;
			}
			void *pp[2] = {o.node, m.node};
			o = (struct value){impl->op(reg, pp, 2, &counting_sum),
					   o.v + m.v};
			temps[nt++] = o.node;
			count.total_steps++;
		}
		struct value loss = unary(impl, reg, &acts[MLP_HIDDEN], o,
					  o.v * o.v, 2 * o.v, 0);
		acts[MLP_HIDDEN].base.run = counting_unary_run;
		count.total_steps++;
		for (int i = 0; i < nt; i++)
			impl->unref(reg, temps[i]);
		void *grads;
		if (bench_adg_backward_ready(reg, loss.node, overlap_ready,
					     &count, &grads) == 0)
			impl->grads_free(grads);
		impl->unref(reg, loss.node);
		early += count.params_early;
		ready += count.params_ready;
		remaining += count.remaining;
	}
	free(ids);
	run_free(r);
	impl->close(reg);
	*mean_remaining = ready ? remaining / ready : 0;
	return ready ? (double)early / ready : 0;
}

/* ------------------------------------------------------------ callgrind */

/* Not inlined, so that callgrind can report each phase's inclusive
 * instruction count by name. */
__attribute__((noinline)) struct value
bench_build_phase(struct run *r, struct value *leaves, int nl, int k,
		  struct mul_step *closures)
{
	return chain(r, leaves, nl, k, closures);
}

__attribute__((noinline)) void bench_backward_phase(struct run *r,
						    struct value root,
						    void *probe,
						    bench_counts *out, int k)
{
	finish(r, root, probe, out, (uint64_t)k);
}

void bench_count_phases(const bench_impl *impl, const bench_params *p,
			long iterations, bench_counts *out)
{
	void *reg = impl->open();
	impl->thread_begin(reg);
	struct run *r = run_new(impl, reg, p, 1, 0);
	int k = p->chain, nl = p->leaves;
	struct value *leaves = calloc(nl, sizeof *leaves);
	struct mul_step *closures = calloc(k, sizeof *closures);
	for (int i = 0; i < nl; i++)
		leaves[i] = (struct value){impl->leaf(reg), 1.0};
	for (long it = 0; it < iterations; it++) {
		struct value c = bench_build_phase(r, leaves, nl, k, closures);
		bench_backward_phase(r, c, leaves[0].node, out, k);
		out->nodes += (uint64_t)k;
	}
	for (int i = 0; i < nl; i++)
		impl->unref(reg, leaves[i].node);
	free(leaves);
	free(closures);
	run_free(r);
	impl->thread_end(reg);
	impl->close(reg);
}

const bench_workload bench_workloads[] = {
	{"disjoint", "nodes",
	 "each thread builds chains and fan-in-2 trees of K products on its "
	 "own leaves, then backward",
	 disjoint_setup, run_free, disjoint_thread, false, false, false},
	{"shared-params", "nodes",
	 "threads share P parameter leaves; each builds a 4-4-1 MLP-shaped "
	 "graph on them per iteration, then backward",
	 shared_setup, run_free, shared_thread, false, false, false},
	{"merge", "nodes",
	 "each thread builds four small graphs and joins them pairwise (three "
	 "merges), then backward",
	 plain_setup, run_free, merge_thread, false, false, false},
	{"lookup", "lookups",
	 "half the threads look up probe nodes' graphs while the others merge "
	 "probes, consume them and put fresh ones in their place",
	 lookup_setup, lookup_teardown, lookup_thread, true, false, false},
	{"trainer", "steps",
	 "a 2-layer MLP learns a synthetic regression target by Hogwild SGD on "
	 "shared parameters",
	 trainer_setup, trainer_teardown, trainer_thread, false, false, false},
	{"rounds", "rounds",
	 "adg only: T participants of one gradient reducer run rounds of one "
	 "double each, so that a round costs the reducer's barrier",
	 bench_rounds_setup, bench_rounds_teardown, bench_rounds_thread, false,
	 false, true},
	{"wide", "steps",
	 "adg only, 1 thread: the backward alone of B chains of L ~1 us (or "
	 "empty) steps joined at a root, sequential and on 1, 2, ... workers",
	 NULL, NULL, NULL, false, true, false},
	{"cpp", "ops",
	 "adg only, 1 thread: a chain of 1000 two-parent products recorded, "
	 "run backward and dropped, through the C API and through adg.hpp, "
	 "side by side: ns per op",
	 NULL, NULL, NULL, false, true, false},
	{"cpp-shared", "nodes",
	 "adg only, 2 threads: chains of 1000 ops through adg.hpp, parents "
	 "gathered at run time, over one shared parameter against one each, "
	 "side by side: nodes/s",
	 NULL, NULL, NULL, false, true, false},
	{"big", "nodes",
	 "adg and floor, 1 thread: one graph of 10^3 ... --big-max nodes (a "
	 "chain, and 64 chains joined at a root): ns per node and step, RSS "
	 "per node",
	 NULL, NULL, NULL, false, true, false},
};

const int bench_n_workloads =
	(int)(sizeof bench_workloads / sizeof *bench_workloads);
