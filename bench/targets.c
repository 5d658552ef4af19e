/*
 * adg-bench's targets: what libadg sets out to reach against its two
 * baselines, as one table, and the lines that judge a run against it.
 *
 * A row compares a figure of adg's with a base figure measured in the same
 * run: it holds when figure >= threshold x base (AT_LEAST), or figure <=
 * threshold x base (AT_MOST). A row whose cells were not run, or failed,
 * reads n/a, and so does a row that needs more cores than the process may
 * run on. Each line's text is made from its row, so a threshold is
 * written once, here; docs/bench.md quotes the lines.
 */
#include "driver.h"

#include <math.h>
#include <string.h>

enum figure {
	RATE,	 /* a cell's median rate, workload units per second */
	NS_NODE, /* a cell's median ns per registered node */
	IDLE,	 /* adg's backward with --idle-graphs alive over with none:
		  * already a ratio to its base, the backward with none */
	/* The wide check, whose "threads" are workers (WIDE_SEQ: the
	 * sequential path): */
	WIDE_RATE,   /* ~1 us steps per second */
	WIDE_NS,     /* ns per empty step */
	WIDE_RETAIN, /* ns per empty step retained; its base, consumed */
	/* The cpp check: ns per op through adg.hpp; its base, the C API's;
	 * judged by the median of each run's ratio (run side by side). */
	LAYER,
	/* The cpp-shared check: two threads' nodes per second over one
	 * shared parameter, gathered borrowed; its base, over a parameter
	 * each; judged by the median of each run's ratio (side by side). */
	GATHER,
	/* The big check, adg's, whose "threads" are a graph's size as a
	 * power of ten (the resident bytes' base: 0, the unit). Last, so
	 * that target_line tells them apart with >= BIG_STEP. */
	BIG_STEP,  /* ns per backward step, a chain; its base, at a size */
	BIG_STEPS, /* the same, 64 chains */
	BIG_COLD,  /* ns per node registered cold; its base, warm */
	BIG_RSS,   /* resident bytes per live node; its base, 1 byte */
};

enum direction { AT_LEAST, AT_MOST };

struct target {
	const char *workload; /* NULL for IDLE */
	enum figure figure;
	int threads;	   /* adg's cell */
	enum impl_id base; /* the base's cell: implementation, threads */
	int base_threads;
	enum direction direction;
	double threshold;
	int cores; /* the least it needs to apply; 0: any machine */
};

/* In the order they are printed. Columns: the workload, the figure, adg's
 * threads (workers, for wide), the base's implementation and threads
 * (for wide, workers: 0 is WIDE_SEQ, the sequential path), direction,
 * threshold, the cores it needs. */
/* clang-format off */
static const struct target targets[] = {
	{"disjoint",      RATE,        2, IMPL_ADG,     1, AT_LEAST, 1.8, 0},
	{"disjoint",      RATE,      128, IMPL_ADG,     2, AT_LEAST, 0.9, 0},
	{"disjoint",      RATE,       32, IMPL_SEED,   32, AT_LEAST, 2,   0},
	{"disjoint",      RATE,      128, IMPL_SEED,  128, AT_LEAST, 2,   0},
	{"shared-params", RATE,       32, IMPL_SEED,   32, AT_LEAST, 2,   0},
	{"shared-params", RATE,      128, IMPL_SEED,  128, AT_LEAST, 2,   0},
	{"disjoint",      RATE,        1, IMPL_SEED,    1, AT_LEAST, 0.8, 0},
	{"disjoint",      NS_NODE,     1, IMPL_FLOOR,   1, AT_MOST,  2,   0},
	{"shared-params", RATE,        1, IMPL_SEED,    1, AT_LEAST, 0.8, 0},
	{"shared-params", NS_NODE,     1, IMPL_FLOOR,   1, AT_MOST,  2,   0},
	{NULL,            IDLE,        1, IMPL_ADG,     1, AT_MOST,  1.2, 0},
	{"wide",          WIDE_RATE,   2, IMPL_ADG,     1, AT_LEAST, 1.7, 2},
	{"wide",          WIDE_NS,     1, IMPL_ADG,     0, AT_MOST,  1.1, 0},
	{"wide",          WIDE_RETAIN, 0, IMPL_ADG,     0, AT_MOST,  1.2, 0},
	{"big",           BIG_STEP,    6, IMPL_ADG,     3, AT_MOST,  1.5, 0},
	{"big",           BIG_STEP,    7, IMPL_ADG,     3, AT_MOST,  2,   0},
	{"big",           BIG_STEPS,   6, IMPL_ADG,     3, AT_MOST,  1.5, 0},
	{"big",           BIG_STEPS,   7, IMPL_ADG,     3, AT_MOST,  2,   0},
	{"big",           BIG_COLD,    7, IMPL_ADG,     3, AT_MOST,  2,   0},
	{"big",           BIG_RSS,     5, IMPL_ADG,     0, AT_MOST,  100, 0},
	{"cpp",           LAYER,       1, IMPL_ADG,     1, AT_MOST,  1.3, 0},
	{"cpp-shared",    GATHER,      2, IMPL_ADG,     2, AT_LEAST, 0.9, 2},
};
/* clang-format on */

/* The big check's figures of a graph of 10^exp nodes (exp 0: the unit);
 * NAN when it was not measured. base: the row's base figure. */
static double big_figure(const struct results *r, enum figure figure, int exp,
			 bool base)
{
	if (figure == BIG_RSS && base)
		return 1; /* bytes */
	long n = 1;
	for (int e = 0; e < exp; e++)
		n *= 10;
	int k = 0;
	while (k < r->big.n_sizes && r->big.sizes[k] != n)
		k++;
	const bench_big_result *b = big_result(
		r, figure == BIG_STEPS ? BIG_CHAINS : BIG_CHAIN, IMPL_ADG, k);
	if (b == NULL)
		return NAN;
	switch (figure) {
	case BIG_COLD:
		return base ? b->ns_node : b->cold_ns_node;
	case BIG_RSS:
		return b->rss_node >= 0 ? b->rss_node : NAN;
	default:
		return b->ns_step;
	}
}

/* impl's figure at threads for row t; NAN when it was not measured. */
static double figure_of(const struct results *r, const struct target *t,
			enum impl_id impl, int threads)
{
	int w = t->workload ? workload_index(t->workload) : -1;
	const struct cell *c;
	switch (t->figure) {
	case BIG_STEP:
	case BIG_STEPS:
	case BIG_COLD:
	case BIG_RSS:
		return big_figure(r, t->figure, threads, false);
	case RATE:
		return rate_of(r, w, impl, threads);
	case NS_NODE:
		c = find_cell(r, w, impl, threads);
		return c ? median(c->ns_node, c->runs) : NAN;
	case IDLE:
		return r->idle_ratio[impl];
	case WIDE_RATE:
		return 1e9 / wide_ns(r, WIDE_WORK, threads);
	case WIDE_NS:
		return wide_ns(r, WIDE_EMPTY, threads);
	case WIDE_RETAIN:
		return wide_ns(r, WIDE_RETAINED, threads);
	case LAYER: /* adg.hpp's; layer_base gives the C API's */
		return r->layer_runs > 0 ? median(r->layer_ns[1], r->layer_runs)
					 : NAN;
	case GATHER: /* one shared parameter's; its base, one each */
		return r->gather_runs > 0
			       ? median(r->gather_rate[BENCH_GATHER_SHARED],
					r->gather_runs)
			       : NAN;
	}
	return NAN;
}

static const char *plural(int n)
{
	return n == 1 ? "" : "s";
}

/* The line's text: "<what adg's figure is> <op> <threshold> x <base>". */
static void describe(char *what, size_t size, const struct target *t,
		     int idle_graphs)
{
	const char *op = t->direction == AT_LEAST ? ">=" : "<=";
	if (t->figure == IDLE) {
		snprintf(what, size,
			 "backward with %d idle graphs %s %g x with none",
			 idle_graphs, op, t->threshold);
		return;
	}
	if (t->figure == WIDE_RETAIN) {
		char mode[32];
		wide_mode(mode, sizeof mode, t->threads);
		snprintf(what, size,
			 "%s, empty steps, %s: retained backward %s %g x "
			 "consuming",
			 t->workload, mode, op, t->threshold);
		return;
	}
	if (t->figure == BIG_STEP || t->figure == BIG_STEPS) {
		snprintf(what, size,
			 "%s, %s: backward ns per step at 10^%d %s %g x at "
			 "10^%d",
			 t->workload,
			 big_shape_name(t->figure == BIG_STEPS ? BIG_CHAINS
							       : BIG_CHAIN),
			 t->threads, op, t->threshold, t->base_threads);
		return;
	}
	if (t->figure == BIG_COLD) {
		snprintf(what, size,
			 "%s, chain: ns per node registered cold at 10^%d %s "
			 "%g x warm at 10^%d",
			 t->workload, t->threads, op, t->threshold,
			 t->base_threads);
		return;
	}
	if (t->figure == LAYER) {
		snprintf(
			what, size,
			"%s, a chain of %d two-parent ops, 1 thread: ns per op "
			"through adg.hpp %s %g x the C API",
			t->workload, BENCH_LAYER_OPS, op, t->threshold);
		return;
	}
	if (t->figure == GATHER) {
		snprintf(what, size,
			 "%s, %d threads, parents gathered at run time, "
			 "borrowed: nodes/s over one shared parameter %s %g x "
			 "over one each",
			 t->workload, t->threads, op, t->threshold);
		return;
	}
	if (t->figure == BIG_RSS) {
		snprintf(what, size,
			 "%s, chain: resident bytes per live node at 10^%d %s "
			 "%g",
			 t->workload, t->threads, op, t->threshold);
		return;
	}
	if (t->figure == WIDE_RATE || t->figure == WIDE_NS) {
		char mode[32], base[32];
		wide_mode(mode, sizeof mode, t->threads);
		wide_mode(base, sizeof base, t->base_threads);
		snprintf(what, size, "%s, %s steps, %s%s %s %g x %s",
			 t->workload,
			 t->figure == WIDE_RATE ? "~1 us" : "empty", mode,
			 t->figure == WIDE_NS ? ": ns per step" : "", op,
			 t->threshold, base);
		return;
	}
	/* Against adg itself, the base is a thread count. */
	char base[32];
	snprintf(base, sizeof base, "%d thread%s", t->base_threads,
		 plural(t->base_threads));
	const char *measured = t->figure == NS_NODE ? ": ns per registered node"
			       : t->base == IMPL_ADG ? ""
						     : ": adg";
	snprintf(what, size, "%s, %d thread%s%s %s %g x %s", t->workload,
		 t->threads, plural(t->threads), measured, op, t->threshold,
		 t->base == IMPL_ADG ? base : impls[t->base]->name);
}

enum verdict { HELD, MISSED, NOT_APPLICABLE };

/* Prints row t's line; returns its verdict. */
static enum verdict target_line(FILE *f, const struct results *r,
				const struct target *t, int idle_graphs)
{
	double a = figure_of(r, t, IMPL_ADG, t->threads);
	/* A retained backward's base is the consuming one, same mode. */
	double b = t->figure == IDLE ? 1
		   : t->figure == LAYER
			   ? (r->layer_runs > 0
				      ? median(r->layer_ns[0], r->layer_runs)
				      : NAN)
		   : t->figure == GATHER
			   ? (r->gather_runs > 0
				      ? median(r->gather_rate
						       [BENCH_GATHER_SEPARATE],
					       r->gather_runs)
				      : NAN)
		   : t->figure == WIDE_RETAIN
			   ? wide_ns(r, WIDE_EMPTY, t->base_threads)
		   : t->figure >= BIG_STEP
			   ? big_figure(r, t->figure, t->base_threads, true)
			   : figure_of(r, t, t->base, t->base_threads);
	bool have = !isnan(a) && !isnan(b);
	bool applies = r->cores >= t->cores;
	/* threshold x b, not a / b: a figure on the boundary gets the
	 * verdict it always got. */
	bool holds = t->direction == AT_LEAST ? a >= t->threshold * b
					      : a <= t->threshold * b;
	/* The wide rows compare each round's two modes, run side by side:
	 * a slow spell of a shared machine then moves both. */
	double q =
		t->figure == WIDE_RATE
			? wide_ratio(r, WIDE_WORK, t->base_threads, t->threads)
		: t->figure == WIDE_NS
			? wide_ratio(r, WIDE_EMPTY, t->threads, t->base_threads)
		: t->figure == WIDE_RETAIN
			? wide_kind_ratio(r, WIDE_RETAINED, WIDE_EMPTY,
					  t->threads)
			: a / b;
	if (t->figure == LAYER)
		q = r->layer_ratio;
	if (t->figure == GATHER)
		q = r->gather_ratio[BENCH_GATHER_SHARED];
	if (t->figure == WIDE_RATE || t->figure == WIDE_NS ||
	    t->figure == WIDE_RETAIN || t->figure == LAYER ||
	    t->figure == GATHER) {
		have = have && !isnan(q);
		holds = t->direction == AT_LEAST ? q >= t->threshold
						 : q <= t->threshold;
	}
	char what[160], fig[128];
	describe(what, sizeof what, t, idle_graphs);
	switch (t->figure) {
	case RATE:
	case WIDE_RATE:
		snprintf(fig, sizeof fig, "%.2f x", q);
		break;
	case NS_NODE:
	case WIDE_NS:
	case WIDE_RETAIN:
	case BIG_STEP:
	case BIG_STEPS:
	case BIG_COLD:
	case LAYER:
		snprintf(fig, sizeof fig, "%.1f ns vs %.1f ns: %.2f x", a, b,
			 q);
		break;
	case GATHER:
		snprintf(fig, sizeof fig, "%.2fM vs %.2fM nodes/s: %.2f x",
			 a / 1e6, b / 1e6, q);
		break;
	case BIG_RSS:
		snprintf(fig, sizeof fig, "%.0f bytes", a);
		break;
	case IDLE:
		snprintf(fig, sizeof fig, "adg %.2f x (seed %.2f x)", a,
			 r->idle_ratio[IMPL_SEED]);
		break;
	}
	/* The n/a line of a per-node row has always named no workload;
	 * kept, so that the output reads as before. */
	const char *shown = what;
	if (!have && t->figure == NS_NODE)
		shown += strlen(t->workload) + 2;
	const char *verdict = !have || !applies ? "n/a"
			      : holds		? "holds"
						: "MISSED";
	if (!applies)
		fprintf(f,
			"  %-8s %s: needs %d cores, this process has %d (%s)\n",
			verdict, shown, t->cores, r->cores,
			have ? fig : "not measured");
	else
		fprintf(f, "  %-8s %s: %s\n", verdict, shown,
			have ? fig : "not measured in this run");
	return !have || !applies ? NOT_APPLICABLE : holds ? HELD : MISSED;
}

/* The plausibility check. T threads on C cores do at most min(T, C)
 * times the work of one thread alone on a core, whatever the code; a
 * cell above that was timed wrong, not run fast. The base is the fastest
 * of the 1-thread cell's runs, not its median: on a shared machine,
 * another process's load takes half of a lone thread's time, but less of
 * a process with 128 threads (the scheduler shares by thread), so a
 * 1-thread median sunk by load makes honest cells look too fast (merge,
 * floor, 4 threads on 2 cores: 2.37 x the 1-thread median, 1.71 x its
 * fastest run, in one sweep here). The margin covers a fastest run that
 * was still slowed: on this machine, quiet, no cell came within it (0.99
 * of the bound at most), while the main thread's clock put 128 threads
 * at up to 2.6 times the bound. Under a load of some 20 other processes
 * a cell can pass it even so: that run's figures are not the machine's. */
#define PLAUSIBLE_NOISE 0.15

/* A cell's median over min(T, cores) x the fastest 1-thread run of the
 * same workload and implementation; NAN without that cell. */
static double plausibility(const struct results *r, const struct cell *c,
			   double *one)
{
	const struct cell *base = find_cell(r, c->workload, c->impl, 1);
	*one = base ? vmax(base->rate, base->runs) : NAN;
	int most = c->threads < r->cores ? c->threads : r->cores;
	return median(c->rate, c->runs) / (most * *one);
}

/* Checks every cell of more than one thread: the line misses when any
 * is implausible, and each such cell gets an IMPLAUSIBLE line of its
 * own. Returns the verdict. */
static enum verdict plausibility_lines(FILE *f, const struct results *r)
{
	const struct cell *worst = NULL;
	double most = NAN, one;
	int bad = 0;
	for (const struct cell *c = next_ok(r, NULL); c; c = next_ok(r, c)) {
		double q = plausibility(r, c, &one);
		if (c->threads == 1 || isnan(q))
			continue;
		if (worst == NULL || q > most) {
			worst = c;
			most = q;
		}
		bad += q > 1 + PLAUSIBLE_NOISE;
	}
	char what[96];
	snprintf(what, sizeof what,
		 "every cell, T threads <= %g x min(T, cores) x fastest "
		 "1-thread run",
		 1 + PLAUSIBLE_NOISE);
	if (worst == NULL) {
		fprintf(f, "  %-8s %s: not measured in this run\n", "n/a",
			what);
		return NOT_APPLICABLE;
	}
	fprintf(f, "  %-8s %s: highest %.2f x (%s, %d threads, %s)",
		bad ? "MISSED" : "holds", what, most,
		bench_workloads[worst->workload].name, worst->threads,
		impls[worst->impl]->name);
	if (bad)
		fprintf(f, ", %d implausible", bad);
	fprintf(f, "\n");
	for (const struct cell *c = next_ok(r, NULL); c; c = next_ok(r, c)) {
		double q = plausibility(r, c, &one);
		if (c->threads == 1 || isnan(q) || q <= 1 + PLAUSIBLE_NOISE)
			continue;
		const bench_workload *wl = &bench_workloads[c->workload];
		double m = median(c->rate, c->runs);
		char rate[32], base[32];
		human(rate, sizeof rate, m);
		human(base, sizeof base, one);
		fprintf(f,
			"  IMPLAUSIBLE: %s, %d threads, %s: %s %s/s is %.2f x "
			"its fastest 1-thread run (%s), more than %g x min(%d, "
			"%d core%s)\n",
			wl->name, c->threads, impls[c->impl]->name, rate,
			wl->unit, m / one, base, 1 + PLAUSIBLE_NOISE,
			c->threads, r->cores, plural(r->cores));
	}
	return bad ? MISSED : HELD;
}

void print_targets(FILE *f, const struct results *r, int idle_graphs)
{
	fprintf(f, "\nTargets:\n");
	int count[3] = {0}; /* by enum verdict */
	for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
		count[target_line(f, r, &targets[i], idle_graphs)]++;
	count[plausibility_lines(f, r)]++;
	fprintf(f, "  %d held, %d missed, %d n/a\n", count[HELD], count[MISSED],
		count[NOT_APPLICABLE]);
}
