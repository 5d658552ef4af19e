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
 * - sync: every mini-batch is cut into units of --unit-rows rows, as many
 *   whatever the thread count, which the threads take in turn; each
 *   records and runs the backward of a unit, and hands each parameter's
 *   gradient from the hook to a gradient reducer (adg_reducer), which
 *   sums the units' gradients in a tree over unit indices and applies one
 *   SGD step: the same weights at any thread count (--unit-rows 0: a
 *   share per thread, summed in thread order, the same weights for a
 *   given T only).
 * Both run on examples/tensor/runner.c, and take the options and main of
 * examples/tensor/trainer.c, which the Fashion-MNIST trainer shares: this
 * file holds the model's layers, the data, the defaults and the help.
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
#include "trainer.h"

#include <adg.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIXELS	 64 /* 8 x 8, each 0..16 */
#define HIDDEN	 64
#define CLASSES	 10
#define N_PARAMS 4

/* Sync's rows per unit, by default. A row here is cheap (about 30,000
 * multiply-adds, under a microsecond), and each unit costs a graph and a
 * backward of its own besides a fold of the 4,874-float gradient, about
 * 5 us in all: on one thread at B = 16, two units of 8 train at 0.70 x
 * one of 16, four of 4 at 0.52 x. More rows would leave a batch of 16
 * one unit, work for one thread; fewer would add units whose fixed cost
 * outweighs their rows. So B = 16 is two units. */
#define UNIT_ROWS 8

/* ---------------------------------------------------------------- data */

static int dataset_alloc(struct dataset *d, int n)
{
	d->n = 0;
	d->features = PIXELS;
	d->x = malloc((size_t)n * PIXELS * sizeof *d->x);
	d->y = malloc((size_t)n * sizeof *d->y);
	return d->x != NULL && d->y != NULL ? 0 : -1;
}

/* Reads the csv o->data, 64 pixels and a label a line, into train and
 * test, pixels scaled to 0..1 and labels 0..9. Row i goes to the test set
 * when i % 5 == 4. Returns 0, or prints what is wrong and returns -1 (-2
 * when the file does not exist). */
static int load_digits(const struct trainer_options *o, struct dataset *train,
		       struct dataset *test)
{
	const char *path = o->data;
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
	if (dataset_alloc(train, MAX_ROWS) != 0 ||
	    dataset_alloc(test, MAX_ROWS) != 0) {
		fprintf(stderr, "%s: out of memory\n", path);
		rc = -1;
	}
	while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
		struct dataset *d = row % 5 == 4 ? test : train;
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
	if (rc == 0 && test->n == 0) {
		fprintf(stderr, "%s: %d rows, too few to split\n", path, row);
		rc = -1;
	}
	fclose(f);
	return rc;
}

/* ---------------------------------------------------------------- model */

/* w1 (64 x 64), b1, w2 (10 x 64), b2: model_new (runner.h) makes them. */
static const struct param_shape shapes[N_PARAMS] = {{"w1", HIDDEN, PIXELS},
						    {"b1", 1, HIDDEN},
						    {"w2", CLASSES, HIDDEN},
						    {"b2", 1, CLASSES}};

/* Records the model's forward pass on the batch x, to the batch's mean
 * cross-entropy (struct train_ops). */
static int forward(struct recorder *rec, struct var x, const int *labels,
		   const struct var *p, struct var *loss)
{
	struct var z1, h1, a1, z2, logits;
	int correct; /* evaluate counts them */
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
		rc = op_softmax_xent(rec, logits, labels, loss, &correct);
	return rc;
}

/* Mean loss and accuracy (%) of the model on d, without a graph. */
static int evaluate(const struct model *m, const struct dataset *d,
		    double *loss, double *accuracy)
{
	struct tensor *x, *h, *a, *z, *logits, *probs;
	int rc = 0, correct = 0;
	struct tensor **all[] = {&x, &h, &a, &z, &logits, &probs};
	const int cols[] = {PIXELS, HIDDEN, HIDDEN, CLASSES, CLASSES, CLASSES};
	const size_t n_all = sizeof all / sizeof *all;
	for (size_t i = 0; i < n_all; i++) {
		*all[i] = tensor_new(d->n, cols[i]);
		if (*all[i] == NULL)
			rc = ADG_ENOMEM;
	}
	const struct tensor *w[N_PARAMS];
	for (int i = 0; i < N_PARAMS; i++)
		w[i] = m->params[i].value;
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
	return rc;
}

/* ----------------------------------------------------------- export */

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
static int write_setup(const struct trainer_options *o, struct model *m,
		       const struct dataset *train)
{
	FILE *f = fopen(o->export_path, "w");
	int *order = malloc((size_t)train->n * sizeof *order);
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
		train->n);
	for (int e = 0; e < o->epochs; e++)
		fprintf(f, " %.9g", learning_rate(o->lr, o->epochs, e));
	for (int i = 0; i < N_PARAMS; i++) {
		const struct param *p = &m->params[i];
		fprintf(f, "\n%s", p->name);
		for (size_t k = 0; k < param_elements(p); k++)
			fprintf(f, " %.9g", p->value->data[k]);
	}
	for (int e = 0; e < o->epochs; e++) {
		shuffle(order, train->n, o->seed, e);
		fprintf(f, "\norder");
		for (int i = 0; i < train->n; i++)
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
		"                   batch is cut into units that the threads "
		"take in turn, and\n"
		"                   a gradient reducer sums their gradients "
		"in a fixed order\n"
		"                   before one update: the same weights at any "
		"thread count\n"
		"  --unit-rows N    sync: N rows per unit (default %d); 0: one "
		"share of each\n"
		"                   batch per thread, summed in thread order "
		"(the weights then\n"
		"                   depend on the thread count)\n"
		"  --sum S          sync with units: tree (the default), the "
		"reducer's fixed\n"
		"                   tree of float sums; exact, each thread's "
		"units added\n"
		"                   exactly (adg/exact.h) as they come, "
		"rounded once\n"
		"  --seed S         initial weights and orders (default 1)\n"
		"  --csv FILE       write each epoch's figures\n"
		"  --export FILE    write the initial weights, learning rates "
		"and orders\n"
		"                   for bench/compare/ (see write_setup), and "
		"exit\n"
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
		"  --skip-if-missing      exit 77 (a skipped test) when "
		"DATA.csv does not exist\n",
		UNIT_ROWS);
}

/* --lr: any but 0; negative (the default) picks 0.1 for B = 1, 0.5 for
 * larger batches. */
static int check_lr(struct trainer_options *o)
{
	if (o->lr == 0)
		return -1;
	if (o->lr < 0)
		o->lr = o->batch == 1 ? 0.1 : 0.5;
	return 0;
}

static const struct train_ops ops = {.forward = forward, .evaluate = evaluate};

/* Sync sums every parameter whole: the largest, 64 x 64, is small work
 * for one thread. */
static const struct trainer digits = {.ops = &ops,
				      .shapes = shapes,
				      .n_params = N_PARAMS,
				      .mode = MODE_HOGWILD,
				      .batch = 1,
				      .epochs = 30,
				      .unit_rows = UNIT_ROWS,
				      .lr = -1,
				      .usage = usage,
				      .check = check_lr,
				      .load = load_digits,
				      .export_setup = write_setup};

int main(int argc, char **argv)
{
	return trainer_main(&digits, argc, argv);
}
