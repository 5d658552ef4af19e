/* The floor under examples/fashion/fashion.c's sync mode: the same model
 * (MLP 784-256-128-10, ReLU, softmax cross-entropy, SGD) trained on the
 * same data with the same GEMMs and elementwise work, over the kernels of
 * examples/tensor/ (the forward ones as they are, the backward ones as
 * tensor.c's steps make the same CBLAS calls), with no autodiff at all:
 * no graph, no nodes, no gradient hook, no reducer, no pool. What
 * fashion's time adds to this is libadg's and the tensor layer's.
 *
 * Reads the initial weights, learning rates and batch order from the
 * folder `fashion --export` writes (see write_setup in fashion.c). On T
 * threads it does what sync mode does: each batch is split across the
 * threads as batch_share splits it; each runs the forward and backward of
 * its share into gradients of its own, scaled as fashion scales them;
 * then, after a barrier, each applies the SGD step to its slice of every
 * parameter, summing the T gradients in thread order, and a second
 * barrier ends the batch. The arithmetic is fashion's, operation for
 * operation, so the final weights are bitwise those of `fashion --mode
 * sync --unit-rows 0` (a share per thread) with the same T, at T = 1 and
 * 2, where the reducer's tree over the shares is thread order (the
 * result line prints their hash, as fashion's does). Sync's default,
 * units of rows, sums other splits of each batch.
 *
 * Usage: fashion_floor SETUP_DIR DATA_DIR THREADS
 * Prints a line per epoch and a "result key=value ..." line, with
 * cpu_per_wall: the process's CPU time over the wall time of the
 * training, about 1.0 on one thread. Built by scripts/compare-torch.sh;
 * not part of libadg's build. */
#define _POSIX_C_SOURCE 200809L
#include "tensor.h"
#include "train.h"

#include <cblas.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PIXELS	 784
#define HIDDEN1	 256
#define HIDDEN2	 128
#define CLASSES	 10
#define N_PARAMS 6
#define N_TEST	 10000

/* ---------------------------------------------------------------- input */

struct dataset {
	int n;
	float *x; /* n x PIXELS, 0..1 */
	int *y;
};

struct setup {
	int epochs, batch, n_train;
	float *lr;	/* per epoch */
	float *weights; /* w1 b1 w2 b2 w3 b3, row-major */
	int32_t *order; /* epochs x n_train */
};

static const int shapes[N_PARAMS][2] = {
	{HIDDEN1, PIXELS}, {1, HIDDEN1},       {HIDDEN2, HIDDEN1},
	{1, HIDDEN2},	   {CLASSES, HIDDEN2}, {1, CLASSES},
};

/* The bytes of path, exactly `bytes` of them, malloc'd, after skip bytes;
 * NULL (printed) when it cannot. */
static void *read_file(const char *path, size_t skip, size_t bytes)
{
	FILE *f = fopen(path, "rb");
	void *data = malloc(bytes > 0 ? bytes : 1);
	int ok = f != NULL && data != NULL &&
		 fseek(f, (long)skip, SEEK_SET) == 0 &&
		 fread(data, 1, bytes, f) == bytes && fgetc(f) == EOF;
	if (f != NULL)
		fclose(f);
	if (!ok) {
		fprintf(stderr, "%s: cannot read %zu bytes after %zu\n", path,
			bytes, skip);
		free(data);
		return NULL;
	}
	return data;
}

static int read_setup(const char *dir, struct setup *s)
{
	char path[4096], word[64], weights_file[256], order_file[256];
	int version, sizes[4];
	uint64_t seed;
	snprintf(path, sizeof path, "%s/setup.txt", dir);
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		fprintf(stderr, "%s: cannot open (run fashion --export %s)\n",
			path, dir);
		return -1;
	}
	int ok = fscanf(f, "fashion-setup %d sizes %d %d %d %d", &version,
			&sizes[0], &sizes[1], &sizes[2], &sizes[3]) == 5 &&
		 version == 1 && sizes[0] == PIXELS && sizes[1] == HIDDEN1 &&
		 sizes[2] == HIDDEN2 && sizes[3] == CLASSES &&
		 fscanf(f, " epochs %d batch %d train %d seed %" SCNu64 " lr",
			&s->epochs, &s->batch, &s->n_train, &seed) == 4 &&
		 s->epochs > 0 && s->batch > 0 && s->n_train > 0 &&
		 s->n_train <= 60000;
	s->lr = ok ? malloc((size_t)s->epochs * sizeof *s->lr) : NULL;
	ok = s->lr != NULL;
	for (int e = 0; ok && e < s->epochs; e++)
		ok = fscanf(f, "%f", &s->lr[e]) == 1;
	ok = ok && fscanf(f, " params") == 0;
	for (int i = 0; ok && i < N_PARAMS; i++) {
		int rows, cols;
		ok = fscanf(f, "%63s %d %d", word, &rows, &cols) == 3 &&
		     rows == shapes[i][0] && cols == shapes[i][1];
	}
	ok = ok &&
	     fscanf(f, " files %255s %255s", weights_file, order_file) == 2;
	fclose(f);
	if (!ok) {
		fprintf(stderr, "%s: not a 784-256-128-10 setup, version 1\n",
			path);
		return -1;
	}
	size_t n_weights = 0;
	for (int i = 0; i < N_PARAMS; i++)
		n_weights += (size_t)shapes[i][0] * (size_t)shapes[i][1];
	snprintf(path, sizeof path, "%s/%s", dir, weights_file);
	s->weights = read_file(path, 0, n_weights * sizeof(float));
	snprintf(path, sizeof path, "%s/%s", dir, order_file);
	s->order = read_file(path, 0,
			     (size_t)s->epochs * (size_t)s->n_train *
				     sizeof(int32_t));
	if (s->weights == NULL || s->order == NULL)
		return -1;
	for (size_t i = 0; i < (size_t)s->epochs * (size_t)s->n_train; i++) {
		if (s->order[i] < 0 || s->order[i] >= s->n_train) {
			fprintf(stderr, "%s: index out of range\n", path);
			return -1;
		}
	}
	return 0;
}

/* The first keep of the count images of dir's IDX pair prefix (train or
 * t10k), scaled as fashion.c scales them; its headers were checked by
 * scripts/fetch-fashion.sh, their sizes here. */
static int read_data(const char *dir, const char *prefix, int count, int keep,
		     struct dataset *d)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte", dir, prefix);
	unsigned char *images = read_file(path, 16, (size_t)count * PIXELS);
	snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte", dir, prefix);
	unsigned char *labels = read_file(path, 8, (size_t)count);
	d->n = keep;
	d->x = malloc((size_t)keep * PIXELS * sizeof *d->x);
	d->y = malloc((size_t)keep * sizeof *d->y);
	int ok = images != NULL && labels != NULL && d->x != NULL &&
		 d->y != NULL;
	for (size_t i = 0; ok && i < (size_t)keep * PIXELS; i++)
		d->x[i] = (float)images[i] / 255.0f;
	for (int i = 0; ok && i < keep; i++) {
		d->y[i] = labels[i];
		ok = labels[i] < CLASSES;
	}
	free(images);
	free(labels);
	if (!ok)
		fprintf(stderr, "%s/%s-*: cannot read the data\n", dir, prefix);
	return ok ? 0 : -1;
}

/* ---------------------------------------------------------------- model */

static struct tensor *tensor_new(int rows, int cols)
{
	struct tensor *t =
		malloc(sizeof *t + (size_t)rows * (size_t)cols * sizeof(float));
	if (t != NULL)
		*t = (struct tensor){.rows = rows, .cols = cols};
	return t;
}

static size_t elements(const struct tensor *t)
{
	return (size_t)t->rows * (size_t)t->cols;
}

/* One thread's buffers for a share of up to `rows` rows: the forward's
 * values, the backward's, and its gradients of the parameters. */
struct worker {
	struct trainer *trainer;
	int index;
	pthread_t thread;
	struct tensor *x, *z1, *a1, *z2, *a2, *logits, *probs;
	struct tensor *d3, *d2, *d1; /* d loss / d pre-activations */
	struct tensor *grad[N_PARAMS];
	int *labels;
	int has_grad; /* 0 when the share was empty */
};

struct trainer {
	int n_threads, batch, n_batches;
	const struct dataset *train;
	struct tensor *params[N_PARAMS];
	const int32_t *order; /* this epoch's */
	float lr;	      /* this epoch's */
	struct worker *workers;
	pthread_barrier_t barrier;
};

/* dx = g w (n x m times m x k), as tensor.c's matmul step computes it. */
static void matmul_nn(const struct tensor *g, const struct tensor *w,
		      struct tensor *dx)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->rows, w->cols,
		    g->cols, 1.0f, g->data, g->cols, w->data, w->cols, 0.0f,
		    dx->data, dx->cols);
}

/* dw = g^T x (m x n times n x k), likewise. */
static void matmul_tn(const struct tensor *g, const struct tensor *x,
		      struct tensor *dw)
{
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g->cols, x->cols,
		    g->rows, 1.0f, g->data, g->cols, x->data, x->cols, 0.0f,
		    dw->data, dw->cols);
}

/* db = g summed over its rows, from 0, row by row. */
static void column_sums(const struct tensor *g, struct tensor *db)
{
	for (int j = 0; j < g->cols; j++)
		db->data[j] = 0;
	for (int i = 0; i < g->rows; i++)
		for (int j = 0; j < g->cols; j++)
			db->data[j] += g->data[i * g->cols + j];
}

/* g = 0 where the ReLU's output y is not positive. */
static void relu_mask(struct tensor *g, const struct tensor *y)
{
	for (size_t i = 0, n = elements(g); i < n; i++)
		if (!(y->data[i] > 0))
			g->data[i] = 0;
}

static void set_rows(struct worker *w, int n)
{
	struct tensor *all[] = {w->x,	   w->z1,    w->a1, w->z2, w->a2,
				w->logits, w->probs, w->d3, w->d2, w->d1};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		all[i]->rows = n;
}

/* Forward and backward of the training images order[0..n), whose loss
 * weighs scale in the batch's (n / the batch's rows), into w->grad. */
static void forward_backward(struct worker *w, const int32_t *order, int n,
			     float scale)
{
	const struct trainer *tr = w->trainer;
	struct tensor *const *p = tr->params;
	set_rows(w, n);
	for (int i = 0; i < n; i++) {
		memcpy(w->x->data + (size_t)i * PIXELS,
		       tr->train->x + (size_t)order[i] * PIXELS,
		       PIXELS * sizeof(float));
		w->labels[i] = tr->train->y[order[i]];
	}
	int correct;
	matmul_nt(w->x, p[0], w->z1);
	add_bias(w->z1, p[1], w->z1);
	relu(w->z1, w->a1);
	matmul_nt(w->a1, p[2], w->z2);
	add_bias(w->z2, p[3], w->z2);
	relu(w->z2, w->a2);
	matmul_nt(w->a2, p[4], w->logits);
	add_bias(w->logits, p[5], w->logits);
	softmax_xent(w->logits, w->labels, w->probs, &correct);
	/* d (scale x mean loss) / d logits, as fashion's seed and
	 * tensor.c's softmax step compute it. */
	float s = scale / (float)n;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < CLASSES; j++)
			w->d3->data[i * CLASSES + j] =
				s * (w->probs->data[i * CLASSES + j] -
				     (float)(j == w->labels[i]));
	column_sums(w->d3, w->grad[5]);
	matmul_nn(w->d3, p[4], w->d2);
	matmul_tn(w->d3, w->a2, w->grad[4]);
	relu_mask(w->d2, w->a2);
	column_sums(w->d2, w->grad[3]);
	matmul_nn(w->d2, p[2], w->d1);
	matmul_tn(w->d2, w->a1, w->grad[2]);
	relu_mask(w->d1, w->a1);
	column_sums(w->d1, w->grad[1]);
	matmul_tn(w->d1, w->x, w->grad[0]);
}

/* value -= lr * (the threads' gradients summed in thread order), for
 * this thread's slice of every parameter: the sum goes into the first
 * gradient's slice, which no other thread reads until the next batch. */
static void apply_slice(struct worker *w)
{
	struct trainer *tr = w->trainer;
	for (int i = 0; i < N_PARAMS; i++) {
		size_t n = elements(tr->params[i]);
		size_t begin = n * (size_t)w->index / (size_t)tr->n_threads;
		size_t end = n * (size_t)(w->index + 1) / (size_t)tr->n_threads;
		float *restrict sum = NULL;
		for (int t = 0; t < tr->n_threads; t++) {
			const struct worker *u = &tr->workers[t];
			if (!u->has_grad)
				continue;
			const float *restrict g = u->grad[i]->data;
			if (sum == NULL) {
				sum = u->grad[i]->data;
				continue;
			}
			for (size_t k = begin; k < end; k++)
				sum[k] += g[k];
		}
		if (sum == NULL)
			continue; /* no thread had rows (never at T <= B) */
		float *restrict value = tr->params[i]->data, lr = tr->lr;
		for (size_t k = begin; k < end; k++)
			value[k] -= lr * sum[k];
	}
}

static void *train_epoch(void *arg)
{
	struct worker *w = arg;
	struct trainer *tr = w->trainer;
	int n_train = tr->train->n;
	for (int k = 0; k < tr->n_batches; k++) {
		int left = n_train - k * tr->batch;
		int rows = left < tr->batch ? left : tr->batch, first, n;
		batch_share(rows, w->index, tr->n_threads, &first, &n);
		w->has_grad = n > 0;
		if (n > 0)
			forward_backward(w, tr->order + k * tr->batch + first,
					 n, (float)n / (float)rows);
		if (tr->n_threads > 1)
			pthread_barrier_wait(&tr->barrier);
		apply_slice(w);
		if (tr->n_threads > 1)
			pthread_barrier_wait(&tr->barrier);
	}
	return NULL;
}

static int worker_init(struct worker *w, struct trainer *tr, int index)
{
	int rows = tr->batch; /* a share is never longer than a batch */
	*w = (struct worker){.trainer = tr, .index = index};
	w->x = tensor_new(rows, PIXELS);
	w->z1 = tensor_new(rows, HIDDEN1);
	w->a1 = tensor_new(rows, HIDDEN1);
	w->z2 = tensor_new(rows, HIDDEN2);
	w->a2 = tensor_new(rows, HIDDEN2);
	w->logits = tensor_new(rows, CLASSES);
	w->probs = tensor_new(rows, CLASSES);
	w->d3 = tensor_new(rows, CLASSES);
	w->d2 = tensor_new(rows, HIDDEN2);
	w->d1 = tensor_new(rows, HIDDEN1);
	w->labels = malloc((size_t)rows * sizeof *w->labels);
	int ok = w->x && w->z1 && w->a1 && w->z2 && w->a2 && w->logits &&
		 w->probs && w->d3 && w->d2 && w->d1 && w->labels;
	for (int i = 0; i < N_PARAMS; i++) {
		w->grad[i] = tensor_new(shapes[i][0], shapes[i][1]);
		ok = ok && w->grad[i] != NULL;
	}
	return ok ? 0 : -1;
}

static void worker_free(struct worker *w)
{
	struct tensor *all[] = {w->x,	   w->z1,    w->a1, w->z2, w->a2,
				w->logits, w->probs, w->d3, w->d2, w->d1};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		free(all[i]);
	for (int i = 0; i < N_PARAMS; i++)
		free(w->grad[i]);
	free(w->labels);
}

/* Test accuracy (%), a chunk of rows at a time. */
static double accuracy_on(struct tensor *const *p, const struct dataset *d,
			  struct worker *scratch)
{
	int correct = 0;
	for (int first = 0; first < d->n;) {
		int n = d->n - first < scratch->trainer->batch
				? d->n - first
				: scratch->trainer->batch;
		int right;
		set_rows(scratch, n);
		memcpy(scratch->x->data, d->x + (size_t)first * PIXELS,
		       (size_t)n * PIXELS * sizeof(float));
		matmul_nt(scratch->x, p[0], scratch->z1);
		add_bias(scratch->z1, p[1], scratch->z1);
		relu(scratch->z1, scratch->a1);
		matmul_nt(scratch->a1, p[2], scratch->z2);
		add_bias(scratch->z2, p[3], scratch->z2);
		relu(scratch->z2, scratch->a2);
		matmul_nt(scratch->a2, p[4], scratch->logits);
		add_bias(scratch->logits, p[5], scratch->logits);
		softmax_xent(scratch->logits, d->y + first, scratch->probs,
			     &right);
		correct += right;
		first += n;
	}
	return 100.0 * correct / d->n;
}

static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr,
			"usage: fashion_floor SETUP_DIR DATA_DIR THREADS\n");
		return 2;
	}
	int n_threads = atoi(argv[3]);
	if (n_threads < 1 || n_threads > 1024) {
		fprintf(stderr, "threads: 1 to 1024\n");
		return 2;
	}
	/* As fashion does: the T threads are the parallelism. */
	openblas_set_num_threads(1);
	struct setup s = {0};
	struct dataset train = {0}, test = {0};
	if (read_setup(argv[1], &s) != 0 ||
	    read_data(argv[2], "train", 60000, s.n_train, &train) != 0 ||
	    read_data(argv[2], "t10k", N_TEST, N_TEST, &test) != 0)
		return 1;
	struct trainer tr = {.n_threads = n_threads,
			     .batch = s.batch,
			     .n_batches = (s.n_train + s.batch - 1) / s.batch,
			     .train = &train};
	tr.workers = calloc((size_t)n_threads, sizeof *tr.workers);
	int failed = tr.workers == NULL ||
		     pthread_barrier_init(&tr.barrier, NULL,
					  (unsigned)n_threads) != 0;
	const float *from = s.weights;
	for (int i = 0; i < N_PARAMS && !failed; i++) {
		tr.params[i] = tensor_new(shapes[i][0], shapes[i][1]);
		failed = tr.params[i] == NULL;
		if (!failed) {
			memcpy(tr.params[i]->data, from,
			       elements(tr.params[i]) * sizeof(float));
			from += elements(tr.params[i]);
		}
	}
	for (int t = 0; t < n_threads && !failed; t++)
		failed = worker_init(&tr.workers[t], &tr, t) != 0;
	if (failed) {
		fprintf(stderr, "out of memory\n");
		return 1;
	}
	double seconds = 0, cpu = 0, accuracy = 0;
	for (int e = 0; e < s.epochs && !failed; e++) {
		tr.order = s.order + (size_t)e * (size_t)s.n_train;
		tr.lr = s.lr[e];
		double cpu_start = cpu_seconds(), start = now();
		int started = 0;
		/* Thread 0 is this one; the others are started per epoch. */
		for (int t = 1; t < n_threads && !failed; t++, started++)
			failed = pthread_create(&tr.workers[t].thread, NULL,
						train_epoch,
						&tr.workers[t]) != 0;
		if (failed) {
			fprintf(stderr, "cannot start a thread\n");
			return 1; /* the others wait at the barrier */
		}
		train_epoch(&tr.workers[0]);
		for (int t = 1; t <= started; t++)
			pthread_join(tr.workers[t].thread, NULL);
		double took = now() - start;
		seconds += took;
		cpu += cpu_seconds() - cpu_start;
		accuracy = accuracy_on(tr.params, &test, &tr.workers[0]);
		printf("T=%d B=%d floor epoch %2d  test %6.2f%%  %8.0f "
		       "samples/s\n",
		       n_threads, s.batch, e + 1, accuracy, s.n_train / took);
		fflush(stdout);
	}
	uint64_t hash = HASH_START;
	for (int i = 0; i < N_PARAMS; i++)
		hash = hash_floats(hash, tr.params[i]->data,
				   elements(tr.params[i]));
	printf("result side=adg mode=floor threads=%d batch=%d epochs=%d "
	       "samples_per_s=%.0f test_accuracy=%.2f cpu_per_wall=%.2f "
	       "weights_hash=%016" PRIx64 "\n",
	       n_threads, s.batch, s.epochs,
	       (double)s.n_train * s.epochs / seconds, accuracy, cpu / seconds,
	       hash);
	for (int t = 0; t < n_threads; t++)
		worker_free(&tr.workers[t]);
	for (int i = 0; i < N_PARAMS; i++)
		free(tr.params[i]);
	pthread_barrier_destroy(&tr.barrier);
	free(tr.workers);
	free(s.lr);
	free(s.weights);
	free(s.order);
	free(train.x);
	free(train.y);
	free(test.x);
	free(test.y);
	return 0;
}
