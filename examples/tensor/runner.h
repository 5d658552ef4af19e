/* What the example trainers (examples/digits, examples/fashion) share of
 * training: a model of tensor parameters (struct model), the examples it
 * learns from (struct dataset), and the runner, which trains the model
 * by SGD on T threads, epoch after epoch, Hogwild or sync, and reports.
 * A trainer gives its layers (the forward pass) and its evaluation; the
 * runner does the rest: each thread's recorder, gradient pool and hooks,
 * its step, Hogwild's updates without a lock, and in sync the gradient
 * reducer (sync.h) that sums the gradients of each batch's units. */
#ifndef EXAMPLES_RUNNER_H
#define EXAMPLES_RUNNER_H

#include "tensor.h"
#include "train.h"

#include <adg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ----------------------------------------------------------- the model */

/* A parameter shared by every thread, as plain floats: how threads may
 * touch them depends on the mode.
 * - sync: the forward and backward passes read value itself (BLAS reads
 *   it, no copy), and the reducer's apply writes it. The reducer orders
 *   them: it applies the batch's updates once every thread has ended
 *   the round, so after every unit's last read of the parameter, and
 *   adg_reducer_end returns only once every update of the batch is
 *   applied, before the next batch's forward.
 * - hogwild: threads read and write value without a lock, each element
 *   with relaxed atomic loads and stores (GCC's __atomic built-ins on
 *   the plain floats), so that concurrent updates may be lost, as Hogwild
 *   allows, but never make a data race, which C does not allow. Relaxed
 *   is enough: a parameter publishes nothing else. Each thread copies the
 *   values before its forward (BLAS reads the copy).
 * The main thread reads and writes value only between epochs, while no
 * worker runs. */
struct param {
	const char *name;
	struct tensor *value;
	adg_node *leaf; /* one leaf for all threads: it couples no graphs */
	uint64_t id;
};

/* A parameter's name and shape, for model_new. */
struct param_shape {
	const char *name;
	int rows, cols;
};

#define MAX_PARAMS 8

struct model {
	adg_registry *registry;
	struct param params[MAX_PARAMS]; /* the forward's order */
	int n_params;
};

/* A rows x cols tensor from malloc (contents undefined), or NULL; free
 * it with free. */
struct tensor *tensor_new(int rows, int cols);

/* Rows x cols. */
size_t param_elements(const struct param *p);

/* Makes the registry and n_params (up to MAX_PARAMS) parameters of these
 * shapes, each with its leaf; their values are model_init's to set.
 * Returns 0 or an ADG_E* code; model_free frees what it made either
 * way. */
int model_new(struct model *m, const struct param_shape *shapes, int n_params);

/* Checks that only the parameters' leaves live (every step's graph is
 * gone), drops them and frees the registry. Returns 0, or 1 on a failure
 * (printed). */
int model_free(struct model *m);

/* He initialisation: weights ~ N(0, 2 / fan-in) (a weight's columns are
 * its fan-in), biases (one row) 0, from a generator seeded by seed. Runs
 * while no worker does. */
void model_init(struct model *m, uint64_t seed);

/* The weights' fingerprint: hash_floats over every parameter in order.
 * Runs while no worker does. */
uint64_t model_hash(const struct model *m);

/* Examples: n rows of features floats, each with its label. */
struct dataset {
	int n, features;
	float *x; /* n x features */
	int *y;	  /* n labels */
};

void dataset_free(struct dataset *d);

/* ---------------------------------------------------------- the runner */

/* What the runner needs of a trainer. */
struct train_ops {
	/* Records the model's forward pass on a batch into rec: x holds the
	 * batch's rows (a constant: node NULL), labels their labels, params
	 * the parameters in model order (the values to read, each with its
	 * leaf as node). Gives the batch's mean loss, 1 x 1
	 * (op_softmax_xent). Runs on the workers' threads, each with a
	 * recorder of its own. Returns 0 or an ADG_E* code. */
	int (*forward)(struct recorder *rec, struct var x, const int *labels,
		       const struct var *params, struct var *loss);
	/* The model's mean loss and accuracy (%) on d, without a graph;
	 * runs while no worker does. Returns 0 or an ADG_E* code. */
	int (*evaluate)(const struct model *m, const struct dataset *d,
			double *loss, double *accuracy);
};

struct worker;

/* One run: n_threads threads train the model for epochs epochs. The
 * trainer sets the first fields; runner_run the others, which the
 * workers read. */
struct runner {
	const struct train_ops *ops;
	struct model *model;	     /* holding its initial weights */
	const struct dataset *train; /* trained on; evaluated each epoch */
	const struct dataset *test;  /* evaluated each epoch */
	enum train_mode mode;
	int n_threads, batch, epochs;
	double first_lr; /* the first epoch's; see learning_rate */
	uint64_t seed;	 /* of each epoch's order (shuffle) */
	int name_mode;	 /* whether each epoch's line names the mode */
	/* Sync: parameters of at least this many elements are summed and
	 * updated in one slice per thread (sync_reducer_new); 0: none. */
	size_t slice_from;
	/* Sync: each batch is cut into units of this many rows (the last
	 * shorter), U = ceil(batch / unit_rows) of them whatever the thread
	 * count, each a backward of its own, and the reducer sums them in a
	 * tree over unit indices: the same weights at any T. 0: one share
	 * of each batch per thread, as even as can be, summed in thread
	 * order (the weights then depend on T). */
	int unit_rows;
	/* Sync with units: instead of the reducer's tree of float sums,
	 * exact sums (adg/exact.h, --sum exact). Each thread takes the
	 * batch's units as they come (an atomic counter), adds each unit's
	 * gradients to accumulators of its own, and gives them to a reducer
	 * without units, which merges them; apply rounds each sum once. The
	 * same weights at any T, other bits than the tree's. */
	int exact;
	/* Sync: time each round's parts on every thread and print, after
	 * the run, where a round's time goes (--profile). */
	int profile;

	adg_reducer *reducer; /* sync */
	/* --sum exact: per batch, the next unit to take, an atomic counter
	 * (relaxed: it hands out numbers; the batch's rows were published
	 * by the rendezvous, the weights by the reducer's barrier). */
	atomic_int *next_unit;
	/* --profile: each round's parts on each thread, n_batches x
	 * n_threads, the last epoch's (each worker writes its own). */
	struct round_clock *clocks;
	float lr;   /* this epoch's; written by main between epochs */
	int *order; /* this epoch's order of the training examples */
	int n_batches;
	/* Hogwild: the next batch to take, an atomic counter, so that each
	 * batch goes to one thread. Relaxed: it hands out numbers and
	 * publishes no data (the order was published by the rendezvous). */
	atomic_int next_batch;
	/* Hogwild: set by a worker that failed, so that the others stop
	 * early; the error itself reaches main through the rendezvous.
	 * Relaxed: a flag read only to stop sooner. */
	atomic_int stop;
	struct rendezvous meet;
	struct worker *workers; /* one per thread */
};

/* What a run ends with. */
struct outcome {
	double accuracy; /* the last epoch's test accuracy, % */
	uint64_t hash;	 /* model_hash of the final weights */
};

/* --same-weights: whether run `run` ends with the weights of every
 * earlier run it should equal: with any_threads (sync with units, whose
 * weights depend on no thread count) every one, else those with its
 * thread count. threads[q] and outcomes[q] are run q's. Returns 0, or 1
 * after printing the first that differs. */
int runner_same_weights(const int *threads, const struct outcome *outcomes,
			int run, int any_threads);

/* Opens path for runner_run's figures and writes the header of their
 * columns; NULL on an error (printed). */
FILE *runner_csv(const char *path);

/* Starts the workers' threads (in sync, with a reducer of the model's
 * parameters), runs the epochs (each with a fresh order and its learning
 * rate), prints a line for each (and writes it to csv unless NULL), then
 * a result line with the weights' hash, and ends the threads. Returns 0,
 * or 1 on an error (printed). */
int runner_run(struct runner *r, FILE *csv, struct outcome *outcome);

#endif /* EXAMPLES_RUNNER_H */
