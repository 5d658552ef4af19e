/*
 * adg-bench: the three implementations it compares, behind one interface,
 * and the workloads that drive them.
 *
 * Every implementation runs the same step code (workloads.c): a step reads
 * its node's gradient and adds to its parents', by parent slot, through the
 * implementation's add_grad. Gradients are doubles everywhere: libadg carries
 * them inside its opaque pointers (impl_adg.c); seed and floor keep them in
 * u64map.
 */
#ifndef ADG_BENCH_H
#define ADG_BENCH_H

#include "gather.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

struct bench_impl;

/* What a step sees when it runs. */
typedef struct bench_call {
	const struct bench_impl *impl;
	/* Where add_grad sends a gradient: the gradient container (seed,
	 * floor), the step's adg_step_call (adg). */
	void *sink;
	double grad; /* this node's gradient, 0 when none arrived */
	const uint64_t *parent_ids;
	size_t n_parents;
} bench_call;

/* A step closure; workloads embed it first in their own structs. The
 * workload owns its memory, and keeps it until the backward has run or the
 * node is gone. */
typedef struct bench_step {
	int (*run)(const bench_call *call, const struct bench_step *self);
} bench_step;

/* y = the sum of its parents: each gets y's gradient (workloads.c). */
extern const bench_step bench_sum_step;

typedef struct bench_impl {
	const char *name;
	bool has_graphs; /* lookup and merge counts mean something */
	void *(*open)(void);
	void (*close)(void *reg);
	void *(*leaf)(void *reg);
	void *(*op)(void *reg, void *const *parents, size_t n,
		    const bench_step *step);
	void (*unref)(void *reg, void *node);
	/* op, then unref of the parents whose bit is set in moved, in one
	 * call (adg_op_moving); NULL: the workloads call op and unref. */
	void *(*op_moving)(void *reg, void *const *parents, size_t n,
			   uint64_t moved, const bench_step *step);
	uint64_t (*id)(void *node);
	/* Backward from root with seed 1: 0 and *grads, or nonzero. */
	int (*backward)(void *reg, void *root, void **grads);
	double (*grad)(void *grads, uint64_t id);
	void (*grads_free)(void *grads);
	/* Adds g to the gradient of the parent at slot. */
	void (*add_grad)(const bench_call *call, size_t slot, double g);
	/* The graph id of node; 0 for none. NULL where there are no graphs. */
	uint64_t (*graph_id)(void *reg, void *node);
	/* Called by each worker thread before and after its run. */
	void (*thread_begin)(void *reg);
	void (*thread_end)(void *reg);
} bench_impl;

extern const bench_impl bench_adg, bench_seed, bench_floor;

/* --heap-slabs: adg's registries get malloc and free as their allocator,
 * so that libadg maps no node slab for huge pages (adg.h, adg_allocator):
 * the other side of the huge-pages comparison. */
extern bool bench_adg_heap_slabs;

/* ---------------------------------------------------------------- u64map */

/* Open addressing, linear probing, key 0 reserved; values are 64 bits. */
typedef struct u64map {
	uint64_t *keys;
	uint64_t *vals;
	size_t cap, count;
} u64map;

void u64map_init(u64map *m, size_t expected);
void u64map_destroy(u64map *m);
void u64map_clear(u64map *m);
/* The value slot for key, inserted as 0 when absent. */
uint64_t *u64map_slot(u64map *m, uint64_t key);
/* The value slot for key, or NULL. */
uint64_t *u64map_find(const u64map *m, uint64_t key);
bool u64map_remove(u64map *m, uint64_t key, uint64_t *val);
/* Iterates: start with *pos = 0; returns false at the end. */
bool u64map_next(const u64map *m, size_t *pos, uint64_t *key, uint64_t *val);

/* The seed and floor gradient containers: a u64map whose slots hold a
 * double's bits, an absent key reading 0.0. Inline, so that neither
 * baseline pays a call the other did not; u64map_get_double fits
 * bench_impl's grad, u64map_add_slot its add_grad. */
static inline double u64map_bits_to_double(uint64_t bits)
{
	double d;
	memcpy(&d, &bits, sizeof d);
	return d;
}

static inline void u64map_add_double(void *map, uint64_t key, double v)
{
	uint64_t *slot = u64map_slot(map, key);
	double sum = u64map_bits_to_double(*slot) + v;
	memcpy(slot, &sum, sizeof sum);
}

static inline void u64map_add_slot(const bench_call *call, size_t slot,
				   double g)
{
	u64map_add_double(call->sink, call->parent_ids[slot], g);
}

static inline double u64map_get_double(void *map, uint64_t key)
{
	uint64_t *slot = u64map_find(map, key);
	return slot != NULL ? u64map_bits_to_double(*slot) : 0.0;
}

/* Removes key, returning what it held. */
static inline double u64map_take_double(u64map *m, uint64_t key)
{
	uint64_t bits = 0; /* 0.0 when absent */
	u64map_remove(m, key, &bits);
	return u64map_bits_to_double(bits);
}

/* ------------------------------------------------------------- workloads */

typedef struct bench_params {
	int chain;	 /* K: nodes per chain or tree (disjoint) */
	int leaves;	 /* leaves per chain (disjoint) */
	int params;	 /* P: shared parameter leaves (shared-params) */
	int idle_graphs; /* idle graphs alive (idle) */
	int trainer_hidden;
	int wide_branches; /* B: chains joined at the root (wide) */
	int wide_chain;	   /* L: steps per chain (wide) */
} bench_params;

/* What one thread did in one run. */
typedef struct bench_counts {
	uint64_t nodes; /* ops registered */
	uint64_t steps; /* steps run by backward */
	uint64_t ops;	/* workload units: iterations, lookups, ... */
	uint64_t merges;
	uint64_t build_ns; /* time spent registering */
	uint64_t backward_ns;
	double loss_first, loss_last; /* trainer */
	/* When its loop began, just before its first unit of work: the run's
	 * interval starts at the first thread's (measure.c). 0: not set. */
	uint64_t start_ns;
} bench_counts;

typedef struct bench_workload {
	const char *name;
	const char *unit; /* what ops counts */
	const char *about;
	/* Per run: set up shared state, tear it down. */
	void *(*setup)(const bench_impl *impl, void *reg, const bench_params *p,
		       int threads);
	void (*teardown)(void *shared);
	/* One thread's loop until *stop. */
	void (*thread)(void *shared, int index, const atomic_int *stop,
		       bench_counts *out);
	bool needs_graphs;
	/* Not a sweep workload: measured on one thread by a check of its
	 * own (measure.c), so it has no setup, teardown or thread. */
	bool check_only;
	/* Runs libadg only: it measures a part of libadg that the other
	 * implementations do not have. */
	bool adg_only;
} bench_workload;

extern const bench_workload bench_workloads[];
extern const int bench_n_workloads;

uint64_t bench_now_ns(void);

/* The idle-graphs check: ns per backward with `idle` unrelated graphs
 * alive, single thread, measured for about `ms` milliseconds. */
double bench_idle_backward_ns(const bench_impl *impl, int idle, int ms,
			      const bench_params *p);

/* libadg only: a backward whose hook is called for each leaf as its
 * gradient becomes final (adg_backward_with). */
int bench_adg_backward_ready(void *reg, void *root,
			     int (*ready)(uint64_t id, void **grad, void *ctx),
			     void *ctx, void **grads);

/* libadg only: a backward whose steps run on ex's workers and the
 * calling thread (adg_backward_with); ex NULL: the sequential path.
 * retain: a retained backward, which leaves the graph as it was. */
struct adg_executor;
int bench_adg_backward_exec(void *reg, void *root,
			    const struct adg_executor *ex, bool retain,
			    void **grads);

/* The fraction of the shared-params graph's parameter gradients that are
 * final while steps are still left to run: what a data-parallel trainer's
 * all-reduce, started from the hook, can overlap. *mean_remaining: the
 * share of the steps still to run when a gradient is final, on average. */
double bench_overlap_fraction(const bench_params *p, int iterations,
			      double *mean_remaining);

/* libadg only, one thread: builds and runs backward on a checkpointed
 * chain (a product, k adds that can rebuild their outputs, a product that
 * asks for the last) for ms milliseconds under a checkpointing strategy.
 * Returns nodes per second; *peak is the most outputs alive at once. */
double bench_checkpoint(int strategy, int k, int ms, long *peak);

/* The rounds workload (rounds.c): a gradient reducer's rounds of one
 * double per participant, T participants. */
void *bench_rounds_setup(const bench_impl *impl, void *reg,
			 const bench_params *p, int threads);
void bench_rounds_teardown(void *shared);
void bench_rounds_thread(void *shared, int index, const atomic_int *stop,
			 bench_counts *out);

/* The cpp workload, one thread: a chain of n two-parent products recorded,
 * run backward and dropped, for ms milliseconds; ns per op (recording,
 * backward and frees), or a negative value on failure. Through the C API
 * with gradients in the pointer (layer.c), and through adg.hpp with double
 * gradients and a lambda per op (layer.cpp; bench_layer_cpp_ns is NULL
 * when the bench was built without C++). */
#define BENCH_LAYER_OPS 1000
double bench_layer_c_ns(int n, int ms);
extern double (*const bench_layer_cpp)(int n, int ms);

/* The cpp-shared workload (gather.h): bench_gather_cpp_nodes, or NULL when
 * the bench was built without C++. */
extern double (*const bench_gather_cpp)(int form, int n, int ms);

/* The wide workload (wide.c; libadg only): backwards over graphs of
 * p->wide_branches chains of p->wide_chain steps joined at one root, run
 * sequentially or by 1 or more workers of a pool. */
typedef struct bench_wide bench_wide;

/* Calibrates the ~1 us step (once per process) and starts a pool for up
 * to max_workers workers. *spin: the multiply-adds of a ~1 us step;
 * *spin_ns: what that many take alone. NULL when the pool cannot start. */
bench_wide *bench_wide_open(const bench_params *p, int max_workers, long *spin,
			    double *spin_ns);
/* One run on a fresh registry: ns per step of the backward and the root's
 * last unref (each
 * graph is built untimed), over backwards for about ms milliseconds, at
 * least three after an untimed one. workers 0: sequential (adg_backward);
 * W >= 1: an executor of W - 1 of the pool's threads, the calling thread
 * the W-th. work: ~1 us steps; else empty ones. retain: each backward is
 * a retained one, and the graph goes with its handles after it. NAN if a
 * backward failed or a gradient came out wrong. *steps: the steps of one
 * backward. */
double bench_wide_run(bench_wide *w, int workers, bool work, bool retain,
		      int ms, int *steps);
void bench_wide_close(bench_wide *w);

/* The big workload (big.c): one graph of n nodes over one leaf, a chain
 * (branches 1) or `branches` chains joined at a root, on one thread. */
typedef struct bench_big_result {
	double cold_ns_node; /* registering, on memory never used before */
	double ns_node;	     /* registering, warm: median of the passes */
	double ns_step;	     /* backward and the root's unref, warm */
	double rss_node;     /* resident growth per live node, cold; -1:
				unreadable */
	int passes;	     /* warm passes */
	long copies;	     /* cold graphs, held together */
} bench_big_result;

/* Builds copies of the graph (enough for 10^5 nodes) on fresh memory,
 * timed and with the resident memory read before and after, runs their
 * backwards, then builds and runs one graph at a time for ms (at least
 * three times). 0, or -1 when a registration or backward failed or a
 * gradient came out wrong; then it leaves what it built to the process's
 * end (measure.c runs it in a process of its own). */
int bench_big_run(const bench_impl *impl, long n, int branches, int ms,
		  bench_big_result *out);

/* For callgrind: build or run backward over `iterations` chains, each in
 * a function of its own that --toggle-collect can name. */
void bench_count_phases(const bench_impl *impl, const bench_params *p,
			long iterations, bench_counts *out);

#endif
