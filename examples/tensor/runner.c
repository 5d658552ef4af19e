/* The runner of the example trainers (see runner.h). */
#include "runner.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

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
