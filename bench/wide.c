/*
 * The wide workload (libadg only): one graph per backward, of B chains of
 * L steps, each chain from a leaf of its own, joined at one root, so that
 * the chains are independent and an executor's workers can run them at
 * once. Every step of a chain does the same fixed amount of arithmetic
 * (about 1 us, calibrated once per process) or none (empty steps: it only
 * passes its gradient on), and only the backward is timed, through the
 * root's last unref. The first
 * shows how a backward's work divides between workers; the second what
 * the scheduler costs per step, against the sequential path; the third,
 * empty steps again under a retained backward, what retaining costs
 * against consuming.
 *
 * One trainer thread. The workers are the threads of one libadg pool,
 * started once for every run, so that no run pays for starting threads.
 */
#include "bench.h"

#include <adg.h>
#include <math.h>
#include <stdlib.h>

/* ------------------------------------------------------------- the spin */

/* The multiply-adds' constants: x -> x * a + b has its fixed point at 1,
 * so from a gradient near 1 the values stay near 1, never denormal (which
 * would make the step slower on some machines than on others). */
static const double spin_a = 1 - 0x1p-20, spin_b = 0x1p-20;

/* n dependent multiply-adds from x: each needs the one before, so the
 * loop neither vectorizes nor runs its iterations side by side, and its
 * time is n times the latency of one. a and b are read from memory, so
 * the compiler cannot fold the loop away. noinline: the calibration and
 * the steps run the same code. */
__attribute__((noinline)) static double spin(double x, long n, double a,
					     double b)
{
	for (long i = 0; i < n; i++)
		x = x * a + b;
	return x;
}

static int cmp_ns(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* The median of 11 timings of spin(n), each over `reps` calls. */
static double time_spin(long n, int reps)
{
	uint64_t t[11];
	volatile double sink = 0;
	volatile double a = spin_a, b = spin_b;
	for (int k = 0; k < 11; k++) {
		uint64_t t0 = bench_now_ns();
		for (int r = 0; r < reps; r++)
			sink = spin(1.0, n, a, b);
		t[k] = bench_now_ns() - t0;
	}
	(void)sink;
	qsort(t, 11, sizeof *t, cmp_ns);
	return (double)t[5] / reps;
}

/* The multiply-adds that take 1 us on this machine, measured once: 20 ms
 * of spinning first, so that the core has left any low-power state, then
 * the median of 11 timings of 2^16. */
static long spin_per_us(double *spin_ns)
{
	static long per_us;
	static double alone;
	if (per_us == 0) {
		uint64_t warm = bench_now_ns() + 20000000;
		while (bench_now_ns() < warm)
			time_spin(1 << 12, 1);
		double ns = time_spin(1 << 16, 1);
		per_us = (long)((1 << 16) * 1000.0 / ns + 0.5);
		if (per_us < 1)
			per_us = 1;
		alone = time_spin(per_us, 100);
	}
	*spin_ns = alone;
	return per_us;
}

/* ------------------------------------------------------------ the steps */

/* y = f(x) with f'(x) = 1, after n multiply-adds (0: an empty step). All
 * the steps of a graph share one closure, read only, from any worker. */
struct spin_step {
	bench_step base;
	long n;
	double a, b;
};

static int spin_run(const bench_call *c, const bench_step *s)
{
	const struct spin_step *p = (const struct spin_step *)s;
	double x = spin(c->grad, p->n, p->a, p->b);
	/* 0 * x adds nothing (x is finite) but uses the spin's result, so
	 * that the compiler cannot drop it: without -ffast-math it may not
	 * fold 0 * x to 0. */
	c->impl->add_grad(c, 0, c->grad + 0.0 * x);
	return 0;
}

/* ------------------------------------------------------------ the runs */

struct bench_wide {
	adg_pool *pool;
	adg_executor executor; /* the pool's, all its threads offered */
	int branches, chain;
	long spin; /* multiply-adds of a ~1 us step */
};

bench_wide *bench_wide_open(const bench_params *p, int max_workers,
			    long *spin_n, double *spin_ns)
{
	bench_wide *w = calloc(1, sizeof *w);
	if (w == NULL)
		return NULL;
	/* A pool has at least one thread; with 1 worker it sits unused. */
	unsigned threads = max_workers > 1 ? (unsigned)max_workers - 1 : 1;
	if (adg_pool_new(threads, &w->pool) != 0 ||
	    adg_pool_executor(w->pool, &w->executor) != 0) {
		adg_pool_free(w->pool);
		free(w);
		return NULL;
	}
	w->branches = p->wide_branches;
	w->chain = p->wide_chain;
	w->spin = spin_per_us(spin_ns);
	*spin_n = w->spin;
	return w;
}

void bench_wide_close(bench_wide *w)
{
	if (w == NULL)
		return;
	adg_pool_free(w->pool);
	free(w);
}

/* Builds one graph: the chains from their leaves, each intermediate
 * dropped once its child holds it, then the root over the chains' ends. */
static void *build(const bench_impl *impl, void *reg, void *const *leaves,
		   int branches, int chain, const struct spin_step *step,
		   void **ends)
{
	for (int b = 0; b < branches; b++) {
		void *x = leaves[b];
		for (int i = 0; i < chain; i++) {
			void *y = impl->op(reg, &x, 1, &step->base);
			if (i > 0)
				impl->unref(reg, x);
			x = y;
		}
		ends[b] = x;
	}
	/* The root: the sum of the chains' ends. */
	void *root = impl->op(reg, ends, (size_t)branches, &bench_sum_step);
	for (int b = 0; b < branches; b++)
		impl->unref(reg, ends[b]);
	return root;
}

double bench_wide_run(bench_wide *w, int workers, bool work, bool retain,
		      int ms, int *steps)
{
	const bench_impl *impl = &bench_adg;
	adg_executor ex = w->executor;
	ex.n_workers = workers > 0 ? (unsigned)workers - 1 : 0;
	const adg_executor *use = workers > 0 ? &ex : NULL;
	struct spin_step step = {
		{spin_run}, work ? w->spin : 0, spin_a, spin_b};
	void *reg = impl->open();
	void **leaves = calloc((size_t)w->branches, sizeof *leaves);
	void **ends = calloc((size_t)w->branches, sizeof *ends);
	for (int b = 0; b < w->branches; b++)
		leaves[b] = impl->leaf(reg);
	*steps = w->branches * w->chain + 1;
	/* The median backward of the run: a pass that another process
	 * preempted (the machine is shared) does not move it. */
	enum { MOST_PASSES = 4096 };
	uint64_t *pass_ns = malloc(MOST_PASSES * sizeof *pass_ns);
	size_t timed = 0;
	uint64_t deadline = bench_now_ns() + (uint64_t)ms * 1000000;
	bool ok = pass_ns != NULL;
	for (int pass = 0; ok && timed < MOST_PASSES &&
			   (pass < 4 || bench_now_ns() < deadline);
	     pass++) {
		void *root = build(impl, reg, leaves, w->branches, w->chain,
				   &step, ends);
		void *grads = NULL;
		/* Timed through the graph's end, the root's last handle: a
		 * consumed graph has freed all but the root by then, a
		 * retained one frees it all there, so that both kinds pay
		 * for the same work. */
		uint64_t t0 = bench_now_ns();
		int rc =
			bench_adg_backward_exec(reg, root, use, retain, &grads);
		impl->unref(reg, root);
		uint64_t t1 = bench_now_ns();
		/* Every chain's slope is 1: each leaf's gradient is 1. */
		for (int b = 0; rc == 0 && b < w->branches; b++)
			if (impl->grad(grads, impl->id(leaves[b])) != 1.0)
				rc = -1;
		ok = rc == 0;
		impl->grads_free(grads);
		if (pass > 0) /* the first warms up, untimed */
			pass_ns[timed++] = t1 - t0;
	}
	for (int b = 0; b < w->branches; b++)
		impl->unref(reg, leaves[b]);
	free(leaves);
	free(ends);
	impl->close(reg);
	double ns = NAN;
	if (ok) {
		qsort(pass_ns, timed, sizeof *pass_ns, cmp_ns);
		ns = (double)pass_ns[timed / 2] / *steps;
	}
	free(pass_ns);
	return ns;
}
