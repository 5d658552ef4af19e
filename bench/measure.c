/*
 * adg-bench's measurements: the sweep's cells, then the one-thread checks
 * (big graphs, idle graphs, the hook's overlap, checkpointing, wide), into
 * struct results.
 *
 * Each cell (workload, threads, implementation) runs in a child process of
 * its own, so that its peak RSS is its own and no cell inherits another's
 * heap; within it, each of --runs runs opens a fresh registry. A run's
 * threads start together at a barrier and stop when the main thread, after
 * --ms, raises a flag. The run's interval is read off the workers' own
 * clocks, from the first one's start (just before its first unit of
 * work) to the last one's stop: with many more threads than cores, the
 * main thread may leave the barrier long after the workers did, and an
 * interval on its clock would leave out their early work while counting
 * it (128 threads on 2 cores read up to 6 x one thread that way).
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "driver.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct worker {
	const bench_impl *impl;
	const bench_workload *wl;
	void *reg, *shared;
	int index;
	pthread_barrier_t *start;
	const atomic_int *stop;
	bench_counts counts;
	uint64_t end_ns; /* its own clock, after its loop */
};

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	w->impl->thread_begin(w->reg);
	pthread_barrier_wait(w->start);
	uint64_t start = bench_now_ns();
	w->wl->thread(w->shared, w->index, w->stop, &w->counts);
	w->end_ns = bench_now_ns();
	/* A workload that sets no start of its own starts here. */
	if (w->counts.start_ns == 0)
		w->counts.start_ns = start;
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
		w[i] = (struct worker){.impl = impl,
				       .wl = wl,
				       .reg = reg,
				       .shared = shared,
				       .index = i,
				       .start = &start,
				       .stop = &stop};
		if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) {
			perror("pthread_create");
			exit(1);
		}
	}
	pthread_barrier_wait(&start);
	sleep_ms(o->ms);
	atomic_store(&stop, 1);
	uint64_t t0 = UINT64_MAX, end = 0;
	bench_counts sum = {0};
	double loss_first = 0, loss_last = 0;
	int with_loss = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(tid[i], NULL);
		if (w[i].counts.start_ns < t0)
			t0 = w[i].counts.start_ns;
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

/* Runs body(o, data) in a child process, so that what it allocates and
 * its peak RSS are its own; data (size bytes, no pointers) comes back
 * through a pipe. False when the child failed: body returned false, or
 * the process died. */
static bool in_child(const struct options *o, void *data, size_t size,
		     bool (*body)(const struct options *o, void *data))
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
		if (!body(o, data))
			_exit(1);
		ssize_t n = write(fd[1], data, size);
		_exit(n == (ssize_t)size ? 0 : 1);
	}
	close(fd[1]);
	void *got = malloc(size);
	ssize_t n = got != NULL ? read(fd[0], got, size) : -1;
	close(fd[0]);
	int status;
	waitpid(pid, &status, 0);
	bool ok = n == (ssize_t)size && WIFEXITED(status) &&
		  WEXITSTATUS(status) == 0;
	if (ok)
		memcpy(data, got, size);
	free(got);
	return ok;
}

static bool cell_body(const struct options *o, void *data)
{
	struct cell *c = data;
	for (int r = 0; r < c->runs; r++)
		run_once(o, impls[c->impl], &bench_workloads[c->workload],
			 c->threads, c, r);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	c->peak_rss_kb = ru.ru_maxrss;
	c->ok = true;
	return true;
}

/* Runs a cell in a child process of its own. */
static bool run_cell(const struct options *o, struct cell *c)
{
	return in_child(o, c, sizeof *c, cell_body);
}

/* The cells the options ask for, workload by workload, then thread count,
 * then implementation; a workload that needs graphs skips floor, one
 * that is adg's only the others. */
static int plan(const struct options *o, struct cell *cells)
{
	int n = 0;
	for (int w = 0; w < bench_n_workloads; w++)
		for (int t = 0; t < o->n_threads; t++)
			for (enum impl_id i = 0; i < N_IMPLS; i++)
				if (o->workload_on[w] && o->impl_on[i] &&
				    !bench_workloads[w].check_only &&
				    (!bench_workloads[w].adg_only ||
				     i == IMPL_ADG) &&
				    (!bench_workloads[w].needs_graphs ||
				     impls[i]->has_graphs))
					cells[n++] = (struct cell){
						.workload = w,
						.impl = i,
						.threads = o->threads[t],
						.runs = o->runs};
	return n;
}

static void sweep(const struct options *o, struct results *r)
{
	r->cells = calloc((size_t)bench_n_workloads * o->n_threads * N_IMPLS,
			  sizeof *r->cells);
	r->n_cells = plan(o, r->cells);
	for (int k = 0; k < r->n_cells; k++) {
		struct cell *c = &r->cells[k];
		bool ok = run_cell(o, c);
		char m[32];
		human(m, sizeof m, ok ? median(c->rate, c->runs) : NAN);
		fprintf(stderr, "[%d/%d] %s threads=%d %s: %s %s/s\n", k + 1,
			r->n_cells, bench_workloads[c->workload].name,
			c->threads, impls[c->impl]->name, ok ? m : "FAILED",
			bench_workloads[c->workload].unit);
	}
}

/* A backward's cost with no idle graphs and with --idle-graphs alive. */
static void idle_check(const struct options *o, struct results *r)
{
	for (enum impl_id i = 0; i < N_IMPLS; i++) {
		if (!o->impl_on[i] || !impls[i]->has_graphs)
			continue;
		/* medians of three, alternating with and without */
		double none[3], with[3];
		for (int k = 0; k < 3; k++) {
			none[k] = bench_idle_backward_ns(impls[i], 0,
							 o->idle_ms / 3, &o->p);
			with[k] = bench_idle_backward_ns(impls[i],
							 o->p.idle_graphs,
							 o->idle_ms / 3, &o->p);
		}
		r->idle_ns[i][0] = median(none, 3);
		r->idle_ns[i][1] = median(with, 3);
		r->idle_ratio[i] = r->idle_ns[i][1] / r->idle_ns[i][0];
		fprintf(stderr,
			"idle %s: %.0f ns per backward, %.0f ns with %d idle "
			"graphs\n",
			impls[i]->name, r->idle_ns[i][0], r->idle_ns[i][1],
			o->p.idle_graphs);
	}
}

static void checkpoint_check(const struct options *o, struct results *r)
{
	for (int st = 0; st < 2; st++) {
		double rate[3];
		for (int k = 0; k < 3; k++)
			rate[k] =
				bench_checkpoint(st, CKPT_CHAIN, o->idle_ms / 3,
						 &r->ckpt_peak[st]);
		r->ckpt_rate[st] = median(rate, 3);
	}
	fprintf(stderr,
		"checkpoint: %.0f / %.0f nodes/s, peaks %ld / %ld outputs\n",
		r->ckpt_rate[0], r->ckpt_rate[1], r->ckpt_peak[0],
		r->ckpt_peak[1]);
}

/* One graph of the big check, in a child process of its own. */
struct big_job {
	enum impl_id impl;
	long n;
	int branches;
	bench_big_result res;
};

static bool big_body(const struct options *o, void *data)
{
	struct big_job *j = data;
	return bench_big_run(impls[j->impl], j->n, j->branches, o->ms,
			     &j->res) == 0;
}

/* One graph of the big check, into r->big, with its progress line. */
static void big_one(const struct options *o, struct big *b, enum big_shape sh,
		    enum impl_id im, int k)
{
	struct big_job j = {.impl = im,
			    .n = b->sizes[k],
			    .branches = sh == BIG_CHAIN ? 1 : BIG_BRANCHES};
	bool ok = in_child(o, &j, sizeof j, big_body);
	b->ok[sh][im][k] = ok;
	b->res[sh][im][k] = j.res;
	char n[16];
	big_size(n, sizeof n, b->sizes[k]);
	if (ok)
		fprintf(stderr,
			"big %s %s %s: %.1f ns per node (cold %.1f), %.1f ns "
			"per step, %.0f B per node\n",
			big_shape_name(sh), n, impls[im]->name, j.res.ns_node,
			j.res.cold_ns_node, j.res.ns_step, j.res.rss_node);
	else
		fprintf(stderr, "big %s %s %s: FAILED\n", big_shape_name(sh), n,
			impls[im]->name);
}

/* The big workload: sizes up, each shape, adg then floor (seed's locator
 * maps are not what it measures). */
static void big_check(const struct options *o, struct results *r)
{
	struct big *b = &r->big;
	for (long n = BIG_SMALLEST;
	     n <= o->big_max && b->n_sizes < BIG_MAX_SIZES; n *= 10)
		b->sizes[b->n_sizes++] = n;
	for (int k = 0; k < b->n_sizes; k++)
		for (int sh = 0; sh < BIG_SHAPES; sh++) {
			if (o->impl_on[IMPL_ADG])
				big_one(o, b, sh, IMPL_ADG, k);
			if (o->impl_on[IMPL_FLOOR])
				big_one(o, b, sh, IMPL_FLOOR, k);
		}
}

int available_cores(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0)
		return CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

/* The wide workload: --runs rounds, each running every mode on every kind
 * of step, for a quarter of --ms each; the modes' order reverses every
 * other round, so that none always runs right after the same one. */
static void wide_check(const struct options *o, struct results *r)
{
	struct wide *w = &r->wide;
	int most = 1;
	w->workers[0] = WIDE_SEQ;
	for (int i = 0; i < o->n_wide_workers; i++) {
		w->workers[i + 1] = o->wide_workers[i];
		if (o->wide_workers[i] > most)
			most = o->wide_workers[i];
	}
	long spin;
	double spin_ns;
	bench_wide *bw = bench_wide_open(&o->p, most, &spin, &spin_ns);
	if (bw == NULL) {
		fprintf(stderr, "wide: FAILED (no pool of %d threads)\n",
			most - 1);
		return;
	}
	int n = o->n_wide_workers + 1, ms = o->ms / 4 > 0 ? o->ms / 4 : 1;
	for (int k = 0; k < o->runs; k++)
		for (int kind = 0; kind < WIDE_KINDS; kind++)
			for (int i = 0; i < n; i++) {
				int m = k % 2 ? n - 1 - i : i;
				w->ns_step[kind][m][k] = bench_wide_run(
					bw, w->workers[m], kind == WIDE_WORK,
					kind == WIDE_RETAINED, ms, &w->steps);
			}
	bench_wide_close(bw);
	w->n_modes = n;
	w->runs = o->runs;
	w->branches = o->p.wide_branches;
	w->chain = o->p.wide_chain;
	w->spin = spin;
	w->spin_ns = spin_ns;
	for (int m = 0; m < n; m++) {
		char name[32];
		wide_mode(name, sizeof name, w->workers[m]);
		fprintf(stderr,
			"wide %s: %.1f ns per ~1 us step, %.1f ns per empty "
			"step, %.1f retained\n",
			name, wide_ns(r, WIDE_WORK, w->workers[m]),
			wide_ns(r, WIDE_EMPTY, w->workers[m]),
			wide_ns(r, WIDE_RETAINED, w->workers[m]));
	}
}

/* The cpp workload: --runs rounds, each timing the C API's chain, then
 * adg.hpp's, so that a slow spell of a shared machine moves both. */
static void layer_check(const struct options *o, struct results *r)
{
	if (bench_layer_cpp == NULL) {
		fprintf(stderr, "cpp: skipped, built without C++\n");
		return;
	}
	double q[MAX_RUNS];
	int n = 0, ms = o->ms > 0 ? o->ms : 1;
	for (int k = 0; k < o->runs && k < MAX_RUNS; k++) {
		double c = bench_layer_c_ns(BENCH_LAYER_OPS, ms);
		double cpp = bench_layer_cpp(BENCH_LAYER_OPS, ms);
		if (c <= 0 || cpp <= 0) {
			fprintf(stderr, "cpp: FAILED\n");
			return;
		}
		r->layer_ns[0][n] = c;
		r->layer_ns[1][n] = cpp;
		q[n++] = cpp / c;
	}
	r->layer_runs = n;
	r->layer_ratio = median(q, n);
	fprintf(stderr,
		"cpp: %.1f ns per op through the C API, %.1f through "
		"adg.hpp: %.2f x\n",
		median(r->layer_ns[0], n), median(r->layer_ns[1], n),
		r->layer_ratio);
}

/* The cpp-shared workload's slices per round: a round's forms take
 * turns, GATHER_SLICES times each for --ms / GATHER_SLICES, so that a
 * slow spell of a shared machine falls on every form alike. On the 2-core
 * VM of docs/bench.md, two 200 ms runs of one form in a row read 0.84 to
 * 1.09 x each other; in rounds of 4 slices of 50 ms, the shared borrowed
 * form read 0.99 to 1.08 x the separate one. */
#define GATHER_SLICES 4

/* The cpp-shared workload: --runs rounds of GATHER_SLICES slices, each
 * running every form, in the reverse order every other slice, so that
 * none always runs right after the same one; a form's rate in a round is
 * the mean of its slices' (of equal length). Its threads are joined when
 * it returns: nothing of it is left for a later fork. */
static void gather_check(const struct options *o, struct results *r)
{
	if (bench_gather_cpp == NULL) {
		fprintf(stderr, "cpp-shared: skipped, built without C++\n");
		return;
	}
	double q[BENCH_GATHER_FORMS][MAX_RUNS];
	int n = 0, ms = o->ms / GATHER_SLICES > 0 ? o->ms / GATHER_SLICES : 1;
	for (int k = 0; k < o->runs && k < MAX_RUNS; k++, n++) {
		for (int f = 0; f < BENCH_GATHER_FORMS; f++)
			r->gather_rate[f][n] = 0;
		for (int s = 0; s < GATHER_SLICES; s++)
			for (int i = 0; i < BENCH_GATHER_FORMS; i++) {
				int f = s % 2 ? BENCH_GATHER_FORMS - 1 - i : i;
				double rate = bench_gather_cpp(
					f, BENCH_GATHER_OPS, ms);
				if (rate <= 0) {
					fprintf(stderr, "cpp-shared: FAILED\n");
					return;
				}
				r->gather_rate[f][n] += rate / GATHER_SLICES;
			}
		for (int f = 0; f < BENCH_GATHER_FORMS; f++)
			q[f][n] = r->gather_rate[f][n] /
				  r->gather_rate[BENCH_GATHER_SEPARATE][n];
	}
	r->gather_runs = n;
	for (int f = 0; f < BENCH_GATHER_FORMS; f++)
		r->gather_ratio[f] = median(q[f], n);
	fprintf(stderr,
		"cpp-shared: %.2fM nodes/s over a parameter each, %.2fM over "
		"one shared (%.2f x), %.2fM gathering copied handles (%.2f "
		"x)\n",
		median(r->gather_rate[BENCH_GATHER_SEPARATE], n) / 1e6,
		median(r->gather_rate[BENCH_GATHER_SHARED], n) / 1e6,
		r->gather_ratio[BENCH_GATHER_SHARED],
		median(r->gather_rate[BENCH_GATHER_COPIED], n) / 1e6,
		r->gather_ratio[BENCH_GATHER_COPIED]);
}

void measure(const struct options *o, struct results *r)
{
	*r = (struct results){
		.overlap = NAN, .remaining = NAN, .ckpt_rate = {NAN, NAN}};
	for (enum impl_id i = 0; i < N_IMPLS; i++)
		r->idle_ratio[i] = r->idle_ns[i][0] = r->idle_ns[i][1] = NAN;
	r->cores = available_cores();
	sweep(o, r);
	/* Right after the sweep, before the checks that allocate in this
	 * process: big's children start with this process's heap, and a
	 * graph built into memory an earlier check freed would grow the
	 * resident set by less than it costs. */
	if (o->workload_on[workload_index("big")])
		big_check(o, r);
	if (o->idle)
		idle_check(o, r);
	if (o->impl_on[IMPL_ADG] &&
	    o->workload_on[workload_index("shared-params")]) {
		r->overlap = bench_overlap_fraction(&o->p, 200, &r->remaining);
		fprintf(stderr,
			"overlap: %.0f%% of parameter gradients final while "
			"steps remained\n",
			100 * r->overlap);
	}
	if (o->impl_on[IMPL_ADG] && o->checkpoint)
		checkpoint_check(o, r);
	r->layer_ratio = NAN;
	if (o->impl_on[IMPL_ADG] && o->workload_on[workload_index("cpp")])
		layer_check(o, r);
	if (o->impl_on[IMPL_ADG] &&
	    o->workload_on[workload_index("cpp-shared")])
		gather_check(o, r);
	/* Last: it starts a pool's threads, and the cells fork. */
	if (o->workload_on[workload_index("wide")]) {
		if (o->impl_on[IMPL_ADG])
			wide_check(o, r);
		else
			fprintf(stderr, "wide: skipped, it runs adg only\n");
	}
}
