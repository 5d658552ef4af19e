/* The model, the workers and the runner of the example trainers (see
 * runner.h). */
#include "runner.h"

#include "sync.h"

#include "../jitter.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ----------------------------------------------------------- the model */

struct tensor *tensor_new(int rows, int cols)
{
	struct tensor *t =
		malloc(sizeof *t + (size_t)rows * cols * sizeof(float));
	if (t != NULL)
		*t = (struct tensor){.rows = rows, .cols = cols};
	return t;
}

size_t param_elements(const struct param *p)
{
	return (size_t)p->value->rows * (size_t)p->value->cols;
}

int model_new(struct model *m, const struct param_shape *shapes, int n_params)
{
	memset(m, 0, sizeof *m);
	if (n_params > MAX_PARAMS)
		return ADG_EINVAL;
	m->n_params = n_params;
	int rc = adg_registry_new(NULL, &m->registry);
	for (int i = 0; i < n_params && rc == 0; i++) {
		struct param *p = &m->params[i];
		p->name = shapes[i].name;
		p->value = tensor_new(shapes[i].rows, shapes[i].cols);
		rc = p->value == NULL ? ADG_ENOMEM
				      : adg_leaf(m->registry, &p->leaf);
		if (rc == 0)
			rc = adg_node_id(p->leaf, &p->id);
	}
	return rc;
}

int model_free(struct model *m)
{
	int failed = 0;
	/* Every step's graph is gone: only the parameters' leaves live. */
	uint64_t leaves = 0;
	for (int i = 0; i < m->n_params; i++)
		leaves += m->params[i].leaf != NULL;
	struct adg_stats st = {.size = sizeof st};
	if (m->registry != NULL && adg_registry_stats(m->registry, &st) == 0 &&
	    (st.live_nodes != leaves || st.live_graphs != 0)) {
		fprintf(stderr,
			"%" PRIu64 " live nodes, %" PRIu64
			" live graphs at the end\n",
			st.live_nodes, st.live_graphs);
		failed = 1;
	}
	int rc = 0;
	for (int i = 0; i < m->n_params; i++) {
		int r = m->params[i].leaf != NULL
				? adg_node_unref(m->params[i].leaf)
				: 0;
		rc = rc != 0 ? rc : r;
		free(m->params[i].value);
	}
	int r = adg_registry_free(m->registry);
	rc = rc != 0 ? rc : r;
	if (rc != 0) {
		fprintf(stderr, "adg_registry_free: %s\n", adg_strerror(rc));
		failed = 1;
	}
	return failed;
}

void model_init(struct model *m, uint64_t seed)
{
	uint64_t state = seed;
	for (int i = 0; i < m->n_params; i++) {
		struct tensor *t = m->params[i].value;
		double scale = t->rows > 1 ? sqrt(2.0 / t->cols) : 0;
		for (size_t k = 0, n = param_elements(&m->params[i]); k < n;
		     k++)
			t->data[k] = (float)(scale * normal(&state));
	}
}

uint64_t model_hash(const struct model *m)
{
	uint64_t hash = HASH_START;
	for (int i = 0; i < m->n_params; i++)
		hash = hash_floats(hash, m->params[i].value->data,
				   param_elements(&m->params[i]));
	return hash;
}

void dataset_free(struct dataset *d)
{
	free(d->x);
	free(d->y);
}

/* ---------------------------------------------------------- the workers */

/* A thread's state: its recorder, gradient pool and hooks. */
struct worker {
	struct runner *runner;
	size_t index;
	pthread_t thread;
	int rc; /* the epoch's first error */
	struct recorder rec;
	struct tensor_pool pool;
	adg_grad_ops ops; /* gradients from pool */
	/* What takes each parameter's gradient from the backward: Hogwild's
	 * ready hook, which applies it, or in sync the reducer's hook of
	 * participant index, which hands it to the reducer. */
	adg_backward_options hogwild;
	struct sync_participant part;
	/* What the forward reads: sync, the shared values; hogwild, this
	 * thread's copy (owned). */
	struct tensor *weights[MAX_PARAMS];
	/* --profile: seconds this thread spent in the reducer's add and
	 * apply, so far (written by this thread only). */
	double fold_s, apply_s;
	/* --sum exact: this thread's accumulator of each parameter, which
	 * its units' backward passes add to (exact_backward's hook); and
	 * room for a slice's rounded sum, for the applies it runs. */
	adg_exact *sums[MAX_PARAMS];
	adg_backward_options exact_backward;
	float *rounded;
};

/* --profile: where one round's time went on one thread, in seconds. */
struct round_clock {
	double compute; /* forward and backward of its units, folds aside */
	double fold;	/* adds of the reducer's tree (and slices) */
	double apply;	/* SGD steps */
	double wait;	/* the rest of its round: the deal, the barrier */
};

/* The worker this thread runs (NULL on the main thread), for the
 * reducer's callbacks, which run on whichever worker the reducer picks. */
static _Thread_local struct worker *this_worker;

/* Hogwild: x -= lr * g with relaxed atomic loads and stores (see struct
 * param): a load and a store, not an atomic read-modify-write, so that
 * another thread's update in between is lost, as Hogwild allows. */
static void sgd_step_hogwild(struct param *p, const struct tensor *g, float lr)
{
	float *value = p->value->data;
	const float *d = g->data;
	for (size_t k = 0, n = param_elements(p); k < n; k++) {
		float v;
		__atomic_load(&value[k], &v, __ATOMIC_RELAXED);
		v -= lr * d[k];
		__atomic_store(&value[k], &v, __ATOMIC_RELAXED);
	}
}

/* Hogwild: copies a parameter into this thread's tensor with relaxed
 * loads, element by element, so the copy may mix two threads' updates,
 * which Hogwild accepts. */
static void snapshot(const struct param *p, struct tensor *t)
{
	float *value = p->value->data;
	for (size_t k = 0, n = param_elements(p); k < n; k++)
		__atomic_load(&value[k], &t->data[k], __ATOMIC_RELAXED);
}

/* The index of the parameter whose leaf is id in m, or -1: what a ready
 * hook, told a leaf's id, looks its parameter up by. */
static int param_index(const struct model *m, uint64_t id)
{
	for (int i = 0; i < m->n_params; i++)
		if (m->params[i].id == id)
			return i;
	return -1;
}

/* Hogwild's gradient-ready hook: called for each parameter (leaves only)
 * as soon as its gradient is final, while the backward goes on with
 * earlier layers. Applies SGD to that parameter and gives the gradient
 * back. */
static int hogwild_ready(uint64_t id, void **grad, void *ctx)
{
	struct worker *w = ctx;
	struct model *m = w->runner->model;
	const struct tensor *g = *grad;
	if (g == NULL)
		return 0;
	int i = param_index(m, id);
	if (i >= 0)
		sgd_step_hogwild(&m->params[i], g, w->runner->lr);
	*grad = NULL; /* taken: back to the pool */
	pool_put(&w->pool, (struct tensor *)g);
	return 0;
}

/* Sync: the reducer's ops. add folds one unit's gradient (or a subtree's
 * sum) into another's (a gradient of some thread's pool, which it reads
 * and writes but does not keep); apply takes one SGD step with the sum of
 * the batch's gradients, with plain stores (see struct param); release
 * gives a gradient back to the pool of the thread that made it, on that
 * thread. */
static int reducer_add(void **sum, const void *value, void *ctx)
{
	const struct runner *r = ctx;
	double start = r->profile ? now() : 0;
	tensor_add(*sum, value);
	if (r->profile)
		this_worker->fold_s += now() - start;
	return 0;
}

/* Elements [*lo, *hi) of slice k of n_slices of n elements. */
static void slice_of(size_t n, size_t k, size_t n_slices, size_t *lo,
		     size_t *hi)
{
	*lo = n * k / n_slices;
	*hi = n * (k + 1) / n_slices;
}

/* A large parameter's sum, one slice at a time (reduce-scatter: several
 * threads fold and apply its slices at once). */
static int reducer_add_slice(void *sum, const void *value, size_t slice,
			     size_t n_slices, void *ctx)
{
	const struct runner *r = ctx;
	double start = r->profile ? now() : 0;
	struct tensor *s = sum;
	const struct tensor *g = value;
	size_t lo, hi;
	slice_of((size_t)s->rows * (size_t)s->cols, slice, n_slices, &lo, &hi);
	for (size_t k = lo; k < hi; k++)
		s->data[k] += g->data[k];
	if (r->profile)
		this_worker->fold_s += now() - start;
	return 0;
}

/* A whole parameter is its one slice, 0 of 1. */
static int reducer_apply(const adg_reduction *r, void *ctx)
{
	struct runner *run = ctx;
	const struct tensor *g = r->sum;
	if (g == NULL)
		return 0;
	double start = run->profile ? now() : 0;
	struct param *p = &run->model->params[r->param];
	float *value = p->value->data, lr = run->lr;
	size_t lo, hi;
	slice_of(param_elements(p), r->slice, r->n_slices, &lo, &hi);
	for (size_t k = lo; k < hi; k++)
		value[k] -= lr * g->data[k];
	if (run->profile)
		this_worker->apply_s += now() - start;
	return 0;
}

static void reducer_release(void *value, size_t participant, void *ctx)
{
	struct runner *run = ctx;
	pool_put(&run->workers[participant].pool, value);
}

/* --sum exact: the backward's ready hook adds each parameter's gradient
 * to this thread's accumulator of it, exactly, and gives the tensor back
 * to the pool; the reducer, without units, merges the threads'
 * accumulators (add, add_slice: the order changes no bit), apply rounds
 * each sum once and steps, and release clears an accumulator on its
 * thread for the next round. */
static int exact_ready(uint64_t id, void **grad, void *ctx)
{
	struct worker *w = ctx;
	const struct model *m = w->runner->model;
	struct tensor *g = *grad;
	if (g == NULL)
		return 0;
	int i = param_index(m, id), rc = 0;
	if (i >= 0)
		rc = adg_exact_add(w->sums[i], 0, g->data,
				   param_elements(&m->params[i]));
	*grad = NULL; /* taken: back to the pool */
	pool_put(&w->pool, g);
	return rc;
}

static int exact_add_slice(void *sum, const void *value, size_t slice,
			   size_t n_slices, void *ctx)
{
	const struct runner *r = ctx;
	double start = r->profile ? now() : 0;
	size_t n = 0, lo, hi;
	int rc = adg_exact_length(sum, &n);
	slice_of(n, slice, n_slices, &lo, &hi);
	if (rc == 0)
		rc = adg_exact_merge(sum, value, lo, hi - lo);
	if (r->profile)
		this_worker->fold_s += now() - start;
	return rc;
}

/* A whole parameter's merge: its one slice, 0 of 1. */
static int exact_add(void **sum, const void *value, void *ctx)
{
	return exact_add_slice(*sum, value, 0, 1, ctx);
}

static int exact_apply(const adg_reduction *r, void *ctx)
{
	struct runner *run = ctx;
	if (r->sum == NULL)
		return 0;
	double start = run->profile ? now() : 0;
	struct param *p = &run->model->params[r->param];
	float *value = p->value->data, lr = run->lr;
	float *g = this_worker->rounded;
	size_t lo, hi;
	slice_of(param_elements(p), r->slice, r->n_slices, &lo, &hi);
	int rc = adg_exact_round(r->sum, lo, g, hi - lo);
	for (size_t k = lo; rc == 0 && k < hi; k++)
		value[k] -= lr * g[k - lo];
	if (run->profile)
		this_worker->apply_s += now() - start;
	return rc;
}

static void exact_release(void *value, size_t participant, void *ctx)
{
	(void)participant, (void)ctx;
	adg_exact_clear(value); /* cannot fail: not NULL */
}

/* Sync: a reducer of the model's parameters, participant t worker t,
 * with ceil(batch / unit_rows) units a round (none: unit_rows 0). The
 * applies wait for the round's end (all or nothing): a failed batch
 * leaves every weight as it was. */
static int reducer_new(struct runner *r)
{
	const struct model *m = r->model;
	uint64_t ids[MAX_PARAMS];
	size_t elements[MAX_PARAMS];
	for (int i = 0; i < m->n_params; i++) {
		ids[i] = m->params[i].id;
		elements[i] = param_elements(&m->params[i]);
	}
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = (size_t)r->n_threads,
		.n_units = r->unit_rows > 0 && !r->exact
				   ? (size_t)((r->batch + r->unit_rows - 1) /
					      r->unit_rows)
				   : 0,
		.param_ids = ids,
		.n_params = (size_t)m->n_params,
		.ops = {.add = reducer_add,
			.apply = reducer_apply,
			.release = reducer_release,
			.ctx = r,
			.add_slice = reducer_add_slice},
	};
	if (r->exact)
		o.ops = (adg_reducer_ops){.add = exact_add,
					  .apply = exact_apply,
					  .release = exact_release,
					  .ctx = r,
					  .add_slice = exact_add_slice};
	return sync_reducer_new(&o, elements, r->slice_from, &r->reducer);
}

/* Prepares worker index, before its thread starts; returns 0 or an
 * ADG_E* code. */
static int worker_init(struct runner *r, size_t index)
{
	struct worker *w = &r->workers[index];
	const struct model *m = r->model;
	memset(w, 0, sizeof *w);
	w->runner = r;
	w->index = index;
	w->rec.registry = m->registry;
	w->rec.pool = &w->pool;
	w->ops = tensor_grad_ops(&w->pool);
	if (r->mode == MODE_SYNC) {
		for (int i = 0; i < m->n_params; i++)
			w->weights[i] = m->params[i].value;
		if (!r->exact)
			return sync_participant_init(&w->part, r->reducer,
						     index, r->unit_rows > 0);
		size_t largest = 0;
		for (int i = 0; i < m->n_params; i++) {
			size_t n = param_elements(&m->params[i]);
			int rc = adg_exact_new(n, &w->sums[i]);
			if (rc != 0)
				return rc;
			largest = n > largest ? n : largest;
		}
		w->rounded = malloc(largest * sizeof *w->rounded);
		w->exact_backward = (adg_backward_options){
			.size = sizeof(adg_backward_options),
			.on_ready = exact_ready,
			.on_ready_ctx = w,
			.leaves_only = 1};
		return w->rounded != NULL ? 0 : ADG_ENOMEM;
	}
	w->hogwild =
		(adg_backward_options){.size = sizeof(adg_backward_options),
				       .on_ready = hogwild_ready,
				       .on_ready_ctx = w,
				       .leaves_only = 1};
	for (int i = 0; i < m->n_params; i++) {
		const struct tensor *v = m->params[i].value;
		w->weights[i] = tensor_new(v->rows, v->cols);
		if (w->weights[i] == NULL)
			return ADG_ENOMEM;
	}
	return 0;
}

/* Frees what the worker holds, after its thread ended (or did not
 * start); returns -1 if a gradient tensor is still out of its pool (a
 * leak of the layer's, or of the reducer's). */
static int worker_free(struct worker *w)
{
	long out = w->pool.outstanding;
	pool_clear(&w->pool);
	arena_free(&w->rec.arena);
	if (w->runner->mode == MODE_HOGWILD)
		for (int i = 0; i < w->runner->model->n_params; i++)
			free(w->weights[i]);
	for (int i = 0; i < MAX_PARAMS; i++)
		adg_exact_free(w->sums[i]);
	free(w->rounded);
	return out == 0 ? 0 : -1;
}

/* Records worker w's forward pass on the training examples order[0..n)
 * and runs its backward, from the loss weighted by scale in the step's
 * loss (1 in Hogwild; in sync the share's n / the batch's rows, so that
 * the threads' gradients add up to those of the batch's mean loss).
 * backward's ready hook takes each parameter's gradient. Returns 0 or an
 * ADG_E* code; what was recorded is dropped either way. */
static int train_batch(struct worker *w, const int *order, int n, float scale,
		       const adg_backward_options *backward)
{
	struct runner *r = w->runner;
	const struct model *m = r->model;
	const struct dataset *d = r->train;
	struct recorder *rec = &w->rec;
	size_t features = (size_t)d->features;
	struct var x = {arena_tensor(&rec->arena, n, d->features), NULL};
	int *labels = arena_alloc(&rec->arena, (size_t)n * sizeof *labels);
	if (x.value == NULL || labels == NULL) {
		recorder_reset(rec); /* nothing recorded: cannot fail */
		return ADG_ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		memcpy(x.value->data + (size_t)i * features,
		       d->x + (size_t)order[i] * features,
		       features * sizeof(float));
		labels[i] = d->y[order[i]];
	}
	struct var p[MAX_PARAMS];
	for (int i = 0; i < m->n_params; i++) {
		if (r->mode == MODE_HOGWILD)
			snapshot(&m->params[i], w->weights[i]);
		p[i] = (struct var){w->weights[i], m->params[i].leaf};
	}
	struct var loss;
	int rc = r->ops->forward(rec, x, labels, p, &loss);
	if (rc == 0) {
		struct tensor *seed = pool_get(&w->pool, 1, 1);
		if (seed == NULL) {
			rc = ADG_ENOMEM;
		} else {
			seed->data[0] = scale; /* d step loss / d loss */
			rc = backward_hooked(m->registry, loss.node, seed,
					     &w->ops, backward);
		}
	}
	int reset = recorder_reset(rec);
	return rc != 0 ? rc : reset;
}

/* ----------------------------------------------------------- the runner */

/* Batch k's rows: the batch size, or fewer for the last. */
static int batch_rows(const struct runner *r, int k)
{
	int left = r->train->n - k * r->batch;
	return left < r->batch ? left : r->batch;
}

static void train_epoch_hogwild(struct worker *w)
{
	struct runner *r = w->runner;
	/* Relaxed, both: see struct runner. */
	while (w->rc == 0 &&
	       !atomic_load_explicit(&r->stop, memory_order_relaxed)) {
		int k = atomic_fetch_add_explicit(&r->next_batch, 1,
						  memory_order_relaxed);
		if (k >= r->n_batches)
			break;
		w->rc = train_batch(w, r->order + k * r->batch,
				    batch_rows(r, k), 1, &w->hogwild);
		if (w->rc != 0)
			atomic_store_explicit(&r->stop, 1,
					      memory_order_relaxed);
	}
}

/* Sync: what a unit of batch k trains on. */
struct sync_batch {
	struct worker *w;
	const int *order; /* the batch's rows */
	int rows;	  /* how many: the batch size, or fewer for the last */
	double compute;	  /* --profile: its units' forward and backward */
};

/* Trains unit `unit` of a batch: rows [unit * unit_rows, ...) with units,
 * else participant unit's share. Each unit's loss is weighted by its rows
 * / the batch's, so that the units' gradients add up to those of the
 * batch's mean loss. A unit with no rows (past the rows of a last batch
 * shorter than the others, or a share of a batch shorter than T) trains
 * nothing: it gives NULL contributions, which change no sum. */
static int sync_unit(size_t unit, void *ctx)
{
	struct sync_batch *b = ctx;
	const struct runner *r = b->w->runner;
	int first, n;
	if (r->unit_rows > 0) {
		long lo = (long)unit * r->unit_rows;
		first = lo < b->rows ? (int)lo : b->rows;
		n = b->rows - first < r->unit_rows ? b->rows - first
						   : r->unit_rows;
	} else {
		batch_share(b->rows, (int)unit, r->n_threads, &first, &n);
	}
	if (n == 0)
		return 0;
	double start = r->profile ? now() : 0, folds = b->w->fold_s;
	int rc = train_batch(
		b->w, b->order + first, n, (float)n / (float)b->rows,
		r->exact ? &b->w->exact_backward : &b->w->part.backward);
	if (r->profile)
		b->compute += now() - start - (b->w->fold_s - folds);
	return rc;
}

/* --sum exact: one round of worker w on batch k: the batch's units, taken
 * as they come, each added to w's accumulators, which go to the reducer;
 * then the round's end. Returns the round's result (the same for all). */
static int exact_round(struct worker *w, struct sync_batch *b, int k)
{
	struct runner *r = w->runner;
	const struct model *m = r->model;
	int n_units = (b->rows + r->unit_rows - 1) / r->unit_rows, rc = 0;
	for (;;) {
		/* Relaxed: see struct runner. */
		int unit = atomic_fetch_add_explicit(&r->next_unit[k], 1,
						     memory_order_relaxed);
		if (unit >= n_units)
			break;
		jitter_pause(); /* the tests' other interleavings */
		if ((rc = sync_unit((size_t)unit, b)) != 0)
			break;
	}
	for (int i = 0; i < m->n_params && rc == 0; i++)
		rc = adg_reducer_give(r->reducer, w->index, m->params[i].id,
				      w->sums[i]);
	return adg_reducer_end(r->reducer, w->index, rc);
}

/* Every thread takes units of every batch (or its share, without units),
 * in step with the others: adg_reducer_end returns once the batch's
 * updates are applied, so the next batch's forward reads updated
 * weights, and it returns the same result to every thread, so that all
 * stop at the same batch on an error. */
static void train_epoch_sync(struct worker *w)
{
	struct runner *r = w->runner;
	for (int k = 0; k < r->n_batches && w->rc == 0; k++) {
		struct sync_batch b = {w, r->order + k * r->batch,
				       batch_rows(r, k), 0};
		double start = r->profile ? now() : 0;
		double folds = w->fold_s, applies = w->apply_s;
		w->rc = r->exact ? exact_round(w, &b, k)
				 : sync_round(&w->part, sync_unit, &b);
		if (!r->profile)
			continue;
		struct round_clock *c =
			&r->clocks[(size_t)k * (size_t)r->n_threads + w->index];
		c->compute = b.compute;
		c->fold = w->fold_s - folds;
		c->apply = w->apply_s - applies;
		c->wait = now() - start - c->compute - c->fold - c->apply;
	}
}

static void *thread_main(void *arg)
{
	struct worker *w = arg;
	unsigned seen = 0;
	this_worker = w;
	while (rendezvous_wait(&w->runner->meet, &seen)) {
		if (w->runner->mode == MODE_SYNC)
			train_epoch_sync(w);
		else
			train_epoch_hogwild(w);
		rendezvous_done(&w->runner->meet);
	}
	return NULL;
}

/* The loss and accuracy on the training examples, and the accuracy on
 * the test examples. */
static int evaluate(const struct runner *r, double *loss,
		    double *train_accuracy, double *test_accuracy)
{
	double unused;
	int rc = r->ops->evaluate(r->model, r->train, loss, train_accuracy);
	if (rc == 0)
		rc = r->ops->evaluate(r->model, r->test, &unused,
				      test_accuracy);
	return rc;
}

/* --profile: where the last epoch's rounds went, in microseconds, means
 * over its rounds: the round (its slowest thread's whole), and the parts
 * of the thread that computed longest (the critical path: its compute,
 * its folds and applies, and its wait, for the deal and the barrier);
 * then every thread's compute, folds and applies together, and the
 * least any thread waited (the barrier's own cost). */
static void print_profile(const struct runner *r)
{
	double round = 0, part[4] = {0}, all[3] = {0}, least = 0;
	int t_n = r->n_threads;
	for (int k = 0; k < r->n_batches; k++) {
		const struct round_clock *c = &r->clocks[(size_t)k * t_n];
		int slow = 0;
		double longest = 0, min_wait = c[0].wait;
		for (int t = 0; t < t_n; t++) {
			double whole = c[t].compute + c[t].fold + c[t].apply +
				       c[t].wait;
			longest = whole > longest ? whole : longest;
			slow = c[t].compute > c[slow].compute ? t : slow;
			min_wait = c[t].wait < min_wait ? c[t].wait : min_wait;
			all[0] += c[t].compute;
			all[1] += c[t].fold;
			all[2] += c[t].apply;
		}
		round += longest;
		part[0] += c[slow].compute;
		part[1] += c[slow].fold;
		part[2] += c[slow].apply;
		part[3] += c[slow].wait;
		least += min_wait;
	}
	double us = 1e6 / r->n_batches;
	printf("profile T=%d B=%d unit_rows=%d: a round %.1f us: the slowest "
	       "thread's compute %.1f, folds %.1f, applies %.1f, wait %.1f; "
	       "all threads' compute %.1f, folds %.1f, applies %.1f; least "
	       "wait %.1f\n",
	       t_n, r->batch, r->unit_rows, round * us, part[0] * us,
	       part[1] * us, part[2] * us, part[3] * us, all[0] * us,
	       all[1] * us, all[2] * us, least * us);
}

FILE *runner_csv(const char *path)
{
	FILE *csv = fopen(path, "w");
	if (csv == NULL)
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
	else
		fprintf(csv, "threads,batch,epoch,seconds,loss,train_accuracy,"
			     "test_accuracy,samples_per_s\n");
	return csv;
}

int runner_run(struct runner *r, FILE *csv, struct outcome *outcome)
{
	int n_train = r->train->n;
	int started = 0, failed = 0, rc = rendezvous_init(&r->meet);
	if (rc != 0) {
		fprintf(stderr, "rendezvous: %s\n", strerror(rc));
		return 1;
	}
	r->reducer = NULL;
	r->n_batches = (n_train + r->batch - 1) / r->batch;
	r->workers = calloc((size_t)r->n_threads, sizeof *r->workers);
	r->order = malloc((size_t)n_train * sizeof *r->order);
	if (r->workers == NULL || r->order == NULL) {
		fprintf(stderr, "out of memory\n");
		failed = 1;
	}
	r->profile = r->profile && r->mode == MODE_SYNC;
	r->clocks =
		r->profile ? calloc((size_t)r->n_batches * (size_t)r->n_threads,
				    sizeof *r->clocks)
			   : NULL;
	if (r->profile && r->clocks == NULL) {
		fprintf(stderr, "out of memory\n");
		failed = 1;
	}
	r->exact = r->exact && r->mode == MODE_SYNC && r->unit_rows > 0;
	r->next_unit =
		r->exact ? calloc((size_t)r->n_batches, sizeof *r->next_unit)
			 : NULL;
	if (r->exact && r->next_unit == NULL) {
		fprintf(stderr, "out of memory\n");
		failed = 1;
	}
	if (!failed && r->mode == MODE_SYNC && (rc = reducer_new(r)) != 0) {
		fprintf(stderr, "adg_reducer_new: %s\n", adg_strerror(rc));
		failed = 1;
	}
	/* Sync needs every worker: if one cannot start, no epoch opens. */
	for (; !failed && started < r->n_threads; started++) {
		struct worker *w = &r->workers[started];
		rc = worker_init(r, (size_t)started);
		if (rc != 0 || (rc = pthread_create(&w->thread, NULL,
						    thread_main, w)) != 0) {
			fprintf(stderr, "thread %d: %s\n", started,
				rc < 0 ? adg_strerror(rc) : strerror(rc));
			worker_free(w);
			failed = 1;
			break;
		}
	}
	double seconds = 0;
	long samples = 0;
	for (int epoch = 0; !failed && epoch < r->epochs; epoch++) {
		shuffle(r->order, n_train, r->seed, epoch);
		r->lr = learning_rate(r->first_lr, r->epochs, epoch);
		/* Relaxed: rendezvous_run's mutex publishes them. */
		atomic_store_explicit(&r->next_batch, 0, memory_order_relaxed);
		for (int k = 0; r->exact && k < r->n_batches; k++)
			atomic_store_explicit(&r->next_unit[k], 0,
					      memory_order_relaxed);
		double start = now();
		rendezvous_run(&r->meet, (unsigned)started);
		double took = now() - start;
		for (int t = 0; t < started; t++) {
			if (r->workers[t].rc != 0) {
				fprintf(stderr, "thread %d: %s\n", t,
					adg_strerror(r->workers[t].rc));
				failed = 1;
			}
		}
		if (failed)
			break;
		seconds += took;
		samples += n_train;
		double loss, train_accuracy, test_accuracy;
		rc = evaluate(r, &loss, &train_accuracy, &test_accuracy);
		if (rc != 0) {
			fprintf(stderr, "evaluate: %s\n", adg_strerror(rc));
			failed = 1;
			break;
		}
		double rate = n_train / took;
		printf("T=%d B=%d ", r->n_threads, r->batch);
		if (r->name_mode)
			printf("%s ", mode_name(r->mode));
		printf("epoch %2d  loss %.4f  train %6.2f%%  test %6.2f%%  "
		       "%8.0f samples/s\n",
		       epoch + 1, loss, train_accuracy, test_accuracy, rate);
		fflush(stdout);
		if (csv != NULL)
			fprintf(csv, "%d,%d,%d,%.6f,%.6f,%.4f,%.4f,%.1f\n",
				r->n_threads, r->batch, epoch + 1, seconds,
				loss, train_accuracy, test_accuracy, rate);
		outcome->accuracy = test_accuracy;
	}
	rendezvous_quit(&r->meet);
	for (int t = 0; t < started; t++) {
		pthread_join(r->workers[t].thread, NULL);
		if (worker_free(&r->workers[t]) != 0) {
			fprintf(stderr, "thread %d: gradient tensors leaked\n",
				t);
			failed = 1;
		}
	}
	if (!failed) {
		outcome->hash = model_hash(r->model);
		printf("result threads=%d batch=%d epochs=%d "
		       "samples_per_s=%.0f test_accuracy=%.2f mode=%s "
		       "weights_hash=%016" PRIx64 " unit_rows=%d sum=%s\n",
		       r->n_threads, r->batch, r->epochs, samples / seconds,
		       outcome->accuracy, mode_name(r->mode), outcome->hash,
		       r->mode == MODE_SYNC ? r->unit_rows : 0,
		       r->exact ? "exact" : "float");
		if (r->profile)
			print_profile(r);
	}
	rc = adg_reducer_free(r->reducer);
	if (rc != 0) {
		fprintf(stderr, "adg_reducer_free: %s\n", adg_strerror(rc));
		failed = 1;
	}
	rendezvous_destroy(&r->meet);
	free(r->clocks);
	free(r->next_unit);
	free(r->order);
	free(r->workers);
	return failed;
}

int runner_same_weights(const int *threads, const struct outcome *outcomes,
			int run, int any_threads)
{
	for (int q = 0; q < run; q++) {
		if ((any_threads || threads[q] == threads[run]) &&
		    outcomes[q].hash != outcomes[run].hash) {
			fprintf(stderr,
				"T=%d and T=%d: runs %d and %d end with "
				"different weights (%016" PRIx64
				" and %016" PRIx64 ")\n",
				threads[q], threads[run], q + 1, run + 1,
				outcomes[q].hash, outcomes[run].hash);
			return 1;
		}
	}
	return 0;
}
