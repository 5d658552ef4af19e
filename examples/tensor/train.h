/* What the example trainers (examples/digits, examples/fashion) share
 * besides the tensor layer: a fixed random generator and each epoch's
 * order, a clock, the options they parse alike, the split of a batch
 * among threads, a hash of the final weights, the rendezvous by which
 * the main thread runs each epoch on the worker threads, and the runner
 * that trains on those threads, epoch after epoch, a model that the
 * trainer knows through a few callbacks. */
#ifndef EXAMPLES_TRAIN_H
#define EXAMPLES_TRAIN_H

#include <adg.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* splitmix64: a tiny, fixed generator, so that orders depend on the seed
 * alone, and initial weights too, up to libm's rounding. */
uint64_t next_random(uint64_t *state);
/* A standard normal deviate (Box-Muller). */
double normal(uint64_t *state);
/* Epoch e's order of the n training examples: a Fisher-Yates shuffle
 * from a generator seeded by the seed and the epoch. */
void shuffle(int *order, int n, uint64_t seed, int epoch);

/* Seconds on the monotonic clock. */
double now(void);

/* Parses --threads' comma-separated list of thread counts (each 1..1024)
 * into threads[0..max); returns how many, or -1 when it is not such a
 * list. */
int parse_threads(const char *list, int *threads, int max);

/* How T threads train on a batch:
 * - hogwild: each thread takes whole batches in turn and updates every
 *   parameter as soon as its gradient is final, without a lock;
 * - sync: each batch is split across the threads, and a gradient reducer
 *   sums each parameter's gradients in thread order before one update. */
enum train_mode { MODE_HOGWILD, MODE_SYNC };
/* "hogwild" or "sync" into *mode; -1 for anything else. */
int parse_mode(const char *name, enum train_mode *mode);
const char *mode_name(enum train_mode mode);

/* Participant part of parts' share of a batch of rows: rows
 * [*first, *first + *n), as even as can be, *n possibly 0. */
void batch_share(int rows, int part, int parts, int *first, int *n);

/* FNV-1a over the bits of v[0..n), continuing from hash (start from
 * HASH_START): a fingerprint of weights, equal only for bitwise equal
 * values (so -0 is not 0). */
#define HASH_START UINT64_C(0xcbf29ce484222325)
uint64_t hash_floats(uint64_t hash, const float *v, size_t n);

/* The main thread opens each epoch for the workers and waits until all
 * are done with it: a mutex and two condition variables, which also make
 * what main wrote before opening (the order, the learning rate) visible
 * to the workers, and what they wrote visible to main after. */
struct rendezvous {
	pthread_mutex_t lock;
	pthread_cond_t opened, finished;
	unsigned epoch;	  /* bumped by main to open an epoch */
	unsigned running; /* workers not yet done with the open epoch */
	int quit;
};

/* Returns 0 or an errno code. */
int rendezvous_init(struct rendezvous *meet);
void rendezvous_destroy(struct rendezvous *meet);
/* A worker waits for the epoch after *seen: returns 1 when one is open
 * (and records it in *seen), 0 when the worker is to quit. */
int rendezvous_wait(struct rendezvous *meet, unsigned *seen);
/* A worker is done with the open epoch. */
void rendezvous_done(struct rendezvous *meet);
/* Main opens an epoch for n workers and waits until they are done. */
void rendezvous_run(struct rendezvous *meet, unsigned n);
/* Main tells the workers to quit (then joins them). */
void rendezvous_quit(struct rendezvous *meet);

/* Epoch e's learning rate: lr, falling linearly to lr / epochs at the
 * last epoch, so that the last epochs settle whatever the run's length. */
float learning_rate(double lr, int epochs, int epoch);

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

#endif /* EXAMPLES_TRAIN_H */
