/* Handwritten digits with libadg: a multi-layer perceptron 64-64-10
 * trained by SGD on T threads, on the UCI digits (1,797 images of 8x8
 * pixels; scripts/fetch-digits.sh fetches them).
 *
 * Every fifth image (row index % 5 == 4) is the test set, the rest train.
 * Each epoch shuffles the training images into one shared order. Two ways
 * to use the threads (--mode):
 * - hogwild (the default): the threads take mini-batches from the order in
 *   turn and, for each, record the forward pass as a graph (tensor.h), run
 *   its backward, and update the shared parameters without a lock as soon
 *   as each one's gradient is final (the gradient-ready hook);
 * - sync: every mini-batch is split across the threads; each records and
 *   runs the backward of its share, and hands each parameter's gradient
 *   from the hook to a gradient reducer (adg_reducer), which sums the
 *   threads' gradients in thread order and applies one SGD step.
 * Prints a line per epoch; --csv writes the same figures, and
 * scripts/digits.sh draws them. --export writes what bench/compare/ needs
 * to train the same model in PyTorch.
 *
 * Usage: digits [options] DATA.csv (--help lists them). Exit status 0;
 * 1 on an error or a missed --min-test-accuracy; 2 on bad usage; 77 when
 * the data is missing and --skip-if-missing is given. */
#include "runner.h"
#include "tensor.h"
#include "train.h"

#include <adg.h>
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIXELS	 64 /* 8 x 8, each 0..16 */
#define HIDDEN	 64
#define CLASSES	 10
#define N_PARAMS 4
#define MAX_RUNS 16 /* thread counts in one --threads list */

/* ---------------------------------------------------------------- data */

struct dataset {
	int n;
	float *x; /* n x PIXELS, scaled to 0..1 */
	int *y;	  /* n labels, 0..9 */
};

struct digits {
	struct dataset train, test;
};

static int dataset_alloc(struct dataset *d, int n)
{
	d->n = 0;
	d->x = malloc((size_t)n * PIXELS * sizeof *d->x);
	d->y = malloc((size_t)n * sizeof *d->y);
	return d->x != NULL && d->y != NULL ? 0 : -1;
}

static void dataset_free(struct dataset *d)
{
	free(d->x);
	free(d->y);
}

/* Reads the csv: 64 pixels and a label a line. Row i goes to the test
 * set when i % 5 == 4. Returns 0, or prints what is wrong and returns -1
 * (-2 when the file does not exist). */
static int load_digits(const char *path, struct digits *out)
{
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		int missing = errno == ENOENT; /* before fprintf changes it */
		fprintf(stderr, "%s: %s (scripts/fetch-digits.sh fetches it)\n",
			path, strerror(errno));
		return missing ? -2 : -1;
	}
	enum { MAX_ROWS = 4096 };
	int rc = 0, row = 0;
	char line[1024];
	if (dataset_alloc(&out->train, MAX_ROWS) != 0 ||
	    dataset_alloc(&out->test, MAX_ROWS) != 0) {
		fprintf(stderr, "%s: out of memory\n", path);
		rc = -1;
	}
	while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
		struct dataset *d = row % 5 == 4 ? &out->test : &out->train;
		if (row == MAX_ROWS) {
			fprintf(stderr, "%s: more than %d rows\n", path,
				MAX_ROWS);
			rc = -1;
			break;
		}
		char *p = line;
		for (int i = 0; i <= PIXELS && rc == 0; i++) {
			char *end;
			long v = strtol(p, &end, 10);
			int max = i < PIXELS ? 16 : CLASSES - 1;
			char sep = i < PIXELS ? ',' : '\n';
			if (end == p || v < 0 || v > max ||
			    (*end != sep && !(i == PIXELS && *end == '\0'))) {
				fprintf(stderr,
					"%s: line %d, field %d: not a number "
					"in 0..%d followed by '%s'\n",
					path, row + 1, i + 1, max,
					sep == ',' ? "," : "\\n");
				rc = -1;
			} else if (i < PIXELS) {
				d->x[(size_t)d->n * PIXELS + i] = (float)v / 16;
			} else {
				d->y[d->n] = (int)v;
			}
			p = end + 1;
		}
		d->n++;
		row++;
	}
	if (rc == 0 && ferror(f)) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		rc = -1;
	}
	if (rc == 0 && out->test.n == 0) {
		fprintf(stderr, "%s: %d rows, too few to split\n", path, row);
		rc = -1;
	}
	fclose(f);
	return rc;
}

/* ---------------------------------------------------------------- model */

/* A parameter shared by every thread. Hogwild: threads read and write
 * its values without a lock, each element with relaxed atomic loads and
 * stores (_Atomic float), so that concurrent updates may be lost, as
 * Hogwild allows, but never make a data race, which C does not allow.
 * Relaxed is enough: a parameter publishes nothing else, and a thread
 * needs no particular other thread's update to be correct. Sync: the
 * reducer orders every access (one thread applies a round's update after
 * every thread's last read in that round, and adg_reducer_end returns
 * after it), so the same relaxed accesses are enough there too. */
struct param {
	const char *name;
	int rows, cols;
	_Atomic float *value;
	adg_node *leaf; /* one leaf for all threads: it couples no graphs */
	uint64_t id;
};

struct model {
	adg_registry *registry;
	struct param params[N_PARAMS]; /* w1 (64 x 64), b1, w2 (10 x 64), b2 */
};

static int model_new(struct model *m)
{
	static const struct {
		const char *name;
		int rows, cols;
	} shapes[N_PARAMS] = {{"w1", HIDDEN, PIXELS},
			      {"b1", 1, HIDDEN},
			      {"w2", CLASSES, HIDDEN},
			      {"b2", 1, CLASSES}};
	memset(m, 0, sizeof *m);
	int rc = adg_registry_new(NULL, &m->registry);
	for (int i = 0; i < N_PARAMS && rc == 0; i++) {
		struct param *p = &m->params[i];
		p->name = shapes[i].name;
		p->rows = shapes[i].rows;
		p->cols = shapes[i].cols;
		p->value = calloc((size_t)p->rows * p->cols, sizeof *p->value);
		rc = p->value == NULL ? ADG_ENOMEM
				      : adg_leaf(m->registry, &p->leaf);
		if (rc == 0)
			rc = adg_node_id(p->leaf, &p->id);
	}
	return rc;
}

/* Drops the leaves and frees the registry; returns the first error. */
static int model_free(struct model *m)
{
	int rc = 0;
	for (int i = 0; i < N_PARAMS; i++) {
		int r = m->params[i].leaf != NULL
				? adg_node_unref(m->params[i].leaf)
				: 0;
		rc = rc != 0 ? rc : r;
		free(m->params[i].value);
	}
	int r = adg_registry_free(m->registry);
	return rc != 0 ? rc : r;
}

/* He initialisation: weights ~ N(0, 2 / fan-in), biases 0. Runs while no
 * worker does (before the first epoch), but stores as the workers load. */
static void model_init(struct model *m, uint64_t seed)
{
	uint64_t state = seed;
	for (int i = 0; i < N_PARAMS; i++) {
		struct param *p = &m->params[i];
		double scale = p->rows > 1 ? sqrt(2.0 / p->cols) : 0;
		for (int k = 0; k < p->rows * p->cols; k++)
			atomic_store_explicit(&p->value[k],
					      (float)(scale * normal(&state)),
					      memory_order_relaxed);
	}
}

/* Copies a parameter into t (a plain tensor that BLAS may read) with
 * relaxed loads: element by element, so the copy may mix two threads'
 * updates, which Hogwild accepts. */
static void snapshot(const struct param *p, struct tensor *t)
{
	_Atomic float *value = p->value;
	float *copy = t->data;
	for (int k = 0, n = p->rows * p->cols; k < n; k++)
		copy[k] = atomic_load_explicit(&value[k], memory_order_relaxed);
}

/* Mean loss and accuracy (%) of the model on d, without a graph. */
static int evaluate(const struct model *m, const struct dataset *d,
		    double *loss, double *accuracy)
{
	struct tensor *w[N_PARAMS] = {0}, *x, *h, *a, *z, *logits, *probs;
	int rc = 0, correct = 0;
	struct tensor **all[] = {&x, &h, &a, &z, &logits, &probs};
	const int cols[] = {PIXELS, HIDDEN, HIDDEN, CLASSES, CLASSES, CLASSES};
	const size_t n_all = sizeof all / sizeof *all;
	for (size_t i = 0; i < n_all; i++) {
		*all[i] = malloc(sizeof(struct tensor) +
				 (size_t)d->n * cols[i] * sizeof(float));
		if (*all[i] == NULL)
			rc = ADG_ENOMEM;
		else
			**all[i] =
				(struct tensor){.rows = d->n, .cols = cols[i]};
	}
	for (int i = 0; i < N_PARAMS; i++) {
		const struct param *p = &m->params[i];
		w[i] = malloc(sizeof(struct tensor) +
			      (size_t)p->rows * p->cols * sizeof(float));
		if (w[i] == NULL) {
			rc = ADG_ENOMEM;
			continue;
		}
		*w[i] = (struct tensor){.rows = p->rows, .cols = p->cols};
		snapshot(p, w[i]);
	}
	if (rc == 0) {
		memcpy(x->data, d->x, (size_t)d->n * PIXELS * sizeof(float));
		matmul_nt(x, w[0], h);
		add_bias(h, w[1], h);
		relu(h, a);
		matmul_nt(a, w[2], z);
		add_bias(z, w[3], logits);
		*loss = softmax_xent(logits, d->y, probs, &correct) / d->n;
		*accuracy = 100.0 * correct / d->n;
	}
	for (size_t i = 0; i < n_all; i++)
		free(*all[i]);
	for (int i = 0; i < N_PARAMS; i++)
		free(w[i]);
	return rc;
}

/* ---------------------------------------------------------- the trainer */

/* A run's state (see struct runner), with the model and the data. */
struct trainer {
	struct runner run; /* threads, epochs, this epoch's lr and order */
	struct model *model;
	const struct digits *data;
	struct worker *workers; /* one per thread */
};

/* A thread's recorder, gradient pool and hooks. */
struct worker {
	struct trainer *trainer;
	struct recorder rec;
	struct tensor_pool pool;
	adg_grad_ops ops;
	adg_backward_options backward;
	struct tensor *weights[N_PARAMS]; /* this thread's copy, for BLAS */
};

/* x -= lr * g, element by element, with relaxed loads and stores (see
 * struct param). */
static void sgd_step(struct param *p, const struct tensor *g, float lr)
{
	_Atomic float *value = p->value;
	const float *d = g->data;
	for (int k = 0, n = p->rows * p->cols; k < n; k++) {
		/* A load and a store, not an atomic read-modify-write: in
		 * Hogwild another thread's update in between is lost, as
		 * Hogwild allows; in sync no other thread writes meanwhile. */
		float v = atomic_load_explicit(&value[k], memory_order_relaxed);
		atomic_store_explicit(&value[k], v - lr * d[k],
				      memory_order_relaxed);
	}
}

/* Hogwild's gradient-ready hook: called for each parameter (leaves only)
 * as soon as its gradient is final, while the backward goes on with
 * earlier layers. Applies SGD to that parameter and gives the gradient
 * back. */
static int apply_sgd(uint64_t id, void **grad, void *ctx)
{
	struct worker *w = ctx;
	const struct tensor *g = *grad;
	if (g == NULL)
		return 0;
	for (int i = 0; i < N_PARAMS; i++) {
		struct param *p = &w->trainer->model->params[i];
		if (p->id == id) {
			sgd_step(p, g, w->trainer->run.lr);
			break;
		}
	}
	*grad = NULL; /* taken: back to the pool */
	pool_put(&w->pool, (struct tensor *)g);
	return 0;
}

/* Sync: the reducer's ops. add folds one thread's gradient into the sum
 * (a gradient of another thread's, which it reads and writes but does not
 * keep); apply takes one SGD step with the sum of all threads'; release
 * gives a gradient back to its thread's pool, on that thread. */
static int reducer_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	tensor_add(*sum, value);
	return 0;
}

static int reducer_apply(const adg_reduction *r, void *ctx)
{
	struct trainer *tr = ctx;
	if (r->sum != NULL)
		sgd_step(&tr->model->params[r->param], r->sum, tr->run.lr);
	return 0;
}

static void reducer_release(void *value, size_t participant, void *ctx)
{
	struct trainer *tr = ctx;
	pool_put(&tr->workers[participant].pool, value);
}

/* Records and runs the backward of one step on the training images
 * order[0..n) (struct train_ops). The hook updates or hands on each
 * parameter's gradient. */
static int train_batch(void *ctx, size_t index, const int *order, int n,
		       float scale)
{
	struct trainer *tr = ctx;
	struct worker *w = &tr->workers[index];
	struct recorder *rec = &w->rec;
	const struct dataset *d = &tr->data->train;
	struct var x = {arena_tensor(&rec->arena, n, PIXELS), NULL};
	int *labels = arena_alloc(&rec->arena, (size_t)n * sizeof *labels);
	if (x.value == NULL || labels == NULL) {
		recorder_reset(rec); /* nothing recorded: cannot fail */
		return ADG_ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		memcpy(x.value->data + (size_t)i * PIXELS,
		       d->x + (size_t)order[i] * PIXELS,
		       PIXELS * sizeof(float));
		labels[i] = d->y[order[i]];
	}
	struct var p[N_PARAMS];
	for (int i = 0; i < N_PARAMS; i++) {
		snapshot(&tr->model->params[i], w->weights[i]);
		p[i] = (struct var){w->weights[i], tr->model->params[i].leaf};
	}
	struct var z1, h1, a1, z2, logits, loss;
	int correct;
	int rc = op_matmul_nt(rec, x, p[0], &z1);
	if (rc == 0)
		rc = op_add_bias(rec, z1, p[1], &h1);
	if (rc == 0)
		rc = op_relu(rec, h1, &a1);
	if (rc == 0)
		rc = op_matmul_nt(rec, a1, p[2], &z2);
	if (rc == 0)
		rc = op_add_bias(rec, z2, p[3], &logits);
	if (rc == 0)
		rc = op_softmax_xent(rec, logits, labels, &loss, &correct);
	if (rc == 0) {
		struct tensor *seed = pool_get(&w->pool, 1, 1);
		adg_grads *grads = NULL;
		if (seed == NULL) {
			rc = ADG_ENOMEM;
		} else {
			seed->data[0] = scale; /* d step loss / d loss */
			rc = adg_backward_with(tr->model->registry, loss.node,
					       seed, &w->ops, &w->backward,
					       &grads);
		}
		/* The hook took every gradient: the container is empty. */
		if (rc == 0)
			rc = adg_grads_free(grads);
	}
	int reset = recorder_reset(rec);
	return rc != 0 ? rc : reset;
}

static int worker_init(void *ctx, size_t index)
{
	struct trainer *tr = ctx;
	struct worker *w = &tr->workers[index];
	memset(w, 0, sizeof *w);
	w->trainer = tr;
	w->rec.registry = tr->model->registry;
	w->rec.pool = &w->pool;
	w->ops = tensor_grad_ops(&w->pool);
	int rc = 0;
	if (tr->run.mode == MODE_SYNC)
		rc = adg_reducer_hook(tr->run.reducer, index, &w->backward);
	else
		w->backward = (adg_backward_options){.on_ready = apply_sgd,
						     .on_ready_ctx = w,
						     .leaves_only = 1};
	for (int i = 0; i < N_PARAMS && rc == 0; i++) {
		const struct param *p = &tr->model->params[i];
		w->weights[i] =
			malloc(sizeof(struct tensor) +
			       (size_t)p->rows * p->cols * sizeof(float));
		if (w->weights[i] == NULL)
			return ADG_ENOMEM;
		*w->weights[i] =
			(struct tensor){.rows = p->rows, .cols = p->cols};
	}
	return rc;
}

/* Frees what the worker holds; returns -1 if a gradient tensor is still
 * out of its pool (a leak of the layer's, or of the reducer's). */
static int worker_free(void *ctx, size_t index)
{
	struct worker *w = &((struct trainer *)ctx)->workers[index];
	long out = w->pool.outstanding;
	pool_clear(&w->pool);
	arena_free(&w->rec.arena);
	for (int i = 0; i < N_PARAMS; i++)
		free(w->weights[i]);
	return out == 0 ? 0 : -1;
}

/* ----------------------------------------------------------- a run */

struct options {
	const char *data, *csv, *export_path;
	int threads[MAX_RUNS], n_runs;
	int batch, epochs;
	enum train_mode mode;
	double lr; /* the first epoch's; see learning_rate */
	uint64_t seed;
	double min_test_accuracy; /* %, or negative: no check */
	int skip_if_missing;
};

/* The final weights' fingerprint (hash_floats over every parameter). */
static uint64_t weights_hash(void *ctx)
{
	const struct model *m = ((struct trainer *)ctx)->model;
	uint64_t hash = HASH_START;
	for (int i = 0; i < N_PARAMS; i++) {
		const struct param *p = &m->params[i];
		for (int k = 0; k < p->rows * p->cols; k++) {
			/* No worker runs: relaxed only because _Atomic. */
			float v = atomic_load_explicit(&p->value[k],
						       memory_order_relaxed);
			hash = hash_floats(hash, &v, 1);
		}
	}
	return hash;
}

/* Sync: a reducer for the model's parameters, in the order of
 * model->params, for n_threads participants. */
static int reducer_new(struct trainer *tr)
{
	uint64_t ids[N_PARAMS];
	for (int i = 0; i < N_PARAMS; i++)
		ids[i] = tr->model->params[i].id;
	adg_reducer_options ro = {
		.n_participants = (size_t)tr->run.n_threads,
		.param_ids = ids,
		.n_params = N_PARAMS,
		.ops = {.add = reducer_add,
			.apply = reducer_apply,
			.release = reducer_release,
			.ctx = tr},
	};
	return adg_reducer_new(&ro, &tr->run.reducer);
}

/* The loss and accuracy on the training images, and the accuracy on the
 * test images (struct train_ops). */
static int evaluate_both(void *ctx, double *loss, double *train_accuracy,
			 double *test_accuracy)
{
	const struct trainer *tr = ctx;
	double unused;
	int rc = evaluate(tr->model, &tr->data->train, loss, train_accuracy);
	if (rc == 0)
		rc = evaluate(tr->model, &tr->data->test, &unused,
			      test_accuracy);
	return rc;
}

/* Trains a fresh model (the same initial weights every run) on n_threads
 * threads; returns 0, or 1 on an error (printed). */
static int run(const struct options *o, struct model *m,
	       const struct digits *data, int n_threads, FILE *csv,
	       struct outcome *outcome)
{
	static const struct train_ops ops = {.worker_init = worker_init,
					     .worker_free = worker_free,
					     .train_batch = train_batch,
					     .evaluate = evaluate_both,
					     .weights_hash = weights_hash};
	struct trainer tr = {.run = {.ops = &ops,
				     .mode = o->mode,
				     .n_threads = n_threads,
				     .batch = o->batch,
				     .epochs = o->epochs,
				     .n_train = data->train.n,
				     .first_lr = o->lr,
				     .seed = o->seed},
			     .model = m,
			     .data = data};
	tr.run.ctx = &tr;
	int failed = 0, rc;
	tr.workers = calloc((size_t)n_threads, sizeof *tr.workers);
	if (tr.workers == NULL) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	if (o->mode == MODE_SYNC && (rc = reducer_new(&tr)) != 0) {
		fprintf(stderr, "adg_reducer_new: %s\n", adg_strerror(rc));
		failed = 1;
	}
	model_init(m, o->seed);
	if (!failed)
		failed = runner_run(&tr.run, csv, outcome);
	rc = adg_reducer_free(tr.run.reducer);
	if (rc != 0) {
		fprintf(stderr, "adg_reducer_free: %s\n", adg_strerror(rc));
		failed = 1;
	}
	free(tr.workers);
	return failed;
}

/* Writes what bench/compare/ needs to train the same model the same way:
 * a text file of whitespace-separated words, in this order:
 *   digits-setup 1
 *   sizes 64 64 10                  pixels, hidden, classes
 *   epochs E  batch B  train N      N training images (row % 5 != 4)
 *   lr E floats                     each epoch's learning rate
 *   w1 64*64 floats  b1 64  w2 10*64  b2 10   initial values, row-major
 *   order E lines of N ints         each epoch's order, 0-based indices
 *                                   into the training images
 * Floats are printed with 9 significant digits, which reads back to the
 * same float. Returns 0 or -1 (printed). */
static int write_setup(const struct options *o, struct model *m,
		       const struct digits *data)
{
	FILE *f = fopen(o->export_path, "w");
	int *order = malloc((size_t)data->train.n * sizeof *order);
	if (f == NULL || order == NULL) {
		fprintf(stderr, "%s: %s\n", o->export_path,
			f == NULL ? strerror(errno) : "out of memory");
		if (f != NULL)
			fclose(f);
		free(order);
		return -1;
	}
	model_init(m, o->seed);
	fprintf(f, "digits-setup 1\nsizes %d %d %d\n", PIXELS, HIDDEN, CLASSES);
	fprintf(f, "epochs %d batch %d train %d\nlr", o->epochs, o->batch,
		data->train.n);
	for (int e = 0; e < o->epochs; e++)
		fprintf(f, " %.9g", learning_rate(o->lr, o->epochs, e));
	/* No worker runs: relaxed loads only because the values are
	 * _Atomic. */
	for (int i = 0; i < N_PARAMS; i++) {
		const struct param *p = &m->params[i];
		fprintf(f, "\n%s", p->name);
		for (int k = 0; k < p->rows * p->cols; k++)
			fprintf(f, " %.9g",
				atomic_load_explicit(&p->value[k],
						     memory_order_relaxed));
	}
	for (int e = 0; e < o->epochs; e++) {
		shuffle(order, data->train.n, o->seed, e);
		fprintf(f, "\norder");
		for (int i = 0; i < data->train.n; i++)
			fprintf(f, " %d", order[i]);
	}
	fputc('\n', f);
	free(order);
	if (ferror(f) | fclose(f)) {
		fprintf(stderr, "%s: write failed\n", o->export_path);
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *to)
{
	fprintf(to,
		"usage: digits [options] DATA.csv\n"
		"  --threads LIST   thread counts to train with, one run "
		"each (1,8; default 1)\n"
		"  --batch B        mini-batch size (default 1)\n"
		"  --epochs E       epochs per run (default 30)\n"
		"  --lr X           first epoch's learning rate, falling "
		"linearly to X / E\n"
		"                   at the last (default 0.1 for B = 1, 0.5 "
		"otherwise)\n"
		"  --mode M         hogwild (the default): each thread "
		"takes whole batches\n"
		"                   and updates the shared weights without a "
		"lock; sync: each\n"
		"                   batch is split across the threads, and a "
		"gradient reducer\n"
		"                   sums their gradients in thread order "
		"before one update\n"
		"  --seed S         initial weights and orders (default 1)\n"
		"  --csv FILE       write each epoch's figures\n"
		"  --export FILE    write the initial weights, learning rates "
		"and orders\n"
		"                   for bench/compare/ (see write_setup), and "
		"exit\n"
		"  --min-test-accuracy P  exit 1 unless every run ends at "
		"P%% or more\n"
		"  --skip-if-missing      exit 77 (a skipped test) when "
		"DATA.csv does not exist\n");
}

static int parse_options(int argc, char **argv, struct options *o)
{
	static const struct option longs[] = {
		{"threads", required_argument, NULL, 't'},
		{"batch", required_argument, NULL, 'b'},
		{"epochs", required_argument, NULL, 'e'},
		{"lr", required_argument, NULL, 'l'},
		{"seed", required_argument, NULL, 's'},
		{"mode", required_argument, NULL, 'o'},
		{"csv", required_argument, NULL, 'c'},
		{"export", required_argument, NULL, 'x'},
		{"min-test-accuracy", required_argument, NULL, 'm'},
		{"skip-if-missing", no_argument, NULL, 'k'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	*o = (struct options){.threads = {1},
			      .n_runs = 1,
			      .batch = 1,
			      .epochs = 30,
			      .lr = -1,
			      .seed = 1,
			      .mode = MODE_HOGWILD,
			      .min_test_accuracy = -1};
	int c;
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		char *end = NULL;
		switch (c) {
		case 't':
			o->n_runs = parse_threads(optarg, o->threads, MAX_RUNS);
			if (o->n_runs < 0)
				return -1;
			continue;
		case 'o':
			if (parse_mode(optarg, &o->mode) != 0)
				return -1;
			continue;
		case 'b':
			o->batch = (int)strtol(optarg, &end, 10);
			break;
		case 'e':
			o->epochs = (int)strtol(optarg, &end, 10);
			break;
		case 'l':
			o->lr = strtod(optarg, &end);
			break;
		case 's':
			o->seed = strtoull(optarg, &end, 10);
			break;
		case 'c':
			o->csv = optarg;
			continue;
		case 'x':
			o->export_path = optarg;
			continue;
		case 'm':
			o->min_test_accuracy = strtod(optarg, &end);
			break;
		case 'k':
			o->skip_if_missing = 1;
			continue;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return -1;
		}
		if (end == optarg || *end != '\0')
			return -1;
	}
	if (optind != argc - 1 || o->batch < 1 || o->batch > 4096 ||
	    o->epochs < 1 || o->epochs > 10000 || o->lr == 0)
		return -1;
	if (o->lr < 0)
		o->lr = o->batch == 1 ? 0.1 : 0.5;
	o->data = argv[optind];
	return 0;
}

int main(int argc, char **argv)
{
	struct options o;
	if (parse_options(argc, argv, &o) != 0) {
		usage(stderr);
		return 2;
	}
	/* The threads here are the parallelism: each BLAS call multiplies
	 * small matrices for one thread's batch. OpenBLAS's own pool would
	 * only hand them between threads (and ThreadSanitizer cannot see
	 * into its uninstrumented workers), so BLAS runs on the calling
	 * thread. OPENBLAS_NUM_THREADS=1 keeps the pool from even starting
	 * when the library loads; this covers a run without it. */
	openblas_set_num_threads(1);

	struct digits data = {{0}, {0}};
	int rc = load_digits(o.data, &data);
	if (rc != 0) {
		dataset_free(&data.train);
		dataset_free(&data.test);
		return rc == -2 && o.skip_if_missing ? 77 : 1;
	}
	printf("%s: %d training images, %d test images\n", o.data, data.train.n,
	       data.test.n);

	struct model m;
	int failed = 0;
	rc = model_new(&m);
	if (rc != 0) {
		fprintf(stderr, "model: %s\n", adg_strerror(rc));
		failed = 1;
	}
	int export_only = o.export_path != NULL;
	if (!failed && export_only)
		failed = write_setup(&o, &m, &data) != 0;
	FILE *csv = NULL;
	if (!failed && !export_only && o.csv != NULL) {
		csv = fopen(o.csv, "w");
		if (csv == NULL) {
			fprintf(stderr, "%s: %s\n", o.csv, strerror(errno));
			failed = 1;
		} else {
			fprintf(csv, "threads,batch,epoch,seconds,loss,"
				     "train_accuracy,test_accuracy,"
				     "samples_per_s\n");
		}
	}
	for (int r = 0; r < o.n_runs && !failed && !export_only; r++) {
		struct outcome out = {0, 0};
		failed = run(&o, &m, &data, o.threads[r], csv, &out);
		if (!failed && o.min_test_accuracy >= 0 &&
		    out.accuracy < o.min_test_accuracy) {
			fprintf(stderr,
				"T=%d: test accuracy %.2f%% is below %.2f%%\n",
				o.threads[r], out.accuracy,
				o.min_test_accuracy);
			failed = 1;
		}
	}
	if (csv != NULL && (ferror(csv) | fclose(csv))) {
		fprintf(stderr, "%s: write failed\n", o.csv);
		failed = 1;
	}
	/* Every step's graph is gone: only the parameters' leaves live. */
	struct adg_stats st;
	if (m.registry != NULL && adg_stats(m.registry, &st) == 0 &&
	    (st.live_nodes != N_PARAMS || st.live_graphs != 0)) {
		fprintf(stderr,
			"%" PRIu64 " live nodes, %" PRIu64
			" live graphs at the end\n",
			st.live_nodes, st.live_graphs);
		failed = 1;
	}
	rc = model_free(&m);
	if (rc != 0) {
		fprintf(stderr, "adg_registry_free: %s\n", adg_strerror(rc));
		failed = 1;
	}
	dataset_free(&data.train);
	dataset_free(&data.test);
	return failed;
}
