/* What the example trainers share besides the tensor layer (train.h). */
#include "train.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ----------------------------------------------------------- randomness */

uint64_t next_random(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15u);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
	return z ^ (z >> 31);
}

static double uniform01(uint64_t *state) /* in (0, 1) */
{
	return ((double)(next_random(state) >> 11) + 0.5) / 9007199254740992.0;
}

double normal(uint64_t *state)
{
	double u = uniform01(state), v = uniform01(state);
	return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

void shuffle(int *order, int n, uint64_t seed, int epoch)
{
	uint64_t state = seed * 1000003u + (uint64_t)epoch + 1;
	for (int i = 0; i < n; i++)
		order[i] = i;
	for (int i = n - 1; i > 0; i--) {
		int j = (int)(next_random(&state) % (uint64_t)(i + 1));
		int t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
}

/* ---------------------------------------------------- options, batches */

double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int parse_threads(const char *list, int *threads, int max)
{
	const char *p = list;
	int n = 0;
	while (*p != '\0') {
		char *end;
		long t = strtol(p, &end, 10);
		if (end == p || t < 1 || t > 1024 || n == max ||
		    (*end != ',' && *end != '\0'))
			return -1;
		threads[n++] = (int)t;
		p = *end == ',' ? end + 1 : end;
	}
	return n > 0 ? n : -1;
}

int parse_mode(const char *name, enum train_mode *mode)
{
	if (strcmp(name, "hogwild") == 0)
		*mode = MODE_HOGWILD;
	else if (strcmp(name, "sync") == 0)
		*mode = MODE_SYNC;
	else
		return -1;
	return 0;
}

const char *mode_name(enum train_mode mode)
{
	return mode == MODE_SYNC ? "sync" : "hogwild";
}

void batch_share(int rows, int part, int parts, int *first, int *n)
{
	/* Boundaries at rows * part / parts: shares differ by one row at
	 * most, and the first ones are the shorter. */
	int begin = (int)((long long)rows * part / parts);
	int end = (int)((long long)rows * (part + 1) / parts);
	*first = begin;
	*n = end - begin;
}

float learning_rate(double lr, int epochs, int epoch)
{
	return (float)(lr * (epochs - epoch) / epochs);
}

uint64_t hash_floats(uint64_t hash, const float *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t bits;
		memcpy(&bits, &v[i], sizeof bits);
		for (int b = 0; b < 4; b++) {
			hash ^= (bits >> (8 * b)) & 0xffu;
			hash *= UINT64_C(0x100000001b3);
		}
	}
	return hash;
}

/* ----------------------------------------------------------- rendezvous */

int rendezvous_init(struct rendezvous *meet)
{
	memset(meet, 0, sizeof *meet);
	int rc = pthread_mutex_init(&meet->lock, NULL);
	if (rc != 0)
		return rc;
	rc = pthread_cond_init(&meet->opened, NULL);
	if (rc != 0)
		goto out_lock;
	rc = pthread_cond_init(&meet->finished, NULL);
	if (rc != 0)
		goto out_opened;
	return 0;
out_opened:
	pthread_cond_destroy(&meet->opened);
out_lock:
	pthread_mutex_destroy(&meet->lock);
	return rc;
}

void rendezvous_destroy(struct rendezvous *meet)
{
	pthread_cond_destroy(&meet->finished);
	pthread_cond_destroy(&meet->opened);
	pthread_mutex_destroy(&meet->lock);
}

int rendezvous_wait(struct rendezvous *meet, unsigned *seen)
{
	pthread_mutex_lock(&meet->lock);
	while (meet->epoch == *seen && !meet->quit)
		pthread_cond_wait(&meet->opened, &meet->lock);
	int quit = meet->quit;
	*seen = meet->epoch;
	pthread_mutex_unlock(&meet->lock);
	return !quit;
}

void rendezvous_done(struct rendezvous *meet)
{
	pthread_mutex_lock(&meet->lock);
	if (--meet->running == 0)
		pthread_cond_signal(&meet->finished);
	pthread_mutex_unlock(&meet->lock);
}

void rendezvous_run(struct rendezvous *meet, unsigned n)
{
	pthread_mutex_lock(&meet->lock);
	meet->running = n;
	meet->epoch++;
	pthread_cond_broadcast(&meet->opened);
	while (meet->running > 0)
		pthread_cond_wait(&meet->finished, &meet->lock);
	pthread_mutex_unlock(&meet->lock);
}

void rendezvous_quit(struct rendezvous *meet)
{
	pthread_mutex_lock(&meet->lock);
	meet->quit = 1;
	pthread_cond_broadcast(&meet->opened);
	pthread_mutex_unlock(&meet->lock);
}

/* ----------------------------------------------------------- the runner */

/* A worker's thread. */
struct runner_thread {
	struct runner *runner;
	size_t index;
	pthread_t thread;
	int rc;
};

/* Batch k's rows: the batch size, or fewer for the last. */
static int batch_rows(const struct runner *r, int k)
{
	int left = r->n_train - k * r->batch;
	return left < r->batch ? left : r->batch;
}

static void train_epoch_hogwild(struct runner_thread *t)
{
	struct runner *r = t->runner;
	/* Relaxed, both: see struct runner. */
	while (t->rc == 0 &&
	       !atomic_load_explicit(&r->stop, memory_order_relaxed)) {
		int k = atomic_fetch_add_explicit(&r->next_batch, 1,
						  memory_order_relaxed);
		if (k >= r->n_batches)
			break;
		t->rc = r->ops->train_batch(r->ctx, t->index,
					    r->order + k * r->batch,
					    batch_rows(r, k), 1);
		if (t->rc != 0)
			atomic_store_explicit(&r->stop, 1,
					      memory_order_relaxed);
	}
}

/* Every thread takes its share of every batch, in step with the others:
 * adg_reducer_end returns once the batch's updates are applied, so the
 * next batch's forward reads updated weights, and it returns the same
 * result to every thread, so that all stop at the same batch on an
 * error. */
static void train_epoch_sync(struct runner_thread *t)
{
	struct runner *r = t->runner;
	for (int k = 0; k < r->n_batches && t->rc == 0; k++) {
		int rows = batch_rows(r, k), first, n;
		batch_share(rows, (int)t->index, r->n_threads, &first, &n);
		/* A thread with no rows (a last batch shorter than T) gives
		 * nothing: NULL contributions. */
		int rc = n > 0 ? r->ops->train_batch(r->ctx, t->index,
						     r->order + k * r->batch +
							     first,
						     n, (float)n / (float)rows)
			       : 0;
		t->rc = adg_reducer_end(r->reducer, t->index, rc);
	}
}

static void *thread_main(void *arg)
{
	struct runner_thread *t = arg;
	unsigned seen = 0;
	while (rendezvous_wait(&t->runner->meet, &seen)) {
		if (t->runner->mode == MODE_SYNC)
			train_epoch_sync(t);
		else
			train_epoch_hogwild(t);
		rendezvous_done(&t->runner->meet);
	}
	return NULL;
}

int runner_run(struct runner *r, FILE *csv, struct outcome *outcome)
{
	int started = 0, failed = 0, rc = rendezvous_init(&r->meet);
	if (rc != 0) {
		fprintf(stderr, "rendezvous: %s\n", strerror(rc));
		return 1;
	}
	r->n_batches = (r->n_train + r->batch - 1) / r->batch;
	r->threads = calloc((size_t)r->n_threads, sizeof *r->threads);
	r->order = malloc((size_t)r->n_train * sizeof *r->order);
	if (r->threads == NULL || r->order == NULL) {
		fprintf(stderr, "out of memory\n");
		failed = 1;
	}
	/* Sync needs every worker: if one cannot start, no epoch opens. */
	for (; !failed && started < r->n_threads; started++) {
		struct runner_thread *t = &r->threads[started];
		t->runner = r;
		t->index = (size_t)started;
		rc = r->ops->worker_init(r->ctx, t->index);
		if (rc != 0 || (rc = pthread_create(&t->thread, NULL,
						    thread_main, t)) != 0) {
			fprintf(stderr, "thread %d: %s\n", started,
				rc < 0 ? adg_strerror(rc) : strerror(rc));
			r->ops->worker_free(r->ctx, t->index);
			failed = 1;
			break;
		}
	}
	double seconds = 0;
	long samples = 0;
	for (int epoch = 0; !failed && epoch < r->epochs; epoch++) {
		shuffle(r->order, r->n_train, r->seed, epoch);
		r->lr = learning_rate(r->first_lr, r->epochs, epoch);
		/* Relaxed: rendezvous_run's mutex publishes it. */
		atomic_store_explicit(&r->next_batch, 0, memory_order_relaxed);
		double start = now();
		rendezvous_run(&r->meet, (unsigned)started);
		double took = now() - start;
		for (int t = 0; t < started; t++) {
			if (r->threads[t].rc != 0) {
				fprintf(stderr, "thread %d: %s\n", t,
					adg_strerror(r->threads[t].rc));
				failed = 1;
			}
		}
		if (failed)
			break;
		seconds += took;
		samples += r->n_train;
		double loss, train_accuracy, test_accuracy;
		rc = r->ops->evaluate(r->ctx, &loss, &train_accuracy,
				      &test_accuracy);
		if (rc != 0) {
			fprintf(stderr, "evaluate: %s\n", adg_strerror(rc));
			failed = 1;
			break;
		}
		double rate = r->n_train / took;
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
		pthread_join(r->threads[t].thread, NULL);
		if (r->ops->worker_free(r->ctx, (size_t)t) != 0) {
			fprintf(stderr, "thread %d: gradient tensors leaked\n",
				t);
			failed = 1;
		}
	}
	if (!failed) {
		outcome->hash = r->ops->weights_hash(r->ctx);
		printf("result threads=%d batch=%d epochs=%d "
		       "samples_per_s=%.0f test_accuracy=%.2f mode=%s "
		       "weights_hash=%016" PRIx64 "\n",
		       r->n_threads, r->batch, r->epochs, samples / seconds,
		       outcome->accuracy, mode_name(r->mode), outcome->hash);
	}
	rendezvous_destroy(&r->meet);
	free(r->order);
	free(r->threads);
	return failed;
}
