/*
 * adg-bench's plot: throughput against threads, one panel per workload and
 * one line per implementation, drawn by gnuplot into throughput.png; and
 * a panel for the big check, ns against the graph's size.
 *
 * The data files and plot.gp stay in the results folder beside the PNG,
 * so that the plot can be redrawn or restyled without running the sweep
 * again. Without gnuplot there is no plot, and the run still succeeds.
 */
#include "driver.h"

#include <math.h>
#include <stdlib.h>

/* Writes one implementation's points for workload w; false when it has
 * none, and then no file. */
static bool write_points(const struct options *o, const struct results *r,
			 int w, enum impl_id i, const char *dat)
{
	FILE *d = fopen(dat, "w");
	int points = 0;
	for (int t = 0; t < o->n_threads && d; t++) {
		double rate = rate_of(r, w, i, o->threads[t]);
		if (!isnan(rate)) {
			fprintf(d, "%d %.0f\n", o->threads[t], rate);
			points++;
		}
	}
	if (d)
		fclose(d);
	if (points == 0)
		remove(dat);
	return points > 0;
}

/* The big check's panel: ns per node and per step against the graph's
 * nodes, adg and floor, the chain solid and 64 chains dashed, from
 * big.dat (NaN: not measured). */
static void plot_big(FILE *gp, const struct results *r, const char *dir)
{
	static const enum impl_id which[2] = {IMPL_ADG, IMPL_FLOOR};
	char dat[1200];
	snprintf(dat, sizeof dat, "%s/big.dat", dir);
	FILE *d = fopen(dat, "w");
	if (d == NULL)
		return;
	fprintf(d, "# nodes, then per graph (chain, 64 chains) and impl (adg, "
		   "floor): ns per node, ns per step\n");
	for (int k = 0; k < r->big.n_sizes; k++) {
		fprintf(d, "%ld", r->big.sizes[k]);
		for (int sh = 0; sh < BIG_SHAPES; sh++)
			for (int i = 0; i < 2; i++) {
				const bench_big_result *b =
					big_result(r, sh, which[i], k);
				fprintf(d, " %.2f %.2f", b ? b->ns_node : NAN,
					b ? b->ns_step : NAN);
			}
		fprintf(d, "\n");
	}
	fclose(d);
	fprintf(gp, "set title 'big (1 thread)'\nset logscale x 10\n"
		    "set format x '10^{%%L}'\nset xlabel 'nodes in the graph'\n"
		    "set ylabel 'ns per node or step'\nset autoscale xfix\n"
		    "set offsets graph 0.05, graph 0.05, 0, 0\n"
		    "set key top left font ',9' samplen 2\nplot ");
	for (int sh = 0; sh < BIG_SHAPES; sh++)
		for (int i = 0; i < 2; i++)
			for (int step = 0; step < 2; step++) {
				/* 64 chains: the backward only, dashed */
				if (sh == BIG_CHAINS && !step)
					continue;
				fprintf(gp,
					"%s'%s' using 1:%d with linespoints "
					"lw 2 lc %d dt %d title '%s %s%s'",
					sh || i || step ? ", " : "", dat,
					2 + 4 * sh + 2 * i + step,
					2 * i + step + 1, sh ? 2 : 1,
					impls[which[i]]->name,
					step ? "backward" : "register",
					sh ? ", 64 chains" : "");
			}
	fprintf(gp, "\n");
}

void plot(const struct options *o, const struct results *r, const char *dir)
{
	/* Sweep workloads, and big: the others have no axis to plot on. */
	int shown = r->big.n_sizes > 0;
	for (int w = 0; w < bench_n_workloads; w++)
		shown += o->workload_on[w] && !bench_workloads[w].check_only;
	if (shown == 0)
		return;
	if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
		fprintf(stderr, "adg-bench: gnuplot not found, no plot "
				"(scripts/bench.sh installs it)\n");
		return;
	}
	char path[1200];
	snprintf(path, sizeof path, "%s/plot.gp", dir);
	FILE *gp = fopen(path, "w");
	if (gp == NULL)
		return;
	int cols = shown > 3 ? 3 : shown, rows = (shown + cols - 1) / cols;
	fprintf(gp, "set terminal png size %d,%d\n", 480 * cols, 380 * rows);
	fprintf(gp, "set output '%s/throughput.png'\n", dir);
	fprintf(gp,
		"set multiplot layout %d,%d title 'adg-bench: throughput "
		"against threads (median of %d runs)'\n",
		rows, cols, o->runs);
	fprintf(gp, "set logscale x 2\nset logscale y 10\n"
		    "set format y '%%.0s%%c'\nset key bottom left\nset grid\n"
		    "set xlabel 'threads'\n");
	for (int w = 0; w < bench_n_workloads; w++) {
		if (!o->workload_on[w] || bench_workloads[w].check_only)
			continue;
		fprintf(gp, "set title '%s'\nset ylabel '%s/s'\nplot ",
			bench_workloads[w].name, bench_workloads[w].unit);
		bool any = false;
		for (enum impl_id i = 0; i < N_IMPLS; i++) {
			char dat[1200];
			snprintf(dat, sizeof dat, "%s/%s-%s.dat", dir,
				 bench_workloads[w].name, impls[i]->name);
			if (!write_points(o, r, w, i, dat))
				continue;
			fprintf(gp,
				"%s'%s' using 1:2 with linespoints lw 2 "
				"title '%s'",
				any ? ", " : "", dat, impls[i]->name);
			any = true;
		}
		fprintf(gp, any ? "\n" : "0 notitle\n");
	}
	if (r->big.n_sizes > 0)
		plot_big(gp, r, dir);
	fprintf(gp, "unset multiplot\n");
	fclose(gp);
	char cmd[1300];
	snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", path);
	if (system(cmd) == 0)
		printf("plot: %s/throughput.png\n", dir);
}
