/*
 * adg-bench: contention benchmarks across thread counts, for libadg, the
 * reference design (seed) and a per-thread floor, measured side by side in
 * one run on one machine.
 *
 *   adg-bench [options]               the sweep: table, CSV, JSON, plot
 *   adg-bench --callgrind [options]   instructions per node and per step
 *
 * Each cell (workload, threads, implementation) runs in a child process of
 * its own, so that its peak RSS is its own and no cell inherits another's
 * heap; within it, each of --runs runs opens a fresh registry.
 */
#include "bench.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RUNS    15
#define MAX_THREADS 1024

static const bench_impl *const impls[] = {&bench_adg, &bench_seed,
					  &bench_floor};
#define N_IMPLS 3

struct options {
	bool workload_on[16];
	int threads[32], n_threads;
	bool impl_on[N_IMPLS];
	int runs, ms, idle_ms;
	bench_params p;
	const char *out_dir;
	bool plot, idle, checkpoint;
	bool callgrind;
	long iterations;
	const char *count_child; /* internal: the process callgrind runs */
};

/* What one cell measured, run by run. */
struct cell {
	int workload, impl, threads, runs;
	double rate[MAX_RUNS];	/* workload units per second */
	double nodes[MAX_RUNS]; /* registered nodes per second */
	double merges[MAX_RUNS];
	double ns_node[MAX_RUNS], ns_step[MAX_RUNS];
	double loss_first[MAX_RUNS], loss_last[MAX_RUNS];
	long peak_rss_kb;
	bool ok;
};

/* ------------------------------------------------------------ one run */

struct worker {
	const bench_impl *impl;
	const bench_workload *wl;
	void *reg, *shared;
	int index;
	pthread_barrier_t *start;
	const atomic_int *stop;
	bench_counts counts;
	uint64_t end_ns;
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	w->impl->thread_begin(w->reg);
	pthread_barrier_wait(w->start);
	w->wl->thread(w->shared, w->index, w->stop, &w->counts);
	w->end_ns = bench_now_ns();
	w->impl->thread_end(w->reg);
	return NULL;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static void run_once(const struct options *o, const bench_impl *impl,
		     const bench_workload *wl, int threads, struct cell *c,
		     int run)
{
	void *reg = impl->open();
	void *shared = wl->setup(impl, reg, &o->p, threads);
	pthread_barrier_t start;
	atomic_int stop = 0;
	struct worker *w = calloc(threads, sizeof *w);
	pthread_t *tid = calloc(threads, sizeof *tid);
	pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
	for (int i = 0; i < threads; i++) {
		w[i] = (struct worker){impl,   wl,    reg, shared, i,
				       &start, &stop, {0}, 0};
		if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) {
			perror("pthread_create");
			exit(1);
		}
	}
	pthread_barrier_wait(&start);
	uint64_t t0 = bench_now_ns();
	sleep_ms(o->ms);
	atomic_store(&stop, 1);
	uint64_t end = t0;
	bench_counts sum = {0};
	double loss_first = 0, loss_last = 0;
	int with_loss = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(tid[i], NULL);
		if (w[i].end_ns > end)
			end = w[i].end_ns;
		sum.nodes += w[i].counts.nodes;
		sum.steps += w[i].counts.steps;
		sum.ops += w[i].counts.ops;
		sum.merges += w[i].counts.merges;
		sum.build_ns += w[i].counts.build_ns;
		sum.backward_ns += w[i].counts.backward_ns;
		if (w[i].counts.loss_first > 0) {
			loss_first += w[i].counts.loss_first;
			loss_last += w[i].counts.loss_last;
			with_loss++;
		}
	}
	pthread_barrier_destroy(&start);
	wl->teardown(shared);
	impl->close(reg);
	double secs = (double)(end - t0) * 1e-9;
	bool by_nodes = strcmp(wl->unit, "nodes") == 0;
	c->rate[run] = (by_nodes ? (double)sum.nodes : (double)sum.ops) / secs;
	c->nodes[run] = (double)sum.nodes / secs;
	c->merges[run] = (double)sum.merges / secs;
	c->ns_node[run] = sum.nodes ? (double)sum.build_ns / sum.nodes : 0;
	c->ns_step[run] = sum.steps ? (double)sum.backward_ns / sum.steps : 0;
	c->loss_first[run] = with_loss ? loss_first / with_loss : 0;
	c->loss_last[run] = with_loss ? loss_last / with_loss : 0;
	free(w);
	free(tid);
}

/* Runs a cell in a child process; its results come back through a pipe. */
static bool run_cell(const struct options *o, struct cell *c)
{
	int fd[2];
	if (pipe(fd) != 0)
		return false;
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		return false;
	if (pid == 0) {
		close(fd[0]);
		for (int r = 0; r < c->runs; r++)
			run_once(o, impls[c->impl],
				 &bench_workloads[c->workload], c->threads, c,
				 r);
		struct rusage ru;
		getrusage(RUSAGE_SELF, &ru);
		c->peak_rss_kb = ru.ru_maxrss;
		c->ok = true;
		ssize_t n = write(fd[1], c, sizeof *c);
		_exit(n == (ssize_t)sizeof *c ? 0 : 1);
	}
	close(fd[1]);
	struct cell got;
	ssize_t n = read(fd[0], &got, sizeof got);
	close(fd[0]);
	int status;
	waitpid(pid, &status, 0);
	if (n != (ssize_t)sizeof got || !WIFEXITED(status) ||
	    WEXITSTATUS(status) != 0)
		return false;
	*c = got;
	return true;
}

/* ------------------------------------------------------------ figures */

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
	double s[MAX_RUNS];
	memcpy(s, v, n * sizeof *s);
	qsort(s, n, sizeof *s, cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static double vmin(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] < m ? v[i] : m;
	return m;
}

static double vmax(const double *v, int n)
{
	double m = v[0];
	for (int i = 1; i < n; i++)
		m = v[i] > m ? v[i] : m;
	return m;
}

static struct cell *cells;
static int n_cells;
/* The hook's overlap figures (bench_overlap_fraction); NAN when not run. */
static double overlap = NAN, remaining = NAN;
/* The checkpoint workload, per strategy (none, balanced); rate NAN when not
 * run. */
static double ckpt_rate[2] = {NAN, NAN};
static long ckpt_peak[2];
#define CKPT_CHAIN 64

static const struct cell *find(int workload, int impl, int threads)
{
	for (int i = 0; i < n_cells; i++)
		if (cells[i].ok && cells[i].workload == workload &&
		    cells[i].impl == impl && cells[i].threads == threads)
			return &cells[i];
	return NULL;
}

static double rate_of(int workload, int impl, int threads)
{
	const struct cell *c = find(workload, impl, threads);
	return c ? median(c->rate, c->runs) : NAN;
}

static int workload_index(const char *name)
{
	for (int i = 0; i < bench_n_workloads; i++)
		if (strcmp(bench_workloads[i].name, name) == 0)
			return i;
	return -1;
}

static void human(char *buf, size_t size, double v)
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

static void print_table(FILE *f)
{
	fprintf(f, "%-13s %4s %-5s %15s %17s %6s %6s %6s %8s %8s %7s\n",
		"workload", "thr", "impl", "median/s", "min-max", "xseed",
		"xfloor", "x1thr", "ns/node", "ns/step", "rss MB");
	for (int i = 0; i < n_cells; i++) {
		const struct cell *c = &cells[i];
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
		ratio(rs, sizeof rs, m, rate_of(c->workload, 1, c->threads));
		ratio(rf, sizeof rf, m, rate_of(c->workload, 2, c->threads));
		ratio(r1, sizeof r1, m, rate_of(c->workload, c->impl, 1));
		if (c->impl == 1)
			snprintf(rs, sizeof rs, "-");
		if (c->impl == 2)
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

static void write_csv(const char *path)
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return;
	fprintf(f, "workload,threads,impl,unit,median,min,max,nodes_per_s,"
		   "merges_per_s,ns_per_node,ns_per_step,peak_rss_kb,"
		   "loss_first,loss_last,runs\n");
	for (int i = 0; i < n_cells; i++) {
		const struct cell *c = &cells[i];
		if (!c->ok)
			continue;
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
	fclose(f);
}

static void write_json(const char *path, double idle_ratio[N_IMPLS],
		       double idle_ns[N_IMPLS][2], int idle_graphs)
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return;
	fprintf(f, "{\n  \"cells\": [\n");
	bool first = true;
	for (int i = 0; i < n_cells; i++) {
		const struct cell *c = &cells[i];
		if (!c->ok)
			continue;
		fprintf(f,
			"%s    {\"workload\": \"%s\", \"threads\": %d, "
			"\"impl\": \"%s\", \"unit\": \"%s\", \"runs\": [",
			first ? "" : ",\n", bench_workloads[c->workload].name,
			c->threads, impls[c->impl]->name,
			bench_workloads[c->workload].unit);
		for (int r = 0; r < c->runs; r++)
			fprintf(f, "%s%.0f", r ? ", " : "", c->rate[r]);
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
	fprintf(f, "\n  ],\n  \"idle\": {\"graphs\": %d", idle_graphs);
	for (int i = 0; i < N_IMPLS; i++)
		if (!isnan(idle_ratio[i]))
			fprintf(f,
				", \"%s\": {\"ns_none\": %.0f, "
				"\"ns_idle\": %.0f, \"ratio\": %.3f}",
				impls[i]->name, idle_ns[i][0], idle_ns[i][1],
				idle_ratio[i]);
	fprintf(f, "}");
	if (!isnan(ckpt_rate[0]))
		fprintf(f,
			",\n  \"checkpoint\": {\"chain\": %d, \"none\": "
			"{\"nodes_per_s\": %.0f, \"peak_outputs\": %ld}, "
			"\"balanced\": {\"nodes_per_s\": %.0f, "
			"\"peak_outputs\": %ld}}",
			CKPT_CHAIN, ckpt_rate[0], ckpt_peak[0], ckpt_rate[1],
			ckpt_peak[1]);
	if (!isnan(overlap))
		fprintf(f,
			",\n  \"overlap\": {\"early_fraction\": %.4f, "
			"\"mean_steps_left\": %.4f}",
			overlap, remaining);
	fprintf(f, "\n}\n");
	fclose(f);
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

static void plot(const struct options *o, const char *dir)
{
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
	int shown = 0;
	for (int w = 0; w < bench_n_workloads; w++)
		shown += o->workload_on[w];
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
		if (!o->workload_on[w])
			continue;
		fprintf(gp, "set title '%s'\nset ylabel '%s/s'\nplot ",
			bench_workloads[w].name, bench_workloads[w].unit);
		bool any = false;
		for (int i = 0; i < N_IMPLS; i++) {
			char dat[1200];
			snprintf(dat, sizeof dat, "%s/%s-%s.dat", dir,
				 bench_workloads[w].name, impls[i]->name);
			FILE *d = fopen(dat, "w");
			int points = 0;
			for (int t = 0; t < o->n_threads && d; t++) {
				double r = rate_of(w, i, o->threads[t]);
				if (!isnan(r)) {
					fprintf(d, "%d %.0f\n", o->threads[t],
						r);
					points++;
				}
			}
			if (d)
				fclose(d);
			if (points == 0) {
				remove(dat);
				continue;
			}
			fprintf(gp,
				"%s'%s' using 1:2 with linespoints lw 2 "
				"title '%s'",
				any ? ", " : "", dat, impls[i]->name);
			any = true;
		}
		fprintf(gp, any ? "\n" : "0 notitle\n");
	}
	fprintf(gp, "unset multiplot\n");
	fclose(gp);
	char cmd[1300];
	snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", path);
	if (system(cmd) == 0)
		printf("plot: %s/throughput.png\n", dir);
}

/* ----------------------------------------------------------- targets */

static void target_line(FILE *f, bool have, bool holds, const char *what,
			const char *figure)
{
	const char *verdict = !have ? "n/a" : holds ? "holds" : "MISSED";
	fprintf(f, "  %-8s %s: %s\n", verdict, what,
		have ? figure : "not measured in this run");
}

static void targets(FILE *f, double idle_ratio[N_IMPLS], int idle_graphs)
{
	int dj = workload_index("disjoint"),
	    sp = workload_index("shared-params");
	char fig[128];
	fprintf(f, "\nTargets:\n");
	double a1 = rate_of(dj, 0, 1), a2 = rate_of(dj, 0, 2),
	       a128 = rate_of(dj, 0, 128);
	snprintf(fig, sizeof fig, "%.2f x", a2 / a1);
	target_line(f, !isnan(a1) && !isnan(a2), a2 >= 1.8 * a1,
		    "disjoint, 2 threads >= 1.8 x 1 thread", fig);
	snprintf(fig, sizeof fig, "%.2f x", a128 / a2);
	target_line(f, !isnan(a2) && !isnan(a128), a128 >= 0.9 * a2,
		    "disjoint, 128 threads >= 0.9 x 2 threads", fig);
	const int wls[2] = {dj, sp};
	for (int k = 0; k < 2; k++)
		for (int t = 32; t <= 128; t *= 4) {
			double a = rate_of(wls[k], 0, t),
			       s = rate_of(wls[k], 1, t);
			char what[96];
			snprintf(what, sizeof what,
				 "%s, %d threads: adg >= 2 x seed",
				 bench_workloads[wls[k]].name, t);
			snprintf(fig, sizeof fig, "%.2f x", a / s);
			target_line(f, !isnan(a) && !isnan(s), a >= 2 * s, what,
				    fig);
		}
	for (int k = 0; k < 2; k++) {
		double a = rate_of(wls[k], 0, 1), s = rate_of(wls[k], 1, 1);
		char what[96];
		snprintf(what, sizeof what, "%s, 1 thread: adg >= 0.8 x seed",
			 bench_workloads[wls[k]].name);
		snprintf(fig, sizeof fig, "%.2f x", a / s);
		target_line(f, !isnan(a) && !isnan(s), a >= 0.8 * s, what, fig);
		const struct cell *ca = find(wls[k], 0, 1),
				  *cf = find(wls[k], 2, 1);
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
	snprintf(fig, sizeof fig, "adg %.2f x (seed %.2f x)", idle_ratio[0],
		 idle_ratio[1]);
	target_line(f, !isnan(idle_ratio[0]), idle_ratio[0] <= 1.2, what, fig);
}

/* A compact Markdown summary: per workload, a row per thread count. */
static void write_markdown(const char *path, const struct options *o,
			   double idle_ratio[N_IMPLS],
			   double idle_ns[N_IMPLS][2])
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return;
	machine_line(f);
	fprintf(f,
		"\n%d runs of %d ms per cell, medians; ratios of medians "
		"measured in the same run.\n",
		o->runs, o->ms);
	for (int w = 0; w < bench_n_workloads; w++) {
		if (!o->workload_on[w])
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
			double r[N_IMPLS];
			char cell[N_IMPLS][32], rs[16], rf[16], r1[16];
			for (int i = 0; i < N_IMPLS; i++) {
				r[i] = rate_of(w, i, th);
				human(cell[i], sizeof cell[i], r[i]);
			}
			ratio(rs, sizeof rs, r[0], r[1]);
			ratio(rf, sizeof rf, r[0], r[2]);
			ratio(r1, sizeof r1, r[0], rate_of(w, 0, 1));
			fprintf(f, "| %d | %s | %s | %s | %s | %s | %s |\n", th,
				cell[0], cell[1], cell[2], rs, rf, r1);
		}
	}
	const struct cell *ca = find(workload_index("disjoint"), 0, 1);
	const struct cell *cf = find(workload_index("disjoint"), 2, 1);
	if (ca && cf)
		fprintf(f,
			"\nPer registered node, 1 thread (disjoint): adg %.1f "
			"ns, floor %.1f ns; per backward step: adg %.1f ns, "
			"floor %.1f ns.\n",
			median(ca->ns_node, ca->runs),
			median(cf->ns_node, cf->runs),
			median(ca->ns_step, ca->runs),
			median(cf->ns_step, cf->runs));
	if (!isnan(idle_ratio[0]))
		fprintf(f,
			"\nBackward of a %d-node chain with %d idle graphs "
			"alive: adg %.0f ns -> %.0f ns (%.2f x)",
			o->p.chain, o->p.idle_graphs, idle_ns[0][0],
			idle_ns[0][1], idle_ratio[0]);
	if (!isnan(idle_ratio[1]))
		fprintf(f, ", seed %.0f ns -> %.0f ns (%.0f x)", idle_ns[1][0],
			idle_ns[1][1], idle_ratio[1]);
	fprintf(f, "\n");
	if (!isnan(overlap))
		fprintf(f,
			"\nGradient-ready hook (shared-params): %.0f%% of the "
			"parameter gradients are final while steps are still "
			"left to run; on average %.0f%% of the steps are left "
			"when one is.\n",
			100 * overlap, 100 * remaining);
	if (!isnan(ckpt_rate[0]))
		fprintf(f,
			"\nCheckpointing (a product, %d memory-bound "
			"adds, a product; 1 thread): `NONE` %.2fM "
			"nodes/s, at most %ld outputs alive; "
			"`BALANCED` %.2fM nodes/s, at most %ld.\n",
			CKPT_CHAIN, ckpt_rate[0] / 1e6, ckpt_peak[0],
			ckpt_rate[1] / 1e6, ckpt_peak[1]);
	fprintf(f, "\n```");
	targets(f, idle_ratio, o->p.idle_graphs);
	fprintf(f, "```\n");
	fclose(f);
}

/* --------------------------------------------------------- callgrind */

static int count_child(const struct options *o)
{
	for (int i = 0; i < N_IMPLS; i++) {
		if (strcmp(impls[i]->name, o->count_child) != 0)
			continue;
		bench_counts c = {0};
		bench_count_phases(impls[i], &o->p, o->iterations, &c);
		printf("%llu %llu\n", (unsigned long long)c.nodes,
		       (unsigned long long)c.steps);
		return 0;
	}
	return 2;
}

/* Inclusive instruction count of a function in a callgrind profile. */
static double inclusive_ir(const char *profile, const char *function)
{
	char cmd[8192], line[4096];
	snprintf(cmd, sizeof cmd, "callgrind_annotate --inclusive=yes '%s'",
		 profile);
	FILE *p = popen(cmd, "r");
	if (p == NULL)
		return NAN;
	double ir = NAN;
	while (fgets(line, sizeof line, p)) {
		if (strstr(line, function) == NULL)
			continue;
		char digits[64];
		int k = 0;
		for (const char *s = line; *s && k < 63; s++) {
			if (*s >= '0' && *s <= '9')
				digits[k++] = *s;
			else if (*s != ',' && k > 0)
				break;
		}
		digits[k] = 0;
		if (k > 0) {
			ir = atof(digits);
			break;
		}
	}
	pclose(p);
	return ir;
}

static int callgrind(const struct options *o)
{
	if (system("command -v valgrind >/dev/null 2>&1") != 0) {
		fprintf(stderr, "adg-bench: valgrind not found "
				"(scripts/bench.sh --callgrind installs it)\n");
		return 1;
	}
	char self[4096];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return 1;
	self[n] = 0;
	printf("callgrind: chain of %d products on %d leaves, %ld iterations, "
	       "1 thread; instructions (Ir) per node, exact and repeatable\n",
	       o->p.chain, o->p.leaves, o->iterations);
	printf("%-6s %14s %14s %14s\n", "impl", "Ir/registered", "Ir/backward",
	       "Ir/node total");
	double total[N_IMPLS];
	for (int i = 0; i < N_IMPLS; i++) {
		total[i] = NAN;
		if (!o->impl_on[i])
			continue;
		char profile[] = "/tmp/adg-callgrind-XXXXXX";
		int fd = mkstemp(profile);
		if (fd < 0)
			return 1;
		close(fd);
		char cmd[16384];
		snprintf(cmd, sizeof cmd,
			 "valgrind --tool=callgrind --callgrind-out-file='%s' "
			 "'%s' --count-child=%s --iterations=%ld --chain=%d "
			 "--leaves=%d 2>/dev/null",
			 profile, self, impls[i]->name, o->iterations,
			 o->p.chain, o->p.leaves);
		FILE *p = popen(cmd, "r");
		unsigned long long nodes = 0, steps = 0;
		if (p == NULL || fscanf(p, "%llu %llu", &nodes, &steps) != 2) {
			fprintf(stderr, "adg-bench: callgrind run failed\n");
			if (p)
				pclose(p);
			remove(profile);
			continue;
		}
		pclose(p);
		double build = inclusive_ir(profile, "bench_build_phase");
		double back = inclusive_ir(profile, "bench_backward_phase");
		remove(profile);
		total[i] = (build + back) / nodes;
		printf("%-6s %14.1f %14.1f %14.1f\n", impls[i]->name,
		       build / nodes, back / steps, total[i]);
	}
	if (!isnan(total[0]) && !isnan(total[2]))
		printf("adg / floor: %.2f x instructions per node\n",
		       total[0] / total[2]);
	if (!isnan(total[0]) && !isnan(total[1]))
		printf("adg / seed:  %.2f x instructions per node\n",
		       total[0] / total[1]);
	return 0;
}

/* ------------------------------------------------------------ options */

static void usage(FILE *f)
{
	fprintf(f, "usage: adg-bench [options]\n"
		   "  --workloads=LIST  comma-separated, from:");
	for (int i = 0; i < bench_n_workloads; i++)
		fprintf(f, " %s", bench_workloads[i].name);
	fprintf(f,
		" (default: all)\n"
		"  --threads=LIST    thread counts (default 1,2,4,8,32,128)\n"
		"  --impls=LIST      from: adg seed floor (default: all)\n"
		"  --runs=N          runs per cell, median reported (default "
		"5)\n"
		"  --ms=N            milliseconds per run (default 100)\n"
		"  --chain=K         nodes per chain/tree (default 32)\n"
		"  --leaves=N        leaves per chain (default 4)\n"
		"  --params=P        shared parameters (default 20)\n"
		"  --hidden=H        trainer hidden units (default 8)\n"
		"  --idle-graphs=N   idle graphs for the idle check "
		"(default 100000)\n"
		"  --no-idle         skip the idle-graphs check\n"
		"  --no-checkpoint   skip the checkpoint workload\n"
		"  --out=DIR         results folder (default results)\n"
		"  --no-plot         skip the gnuplot PNG\n"
		"  --callgrind       count instructions per node under "
		"valgrind instead\n"
		"  --iterations=N    chains per callgrind run (default "
		"2000)\n\n");
	for (int i = 0; i < bench_n_workloads; i++)
		fprintf(f, "  %-14s %s\n", bench_workloads[i].name,
			bench_workloads[i].about);
	fprintf(f,
		"\nAlso measured, on one thread: a backward's cost with idle "
		"graphs alive (adg, seed),\nhow early the gradient-ready hook "
		"sees parameters (adg), and the checkpoint\nworkload's peak "
		"live outputs and nodes/s under both strategies (adg).\n");
}

static int parse_list(const char *s, int *out, int max)
{
	int n = 0;
	while (*s && n < max) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 1 || v > MAX_THREADS)
			return -1;
		out[n++] = (int)v;
		s = *end == ',' ? end + 1 : end;
		if (*end != ',' && *end != 0)
			return -1;
	}
	return n;
}

static bool parse_names(const char *s, bool *on, int n,
			const char *(*name)(int))
{
	memset(on, 0, n * sizeof *on);
	char buf[512];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
		int i = 0;
		while (i < n && strcmp(name(i), tok) != 0)
			i++;
		if (i == n)
			return false;
		on[i] = true;
	}
	return true;
}

static const char *workload_name(int i)
{
	return bench_workloads[i].name;
}

static const char *impl_name(int i)
{
	return impls[i]->name;
}

static bool parse(int argc, char **argv, struct options *o)
{
	static const int default_threads[] = {1, 2, 4, 8, 32, 128};
	*o = (struct options){
		.runs = 5,
		.ms = 100,
		.idle_ms = 300,
		.p = {.chain = 32,
		      .leaves = 4,
		      .params = 20,
		      .idle_graphs = 100000,
		      .trainer_hidden = 8},
		.out_dir = "results",
		.plot = true,
		.idle = true,
		.checkpoint = true,
		.iterations = 2000,
	};
	for (int i = 0; i < bench_n_workloads; i++)
		o->workload_on[i] = true;
	for (int i = 0; i < N_IMPLS; i++)
		o->impl_on[i] = true;
	memcpy(o->threads, default_threads, sizeof default_threads);
	o->n_threads = 6;
	static const struct option longs[] = {
		{"workloads", required_argument, 0, 'w'},
		{"threads", required_argument, 0, 't'},
		{"impls", required_argument, 0, 'i'},
		{"runs", required_argument, 0, 'r'},
		{"ms", required_argument, 0, 'm'},
		{"chain", required_argument, 0, 'k'},
		{"leaves", required_argument, 0, 'l'},
		{"params", required_argument, 0, 'p'},
		{"hidden", required_argument, 0, 'H'},
		{"idle-graphs", required_argument, 0, 'g'},
		{"no-idle", no_argument, 0, 'G'},
		{"no-checkpoint", no_argument, 0, 'K'},
		{"out", required_argument, 0, 'o'},
		{"no-plot", no_argument, 0, 'P'},
		{"callgrind", no_argument, 0, 'c'},
		{"iterations", required_argument, 0, 'n'},
		{"count-child", required_argument, 0, 'C'},
		{"help", no_argument, 0, 'h'},
		{0, 0, 0, 0},
	};
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (!parse_names(optarg, o->workload_on,
					 bench_n_workloads, workload_name))
				return false;
			break;
		case 't':
			o->n_threads = parse_list(optarg, o->threads, 32);
			if (o->n_threads <= 0)
				return false;
			break;
		case 'i':
			if (!parse_names(optarg, o->impl_on, N_IMPLS,
					 impl_name))
				return false;
			break;
		case 'r':
			o->runs = atoi(optarg);
			if (o->runs < 1 || o->runs > MAX_RUNS)
				return false;
			break;
		case 'm':
			o->ms = atoi(optarg);
			if (o->ms < 1)
				return false;
			break;
		case 'k':
			o->p.chain = atoi(optarg);
			if (o->p.chain < 2)
				return false;
			break;
		case 'l':
			o->p.leaves = atoi(optarg);
			if (o->p.leaves < 2)
				return false;
			break;
		case 'p':
			o->p.params = atoi(optarg);
			if (o->p.params < 1)
				return false;
			break;
		case 'H':
			o->p.trainer_hidden = atoi(optarg);
			if (o->p.trainer_hidden < 1)
				return false;
			break;
		case 'g':
			o->p.idle_graphs = atoi(optarg);
			if (o->p.idle_graphs < 0)
				return false;
			break;
		case 'G':
			o->idle = false;
			break;
		case 'K':
			o->checkpoint = false;
			break;
		case 'o':
			o->out_dir = optarg;
			break;
		case 'P':
			o->plot = false;
			break;
		case 'c':
			o->callgrind = true;
			break;
		case 'n':
			o->iterations = atol(optarg);
			if (o->iterations < 1)
				return false;
			break;
		case 'C':
			o->count_child = optarg;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return false;
		}
	}
	return optind == argc;
}

/* ------------------------------------------------------------- main */

int main(int argc, char **argv)
{
	struct options o;
	if (!parse(argc, argv, &o)) {
		usage(stderr);
		return 2;
	}
	if (o.count_child)
		return count_child(&o);
	if (o.callgrind)
		return callgrind(&o);

	int total = 0;
	for (int w = 0; w < bench_n_workloads; w++)
		for (int t = 0; t < o.n_threads; t++)
			for (int i = 0; i < N_IMPLS; i++)
				if (o.workload_on[w] && o.impl_on[i] &&
				    (!bench_workloads[w].needs_graphs ||
				     impls[i]->has_graphs))
					total++;
	cells = calloc(total ? total : 1, sizeof *cells);
	machine_line(stdout);
	printf("%d runs of %d ms per cell; rates are medians; ratios compare "
	       "medians measured in this run\n\n",
	       o.runs, o.ms);
	for (int w = 0; w < bench_n_workloads; w++)
		for (int t = 0; t < o.n_threads; t++)
			for (int i = 0; i < N_IMPLS; i++) {
				if (!o.workload_on[w] || !o.impl_on[i] ||
				    (bench_workloads[w].needs_graphs &&
				     !impls[i]->has_graphs))
					continue;
				struct cell *c = &cells[n_cells++];
				*c = (struct cell){.workload = w,
						   .impl = i,
						   .threads = o.threads[t],
						   .runs = o.runs};
				bool ok = run_cell(&o, c);
				char m[32];
				human(m, sizeof m,
				      ok ? median(c->rate, c->runs) : NAN);
				fprintf(stderr,
					"[%d/%d] %s threads=%d %s: %s %s/s\n",
					n_cells, total, bench_workloads[w].name,
					o.threads[t], impls[i]->name,
					ok ? m : "FAILED",
					bench_workloads[w].unit);
			}

	double idle_ratio[N_IMPLS], idle_ns[N_IMPLS][2];
	for (int i = 0; i < N_IMPLS; i++)
		idle_ratio[i] = NAN;
	if (o.idle) {
		for (int i = 0; i < N_IMPLS; i++) {
			if (!o.impl_on[i] || !impls[i]->has_graphs)
				continue;
			/* medians of three, alternating with and without */
			double none[3], with[3];
			for (int r = 0; r < 3; r++) {
				none[r] = bench_idle_backward_ns(
					impls[i], 0, o.idle_ms / 3, &o.p);
				with[r] = bench_idle_backward_ns(
					impls[i], o.p.idle_graphs,
					o.idle_ms / 3, &o.p);
			}
			idle_ns[i][0] = median(none, 3);
			idle_ns[i][1] = median(with, 3);
			idle_ratio[i] = idle_ns[i][1] / idle_ns[i][0];
			fprintf(stderr,
				"idle %s: %.0f ns per backward, %.0f ns "
				"with %d idle graphs\n",
				impls[i]->name, idle_ns[i][0], idle_ns[i][1],
				o.p.idle_graphs);
		}
	}

	if (o.impl_on[0] && o.workload_on[workload_index("shared-params")]) {
		overlap = bench_overlap_fraction(&o.p, 200, &remaining);
		fprintf(stderr,
			"overlap: %.0f%% of parameter gradients final "
			"while steps remained\n",
			100 * overlap);
	}

	if (o.impl_on[0] && o.checkpoint) {
		for (int st = 0; st < 2; st++) {
			double r[3];
			for (int k = 0; k < 3; k++)
				r[k] = bench_checkpoint(st, CKPT_CHAIN,
							o.idle_ms / 3,
							&ckpt_peak[st]);
			ckpt_rate[st] = median(r, 3);
		}
		fprintf(stderr,
			"checkpoint: %.0f / %.0f nodes/s, peaks %ld / "
			"%ld outputs\n",
			ckpt_rate[0], ckpt_rate[1], ckpt_peak[0], ckpt_peak[1]);
	}

	print_table(stdout);
	if (!isnan(ckpt_rate[0]))
		printf("\ncheckpoint (adg, a product, %d adds, a product; 1 "
		       "thread): none %.2fM nodes/s, peak %ld outputs alive; "
		       "balanced %.2fM nodes/s, peak %ld\n",
		       CKPT_CHAIN, ckpt_rate[0] / 1e6, ckpt_peak[0],
		       ckpt_rate[1] / 1e6, ckpt_peak[1]);
	if (!isnan(overlap))
		printf("\nshared-params, adg_backward_with's hook: %.0f%% of "
		       "the parameter gradients are final (and could be sent) "
		       "while steps are still left to run; on average %.0f%% "
		       "of "
		       "the steps are left when one is\n",
		       100 * overlap, 100 * remaining);
	if (o.idle) {
		printf("\nbackward of a %d-node chain, 1 thread, with %d idle "
		       "graphs alive vs none:\n",
		       o.p.chain, o.p.idle_graphs);
		for (int i = 0; i < N_IMPLS; i++)
			if (!isnan(idle_ratio[i]))
				printf("  %-5s %9.0f ns -> %12.0f ns  (%.2f "
				       "x)\n",
				       impls[i]->name, idle_ns[i][0],
				       idle_ns[i][1], idle_ratio[i]);
	}
	targets(stdout, idle_ratio, o.p.idle_graphs);

	char stamp[64], dir[1024];
	time_t now = time(NULL);
	strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
	mkdir(o.out_dir, 0755);
	if (strlen(o.out_dir) > 900) {
		fprintf(stderr, "adg-bench: --out is too long\n");
		return 2;
	}
	snprintf(dir, sizeof dir, "%s/%s", o.out_dir, stamp);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		perror(dir);
		return 1;
	}
	char path[1100];
	snprintf(path, sizeof path, "%s/bench.csv", dir);
	write_csv(path);
	snprintf(path, sizeof path, "%s/bench.json", dir);
	write_json(path, idle_ratio, idle_ns, o.p.idle_graphs);
	snprintf(path, sizeof path, "%s/summary.md", dir);
	write_markdown(path, &o, idle_ratio, idle_ns);
	snprintf(path, sizeof path, "%s/table.txt", dir);
	FILE *tf = fopen(path, "w");
	if (tf) {
		machine_line(tf);
		print_table(tf);
		fclose(tf);
	}
	printf("\nresults: %s/{bench.csv,bench.json,table.txt,summary.md}\n",
	       dir);
	if (o.plot)
		plot(&o, dir);
	return 0;
}
