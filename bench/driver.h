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
	int plot, idle, checkpoint, callgrind;
	long iterations;
	const char *count_child; /* internal: the process callgrind runs */
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
};

/* cli.c: false on a malformed command line. --help prints and exits. */
bool parse_options(int argc, char **argv, struct options *o);
void usage(FILE *f);

/* measure.c: runs the sweep and the one-thread checks, with progress on
 * stderr. The caller frees r->cells. */
void measure(const struct options *o, struct results *r);

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
