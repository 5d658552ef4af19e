/* What the example trainers (examples/digits, examples/fashion) share
 * besides the tensor layer: a fixed random generator and each epoch's
 * order, a clock, the options they parse alike, the split of a batch
 * among threads, a hash of the final weights, and the rendezvous by
 * which the main thread runs each epoch on the worker threads (runner.h
 * has the runner that trains on them). */
#ifndef EXAMPLES_TRAIN_H
#define EXAMPLES_TRAIN_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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

#endif /* EXAMPLES_TRAIN_H */
