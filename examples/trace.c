/* A timeline of a threaded backward, in the trace-event format that
 * chrome://tracing and Perfetto read, and the graph it ran, in Graphviz
 * DOT.
 *
 * The graph: a batch of 8 samples through a two-layer net on scalars
 * (h = relu(w1 x), y = w2 h), each sample a branch, summed into a loss.
 * Its steps are named ("mul", "relu", "square", "loss") and do a little
 * arithmetic each, so that the workers have something to share.
 * on_step, called on the thread that runs each step, records when it
 * started and how long it ran; the program writes one complete event
 * ("ph": "X") per step, one row (tid) per thread.
 *
 * Usage: trace [trace.json [graph.dot]]; without arguments it only checks
 * that every step was traced once. */
#include <adg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "boxed.h"

#define SAMPLES 8
#define STEPS	(SAMPLES * 4 + SAMPLES - 1) /* 4 a sample, the adds */

static adg_registry *reg;

/* A step's closure: d out / d parent k = slope[k]. */
struct op {
	size_t n;
	double slope[2];
};

static double busy(double x)
{
	/* About 20 us of arithmetic, so that the timeline shows bars. */
	for (int i = 0; i < 20000; i++)
		x = x * 0.999999 + 1e-6;
	return x;
}

static int backward(adg_step_call *call, void *user)
{
	const struct op *op = user;
	double g = call->grad ? *(double *)call->grad : 0;
	g += 0 * busy(g); /* the work, folded in so it is not dropped */
	for (size_t k = 0; k < op->n; k++) {
		void *d = boxed(g * op->slope[k]);
		if (d == NULL)
			return ADG_ENOMEM;
		int rc = adg_step_give(call, k, d);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static adg_node *op(const char *name, adg_node *a, double da, adg_node *b,
		    double db)
{
	struct op *o = malloc(sizeof *o);
	if (o == NULL)
		return NULL;
	*o = (struct op){.n = b ? 2 : 1, .slope = {da, db}};
	adg_node *parents[2] = {a, b}, *out;
	adg_step step = {
		.backward = backward, .release = free, .user = o, .name = name};
	if (adg_op(reg, parents, o->n, &step, &out) != 0) {
		free(o);
		return NULL;
	}
	return out;
}

/* ---------------------------------------------------------- the trace */

struct event {
	uint64_t id;
	const char *name;
	int thread;
	uint64_t start_ns, duration_ns;
};

static struct event events[STEPS];
static atomic_int n_events;
static atomic_int n_threads;
static _Thread_local int thread_row = -1;
static uint64_t origin_ns;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Runs on the thread that runs the step: a thread-local row, and the
 * event written at the after call, from its duration. */
static int on_step(const adg_step_event *e, void *ctx)
{
	(void)ctx;
	if (thread_row < 0)
		thread_row = atomic_fetch_add(&n_threads, 1);
	if (!e->after)
		return 0;
	int i = atomic_fetch_add(&n_events, 1);
	if (i >= STEPS)
		return ADG_EUSER; /* more steps than the graph has */
	events[i] = (struct event){
		.id = e->node_id,
		.name = e->name,
		.thread = thread_row,
		.start_ns = now_ns() - e->duration_ns - origin_ns,
		.duration_ns = e->duration_ns,
	};
	return 0;
}

static int write_file(const char *text, size_t len, void *f)
{
	return fwrite(text, 1, len, f) == len ? 0 : -1;
}

static int write_trace(const char *path)
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return -1;
	fprintf(f, "{\"traceEvents\": [\n");
	for (int i = 0; i < n_events; i++)
		fprintf(f,
			"  {\"name\": \"%s %llu\", \"ph\": \"X\", \"ts\": "
			"%.3f, \"dur\": %.3f, \"pid\": 1, \"tid\": %d}%s\n",
			events[i].name ? events[i].name : "step",
			(unsigned long long)events[i].id,
			events[i].start_ns / 1e3, events[i].duration_ns / 1e3,
			events[i].thread, i + 1 < n_events ? "," : "");
	fprintf(f, "], \"displayTimeUnit\": \"ms\"}\n");
	return fclose(f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	int rc = adg_registry_new(NULL, &reg);
	adg_node *w1 = NULL, *w2 = NULL, *squares[SAMPLES] = {0};
	if (rc == 0)
		rc = adg_leaf(reg, &w1);
	if (rc == 0)
		rc = adg_leaf(reg, &w2);
	const double v1 = 0.5, v2 = -1.5;
	for (int b = 0; b < SAMPLES && rc == 0; b++) {
		double x = 0.25 * (b + 1), h = v1 * x > 0 ? v1 * x : 0;
		adg_node *pre = op("mul", w1, x, NULL, 0);
		adg_node *act = pre ? op("relu", pre, h > 0, NULL, 0) : NULL;
		adg_node *y = act ? op("mul", act, v2, w2, h) : NULL;
		squares[b] = y ? op("square", y, 2 * v2 * h, NULL, 0) : NULL;
		for (adg_node **n = (adg_node *[]){pre, act, y}, **e = n + 3;
		     n < e; n++)
			if (*n != NULL)
				adg_node_unref(*n);
		rc = squares[b] != NULL ? 0 : ADG_ENOMEM;
	}
	/* The loss: the squares summed, by a chain of adds. */
	adg_node *loss = NULL;
	if (rc == 0) {
		adg_node *level[SAMPLES];
		for (int b = 0; b < SAMPLES; b++)
			level[b] = squares[b];
		loss = level[0];
		adg_node_ref(loss);
		for (int b = 1; b < SAMPLES && loss != NULL; b++) {
			adg_node *sum = op("loss", loss, 1, level[b], 1);
			adg_node_unref(loss);
			loss = sum;
		}
		rc = loss != NULL ? 0 : ADG_ENOMEM;
	}
	for (int b = 0; b < SAMPLES; b++)
		if (squares[b] != NULL)
			adg_node_unref(squares[b]);
	if (rc == 0 && argc > 2) {
		FILE *f = fopen(argv[2], "w");
		rc = f ? adg_graph_write_dot(loss, write_file, f) : -1;
		if (f != NULL && fclose(f) != 0)
			rc = -1;
	}
	adg_pool *pool = NULL;
	if (rc == 0)
		rc = adg_pool_new(3, &pool);
	if (rc == 0) {
		adg_executor executor;
		adg_pool_executor(pool, &executor);
		adg_backward_options o = {.size = sizeof o,
					  .executor = &executor,
					  .on_step = on_step};
		adg_grads *grads = NULL;
		void *seed = boxed(1);
		origin_ns = now_ns();
		rc = seed ? adg_backward_with(reg, loss, seed, &boxed_ops, &o,
					      &grads)
			  : ADG_ENOMEM;
		adg_grads_free(grads);
	}
	adg_pool_free(pool);
	/* Every step once. */
	if (rc == 0 && n_events != STEPS) {
		fprintf(stderr, "traced %d steps, want %d\n", (int)n_events,
			STEPS);
		rc = 1;
	}
	if (rc == 0 && argc > 1 && write_trace(argv[1]) != 0)
		rc = 1;
	if (rc == 0)
		printf("traced %d steps on %d thread%s\n", (int)n_events,
		       (int)n_threads, n_threads == 1 ? "" : "s");
	if (loss != NULL)
		adg_node_unref(loss);
	if (w1 != NULL)
		adg_node_unref(w1);
	if (w2 != NULL)
		adg_node_unref(w2);
	if (rc < 0)
		fprintf(stderr, "trace: %s\n", adg_strerror(rc));
	if (adg_registry_free(reg) != 0)
		rc = 1;
	return rc == 0 ? 0 : 1;
}
