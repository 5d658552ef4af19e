/*
 * adg-bench's targets: what libadg sets out to reach against its two
 * baselines, and the lines that judge a run against them. Every figure
 * compared was measured in the same run; a target whose cells were not
 * run, or failed, reads n/a.
 */
#include "driver.h"

#include <math.h>

static void target_line(FILE *f, bool have, bool holds, const char *what,
			const char *figure)
{
	const char *verdict = !have ? "n/a" : holds ? "holds" : "MISSED";
	fprintf(f, "  %-8s %s: %s\n", verdict, what,
		have ? figure : "not measured in this run");
}

void print_targets(FILE *f, const struct results *r, int idle_graphs)
{
	int dj = workload_index("disjoint"),
	    sp = workload_index("shared-params");
	char fig[128];
	fprintf(f, "\nTargets:\n");
	double a1 = rate_of(r, dj, IMPL_ADG, 1),
	       a2 = rate_of(r, dj, IMPL_ADG, 2),
	       a128 = rate_of(r, dj, IMPL_ADG, 128);
	snprintf(fig, sizeof fig, "%.2f x", a2 / a1);
	target_line(f, !isnan(a1) && !isnan(a2), a2 >= 1.8 * a1,
		    "disjoint, 2 threads >= 1.8 x 1 thread", fig);
	snprintf(fig, sizeof fig, "%.2f x", a128 / a2);
	target_line(f, !isnan(a2) && !isnan(a128), a128 >= 0.9 * a2,
		    "disjoint, 128 threads >= 0.9 x 2 threads", fig);
	const int wls[2] = {dj, sp};
	for (int k = 0; k < 2; k++)
		for (int t = 32; t <= 128; t *= 4) {
			double a = rate_of(r, wls[k], IMPL_ADG, t),
			       s = rate_of(r, wls[k], IMPL_SEED, t);
			char what[96];
			snprintf(what, sizeof what,
				 "%s, %d threads: adg >= 2 x seed",
				 bench_workloads[wls[k]].name, t);
			snprintf(fig, sizeof fig, "%.2f x", a / s);
			target_line(f, !isnan(a) && !isnan(s), a >= 2 * s, what,
				    fig);
		}
	for (int k = 0; k < 2; k++) {
		double a = rate_of(r, wls[k], IMPL_ADG, 1),
		       s = rate_of(r, wls[k], IMPL_SEED, 1);
		char what[96];
		snprintf(what, sizeof what, "%s, 1 thread: adg >= 0.8 x seed",
			 bench_workloads[wls[k]].name);
		snprintf(fig, sizeof fig, "%.2f x", a / s);
		target_line(f, !isnan(a) && !isnan(s), a >= 0.8 * s, what, fig);
		const struct cell *ca = find_cell(r, wls[k], IMPL_ADG, 1),
				  *cf = find_cell(r, wls[k], IMPL_FLOOR, 1);
		if (ca && cf) {
			double na = median(ca->ns_node, ca->runs),
			       nf = median(cf->ns_node, cf->runs);
			snprintf(what, sizeof what,
				 "%s, 1 thread: ns per registered node <= 2 x "
				 "floor",
				 bench_workloads[wls[k]].name);
			snprintf(fig, sizeof fig, "%.1f ns vs %.1f ns: %.2f x",
				 na, nf, na / nf);
			target_line(f, true, na <= 2 * nf, what, fig);
		} else {
			target_line(f, false, false,
				    "1 thread: ns per registered node <= 2 x "
				    "floor",
				    "");
		}
	}
	char what[96];
	snprintf(what, sizeof what,
		 "backward with %d idle graphs <= 1.2 x with none",
		 idle_graphs);
	snprintf(fig, sizeof fig, "adg %.2f x (seed %.2f x)",
		 r->idle_ratio[IMPL_ADG], r->idle_ratio[IMPL_SEED]);
	target_line(f, !isnan(r->idle_ratio[IMPL_ADG]),
		    r->idle_ratio[IMPL_ADG] <= 1.2, what, fig);
}
