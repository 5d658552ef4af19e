/*
 * Data-parallel training across processes and threads with Open MPI:
 * ranks x threads, as a trainer on several many-core machines runs.
 *
 * Every rank holds the same 2-layer MLP (4 inputs, 8 tanh units, 1 output,
 * each weight a scalar leaf) and its shard of the batch, which is the whole
 * synthetic regression set: rank r takes samples r, r + R, r + 2R, ... (R
 * ranks). Each rank runs T worker threads (--threads T, default 2) that
 * split its shard the same way. Per step, each thread builds one graph for
 * its share's squared error and runs backward with an adg_reducer's hook;
 * the reducer sums each parameter's T gradients in thread order. The
 * reducer's set-up and each thread's part in it come from
 * examples/tensor/sync.c, which the trainers of examples/digits and
 * examples/fashion share.
 *
 * Buckets. The reducer's apply callback does not update the parameter: it
 * writes the rank's sum into the send buffer of the parameter's bucket and
 * counts it there (one atomic add). The buckets are the model's four
 * tensors, W1 (32 values), b1 (8), W2 (8) and b2 (1): one all-reduce for
 * each rather than one per scalar. When a bucket's last value is in, the
 * main thread starts one MPI_Iallreduce for it at once, while the workers'
 * backward passes go on with earlier layers. Once all four have completed
 * (MPI_Waitall), the main thread averages over the ranks and applies SGD,
 * then lets the workers start the next step's forward. The last line
 * counts the all-reduces that started before the rank's last bucket was
 * ready, that is, beside a backward still running.
 *
 * Who calls MPI: the main thread, and only it, so MPI_THREAD_FUNNELED is
 * enough (asked for, and `provided` checked). The apply callback runs on
 * whichever worker brought a parameter's last gradient, several at once;
 * rather than require MPI_THREAD_MULTIPLE (which an MPI need not provide,
 * and which turns on locking inside Open MPI), the worker that completes a
 * bucket only puts its index on a queue (a mutex, four times a step) and wakes
 * the main thread, which takes no share of the batch: it sleeps until a bucket
 * comes, starts it, and after each start tests the started requests once (Open
 * MPI here has no progress thread: a nonblocking collective moves only
 * inside MPI calls).
 *
 * One communicator per bucket (MPI_Comm_dup). The order in which a rank's
 * buckets complete depends on its threads' timing, and collectives on one
 * communicator must start in the same order on every rank; each bucket's
 * communicator carries one all-reduce per step, so the order across
 * buckets is free.
 *
 * The mean. Each thread divides its share's squared error by the size of
 * the rank's shard (the reducer sums: the rank's mean gradient); the
 * all-reduce sums the ranks, and dividing by R gives the mean gradient
 * over the whole batch (the shards are equal: 64 samples divisible by
 * R x T).
 *
 * Reproducible: the reducer folds in thread order whatever the timing,
 * each bucket is one all-reduce of fixed size on its own communicator,
 * and the update is the same plain arithmetic on every rank. Checked
 * here (Open MPI 4.1.4, shared memory, 2 cores) by running again: the
 * fingerprint of the final weights printed at the end was the same in
 * five runs each of 1, 2 and 4 threads on 2 ranks, 2 and 4 on 4, and 2
 * on 8. Not promised: the same weights for another T (another
 * split of each sum) or R, or under another MPI, or another choice of
 * all-reduce algorithm.
 *
 * It checks itself and exits non-zero when a check fails:
 * - after every step the parameters are bitwise identical on every rank
 *   (an all-reduce of their bit patterns, MIN against MAX);
 * - after step 1 they match one full-batch SGD step computed in a single
 *   process (here, by every rank on its own) to 1e-6;
 * - the full-batch loss after the last step is below the first.
 *
 *   mpirun -np 4 ./mpi_data_parallel [--threads T] [steps]
 *
 * (defaults: 2 threads, 50 steps).
 */
#include <adg.h>
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxed.h"
#include "sync.h" /* examples/tensor: the reducer glue the trainers share */

#define IN	      4
#define HIDDEN	      8
#define SAMPLES	      64 /* divisible by every ranks x threads allowed */
#define PARAMS	      (HIDDEN * IN + HIDDEN + HIDDEN + 1) /* W1, b1, W2, b2 */
#define LEARNING_RATE 0.1
#define MAX_THREADS   64
#define BUCKETS	      4

/* The buckets, as ranges of the parameters' order (W1, b1, W2, b2). */
static const struct {
	const char *name;
	int first, count;
} bucket[BUCKETS] = {
	{"W1", 0, HIDDEN *IN},
	{"b1", HIDDEN *IN, HIDDEN},
	{"W2", HIDDEN *IN + HIDDEN, HIDDEN},
	{"b2", HIDDEN *IN + 2 * HIDDEN, 1},
};

static int bucket_of(int param)
{
	int b = 0;
	while (param >= bucket[b].first + bucket[b].count)
		b++;
	return b;
}

static double data_x[SAMPLES][IN], data_y[SAMPLES];

static void make_data(void)
{
	unsigned int s = 12345;
	for (int i = 0; i < SAMPLES; i++) {
		for (int k = 0; k < IN; k++) {
			s = s * 1103515245u + 12345u;
			data_x[i][k] = (double)(s >> 8) / (1u << 24) * 2 - 1;
		}
		const double *x = data_x[i];
		data_y[i] =
			0.5 * sin(2 * x[0]) + 0.3 * x[1] * x[2] - 0.2 * x[3];
	}
}

static void init_params(double *w)
{
	unsigned int s = 777;
	for (int i = 0; i < PARAMS; i++) {
		s = s * 1103515245u + 12345u;
		w[i] = ((double)(s >> 8) / (1u << 24) - 0.5) *
		       (i < HIDDEN * IN ? 1.0 : 0.5);
	}
}

/* Full-batch mean squared error, plain C: the reference to watch fall. */
static double full_loss(const double *w)
{
	const double *w1 = w, *b1 = w + HIDDEN * IN, *w2 = b1 + HIDDEN,
		     *b2 = w2 + HIDDEN;
	double total = 0;
	for (int i = 0; i < SAMPLES; i++) {
		double out = b2[0];
		for (int j = 0; j < HIDDEN; j++) {
			double z = b1[j];
			for (int k = 0; k < IN; k++)
				z += w1[j * IN + k] * data_x[i][k];
			out += w2[j] * tanh(z);
		}
		total += (out - data_y[i]) * (out - data_y[i]);
	}
	return total / SAMPLES;
}

/* ----------------------------------------------- gradients and steps */

/* Every op here is linear in each parent: y = sum_i c_i * parent_i, with
 * the c_i (the local derivatives) taken at the forward values. */
struct linear {
	size_t n;
	double c[];
};

static int linear_backward(adg_step_call *call, void *user)
{
	const struct linear *l = user;
	double g = call->grad ? *(double *)call->grad : 0;
	for (size_t i = 0; i < l->n; i++) {
		void *v = boxed(g * l->c[i]);
		if (v == NULL)
			return ADG_ENOMEM;
		int rc = adg_step_give(call, i, v);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static void linear_release(void *user)
{
	free(user);
}

/* One op with parents p[0..n) and local derivatives c; 0 or an error. */
static int op(adg_registry *reg, adg_node **p, const double *c, size_t n,
	      adg_node **out)
{
	struct linear *l = malloc(sizeof *l + n * sizeof(double));
	if (l == NULL)
		return ADG_ENOMEM;
	l->n = n;
	memcpy(l->c, c, n * sizeof(double));
	adg_step step = {.backward = linear_backward,
			 .release = linear_release,
			 .user = l};
	int rc = adg_op(reg, p, n, &step, out);
	if (rc != 0)
		free(l);
	return rc;
}

/* Builds the squared error over samples first, first + stride, ... (count
 * of them), divided by denom, on parameter leaves param[] with values w[];
 * returns its node in *loss. The graph is one tree per sample, summed at
 * the top. */
static int build_loss(adg_registry *reg, adg_node **param, const double *w,
		      int first, int count, int stride, int denom,
		      adg_node **loss)
{
	const double *w1 = w, *b1 = w + HIDDEN * IN, *w2 = b1 + HIDDEN,
		     *b2 = w2 + HIDDEN;
	adg_node **p_w1 = param, **p_b1 = param + HIDDEN * IN,
		 **p_w2 = p_b1 + HIDDEN, **p_b2 = p_w2 + HIDDEN;
	adg_node **per_sample = calloc(count, sizeof *per_sample);
	double *ones = malloc(count * sizeof *ones);
	int rc = per_sample && ones ? 0 : ADG_ENOMEM;

	for (int s = 0; s < count && rc == 0; s++) {
		const double *x = data_x[first + s * stride];
		double out_v = b2[0];
		adg_node *acts[HIDDEN] = {0};
		double act_v[HIDDEN];
		for (int j = 0; j < HIDDEN && rc == 0; j++) {
			/* z_j = sum_k w1[j][k] x_k + b1[j]; a_j = tanh(z_j) */
			adg_node *zp[IN + 1];
			double zc[IN + 1], z = b1[j];
			for (int k = 0; k < IN; k++) {
				zp[k] = p_w1[j * IN + k];
				zc[k] = x[k];
				z += w1[j * IN + k] * x[k];
			}
			zp[IN] = p_b1[j];
			zc[IN] = 1;
			adg_node *zn;
			rc = op(reg, zp, zc, IN + 1, &zn);
			if (rc != 0)
				break;
			act_v[j] = tanh(z);
			double slope = 1 - act_v[j] * act_v[j];
			rc = op(reg, &zn, &slope, 1, &acts[j]);
			adg_node_unref(zn);
			out_v += w2[j] * act_v[j];
		}
		/* out = sum_j w2[j] a_j + b2; err^2 / denom */
		adg_node *op_p[2 * HIDDEN + 1];
		double op_c[2 * HIDDEN + 1];
		for (int j = 0; j < HIDDEN; j++) {
			op_p[2 * j] = p_w2[j];
			op_c[2 * j] = act_v[j];
			op_p[2 * j + 1] = acts[j];
			op_c[2 * j + 1] = w2[j];
		}
		op_p[2 * HIDDEN] = p_b2[0];
		op_c[2 * HIDDEN] = 1;
		adg_node *out = NULL;
		if (rc == 0)
			rc = op(reg, op_p, op_c, 2 * HIDDEN + 1, &out);
		for (int j = 0; j < HIDDEN; j++)
			if (acts[j] != NULL)
				adg_node_unref(acts[j]);
		double err = out_v - data_y[first + s * stride];
		double d = 2 * err / denom;
		if (rc == 0)
			rc = op(reg, &out, &d, 1, &per_sample[s]);
		if (out != NULL)
			adg_node_unref(out);
		ones[s] = 1;
	}
	if (rc == 0)
		rc = op(reg, per_sample, ones, count, loss);
	for (int s = 0; s < count && per_sample; s++)
		if (per_sample[s] != NULL)
			adg_node_unref(per_sample[s]);
	free(per_sample);
	free(ones);
	return rc;
}

/* ------------------------------------------------------ the rank */

#define EMPI (ADG_EUSER - 1) /* an MPI call failed */

/* One rank: its model, its threads and the step's exchange. */
struct rank {
	int rank, world, threads;
	adg_registry *reg;
	adg_node *param[PARAMS];
	uint64_t param_id[PARAMS];
	/* Read by the workers' forward, written by the main thread between
	 * steps only (ordered by lock). */
	double w[PARAMS];
	adg_reducer *reducer;
	MPI_Comm comm[BUCKETS];

	/* The step's exchange. send is written by the apply callbacks,
	 * each its own parameters; a bucket's count, then the queue's lock,
	 * hands its values to the main thread, which alone calls MPI. */
	double send[PARAMS], recv[PARAMS];
	atomic_int reduced[BUCKETS]; /* parameters of the bucket in send */

	/* The meeting of the main thread and the workers. */
	pthread_mutex_t lock;
	pthread_cond_t go;   /* step or quit moved */
	pthread_cond_t wake; /* a bucket is queued, or a worker is done */
	unsigned long step;  /* steps started */
	int quit;
	int done;	    /* workers past this step's adg_reducer_end */
	int rc;		    /* this step's first error */
	int queue[BUCKETS]; /* buckets ready to start, in arrival order */
	int queued;
};

/* The reducer's ops. add folds one thread's gradient into the sum; the
 * reducer hands each value back through release, so add keeps it. */
static int reducer_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(double *)value;
	return 0;
}

/* A parameter's T gradients are summed: put the rank's sum in its bucket,
 * and hand the bucket over if this was its last parameter. */
static int reducer_apply(const adg_reduction *r, void *ctx)
{
	struct rank *s = ctx;
	int i = (int)r->param, b = bucket_of(i);
	s->send[i] = r->sum != NULL ? *(const double *)r->sum : 0;
	/* acq_rel: the release publishes this send[i]; the add that makes
	 * the count whole acquires every other one's, and the lock below
	 * passes them all to the main thread. */
	int n = atomic_fetch_add_explicit(&s->reduced[b], 1,
					  memory_order_acq_rel);
	if (n + 1 < bucket[b].count)
		return 0;
	pthread_mutex_lock(&s->lock);
	s->queue[s->queued++] = b;
	pthread_cond_signal(&s->wake);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static void reducer_release(void *value, size_t participant, void *ctx)
{
	(void)participant;
	(void)ctx;
	free(value);
}

struct worker {
	struct rank *s;
	struct sync_participant part; /* index: its share of the samples */
	pthread_t thread;
};

/* One step of a worker: the forward and backward of its share. The
 * parameters' gradients go to the reducer from the hook. */
static int worker_step(struct worker *wk)
{
	struct rank *s = wk->s;
	int stride = s->world * s->threads, count = SAMPLES / stride;
	adg_node *loss;
	int rc = build_loss(s->reg, s->param, s->w,
			    s->rank + s->world * (int)wk->part.index, count,
			    stride, SAMPLES / s->world, &loss);
	if (rc != 0)
		return rc;
	rc = backward_hooked(s->reg, loss, boxed(1.0), &boxed_ops,
			     &wk->part.backward);
	adg_node_unref(loss);
	return rc;
}

static void *worker_main(void *arg)
{
	struct worker *wk = arg;
	struct rank *s = wk->s;
	unsigned long seen = 0;
	for (;;) {
		pthread_mutex_lock(&s->lock);
		while (s->step == seen && !s->quit)
			pthread_cond_wait(&s->go, &s->lock);
		int quit = s->quit;
		seen = s->step;
		pthread_mutex_unlock(&s->lock);
		if (quit)
			break;
		/* Returns once every parameter of the step is reduced and
		 * handed to its bucket (or the round is abandoned). */
		int rc = adg_reducer_end(wk->part.reducer, wk->part.index,
					 worker_step(wk));
		pthread_mutex_lock(&s->lock);
		if (rc != 0 && s->rc == 0)
			s->rc = rc;
		s->done++;
		pthread_cond_signal(&s->wake);
		pthread_mutex_unlock(&s->lock);
	}
	return NULL;
}

/* One SGD step over the whole batch, on the main thread: the workers run
 * the backward passes, this thread starts each bucket's all-reduce as
 * soon as it is ready, then waits for them all and updates. order[]
 * gets the buckets in the order they started, *early the number started
 * before the rank's last bucket was ready (while backward passes still
 * ran). 0 or an error code. */
static int train_step(struct rank *s, int *order, int *early)
{
	MPI_Request req[BUCKETS];
	int started[BUCKETS] = {0}, n_started = 0, mpi_rc = MPI_SUCCESS;
	for (int b = 0; b < BUCKETS; b++) {
		req[b] = MPI_REQUEST_NULL;
		atomic_store_explicit(&s->reduced[b], 0, memory_order_relaxed);
	}
	pthread_mutex_lock(&s->lock);
	s->done = 0;
	s->rc = 0;
	s->queued = 0;
	s->step++;
	pthread_cond_broadcast(&s->go);
	/* Every bucket is queued before the last worker is done, unless the
	 * round was abandoned. */
	while (n_started < BUCKETS) {
		while (n_started == s->queued && s->done < s->threads)
			pthread_cond_wait(&s->wake, &s->lock);
		if (n_started == s->queued)
			break; /* the workers are done: an abandoned round */
		int b = s->queue[n_started];
		*early += s->queued < BUCKETS;
		pthread_mutex_unlock(&s->lock);
		if (mpi_rc == MPI_SUCCESS)
			mpi_rc = MPI_Iallreduce(s->send + bucket[b].first,
						s->recv + bucket[b].first,
						bucket[b].count, MPI_DOUBLE,
						MPI_SUM, s->comm[b], &req[b]);
		int flag;
		if (mpi_rc == MPI_SUCCESS)
			mpi_rc = MPI_Testall(BUCKETS, req, &flag,
					     MPI_STATUSES_IGNORE);
		order[n_started++] = b;
		started[b] = 1;
		pthread_mutex_lock(&s->lock);
	}
	while (s->done < s->threads)
		pthread_cond_wait(&s->wake, &s->lock);
	int rc = s->rc;
	pthread_mutex_unlock(&s->lock);
	/* A failed round still starts every bucket, on zeros, so that the
	 * ranks' collectives match; the step's check tells every rank. */
	for (int b = 0; b < BUCKETS; b++) {
		if (started[b])
			continue;
		memset(s->send + bucket[b].first, 0,
		       bucket[b].count * sizeof(double));
		if (mpi_rc == MPI_SUCCESS)
			mpi_rc = MPI_Iallreduce(s->send + bucket[b].first,
						s->recv + bucket[b].first,
						bucket[b].count, MPI_DOUBLE,
						MPI_SUM, s->comm[b], &req[b]);
		order[n_started++] = b;
	}
	if (mpi_rc == MPI_SUCCESS)
		mpi_rc = MPI_Waitall(BUCKETS, req, MPI_STATUSES_IGNORE);
	if (rc == 0 && mpi_rc != MPI_SUCCESS)
		rc = EMPI;
	if (rc != 0)
		return rc;
	for (int i = 0; i < PARAMS; i++)
		s->w[i] -= LEARNING_RATE * (s->recv[i] / s->world);
	return 0;
}

/* The same first step in one process over the whole set: the reference. */
static int full_batch_step(adg_registry *reg, adg_node **param, double *w)
{
	adg_node *loss;
	int rc = build_loss(reg, param, w, 0, SAMPLES, 1, SAMPLES, &loss);
	if (rc != 0)
		return rc;
	adg_grads *grads;
	rc = adg_backward(reg, loss, boxed(1.0), &boxed_ops, &grads);
	adg_node_unref(loss);
	double g[PARAMS];
	for (int i = 0; i < PARAMS && rc == 0; i++) {
		void *v;
		rc = adg_grads_get_node(grads, param[i], &v);
		g[i] = rc == 0 ? *(double *)v : 0;
	}
	if (grads != NULL && rc == 0)
		adg_grads_free(grads);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		w[i] -= LEARNING_RATE * g[i];
	return rc;
}

/* Whether w is bitwise the same on every rank, and whether every rank's
 * step succeeded (ok): one all-reduce, MIN of the bit patterns against
 * MIN of their complements (the MAX). 0 or EMPI. */
static int agree(const double *w, int ok, int *same, int *all_ok)
{
	uint64_t v[2 * PARAMS + 1];
	for (int i = 0; i < PARAMS; i++) {
		memcpy(&v[i], &w[i], sizeof v[i]);
		v[PARAMS + i] = ~v[i];
	}
	v[2 * PARAMS] = ok != 0;
	if (MPI_Allreduce(MPI_IN_PLACE, v, 2 * PARAMS + 1, MPI_UINT64_T,
			  MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
		return EMPI;
	*same = 1;
	for (int i = 0; i < PARAMS; i++)
		if (v[i] != ~v[PARAMS + i])
			*same = 0;
	*all_ok = v[2 * PARAMS] != 0;
	return 0;
}

/* FNV-1a over the weights' bits: one line to compare runs by. */
static uint64_t fingerprint(const double *w)
{
	uint64_t h = UINT64_C(14695981039346656037);
	const unsigned char *p = (const unsigned char *)w;
	for (size_t i = 0; i < PARAMS * sizeof *w; i++)
		h = (h ^ p[i]) * UINT64_C(1099511628211);
	return h;
}

/* Parses [--threads T] [steps]; 0, or -1 on bad usage. */
static int parse(int argc, char **argv, int *threads, int *steps)
{
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		int *to = steps;
		if (strcmp(arg, "--threads") == 0 && i + 1 < argc) {
			arg = argv[++i];
			to = threads;
		} else if (strncmp(arg, "--threads=", 10) == 0) {
			arg += 10;
			to = threads;
		}
		char *end;
		long v = strtol(arg, &end, 10);
		if (end == arg || *end != '\0' || v < 1 || v > 1000000)
			return -1;
		*to = (int)v;
	}
	return *threads <= MAX_THREADS ? 0 : -1;
}

/* Makes the communicators (first: MPI_Comm_dup is collective, so every
 * rank calls it whatever fails after), the registry, the leaves and the
 * reducer. */
static int rank_init(struct rank *s)
{
	int rc = 0;
	for (int b = 0; b < BUCKETS; b++)
		s->comm[b] = MPI_COMM_NULL;
	for (int b = 0; b < BUCKETS; b++)
		if (MPI_Comm_dup(MPI_COMM_WORLD, &s->comm[b]) != MPI_SUCCESS)
			rc = EMPI;
	if (rc == 0)
		rc = adg_registry_new(NULL, &s->reg);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		rc = adg_leaf(s->reg, &s->param[i]);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		rc = adg_node_id(s->param[i], &s->param_id[i]);
	/* Every parameter is one scalar: none is cut into slices. */
	adg_reducer_ops ops = {.add = reducer_add,
			       .apply = reducer_apply,
			       .release = reducer_release,
			       .ctx = s};
	if (rc == 0)
		rc = sync_reducer_new(&ops, (size_t)s->threads, s->param_id,
				      NULL, PARAMS, 0, &s->reducer);
	return rc;
}

static int rank_free(struct rank *s)
{
	int failures = 0;
	for (int b = 0; b < BUCKETS; b++)
		if (s->comm[b] != MPI_COMM_NULL)
			MPI_Comm_free(&s->comm[b]);
	if (adg_reducer_free(s->reducer) != 0)
		failures++;
	for (int i = 0; i < PARAMS; i++)
		if (s->param[i] != NULL)
			adg_node_unref(s->param[i]);
	if (adg_registry_free(s->reg) != 0)
		failures++;
	return failures;
}

static const char *describe(int rc)
{
	return rc == EMPI ? "an MPI call failed" : adg_strerror(rc);
}

int main(int argc, char **argv)
{
	int provided;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
	struct rank s = {.threads = 2};
	MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
	MPI_Comm_size(MPI_COMM_WORLD, &s.world);
	int steps = 50;
	if (provided < MPI_THREAD_FUNNELED) {
		if (s.rank == 0)
			fprintf(stderr,
				"mpi_data_parallel: this MPI gives thread "
				"level %d, below MPI_THREAD_FUNNELED\n",
				provided);
		MPI_Finalize();
		return 1;
	}
	if (parse(argc, argv, &s.threads, &steps) != 0 ||
	    SAMPLES % (s.world * s.threads) != 0) {
		if (s.rank == 0)
			fprintf(stderr,
				"usage: mpi_data_parallel [--threads T] "
				"[steps], T <= %d, ranks x T dividing %d\n",
				MAX_THREADS, SAMPLES);
		MPI_Finalize();
		return 2;
	}
	make_data();

	struct worker workers[MAX_THREADS];
	int n_workers = 0, failures = 0;
	double reference[PARAMS];
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.go, NULL);
	pthread_cond_init(&s.wake, NULL);
	int rc = rank_init(&s);
	init_params(s.w);
	memcpy(reference, s.w, sizeof s.w);
	if (rc == 0)
		rc = full_batch_step(s.reg, s.param, reference);
	for (int t = 0; t < s.threads && rc == 0; t++) {
		struct worker *wk = &workers[t];
		*wk = (struct worker){.s = &s};
		rc = sync_participant_init(&wk->part, s.reducer, (size_t)t);
		if (rc == 0 &&
		    pthread_create(&wk->thread, NULL, worker_main, wk) != 0)
			rc = ADG_ENOMEM;
		if (rc == 0)
			n_workers++;
	}
	double first_loss = full_loss(s.w);

	/* Every rank goes through the same steps, and leaves at the same
	 * one: a step's failure anywhere shows in the check's all-reduce. */
	int all_ok = 1, step, early = 0;
	for (step = 1; step <= steps; step++) {
		int order[BUCKETS];
		if (rc == 0)
			rc = train_step(&s, order, &early);
		int same = 1, check = agree(s.w, rc == 0, &same, &all_ok);
		if (rc == 0)
			rc = check;
		if (check != 0 || !all_ok)
			break;
		if (!same) {
			if (s.rank == 0)
				printf("step %d: parameters differ between "
				       "ranks\n",
				       step);
			failures++;
		}
		if (step == 1) {
			double worst = 0;
			for (int i = 0; i < PARAMS; i++)
				worst = fmax(worst,
					     fabs(s.w[i] - reference[i]));
			if (s.rank == 0)
				printf("step 1: largest difference from a "
				       "single-process full-batch step: %.3g\n",
				       worst);
			if (worst > 1e-6)
				failures++;
		}
		if (s.rank == 0 && (step == 1 || step % 10 == 0)) {
			printf("step %d: full-batch loss %.6f; all-reduces "
			       "started:",
			       step, full_loss(s.w));
			for (int b = 0; b < BUCKETS; b++)
				printf(" %s", bucket[order[b]].name);
			printf("\n");
		}
	}

	pthread_mutex_lock(&s.lock);
	s.quit = 1;
	pthread_cond_broadcast(&s.go);
	pthread_mutex_unlock(&s.lock);
	for (int t = 0; t < n_workers; t++)
		pthread_join(workers[t].thread, NULL);

	double last_loss = full_loss(s.w);
	if (rc == 0 && all_ok && s.rank == 0)
		printf("loss %.6f -> %.6f over %d steps on %d ranks x %d "
		       "threads; %d of %d all-reduces started before the "
		       "rank's last bucket was ready; weights fingerprint "
		       "%016" PRIx64 "\n",
		       first_loss, last_loss, steps, s.world, s.threads, early,
		       steps * BUCKETS, fingerprint(s.w));
	if (rc == 0 && all_ok && !(last_loss < first_loss))
		failures++;
	if (rc != 0) {
		fprintf(stderr, "rank %d: %s\n", s.rank, describe(rc));
		failures++;
	} else if (!all_ok) {
		if (s.rank == 0)
			fprintf(stderr, "step %d failed on another rank\n",
				step);
		failures++;
	}
	failures += rank_free(&s);
	pthread_cond_destroy(&s.wake);
	pthread_cond_destroy(&s.go);
	pthread_mutex_destroy(&s.lock);

	int all_failures;
	MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM,
		      MPI_COMM_WORLD);
	if (s.rank == 0)
		printf("mpi: %d passed, %d failed\n", all_failures == 0 ? 1 : 0,
		       all_failures == 0 ? 0 : 1);
	MPI_Finalize();
	return all_failures == 0 ? 0 : 1;
}
