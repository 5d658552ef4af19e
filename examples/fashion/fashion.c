/* Fashion-MNIST with libadg: a multi-layer perceptron 784-256-128-10
 * (ReLU, softmax cross-entropy) trained by SGD on T threads, on Zalando's
 * 60,000 training and 10,000 test images of 28x28 grey pixels
 * (scripts/fetch-fashion.sh fetches them).
 *
 * Each epoch shuffles the training images into one shared order, and the
 * threads train on it one of two ways (--mode):
 * - sync (the default): every mini-batch is cut into units of
 *   --unit-rows rows, as many whatever the thread count, and the T
 *   threads take them in turn. Each records a unit's forward pass as a
 *   graph of its own (examples/tensor/tensor.h), runs its backward, and
 *   hands each parameter's gradient, from the gradient-ready hook, to a
 *   gradient reducer (adg_reducer), which sums the units' gradients in a
 *   tree over unit indices as they arrive, while the other units'
 *   backward passes go on; once every thread has ended the batch it
 *   applies one SGD step to each parameter, and adg_reducer_end waits for
 *   the batch's last update, so the next batch's forward reads updated
 *   weights. The sum's order depends on neither the timing nor T: runs
 *   with any T end with bitwise identical weights (the result line
 *   prints their hash). --unit-rows 0 cuts each batch into one share per
 *   thread instead, summed in thread order: the same weights for a given
 *   T only.
 * - hogwild: the threads take whole mini-batches in turn, and each updates
 *   the shared parameters without a lock as soon as each one's gradient is
 *   final, as examples/digits does.
 * Both run on examples/tensor/runner.c, and take the options and main of
 * examples/tensor/trainer.c, which the digits trainer shares: this file
 * holds the model's layers, the data, the defaults and the help.
 * Prints a line per epoch; --csv writes the same figures, and
 * scripts/fashion.sh draws them.
 *
 * Usage: fashion [options] DIR, DIR holding the four IDX files (--help
 * lists the options). Exit status 0; 1 on an error or a missed check; 2
 * on bad usage; 77 when the data is missing and --skip-if-missing is
 * given. */
#include "runner.h"
#include "tensor.h"
#include "train.h"
#include "trainer.h"

#include <adg.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define SIDE	 28
#define PIXELS	 (SIDE * SIDE)
#define HIDDEN1	 256
#define HIDDEN2	 128
#define CLASSES	 10
#define N_PARAMS 6
#define N_TRAIN	 60000
#define N_TEST	 10000

/* ---------------------------------------------------------------- data */

/* Reads dir/name, an IDX file of unsigned bytes with n_dims dimensions:
 * count items of item bytes each (28 x 28 for an image, 1 for a label).
 * Checks the header (magic number 0x0000080N, the count, 28 x 28 for
 * images) and the size, and returns the items in *out (malloc'd). Returns
 * 0, or prints what is wrong and returns -1 (-2 when the file does not
 * exist). */
static int read_idx(const char *dir, const char *name, int n_dims, int count,
		    unsigned char **out)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, name);
	*out = NULL;
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		int missing = errno == ENOENT; /* before fprintf changes it */
		fprintf(stderr,
			"%s: %s (scripts/fetch-fashion.sh fetches it)\n", path,
			strerror(errno));
		return missing ? -2 : -1;
	}
	unsigned char header[16];
	size_t header_bytes = 4 + 4 * (size_t)n_dims;
	int rc = -1;
	if (fread(header, 1, header_bytes, f) != header_bytes) {
		fprintf(stderr, "%s: shorter than an IDX header\n", path);
		goto out_close;
	}
	/* Two zero bytes, 0x08 (unsigned bytes), the number of dimensions;
	 * then each dimension, a big-endian 32-bit number. */
	if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 ||
	    header[3] != n_dims) {
		fprintf(stderr,
			"%s: magic number %02x%02x%02x%02x, not 000008%02x "
			"(IDX, unsigned bytes, %d dimension%s)\n",
			path, header[0], header[1], header[2], header[3],
			n_dims, n_dims, n_dims > 1 ? "s" : "");
		goto out_close;
	}
	uint32_t dims[3];
	for (int i = 0; i < n_dims; i++) {
		const unsigned char *b = header + 4 + 4 * i;
		dims[i] = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 |
			  (uint32_t)b[2] << 8 | b[3];
	}
	if (dims[0] != (uint32_t)count) {
		fprintf(stderr, "%s: %" PRIu32 " items, not %d\n", path,
			dims[0], count);
		goto out_close;
	}
	if (n_dims == 3 && (dims[1] != SIDE || dims[2] != SIDE)) {
		fprintf(stderr,
			"%s: images of %" PRIu32 "x%" PRIu32 ", not %dx%d\n",
			path, dims[1], dims[2], SIDE, SIDE);
		goto out_close;
	}
	size_t bytes = (size_t)count * (n_dims == 3 ? PIXELS : 1);
	*out = malloc(bytes);
	if (*out == NULL) {
		fprintf(stderr, "%s: out of memory\n", path);
		goto out_close;
	}
	size_t got = fread(*out, 1, bytes, f);
	if (got != bytes || fgetc(f) != EOF) {
		if (ferror(f))
			fprintf(stderr, "%s: %s\n", path, strerror(errno));
		else if (got != bytes)
			fprintf(stderr,
				"%s: %zu bytes after the header, not %zu "
				"(truncated)\n",
				path, got, bytes);
		else
			fprintf(stderr,
				"%s: more than the %zu bytes the header "
				"announces\n",
				path, bytes);
		free(*out);
		*out = NULL;
		goto out_close;
	}
	rc = 0;
out_close:
	fclose(f);
	return rc;
}

/* Reads one half of the data set (train or t10k) into d, the first
 * keep images only. Returns as read_idx does. */
static int load_half(const char *dir, const char *prefix, int count, int keep,
		     struct dataset *d)
{
	char images_name[64], labels_name[64];
	snprintf(images_name, sizeof images_name, "%s-images-idx3-ubyte",
		 prefix);
	snprintf(labels_name, sizeof labels_name, "%s-labels-idx1-ubyte",
		 prefix);
	unsigned char *images = NULL, *labels = NULL;
	int rc = read_idx(dir, images_name, 3, count, &images);
	if (rc == 0)
		rc = read_idx(dir, labels_name, 1, count, &labels);
	for (int i = 0; rc == 0 && i < count; i++) {
		if (labels[i] >= CLASSES) {
			fprintf(stderr, "%s/%s: label %d is %d, not in 0..%d\n",
				dir, labels_name, i + 1, labels[i],
				CLASSES - 1);
			rc = -1;
		}
	}
	if (rc == 0) {
		d->n = keep;
		d->features = PIXELS;
		d->x = malloc((size_t)keep * PIXELS * sizeof *d->x);
		d->y = malloc((size_t)keep * sizeof *d->y);
		if (d->x == NULL || d->y == NULL) {
			fprintf(stderr, "%s: out of memory\n", dir);
			rc = -1;
		}
	}
	for (int i = 0; rc == 0 && i < keep; i++) {
		for (int k = 0; k < PIXELS; k++)
			d->x[(size_t)i * PIXELS + k] =
				(float)images[(size_t)i * PIXELS + k] / 255.0f;
		d->y[i] = labels[i];
	}
	free(images);
	free(labels);
	return rc;
}

/* Reads the data set from the folder o->data into train and test,
 * pixels scaled to 0..1 and labels 0..9, the first o->train_subset
 * training images only when it is positive. Returns as read_idx does. */
static int load_fashion(const struct trainer_options *o, struct dataset *train,
			struct dataset *test)
{
	int keep = o->train_subset > 0 && o->train_subset < N_TRAIN
			   ? o->train_subset
			   : N_TRAIN;
	int rc = load_half(o->data, "train", N_TRAIN, keep, train);
	if (rc == 0)
		rc = load_half(o->data, "t10k", N_TEST, N_TEST, test);
	return rc;
}

/* ---------------------------------------------------------------- model */

/* w1 (256 x 784), b1, w2 (128 x 256), b2, w3 (10 x 128), b3: model_new
 * (runner.h) makes them. */
static const struct param_shape shapes[N_PARAMS] = {
	{"w1", HIDDEN1, PIXELS},  {"b1", 1, HIDDEN1},
	{"w2", HIDDEN2, HIDDEN1}, {"b2", 1, HIDDEN2},
	{"w3", CLASSES, HIDDEN2}, {"b3", 1, CLASSES},
};

/* Records the model's forward pass on the batch x, to the batch's mean
 * cross-entropy (struct train_ops). */
static int forward(struct recorder *rec, struct var x, const int *labels,
		   const struct var *p, struct var *loss)
{
	struct var z1, h1, a1, z2, h2, a2, z3, logits;
	int correct; /* evaluate counts them */
	int rc = op_matmul_nt(rec, x, p[0], &z1);
	if (rc == 0)
		rc = op_add_bias(rec, z1, p[1], &h1);
	if (rc == 0)
		rc = op_relu(rec, h1, &a1);
	if (rc == 0)
		rc = op_matmul_nt(rec, a1, p[2], &z2);
	if (rc == 0)
		rc = op_add_bias(rec, z2, p[3], &h2);
	if (rc == 0)
		rc = op_relu(rec, h2, &a2);
	if (rc == 0)
		rc = op_matmul_nt(rec, a2, p[4], &z3);
	if (rc == 0)
		rc = op_add_bias(rec, z3, p[5], &logits);
	if (rc == 0)
		rc = op_softmax_xent(rec, logits, labels, loss, &correct);
	return rc;
}

/* Mean loss and accuracy (%) of the model on d, without a graph, a chunk
 * of rows at a time. Runs while no worker does. */
static int evaluate(const struct model *m, const struct dataset *d,
		    double *loss, double *accuracy)
{
	enum { CHUNK = 1000 };
	struct tensor *x, *h1, *a1, *h2, *a2, *logits, *probs;
	struct tensor **all[] = {&x, &h1, &a1, &h2, &a2, &logits, &probs};
	const int cols[] = {PIXELS,  HIDDEN1, HIDDEN1, HIDDEN2,
			    HIDDEN2, CLASSES, CLASSES};
	const size_t n_all = sizeof all / sizeof *all;
	int rc = 0, correct = 0;
	double total = 0;
	for (size_t i = 0; i < n_all; i++) {
		*all[i] = tensor_new(CHUNK, cols[i]);
		if (*all[i] == NULL)
			rc = ADG_ENOMEM;
	}
	const struct tensor *w[N_PARAMS];
	for (int i = 0; i < N_PARAMS; i++)
		w[i] = m->params[i].value;
	for (int first = 0; rc == 0 && first < d->n; first += CHUNK) {
		int n = d->n - first < CHUNK ? d->n - first : CHUNK, right;
		for (size_t i = 0; i < n_all; i++)
			(*all[i])->rows = n;
		memcpy(x->data, d->x + (size_t)first * PIXELS,
		       (size_t)n * PIXELS * sizeof(float));
		matmul_nt(x, w[0], h1);
		add_bias(h1, w[1], h1);
		relu(h1, a1);
		matmul_nt(a1, w[2], h2);
		add_bias(h2, w[3], h2);
		relu(h2, a2);
		matmul_nt(a2, w[4], logits);
		add_bias(logits, w[5], logits);
		total += softmax_xent(logits, d->y + first, probs, &right);
		correct += right;
	}
	if (rc == 0) {
		*loss = total / d->n;
		*accuracy = 100.0 * correct / d->n;
	}
	for (size_t i = 0; i < n_all; i++)
		free(*all[i]);
	return rc;
}

/* ----------------------------------------------------------- a run */

/* Parameters of at least this many elements are summed and updated in
 * one slice per thread, by all of them: the first layer's weights (85%
 * of the model) would otherwise be summed and updated by one thread
 * while the others wait at the barrier. */
#define SLICED_ELEMENTS 4096

/* Sync's rows per unit, by default. Every unit costs a fold of the whole
 * gradient, 235,146 floats (the first layer's 200,704 of them), about
 * 0.9 MB read twice and written once, and GEMMs of fewer rows: on one
 * thread at B = 64, two units of 32 train at 0.88 x one of 64, four of
 * 16 at 0.74 x (docs/trainers.md). Fewer rows would add folds faster
 * than threads to share them; more would leave the default batch of 64
 * one unit, work for one thread. So B = 64 is two units, B = 256 eight. */
#define UNIT_ROWS 32

/* ----------------------------------------------------------- export */

/* Writes what bench/compare/ needs to train the same model the same way
 * into the folder dir (made if it does not exist), three files:
 * - setup.txt, whitespace-separated words:
 *     fashion-setup 1
 *     sizes 784 256 128 10               pixels, hidden 1, hidden 2, classes
 *     epochs E batch B train N seed S    N: the first N training images
 *     lr E floats                        each epoch's learning rate
 *     params w1 256 784 b1 1 256 w2 128 256 b2 1 128 w3 10 128 b3 1 10
 *     files weights.f32 order.i32
 *   floats with 9 significant digits, which read back to the same float;
 * - weights.f32: the initial values of the parameters listed, in that
 *   order, each row-major, as 32-bit floats in this machine's byte order;
 * - order.i32: E times N 32-bit ints in this machine's byte order, each
 *   epoch's order of the training images (0-based), epoch 1 first.
 * Returns 0 or -1 (printed). */
static int write_setup(const struct trainer_options *o, struct model *m,
		       const struct dataset *train)
{
	static const char *const names[] = {"setup.txt", "weights.f32",
					    "order.i32"};
	char path[3][4096];
	FILE *f[3] = {NULL, NULL, NULL};
	int n = train->n, failed = 0;
	int *order = malloc((size_t)n * sizeof *order);
	if (order == NULL) {
		fprintf(stderr, "%s: out of memory\n", o->export_path);
		return -1;
	}
	if (mkdir(o->export_path, 0777) != 0 && errno != EEXIST) {
		fprintf(stderr, "%s: %s\n", o->export_path, strerror(errno));
		failed = 1;
	}
	for (int i = 0; i < 3 && !failed; i++) {
		snprintf(path[i], sizeof path[i], "%s/%s", o->export_path,
			 names[i]);
		f[i] = fopen(path[i], i == 0 ? "w" : "wb");
		if (f[i] == NULL) {
			fprintf(stderr, "%s: %s\n", path[i], strerror(errno));
			failed = 1;
		}
	}
	if (!failed) {
		model_init(m, o->seed);
		fprintf(f[0], "fashion-setup 1\nsizes %d %d %d %d\n", PIXELS,
			HIDDEN1, HIDDEN2, CLASSES);
		fprintf(f[0],
			"epochs %d batch %d train %d seed %" PRIu64 "\nlr",
			o->epochs, o->batch, n, o->seed);
		for (int e = 0; e < o->epochs; e++)
			fprintf(f[0], " %.9g",
				learning_rate(o->lr, o->epochs, e));
		fprintf(f[0], "\nparams");
		for (int i = 0; i < N_PARAMS; i++) {
			const struct param *p = &m->params[i];
			fprintf(f[0], " %s %d %d", p->name, p->value->rows,
				p->value->cols);
			fwrite(p->value->data, sizeof(float), param_elements(p),
			       f[1]);
		}
		fprintf(f[0], "\nfiles %s %s\n", names[1], names[2]);
		for (int e = 0; e < o->epochs; e++) {
			shuffle(order, n, o->seed, e);
			for (int i = 0; i < n; i++) {
				int32_t v = order[i];
				fwrite(&v, sizeof v, 1, f[2]);
			}
		}
	}
	for (int i = 0; i < 3; i++) {
		if (f[i] != NULL && (ferror(f[i]) | fclose(f[i])) && !failed) {
			fprintf(stderr, "%s: write failed\n", path[i]);
			failed = 1;
		}
	}
	free(order);
	return failed ? -1 : 0;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *to)
{
	fprintf(to,
		"usage: fashion [options] DIR\n"
		"  DIR holds train-images-idx3-ubyte, "
		"train-labels-idx1-ubyte,\n"
		"  t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte "
		"(scripts/fetch-fashion.sh)\n"
		"  --threads LIST   thread counts to train with, one run "
		"each (1,2; default 1)\n"
		"  --mode M         sync (the default): each batch is cut "
		"into units that the\n"
		"                   threads take in turn, and a gradient "
		"reducer sums their\n"
		"                   gradients in a fixed order before one "
		"update: the same\n"
		"                   weights at any thread count; hogwild: "
		"each thread takes\n"
		"                   whole batches and updates the shared "
		"weights without a lock\n"
		"  --unit-rows N    sync: N rows per unit (default %d; each "
		"unit costs a sum\n"
		"                   of the whole gradient); 0: one share of "
		"each batch per\n"
		"                   thread, summed in thread order (the "
		"weights then depend\n"
		"                   on the thread count)\n"
		"  --sum S          sync with units: tree (the default), the "
		"reducer's fixed\n"
		"                   tree of float sums; exact, each thread's "
		"units added\n"
		"                   exactly (adg/exact.h) as they come, "
		"rounded once: the\n"
		"                   same weights at any thread count, other "
		"bits than tree's\n"
		"  --batch B        mini-batch size (default 64)\n"
		"  --epochs E       epochs per run (default 10)\n"
		"  --lr X           first epoch's learning rate, falling "
		"linearly to X / E\n"
		"                   at the last (default 0.1)\n"
		"  --seed S         initial weights and orders (default 1)\n"
		"  --train-subset N train on the first N training images "
		"only\n"
		"  --csv FILE       write each epoch's figures\n"
		"  --export DIR     write the initial weights, learning rates "
		"and orders\n"
		"                   for bench/compare/ (see write_setup), and "
		"train nothing\n"
		"  --min-test-accuracy P  exit 1 unless every run ends at "
		"P%% or more\n"
		"  --same-weights   exit 1 unless the runs end with bitwise "
		"identical weights:\n"
		"                   all of them in sync with units, else "
		"those with the same\n"
		"                   thread count\n"
		"  --profile        sync: after each run, where a round's "
		"time went (the\n"
		"                   slowest thread's compute, folds, applies "
		"and wait)\n"
		"  --skip-if-missing      exit 77 (a skipped test) when a "
		"file of DIR does\n"
		"                   not exist\n",
		UNIT_ROWS);
}

/* --lr: positive. */
static int check_lr(struct trainer_options *o)
{
	return o->lr > 0 ? 0 : -1;
}

static const struct train_ops ops = {.forward = forward, .evaluate = evaluate};

static const struct trainer fashion = {.ops = &ops,
				       .shapes = shapes,
				       .n_params = N_PARAMS,
				       .mode = MODE_SYNC,
				       .batch = 64,
				       .epochs = 10,
				       .unit_rows = UNIT_ROWS,
				       .lr = 0.1,
				       .takes_train_subset = 1,
				       .name_mode = 1,
				       .slice_from = SLICED_ELEMENTS,
				       .usage = usage,
				       .check = check_lr,
				       .load = load_fashion,
				       .export_setup = write_setup};

int main(int argc, char **argv)
{
	return trainer_main(&fashion, argc, argv);
}
