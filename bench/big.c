/*
 * The big workload: one graph of N nodes (10^3 up to 10^7), for libadg
 * and the floor, one thread. What a node costs to register, a step to run
 * backward and a live node in resident memory, as the graph grows past
 * the caches: a graph that fits in L1 and one that needs a gigabyte.
 *
 * Two shapes over one leaf w: a chain, y_1 = w * w, y_{k+1} = y_k * w;
 * and 64 such chains joined at a root that sums their ends. w is 1, so
 * every value is 1 and both partials of every product are 1: each node's
 * step is bench_sum_step, one static closure for the whole graph, and the
 * gradients travel in the implementations' own containers (libadg's in
 * the pointer bits): the program allocates nothing per node beyond what
 * the implementation does. w's gradient (one per product, one more for
 * each chain's first) checks that the backward ran them all.
 *
 * The first graphs of a process are built on memory never used before
 * (cold: page faults, a heap that grows); the graphs after it reuse what
 * the first ones freed (warm). measure.c runs each (shape, N,
 * implementation) in a process of its own, so that the resident memory
 * it reads grew for that graph alone.
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* This process's resident bytes (/proc/self/statm); -1 if unreadable. */
static long resident_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	long size, resident;
	int got = f != NULL ? fscanf(f, "%ld %ld", &size, &resident) : 0;
	if (f != NULL)
		fclose(f);
	return got == 2 ? resident * sysconf(_SC_PAGESIZE) : -1;
}

/* The product nodes of a graph of n nodes: with more than one chain, one
 * of the n is the root. */
static long products(long n, int branches)
{
	return branches > 1 ? n - 1 : n;
}

/* Builds one graph of n nodes over w, each intermediate dropped once its
 * child holds it; returns its root, or NULL when a registration failed
 * (what was built stays: the process ends). */
static void *build(const bench_impl *impl, void *reg, void *w, long n,
		   int branches, void **ends)
{
	long k = products(n, branches);
	for (int b = 0; b < branches; b++) {
		long len = k / branches + (b < k % branches);
		void *y = w;
		for (long i = 0; i < len; i++) {
			void *p[2] = {y, w};
			void *z = impl->op(reg, p, 2, &bench_sum_step);
			if (z == NULL)
				return NULL;
			if (y != w)
				impl->unref(reg, y);
			y = z;
		}
		ends[b] = y;
	}
	if (branches == 1)
		return ends[0];
	void *root = impl->op(reg, ends, (size_t)branches, &bench_sum_step);
	for (int b = 0; root != NULL && b < branches; b++)
		impl->unref(reg, ends[b]);
	return root;
}

/* Backward from root and the root's unref, timed together (a consumed
 * graph is freed during its backward, but for the root); 0, or -1 when
 * it failed or w's gradient came out wrong. */
static int backward(const bench_impl *impl, void *reg, void *root, void *w,
		    long n, int branches, uint64_t *ns)
{
	void *grads = NULL;
	uint64_t t0 = bench_now_ns();
	int rc = impl->backward(reg, root, &grads);
	impl->unref(reg, root);
	*ns = bench_now_ns() - t0;
	double want = (double)(products(n, branches) + branches);
	if (rc == 0 && impl->grad(grads, impl->id(w)) != want)
		rc = -1;
	if (rc == 0)
		impl->grads_free(grads);
	return rc;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

/* The cold graphs span at least this many nodes, so that the resident
 * growth of a small graph is many pages, not one or two. */
#define COLD_NODES 100000

int bench_big_run(const bench_impl *impl, long n, int branches, int ms,
		  bench_big_result *out)
{
	if (n <= branches)
		return -1; /* every chain has a node */
	void *reg = impl->open();
	impl->thread_begin(reg);
	void *w = impl->leaf(reg);
	void **ends = calloc((size_t)branches, sizeof *ends);
	long copies = n < COLD_NODES ? (COLD_NODES + n - 1) / n : 1;
	void **roots = calloc((size_t)copies, sizeof *roots);
	if (reg == NULL || w == NULL || ends == NULL || roots == NULL)
		return -1;
	/* Cold: the copies together, held while the memory is read. */
	long rss0 = resident_bytes();
	uint64_t t0 = bench_now_ns();
	for (long c = 0; c < copies; c++)
		if ((roots[c] = build(impl, reg, w, n, branches, ends)) == NULL)
			return -1;
	uint64_t t1 = bench_now_ns();
	long rss1 = resident_bytes();
	out->cold_ns_node = (double)(t1 - t0) / ((double)copies * n);
	out->rss_node = rss0 < 0 || rss1 < 0
				? -1
				: (double)(rss1 - rss0) / ((double)copies * n);
	uint64_t ns;
	for (long c = 0; c < copies; c++)
		if (backward(impl, reg, roots[c], w, n, branches, &ns) != 0)
			return -1;
	/* Warm: one graph at a time, for ms, at least three; medians, so
	 * that a pass another process preempted moves nothing. */
	enum { MOST_PASSES = 4096 };
	uint64_t *build_ns = malloc(MOST_PASSES * sizeof *build_ns);
	uint64_t *back_ns = malloc(MOST_PASSES * sizeof *back_ns);
	if (build_ns == NULL || back_ns == NULL)
		return -1;
	int passes = 0;
	uint64_t deadline = bench_now_ns() + (uint64_t)ms * 1000000;
	while (passes < MOST_PASSES &&
	       (passes < 3 || bench_now_ns() < deadline)) {
		t0 = bench_now_ns();
		void *root = build(impl, reg, w, n, branches, ends);
		build_ns[passes] = bench_now_ns() - t0;
		if (root == NULL || backward(impl, reg, root, w, n, branches,
					     &back_ns[passes]) != 0)
			return -1;
		passes++;
	}
	qsort(build_ns, (size_t)passes, sizeof *build_ns, cmp_u64);
	qsort(back_ns, (size_t)passes, sizeof *back_ns, cmp_u64);
	out->ns_node = (double)build_ns[passes / 2] / n;
	out->ns_step = (double)back_ns[passes / 2] / n;
	out->passes = passes;
	out->copies = copies;
	impl->unref(reg, w);
	free(build_ns);
	free(back_ns);
	free(ends);
	free(roots);
	impl->thread_end(reg);
	impl->close(reg);
	return 0;
}
