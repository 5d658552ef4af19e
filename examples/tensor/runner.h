/* The runner that the example trainers (examples/digits, examples/fashion)
 * share: it trains on T threads, epoch after epoch, a model that the
 * trainer knows through a few callbacks. */
#ifndef EXAMPLES_RUNNER_H
#define EXAMPLES_RUNNER_H

#include "train.h"

#include <adg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---------------------------------------------------------- the runner */

/* What the runner needs of a trainer, each called with the runner's ctx;
 * a worker is the trainer's state of one thread, index 0..n_threads
 * (the reducer's participant in sync). */
struct train_ops {
	/* Prepares worker index, before its thread starts; returns 0 or an
	 * ADG_E* code. */
	int (*worker_init)(void *ctx, size_t index);
	/* Frees what worker index holds, after its thread ended (or did not
	 * start); returns -1 if a gradient tensor is still out of its
	 * pool. */
	int (*worker_free)(void *ctx, size_t index);
	/* Worker index records and runs the backward of one step on the
	 * training examples order[0..n), whose loss weighs scale in the
	 * step's loss (1 in Hogwild; in sync the share's n / the batch's
	 * rows, so that the threads' gradients add up to those of the
	 * batch's mean loss). Returns 0 or an ADG_E* code. */
	int (*train_batch)(void *ctx, size_t index, const int *order, int n,
			   float scale);
	/* The model's mean loss and accuracy (%) on the training set, and
	 * its accuracy on the test set; runs while no worker does. */
	int (*evaluate)(void *ctx, double *loss, double *train_accuracy,
			double *test_accuracy);
	/* The final weights' fingerprint (hash_floats). */
	uint64_t (*weights_hash)(void *ctx);
};

struct runner_thread;

/* One run: n_threads threads train the model for epochs epochs. The
 * trainer sets the first fields; runner_run the others, which the
 * workers read. */
struct runner {
	const struct train_ops *ops;
	void *ctx;
	enum train_mode mode;
	int n_threads, batch, epochs;
	int n_train;	      /* training examples */
	double first_lr;      /* the first epoch's; see learning_rate */
	uint64_t seed;	      /* of each epoch's order (shuffle) */
	int name_mode;	      /* whether each epoch's line names the mode */
	adg_reducer *reducer; /* sync only: made and freed by the trainer */

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
	struct runner_thread *threads;
};

/* What a run ends with. */
struct outcome {
	double accuracy; /* the last epoch's test accuracy, % */
	uint64_t hash;	 /* weights_hash of the final weights */
};

/* Starts the workers' threads, runs the epochs (each with a fresh order
 * and its learning rate), prints a line for each (and writes it to csv
 * unless NULL), then a result line with the weights' hash, and ends the
 * threads. The model is to hold its initial weights. Returns 0, or 1 on
 * an error (printed). */
int runner_run(struct runner *r, FILE *csv, struct outcome *outcome);

#endif /* EXAMPLES_RUNNER_H */
