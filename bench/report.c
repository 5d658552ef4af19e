/*
 * adg-bench's report: the table and the one-thread figures on stdout, and
 * the results folder (bench.csv, bench.json, table.txt, summary.md).
 *
 * Every ratio compares medians measured in the same run on the same
 * machine, never figures from another run. The formats are read by people
 * and scripts, and docs/bench.md quotes summary.md: change a column or a key
 * only on purpose.
 */
#include "driver.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void human(char *buf, size_t size, double v)
{
	if (isnan(v))
		snprintf(buf, size, "-");
	else if (v >= 1e9)
		snprintf(buf, size, "%.2fG", v / 1e9);
	else if (v >= 1e6)
		snprintf(buf, size, "%.2fM", v / 1e6);
	else if (v >= 1e3)
		snprintf(buf, size, "%.1fk", v / 1e3);
	else
		snprintf(buf, size, "%.0f", v);
}

static void ratio(char *buf, size_t size, double a, double b)
{
	if (isnan(a) || isnan(b) || b == 0)
		snprintf(buf, size, "-");
	else
		snprintf(buf, size, "%.2f", a / b);
}

/* A ratio already taken, or "-". */
static void ratio_of(char *buf, size_t size, double q)
{
	ratio(buf, size, q, 1);
}

static void machine_line(FILE *f)
{
	char model[256] = "unknown cpu";
	FILE *ci = fopen("/proc/cpuinfo", "r");
	char line[512];
	while (ci && fgets(line, sizeof line, ci)) {
		if (strncmp(line, "model name", 10) == 0) {
			char *v = strchr(line, ':');
			if (v) {
				snprintf(model, sizeof model, "%s", v + 2);
				model[strcspn(model, "\n")] = 0;
			}
			break;
		}
	}
	if (ci)
		fclose(ci);
	fprintf(f, "machine: %s, %ld cores online\n", model,
		sysconf(_SC_NPROCESSORS_ONLN));
}

void print_heading(const struct options *o)
{
	machine_line(stdout);
	printf("%d runs of %d ms per cell; rates are medians; ratios compare "
	       "medians measured in this run\n\n",
	       o->runs, o->ms);
}

static void print_table(FILE *f, const struct results *r)
{
	fprintf(f, "%-13s %4s %-5s %15s %17s %6s %6s %6s %8s %8s %7s\n",
		"workload", "thr", "impl", "median/s", "min-max", "xseed",
		"xfloor", "x1thr", "ns/node", "ns/step", "rss MB");
	for (int i = 0; i < r->n_cells; i++) {
		const struct cell *c = &r->cells[i];
		if (!c->ok) {
			fprintf(f, "%-13s %4d %-5s   (failed)\n",
				bench_workloads[c->workload].name, c->threads,
				impls[c->impl]->name);
			continue;
		}
		const bench_workload *wl = &bench_workloads[c->workload];
		double m = median(c->rate, c->runs);
		char med[32], lo[16], hi[16], rs[16], rf[16], r1[16], range[40];
		char unit_rate[48];
		human(med, sizeof med, m);
		snprintf(unit_rate, sizeof unit_rate, "%s %s", med, wl->unit);
		human(lo, sizeof lo, vmin(c->rate, c->runs));
		human(hi, sizeof hi, vmax(c->rate, c->runs));
		snprintf(range, sizeof range, "%s-%s", lo, hi);
		ratio(rs, sizeof rs, m,
		      rate_of(r, c->workload, IMPL_SEED, c->threads));
		ratio(rf, sizeof rf, m,
		      rate_of(r, c->workload, IMPL_FLOOR, c->threads));
		ratio(r1, sizeof r1, m, rate_of(r, c->workload, c->impl, 1));
		if (c->impl == IMPL_SEED)
			snprintf(rs, sizeof rs, "-");
		if (c->impl == IMPL_FLOOR)
			snprintf(rf, sizeof rf, "-");
		fprintf(f,
			"%-13s %4d %-5s %15s %17s %6s %6s %6s %8.1f %8.1f "
			"%7.1f",
			wl->name, c->threads, impls[c->impl]->name, unit_rate,
			range, rs, rf, r1, median(c->ns_node, c->runs),
			median(c->ns_step, c->runs), c->peak_rss_kb / 1024.0);
		if (median(c->loss_first, c->runs) > 0)
			fprintf(f, "  loss %.4f -> %.4f",
				median(c->loss_first, c->runs),
				median(c->loss_last, c->runs));
		if (median(c->merges, c->runs) > 0 &&
		    strcmp(wl->name, "merge") == 0)
			fprintf(f, "  %.2fM merges/s",
				median(c->merges, c->runs) / 1e6);
		fprintf(f, "\n");
	}
}

/* The wide check's shape, in the words every report uses; sep goes
 * between its three parts. */
static void wide_about(FILE *f, const struct results *r, const char *sep)
{
	const struct wide *w = &r->wide;
	fprintf(f,
		"adg only (seed and floor have no executor), 1 trainer "
		"thread, %d core%s available;%sone graph per backward of %d "
		"chains of %d steps joined at a root (%d steps), built "
		"untimed;%sns per step of the backward and the root's unref, "
		"medians of %d "
		"alternating runs",
		r->cores, r->cores == 1 ? "" : "s", sep, w->branches, w->chain,
		w->steps, sep, w->runs);
}

/* The scheduler's cost per step: empty steps on 1 worker against the
 * sequential path. */
static void wide_cost(FILE *f, const struct results *r, const char *sep)
{
	const struct wide *w = &r->wide;
	double seq = wide_ns(r, WIDE_EMPTY, WIDE_SEQ);
	double one = wide_ns(r, WIDE_EMPTY, 1);
	fprintf(f,
		"a ~1 us step is %ld dependent multiply-adds here (%.0f ns "
		"alone);%sscheduling cost (empty steps, 1 worker against "
		"sequential): %+.1f ns per step (%.2f x)",
		w->spin, w->spin_ns, sep, one - seq,
		wide_ratio(r, WIDE_EMPTY, 1, WIDE_SEQ));
}

/* ns with one decimal, or "-" for a figure not measured (a failed run). */
static void ns(char *buf, size_t size, double v)
{
	if (isnan(v))
		snprintf(buf, size, "-");
	else
		snprintf(buf, size, "%.1f", v);
}

/* One mode's cells of the wide table, as text. */
struct wide_row {
	char name[32], work[32], speedup[16], empty[32], cost[16];
	char retained[32], retain_cost[16];
};

static struct wide_row wide_row(const struct results *r, int workers)
{
	struct wide_row c;
	wide_mode(c.name, sizeof c.name, workers);
	ns(c.work, sizeof c.work, wide_ns(r, WIDE_WORK, workers));
	ratio_of(c.speedup, sizeof c.speedup,
		 wide_ratio(r, WIDE_WORK, 1, workers));
	ns(c.empty, sizeof c.empty, wide_ns(r, WIDE_EMPTY, workers));
	ratio_of(c.cost, sizeof c.cost,
		 wide_ratio(r, WIDE_EMPTY, workers, WIDE_SEQ));
	ns(c.retained, sizeof c.retained, wide_ns(r, WIDE_RETAINED, workers));
	ratio_of(c.retain_cost, sizeof c.retain_cost,
		 wide_kind_ratio(r, WIDE_RETAINED, WIDE_EMPTY, workers));
	return c;
}

/* Per mode: ns per ~1 us step and its speedup against 1 worker, ns per
 * empty step and its ratio to sequential, ns per empty step retained and
 * its ratio to consumed. */
static void print_wide(FILE *f, const struct results *r)
{
	const struct wide *w = &r->wide;
	fprintf(f, "\nwide: ");
	wide_about(f, r, "\n  ");
	fprintf(f, ":\n  %-12s %14s %10s %14s %10s %14s %10s\n", "workers",
		"ns/~1us step", "x1worker", "ns/empty step", "xseq",
		"ns/retained", "xconsumed");
	for (int m = 0; m < w->n_modes; m++) {
		struct wide_row c = wide_row(r, w->workers[m]);
		fprintf(f, "  %-12s %14s %10s %14s %10s %14s %10s\n", c.name,
			c.work, c.speedup, c.empty, c.cost, c.retained,
			c.retain_cost);
	}
	fprintf(f, "  ");
	wide_cost(f, r, "\n  ");
	fprintf(f, "\n");
}

/* The big check's shape, in the words every report uses. */
static void big_about(FILE *f, const struct results *r, const char *sep)
{
	char most[16];
	big_size(most, sizeof most, r->big.sizes[r->big.n_sizes - 1]);
	fprintf(f,
		"adg and floor, 1 thread, each graph in a process of its "
		"own;%sone graph of N nodes (10^3 to %s) over one leaf: a "
		"chain, or %d chains joined at a root;%sregister: ns per node, "
		"the median of the builds after the cold ones (cold: the "
		"first, on memory never used before, enough graphs for 10^5 "
		"nodes);%sbackward: ns per step of the "
		"backward and the root's unref, the same passes;%sRSS: "
		"resident growth per live node over the cold graphs",
		sep, most, BIG_BRANCHES, sep, sep, sep);
}

/* One size's figures of the big table, as text: per implementation (adg,
 * floor) warm and cold ns per node, ns per step, bytes per node. */
struct big_row {
	char n[16], reg[2][16], cold[2][16], step[2][16], bytes[2][16];
};

static struct big_row big_row(const struct results *r, enum big_shape sh, int k)
{
	static const enum impl_id which[2] = {IMPL_ADG, IMPL_FLOOR};
	struct big_row c;
	big_size(c.n, sizeof c.n, r->big.sizes[k]);
	for (int i = 0; i < 2; i++) {
		const bench_big_result *b = big_result(r, sh, which[i], k);
		ns(c.reg[i], sizeof c.reg[i], b ? b->ns_node : NAN);
		ns(c.cold[i], sizeof c.cold[i], b ? b->cold_ns_node : NAN);
		ns(c.step[i], sizeof c.step[i], b ? b->ns_step : NAN);
		if (b && b->rss_node >= 0)
			snprintf(c.bytes[i], sizeof c.bytes[i], "%.0f",
				 b->rss_node);
		else
			snprintf(c.bytes[i], sizeof c.bytes[i], "-");
	}
	return c;
}

/* ns per backward step at size k over at the smallest; NAN when either
 * is missing. */
static double big_growth(const struct results *r, enum big_shape sh,
			 enum impl_id impl, int k)
{
	const bench_big_result *a = big_result(r, sh, impl, k);
	const bench_big_result *b = big_result(r, sh, impl, 0);
	return a && b ? a->ns_step / b->ns_step : NAN;
}

/* "Backward ns per step, 10^6 nodes over 10^3: chain adg 1.10 x, ...":
 * for 10^6, and for the largest size when it is another. */
static void big_growth_lines(FILE *f, const struct results *r,
			     const char *indent)
{
	const struct big *b = &r->big;
	char lo[16], hi[16], q[4][16];
	big_size(lo, sizeof lo, b->sizes[0]);
	for (int k = 1; k < b->n_sizes; k++) {
		if (b->sizes[k] != 1000000 && k != b->n_sizes - 1)
			continue;
		big_size(hi, sizeof hi, b->sizes[k]);
		for (int sh = 0; sh < BIG_SHAPES; sh++) {
			ratio_of(q[2 * sh], sizeof q[0],
				 big_growth(r, sh, IMPL_ADG, k));
			ratio_of(q[2 * sh + 1], sizeof q[0],
				 big_growth(r, sh, IMPL_FLOOR, k));
		}
		fprintf(f,
			"%sBackward ns per step, %s nodes over %s: %s adg %s "
			"x, floor %s x; %s adg %s x, floor %s x.\n",
			indent, hi, lo, big_shape_name(BIG_CHAIN), q[0], q[1],
			big_shape_name(BIG_CHAINS), q[2], q[3]);
	}
}

static void print_big(FILE *f, const struct results *r)
{
	fprintf(f, "\nbig: ");
	big_about(f, r, "\n  ");
	fprintf(f, ":\n  %-9s %5s | %9s %8s %9s %7s | %9s %8s %9s %7s\n",
		"graph", "N", "adg reg", "cold", "backward", "B/node",
		"floor reg", "cold", "backward", "B/node");
	for (int sh = 0; sh < BIG_SHAPES; sh++)
		for (int k = 0; k < r->big.n_sizes; k++) {
			struct big_row c = big_row(r, sh, k);
			fprintf(f,
				"  %-9s %5s | %9s %8s %9s %7s | %9s %8s %9s "
				"%7s\n",
				big_shape_name(sh), c.n, c.reg[0], c.cold[0],
				c.step[0], c.bytes[0], c.reg[1], c.cold[1],
				c.step[1], c.bytes[1]);
		}
	big_growth_lines(f, r, "  ");
}

/* The cpp check's line: C API and adg.hpp side by side. */
static void print_layer(FILE *f, const struct results *r, const char *before)
{
	fprintf(f,
		"%scpp (a chain of %d two-parent ops recorded, run backward "
		"and dropped; 1 thread): %.1f ns per op through the C API, "
		"%.1f through adg.hpp: %.2f x (median of %d rounds' "
		"ratios)\n",
		before, BENCH_LAYER_OPS, median(r->layer_ns[0], r->layer_runs),
		median(r->layer_ns[1], r->layer_runs), r->layer_ratio,
		r->layer_runs);
}

/* The cpp-shared check's line: the three forms side by side. */
static void print_gather(FILE *f, const struct results *r, const char *before)
{
	int n = r->gather_runs;
	fprintf(f,
		"%scpp-shared (2 threads, chains of %d ops through adg.hpp, "
		"parents {y, a parameter} gathered at run time, recorded, run "
		"backward and dropped): a parameter each %.2fM nodes/s; one "
		"shared, borrowed (std::vector<node_ref>) %.2fM: %.2f x; one "
		"shared, copied handles (std::vector<node>) %.2fM: %.2f x "
		"(medians of %d rounds' ratios)\n",
		before, BENCH_GATHER_OPS,
		median(r->gather_rate[BENCH_GATHER_SEPARATE], n) / 1e6,
		median(r->gather_rate[BENCH_GATHER_SHARED], n) / 1e6,
		r->gather_ratio[BENCH_GATHER_SHARED],
		median(r->gather_rate[BENCH_GATHER_COPIED], n) / 1e6,
		r->gather_ratio[BENCH_GATHER_COPIED], n);
}

void print_report(const struct options *o, const struct results *r)
{
	print_table(stdout, r);
	if (!isnan(r->ckpt_rate[0]))
		printf("\ncheckpoint (adg, a product, %d adds, a product; 1 "
		       "thread): none %.2fM nodes/s, peak %ld outputs alive; "
		       "balanced %.2fM nodes/s, peak %ld\n",
		       CKPT_CHAIN, r->ckpt_rate[0] / 1e6, r->ckpt_peak[0],
		       r->ckpt_rate[1] / 1e6, r->ckpt_peak[1]);
	if (!isnan(r->overlap))
		printf("\nshared-params, adg_backward_with's hook: %.0f%% of "
		       "the parameter gradients are final (and could be sent) "
		       "while steps are still left to run; on average %.0f%% "
		       "of the steps are left when one is\n",
		       100 * r->overlap, 100 * r->remaining);
	if (o->idle) {
		printf("\nbackward of a %d-node chain, 1 thread, with %d idle "
		       "graphs alive vs none:\n",
		       o->p.chain, o->p.idle_graphs);
		for (enum impl_id i = 0; i < N_IMPLS; i++)
			if (!isnan(r->idle_ratio[i]))
				printf("  %-5s %9.0f ns -> %12.0f ns  (%.2f "
				       "x)\n",
				       impls[i]->name, r->idle_ns[i][0],
				       r->idle_ns[i][1], r->idle_ratio[i]);
	}
	if (r->big.n_sizes > 0)
		print_big(stdout, r);
	if (r->wide.n_modes > 0)
		print_wide(stdout, r);
	if (r->layer_runs > 0)
		print_layer(stdout, r, "\n");
	if (r->gather_runs > 0)
		print_gather(stdout, r, "\n");
	print_targets(stdout, r, o->p.idle_graphs);
}

static void write_csv(FILE *f, const struct options *o, const struct results *r)
{
	(void)o;
	fprintf(f, "workload,threads,impl,unit,median,min,max,nodes_per_s,"
		   "merges_per_s,ns_per_node,ns_per_step,peak_rss_kb,"
		   "loss_first,loss_last,runs\n");
	for (const struct cell *c = next_ok(r, NULL); c; c = next_ok(r, c)) {
		fprintf(f,
			"%s,%d,%s,%s,%.0f,%.0f,%.0f,%.0f,%.0f,%.2f,%.2f,%ld,"
			"%.6f,%.6f,%d\n",
			bench_workloads[c->workload].name, c->threads,
			impls[c->impl]->name, bench_workloads[c->workload].unit,
			median(c->rate, c->runs), vmin(c->rate, c->runs),
			vmax(c->rate, c->runs), median(c->nodes, c->runs),
			median(c->merges, c->runs), median(c->ns_node, c->runs),
			median(c->ns_step, c->runs), c->peak_rss_kb,
			median(c->loss_first, c->runs),
			median(c->loss_last, c->runs), c->runs);
	}
}

/* A JSON number with `digits` decimals, or null for a figure not
 * measured. */
static void json_number(FILE *f, int digits, double v)
{
	if (isnan(v))
		fprintf(f, "null");
	else
		fprintf(f, "%.*f", digits, v);
}

/* "wide": its shape, then a mode per entry: workers (0 and executor
 * false: sequential), and per kind of step the median and each run's ns
 * per step. */
static void write_json_wide(FILE *f, const struct results *r)
{
	const struct wide *w = &r->wide;
	static const char *const kinds[WIDE_KINDS] = {"work", "empty",
						      "retained"};
	fprintf(f,
		",\n  \"wide\": {\"branches\": %d, \"chain\": %d, "
		"\"steps\": %d, \"spin_madds\": %ld, \"spin_ns\": %.1f, "
		"\"cores\": %d, \"modes\": [",
		w->branches, w->chain, w->steps, w->spin, w->spin_ns, r->cores);
	for (int m = 0; m < w->n_modes; m++) {
		fprintf(f, "%s\n    {\"workers\": %d, \"executor\": %s",
			m ? "," : "", w->workers[m],
			w->workers[m] == WIDE_SEQ ? "false" : "true");
		for (int k = 0; k < WIDE_KINDS; k++) {
			fprintf(f, ", \"%s\": {\"ns_per_step\": ", kinds[k]);
			json_number(f, 2, wide_ns(r, k, w->workers[m]));
			fprintf(f, ", \"runs\": [");
			for (int i = 0; i < w->runs; i++) {
				fprintf(f, "%s", i ? ", " : "");
				json_number(f, 2, w->ns_step[k][m][i]);
			}
			fprintf(f, "]}");
		}
		fprintf(f, ", \"speedup_vs_1_worker\": ");
		json_number(f, 3, wide_ratio(r, WIDE_WORK, 1, w->workers[m]));
		fprintf(f, ", \"empty_vs_sequential\": ");
		json_number(f, 3,
			    wide_ratio(r, WIDE_EMPTY, w->workers[m], WIDE_SEQ));
		fprintf(f, ", \"retained_vs_consumed\": ");
		json_number(f, 3,
			    wide_kind_ratio(r, WIDE_RETAINED, WIDE_EMPTY,
					    w->workers[m]));
		fprintf(f, "}");
	}
	fprintf(f, "\n  ]}");
}

/* "big": a graph per entry: shape, nodes, and per implementation its
 * figures (null where not measured or failed). */
static void write_json_big(FILE *f, const struct results *r)
{
	const struct big *b = &r->big;
	static const enum impl_id which[2] = {IMPL_ADG, IMPL_FLOOR};
	fprintf(f, ",\n  \"big\": {\"branches\": %d, \"graphs\": [",
		BIG_BRANCHES);
	bool first = true;
	for (int sh = 0; sh < BIG_SHAPES; sh++)
		for (int k = 0; k < b->n_sizes; k++) {
			fprintf(f, "%s\n    {\"graph\": \"%s\", \"nodes\": %ld",
				first ? "" : ",", big_shape_name(sh),
				b->sizes[k]);
			first = false;
			for (int i = 0; i < 2; i++) {
				const bench_big_result *x =
					big_result(r, sh, which[i], k);
				fprintf(f, ", \"%s\": ", impls[which[i]]->name);
				if (x == NULL) {
					fprintf(f, "null");
					continue;
				}
				fprintf(f,
					"{\"register_ns_per_node\": %.2f, "
					"\"register_cold_ns_per_node\": %.2f, "
					"\"backward_ns_per_step\": %.2f, "
					"\"backward_vs_smallest\": ",
					x->ns_node, x->cold_ns_node,
					x->ns_step);
				json_number(f, 3,
					    big_growth(r, sh, which[i], k));
				fprintf(f, ", \"rss_bytes_per_node\": ");
				json_number(f, 1,
					    x->rss_node >= 0 ? x->rss_node
							     : NAN);
				fprintf(f,
					", \"passes\": %d, \"cold_graphs\": "
					"%ld}",
					x->passes, x->copies);
			}
			fprintf(f, "}");
		}
	fprintf(f, "\n  ]}");
}

/* The cpp-shared check: each form's nodes per second, run by run, and
 * its ratio to the separate form. */
static void write_json_gather(FILE *f, const struct results *r)
{
	static const char *const names[BENCH_GATHER_FORMS] = {
		[BENCH_GATHER_SEPARATE] = "separate",
		[BENCH_GATHER_SHARED] = "shared_borrowed",
		[BENCH_GATHER_COPIED] = "shared_copied",
	};
	fprintf(f, ",\n  \"cpp_shared\": {\"ops_per_chain\": %d",
		BENCH_GATHER_OPS);
	for (int form = 0; form < BENCH_GATHER_FORMS; form++) {
		fprintf(f, ", \"%s\": {\"nodes_per_s\": [", names[form]);
		for (int k = 0; k < r->gather_runs; k++)
			fprintf(f, "%s%.0f", k ? ", " : "",
				r->gather_rate[form][k]);
		fprintf(f, "], \"median_ratio\": ");
		json_number(f, 3, r->gather_ratio[form]);
		fprintf(f, "}");
	}
	fprintf(f, "}");
}

static void write_json(FILE *f, const struct options *o,
		       const struct results *r)
{
	fprintf(f, "{\n  \"cells\": [\n");
	bool first = true;
	for (const struct cell *c = next_ok(r, NULL); c; c = next_ok(r, c)) {
		fprintf(f,
			"%s    {\"workload\": \"%s\", \"threads\": %d, "
			"\"impl\": \"%s\", \"unit\": \"%s\", \"runs\": [",
			first ? "" : ",\n", bench_workloads[c->workload].name,
			c->threads, impls[c->impl]->name,
			bench_workloads[c->workload].unit);
		for (int k = 0; k < c->runs; k++)
			fprintf(f, "%s%.0f", k ? ", " : "", c->rate[k]);
		fprintf(f,
			"], \"median\": %.0f, \"nodes_per_s\": %.0f, "
			"\"ns_per_node\": %.2f, \"ns_per_step\": %.2f, "
			"\"peak_rss_kb\": %ld, \"loss_first\": %.6f, "
			"\"loss_last\": %.6f}",
			median(c->rate, c->runs), median(c->nodes, c->runs),
			median(c->ns_node, c->runs),
			median(c->ns_step, c->runs), c->peak_rss_kb,
			median(c->loss_first, c->runs),
			median(c->loss_last, c->runs));
		first = false;
	}
	fprintf(f, "\n  ],\n  \"idle\": {\"graphs\": %d", o->p.idle_graphs);
	for (enum impl_id i = 0; i < N_IMPLS; i++)
		if (!isnan(r->idle_ratio[i]))
			fprintf(f,
				", \"%s\": {\"ns_none\": %.0f, "
				"\"ns_idle\": %.0f, \"ratio\": %.3f}",
				impls[i]->name, r->idle_ns[i][0],
				r->idle_ns[i][1], r->idle_ratio[i]);
	fprintf(f, "}");
	if (!isnan(r->ckpt_rate[0]))
		fprintf(f,
			",\n  \"checkpoint\": {\"chain\": %d, \"none\": "
			"{\"nodes_per_s\": %.0f, \"peak_outputs\": %ld}, "
			"\"balanced\": {\"nodes_per_s\": %.0f, "
			"\"peak_outputs\": %ld}}",
			CKPT_CHAIN, r->ckpt_rate[0], r->ckpt_peak[0],
			r->ckpt_rate[1], r->ckpt_peak[1]);
	if (!isnan(r->overlap))
		fprintf(f,
			",\n  \"overlap\": {\"early_fraction\": %.4f, "
			"\"mean_steps_left\": %.4f}",
			r->overlap, r->remaining);
	if (r->big.n_sizes > 0)
		write_json_big(f, r);
	if (r->wide.n_modes > 0)
		write_json_wide(f, r);
	if (r->gather_runs > 0)
		write_json_gather(f, r);
	fprintf(f, "\n}\n");
}

static void write_table(FILE *f, const struct options *o,
			const struct results *r)
{
	(void)o;
	machine_line(f);
	print_table(f, r);
}

/* The wide check as a table: a row per mode. */
static void write_markdown_wide(FILE *f, const struct results *r)
{
	const struct wide *w = &r->wide;
	fprintf(f, "\n**wide** (ns per step): ");
	wide_about(f, r, " ");
	fprintf(f, ".\n\n| workers | ~1 us steps | speedup vs 1 worker "
		   "| empty steps | vs sequential | empty, retained "
		   "| vs consumed |\n"
		   "|---|---:|---:|---:|---:|---:|---:|\n");
	for (int m = 0; m < w->n_modes; m++) {
		struct wide_row c = wide_row(r, w->workers[m]);
		fprintf(f, "| %s | %s | %s | %s | %s | %s | %s |\n", c.name,
			c.work, c.speedup, c.empty, c.cost, c.retained,
			c.retain_cost);
	}
	fprintf(f, "\nWide: ");
	wide_cost(f, r, " ");
	fprintf(f, ".\n");
}

/* The big check as a table: a row per shape and size. */
static void write_markdown_big(FILE *f, const struct results *r)
{
	fprintf(f, "\n**big** (ns per node, per step; bytes per node): ");
	big_about(f, r, " ");
	fprintf(f, ".\n\n| graph | N | adg register ns/node | cold "
		   "| adg backward ns/step | adg RSS B/node "
		   "| floor register ns/node | cold | floor backward ns/step "
		   "| floor RSS B/node |\n"
		   "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
	for (int sh = 0; sh < BIG_SHAPES; sh++)
		for (int k = 0; k < r->big.n_sizes; k++) {
			struct big_row c = big_row(r, sh, k);
			fprintf(f,
				"| %s | %s | %s | %s | %s | %s | %s | %s | %s "
				"| %s |\n",
				big_shape_name(sh), c.n, c.reg[0], c.cold[0],
				c.step[0], c.bytes[0], c.reg[1], c.cold[1],
				c.step[1], c.bytes[1]);
		}
	fprintf(f, "\n");
	big_growth_lines(f, r, "");
}

/* big.csv: a row per shape, size and implementation measured. */
static void write_big_csv(FILE *f, const struct options *o,
			  const struct results *r)
{
	(void)o;
	const struct big *b = &r->big;
	fprintf(f, "graph,nodes,impl,register_ns_per_node,"
		   "register_cold_ns_per_node,backward_ns_per_step,"
		   "backward_vs_smallest,rss_bytes_per_node,passes,"
		   "cold_graphs\n");
	for (int sh = 0; sh < BIG_SHAPES; sh++)
		for (int k = 0; k < b->n_sizes; k++)
			for (enum impl_id i = 0; i < N_IMPLS; i++) {
				const bench_big_result *x =
					big_result(r, sh, i, k);
				if (x == NULL)
					continue;
				fprintf(f,
					"%s,%ld,%s,%.2f,%.2f,%.2f,%.3f,%.1f,%d,"
					"%ld\n",
					big_shape_name(sh), b->sizes[k],
					impls[i]->name, x->ns_node,
					x->cold_ns_node, x->ns_step,
					big_growth(r, sh, i, k), x->rss_node,
					x->passes, x->copies);
			}
}

/* wide.csv: a row per mode and kind of step. workers 0 is sequential. */
static void write_wide_csv(FILE *f, const struct options *o,
			   const struct results *r)
{
	(void)o;
	const struct wide *w = &r->wide;
	static const char *const kinds[WIDE_KINDS] = {"work", "empty",
						      "retained"};
	fprintf(f, "step,workers,executor,ns_per_step,min,max,"
		   "speedup_vs_1_worker,vs_sequential,steps,branches,chain,"
		   "spin_madds,spin_ns,cores,runs\n");
	for (int k = 0; k < WIDE_KINDS; k++)
		for (int m = 0; m < w->n_modes; m++) {
			double ns = wide_ns(r, k, w->workers[m]);
			fprintf(f,
				"%s,%d,%d,%.2f,%.2f,%.2f,%.3f,%.3f,%d,%d,%d,"
				"%ld,%.1f,%d,%d\n",
				kinds[k], w->workers[m],
				w->workers[m] != WIDE_SEQ, ns,
				vmin(w->ns_step[k][m], w->runs),
				vmax(w->ns_step[k][m], w->runs),
				wide_ns(r, k, 1) / ns,
				ns / wide_ns(r, k, WIDE_SEQ), w->steps,
				w->branches, w->chain, w->spin, w->spin_ns,
				r->cores, w->runs);
		}
}

/* A compact Markdown summary: per workload, a row per thread count. */
static void write_markdown(FILE *f, const struct options *o,
			   const struct results *r)
{
	machine_line(f);
	fprintf(f,
		"\n%d runs of %d ms per cell, medians; ratios of medians "
		"measured in the same run.\n",
		o->runs, o->ms);
	for (int w = 0; w < bench_n_workloads; w++) {
		if (!o->workload_on[w] || bench_workloads[w].check_only)
			continue;
		const char *unit = bench_workloads[w].unit;
		fprintf(f, "\n**%s** (%s/s)\n\n", bench_workloads[w].name,
			unit);
		fprintf(f,
			"| threads | adg | seed | floor | adg/seed | adg/floor "
			"| adg vs 1 thread |\n");
		fprintf(f, "|---:|---:|---:|---:|---:|---:|---:|\n");
		for (int t = 0; t < o->n_threads; t++) {
			int th = o->threads[t];
			double rt[N_IMPLS];
			char cell[N_IMPLS][32], rs[16], rf[16], r1[16];
			for (enum impl_id i = 0; i < N_IMPLS; i++) {
				rt[i] = rate_of(r, w, i, th);
				human(cell[i], sizeof cell[i], rt[i]);
			}
			ratio(rs, sizeof rs, rt[IMPL_ADG], rt[IMPL_SEED]);
			ratio(rf, sizeof rf, rt[IMPL_ADG], rt[IMPL_FLOOR]);
			ratio(r1, sizeof r1, rt[IMPL_ADG],
			      rate_of(r, w, IMPL_ADG, 1));
			fprintf(f, "| %d | %s | %s | %s | %s | %s | %s |\n", th,
				cell[IMPL_ADG], cell[IMPL_SEED],
				cell[IMPL_FLOOR], rs, rf, r1);
		}
	}
	int dj = workload_index("disjoint");
	const struct cell *ca = find_cell(r, dj, IMPL_ADG, 1);
	const struct cell *cf = find_cell(r, dj, IMPL_FLOOR, 1);
	if (ca && cf)
		fprintf(f,
			"\nPer registered node, 1 thread (disjoint): adg %.1f "
			"ns, floor %.1f ns; per backward step: adg %.1f ns, "
			"floor %.1f ns.\n",
			median(ca->ns_node, ca->runs),
			median(cf->ns_node, cf->runs),
			median(ca->ns_step, ca->runs),
			median(cf->ns_step, cf->runs));
	if (!isnan(r->idle_ratio[IMPL_ADG]))
		fprintf(f,
			"\nBackward of a %d-node chain with %d idle graphs "
			"alive: adg %.0f ns -> %.0f ns (%.2f x)",
			o->p.chain, o->p.idle_graphs, r->idle_ns[IMPL_ADG][0],
			r->idle_ns[IMPL_ADG][1], r->idle_ratio[IMPL_ADG]);
	if (!isnan(r->idle_ratio[IMPL_SEED]))
		fprintf(f, ", seed %.0f ns -> %.0f ns (%.0f x)",
			r->idle_ns[IMPL_SEED][0], r->idle_ns[IMPL_SEED][1],
			r->idle_ratio[IMPL_SEED]);
	fprintf(f, "\n");
	if (!isnan(r->overlap))
		fprintf(f,
			"\nGradient-ready hook (shared-params): %.0f%% of the "
			"parameter gradients are final while steps are still "
			"left to run; on average %.0f%% of the steps are left "
			"when one is.\n",
			100 * r->overlap, 100 * r->remaining);
	if (!isnan(r->ckpt_rate[0]))
		fprintf(f,
			"\nCheckpointing (a product, %d memory-bound "
			"adds, a product; 1 thread): `NONE` %.2fM "
			"nodes/s, at most %ld outputs alive; "
			"`BALANCED` %.2fM nodes/s, at most %ld.\n",
			CKPT_CHAIN, r->ckpt_rate[0] / 1e6, r->ckpt_peak[0],
			r->ckpt_rate[1] / 1e6, r->ckpt_peak[1]);
	if (r->big.n_sizes > 0)
		write_markdown_big(f, r);
	if (r->wide.n_modes > 0)
		write_markdown_wide(f, r);
	if (r->layer_runs > 0)
		print_layer(f, r, "\n");
	if (r->gather_runs > 0)
		print_gather(f, r, "\n");
	fprintf(f, "\n```");
	print_targets(f, r, o->p.idle_graphs);
	fprintf(f, "```\n");
}

static bool wide_ran(const struct results *r)
{
	return r->wide.n_modes > 0;
}

static bool big_ran(const struct results *r)
{
	return r->big.n_sizes > 0;
}

/* The results folder's files, in the order they are written; a file that
 * cannot be opened is skipped, as it always was. */
static const struct {
	const char *name;
	void (*write)(FILE *f, const struct options *o,
		      const struct results *r);
	bool (*wanted)(const struct results *r); /* NULL: always */
} files[] = {
	{"bench.csv", write_csv, NULL},
	{"bench.json", write_json, NULL},
	{"summary.md", write_markdown, NULL},
	{"table.txt", write_table, NULL},
	{"wide.csv", write_wide_csv, wide_ran},
	{"big.csv", write_big_csv, big_ran},
};

int write_results(const struct options *o, const struct results *r, char *dir,
		  size_t size)
{
	char stamp[64];
	time_t now = time(NULL);
	strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
	mkdir(o->out_dir, 0755);
	if (strlen(o->out_dir) > 900) {
		fprintf(stderr, "adg-bench: --out is too long\n");
		return 2;
	}
	snprintf(dir, size, "%s/%s", o->out_dir, stamp);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		perror(dir);
		return 1;
	}
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		if (files[i].wanted && !files[i].wanted(r))
			continue;
		char path[1100];
		snprintf(path, sizeof path, "%s/%s", dir, files[i].name);
		FILE *f = fopen(path, "w");
		if (f == NULL)
			continue;
		files[i].write(f, o, r);
		fclose(f);
	}
	printf("\nresults: "
	       "%s/{bench.csv,bench.json,table.txt,summary.md%s%s}\n",
	       dir, wide_ran(r) ? ",wide.csv" : "",
	       big_ran(r) ? ",big.csv" : "");
	return 0;
}
