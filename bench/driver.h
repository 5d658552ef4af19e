/*
 * adg-bench's driver: what its parts share.
 *
 * main.c runs them in order. cli.c reads the command line into struct
 * options; measure.c runs the cells and the one-thread checks into struct
 * results; report.c prints the table and writes the results folder,
 * targets.c judges the targets, plot.c draws the PNG; callgrind.c counts
 * instructions instead under --callgrind. stats.c reduces a cell's runs to
 * the figures the others print. The parts keep no state of their own:
 * whatever was measured travels in struct results.
 */
#ifndef ADG_BENCH_DRIVER_H
#define ADG_BENCH_DRIVER_H

#include "bench.h"

#include <stdio.h>

#define MAX_RUNS    15
#define MAX_THREADS 1024
/* The wide check: worker counts it can take (sequential is one more), and
 * the most workers one backward can have (ADG_EXECUTOR_MAX_WORKERS plus
 * the calling thread, rounded down to a power of two). */
#define WIDE_MAX_COUNTS	 9
#define WIDE_MAX_WORKERS 256

/* The implementations, in the order every report lists them. */
enum impl_id { IMPL_ADG, IMPL_SEED, IMPL_FLOOR, N_IMPLS };
extern const bench_impl *const impls[N_IMPLS];

struct options {
	bool workload_on[16];
	int threads[32], n_threads;
	bool impl_on[N_IMPLS];
	int runs, ms, idle_ms;
	bench_params p;
	const char *out_dir;
	/* ints, for getopt_long to set: --no-plot, --no-idle, ... */
	int plot, idle, checkpoint, callgrind, phases, heap_slabs;
	long iterations;
	const char *count_child; /* internal: the process callgrind runs */
	/* The wide check's worker counts, 1 first (--wide-workers). */
	int wide_workers[WIDE_MAX_COUNTS], n_wide_workers;
	/* The big check's largest graph (--big-max); its default depends
	 * on whether --workloads was given. */
	long big_max;
	bool workloads_named;
};

/* What one cell measured, run by run. It comes back from the cell's child
 * process through a pipe, so it holds no pointers. */
struct cell {
	int workload;
	enum impl_id impl;
	int threads, runs;
	double rate[MAX_RUNS];	/* workload units per second */
	double nodes[MAX_RUNS]; /* registered nodes per second */
	double merges[MAX_RUNS];
	double ns_node[MAX_RUNS], ns_step[MAX_RUNS];
	double loss_first[MAX_RUNS], loss_last[MAX_RUNS];
	long peak_rss_kb;
	bool ok;
};

#define CKPT_CHAIN 64 /* adds in the checkpoint workload's chain */

/* The wide check's modes: sequential (no executor), then each count of
 * --wide-workers; its kinds of step. */
#define WIDE_SEQ 0 /* workers[] of the sequential mode */
/* WIDE_RETAINED: empty steps, each backward a retained one. */
enum wide_kind { WIDE_WORK, WIDE_EMPTY, WIDE_RETAINED, WIDE_KINDS };

struct wide {
	int n_modes, runs;
	int workers[WIDE_MAX_COUNTS + 1]; /* WIDE_SEQ, then W: W workers */
	/* ns per step, run by run; NAN for a run that failed */
	double ns_step[WIDE_KINDS][WIDE_MAX_COUNTS + 1][MAX_RUNS];
	int branches, chain, steps; /* steps of one backward */
	long spin;		    /* multiply-adds of a ~1 us step */
	double spin_ns;		    /* their time alone */
};

/* The big check: graphs of 10^3, 10^4, ... nodes up to --big-max, each
 * as a chain and as BIG_BRANCHES chains joined at a root, for adg and
 * floor, each in a process of its own (bench_big_run). */
#define BIG_SMALLEST  1000L
#define BIG_LARGEST   10000000L /* 10^7: some 2 GB for adg */
#define BIG_MAX_SIZES 5		/* 10^3 ... 10^7 */
#define BIG_BRANCHES  64
enum big_shape { BIG_CHAIN, BIG_CHAINS, BIG_SHAPES };

struct big {
	int n_sizes; /* 0 when it did not run */
	long sizes[BIG_MAX_SIZES];
	/* by shape, implementation (seed's unused) and size */
	bench_big_result res[BIG_SHAPES][N_IMPLS][BIG_MAX_SIZES];
	bool ok[BIG_SHAPES][N_IMPLS][BIG_MAX_SIZES];
};

/* Everything a sweep measured. A one-thread figure not measured is NAN. */
struct results {
	struct cell *cells; /* in the order they ran */
	int n_cells;
	/* Backward ns with no idle graphs and with --idle-graphs, and their
	 * ratio (bench_idle_backward_ns). */
	double idle_ns[N_IMPLS][2], idle_ratio[N_IMPLS];
	/* The hook's overlap figures (bench_overlap_fraction). */
	double overlap, remaining;
	/* The checkpoint workload, per strategy (none, balanced). */
	double ckpt_rate[2];
	long ckpt_peak[2];
	/* The wide check; n_modes 0 when it did not run. */
	struct wide wide;
	struct big big;
	/* The cpp check: ns per op through the C API and through adg.hpp,
	 * run by run (alternating), and the median of each run's ratio;
	 * layer_runs 0 when it did not run. */
	double layer_ns[2][MAX_RUNS], layer_ratio;
	int layer_runs;
	/* The cpp-shared check: nodes per second of two threads, by form
	 * (enum bench_gather_form), run by run (the forms side by side in
	 * each), and the median of each run's ratio of a form to
	 * BENCH_GATHER_SEPARATE; gather_runs 0 when it did not run. */
	double gather_rate[BENCH_GATHER_FORMS][MAX_RUNS];
	double gather_ratio[BENCH_GATHER_FORMS];
	int gather_runs;
	int cores; /* cores this process may run on */
};

/* cli.c: false on a malformed command line. --help prints and exits. */
bool parse_options(int argc, char **argv, struct options *o);
void usage(FILE *f);

/* measure.c: runs the sweep and the one-thread checks, with progress on
 * stderr. The caller frees r->cells. */
void measure(const struct options *o, struct results *r);
/* The cores this process may run on (its affinity mask). */
int available_cores(void);

/* stats.c */
double median(const double *v, int n);
double vmin(const double *v, int n);
double vmax(const double *v, int n);
/* The cell after prev (NULL: the first) that ran and succeeded, or NULL. */
const struct cell *next_ok(const struct results *r, const struct cell *prev);
/* The cell (workload, impl, threads) if it ran and succeeded, or NULL. */
const struct cell *find_cell(const struct results *r, int workload,
			     enum impl_id impl, int threads);
/* A cell's median rate; NAN when it did not run. */
double rate_of(const struct results *r, int workload, enum impl_id impl,
	       int threads);
int workload_index(const char *name);
/* The wide check's median ns per step for kind at `workers` (WIDE_SEQ:
 * sequential); NAN when not measured or a run failed. */
double wide_ns(const struct results *r, enum wide_kind kind, int workers);
/* The median over the check's rounds of ns per step at `workers` over ns
 * per step at `base`, each round's two taken side by side: a slow spell
 * of the machine moves both. NAN when not measured or a run failed. */
double wide_ratio(const struct results *r, enum wide_kind kind, int workers,
		  int base);
/* The median over the check's rounds of ns per step of kind over ns per
 * step of base_kind, both at `workers`, each round's two side by side.
 * NAN when not measured or a run failed. */
double wide_kind_ratio(const struct results *r, enum wide_kind kind,
		       enum wide_kind base_kind, int workers);
/* "sequential", "1 worker", "2 workers", ... */
void wide_mode(char *buf, size_t size, int workers);
/* The big check's figures for (shape, impl, size index), or NULL when
 * not measured or failed. */
const bench_big_result *big_result(const struct results *r,
				   enum big_shape shape, enum impl_id impl,
				   int size);
/* "chain", "64 chains" */
const char *big_shape_name(enum big_shape shape);
/* "10^3", ...; any other size as a number */
void big_size(char *buf, size_t size, long n);

/* report.c */
void human(char *buf, size_t size, double v);
/* The machine and the run's shape, before the sweep's progress. */
void print_heading(const struct options *o);
/* The table, the one-thread figures and the targets. */
void print_report(const struct options *o, const struct results *r);
/* Writes the files into a new folder under --out, its path in dir;
 * returns main's exit status. */
int write_results(const struct options *o, const struct results *r, char *dir,
		  size_t size);

/* targets.c: the "Targets:" block. */
void print_targets(FILE *f, const struct results *r, int idle_graphs);

/* plot.c: the throughput PNG and its data, into dir. */
void plot(const struct options *o, const struct results *r, const char *dir);

/* callgrind.c: --callgrind, and the child process it profiles. */
int callgrind(const struct options *o);
int count_child(const struct options *o);

#endif
