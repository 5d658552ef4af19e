/*
 * adg-bench's targets: what libadg sets out to reach against its two
 * baselines, as one table, and the lines that judge a run against it.
 *
 * A row compares a figure of adg's with a base figure measured in the same
 * run: it holds when figure >= threshold x base (AT_LEAST), or figure <=
 * threshold x base (AT_MOST). A row whose cells were not run, or failed,
 * reads n/a, and so does a row that needs more cores than the process may
 * run on. Each line's text is made from its row, so a threshold is
 * written once, here; README.md quotes the lines.
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
};
/* clang-format on */

/* impl's figure at threads for row t; NAN when it was not measured. */
static double figure_of(const struct results *r, const struct target *t,
			enum impl_id impl, int threads)
{
	int w = t->workload ? workload_index(t->workload) : -1;
	const struct cell *c;
	switch (t->figure) {
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

static void target_line(FILE *f, const struct results *r,
			const struct target *t, int idle_graphs)
{
	double a = figure_of(r, t, IMPL_ADG, t->threads);
	/* A retained backward's base is the consuming one, same mode. */
	double b = t->figure == IDLE ? 1
		   : t->figure == WIDE_RETAIN
			   ? wide_ns(r, WIDE_EMPTY, t->base_threads)
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
	if (t->figure == WIDE_RATE || t->figure == WIDE_NS ||
	    t->figure == WIDE_RETAIN) {
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
		snprintf(fig, sizeof fig, "%.1f ns vs %.1f ns: %.2f x", a, b,
			 q);
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
}

void print_targets(FILE *f, const struct results *r, int idle_graphs)
{
	fprintf(f, "\nTargets:\n");
	for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
		target_line(f, r, &targets[i], idle_graphs);
}
