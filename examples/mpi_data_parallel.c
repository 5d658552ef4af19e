/*
 * Data-parallel training across processes and threads with Open MPI:
 * ranks x threads, as a trainer on several many-core machines runs, with
 * the same bits at every rank and thread count.
 *
 * Every rank holds the same 2-layer MLP (4 inputs, 8 tanh units, 1 output,
 * each weight a scalar leaf). The batch, the whole synthetic regression
 * set of 64 samples, is cut into the job's 16 work units of 4 samples
 * each, whatever R and T: rank r of R holds units 16r/R to 16(r+1)/R - 1
 * (--threads T worker threads take them as they come, a graph and a
 * backward each, with an adg_reducer's hook). Each rank's reducer holds
 * its range of the job's units (adg_reducer_options.total_units): it
 * folds their gradients over the job's tree, a binary tree over the 16
 * unit indices, as they arrive, and hands apply its partial sums, the
 * largest subtrees within its range (one for 1, 2, 4, 8 or 16 ranks, up
 * to 2 log2(16) for others).
 *
 * Buckets. The reducer's apply callback does not update the parameter: it
 * writes the rank's partial sum into the send buffer of the parameter's
 * bucket and counts it there (one atomic add), as soon as it is complete
 * (apply_early: the update waits for every rank anyway). The buckets are
 * the model's four tensors, W1 (32 values), b1 (8), W2 (8) and b2 (1):
 * one exchange for each rather than one per scalar. When a bucket's last
 * partial sum is in, the main thread starts its sum across the ranks at
 * once, while the workers' backward passes go on with earlier layers.
 * Once all four are done, the main thread applies SGD, then lets the
 * workers start the next step's forward. The last line counts the
 * exchanges that started before the rank's last bucket was ready, that
 * is, beside a backward still running.
 *
 * Sums across ranks, over the job's tree (--allreduce tree, the default):
 * the ranks' partial sums are folded over the rest of the job's tree by
 * this program (struct exchange: a reduce-scatter by hand, each rank
 * receiving a slice of the parameters' partial sums from every rank with
 * MPI_Ialltoallv and folding it, then MPI_Iallgatherv of the folded
 * slices), not by MPI. --allreduce mpi folds each rank's partial sums in
 * order and uses MPI_Iallreduce, whose order of additions is the
 * algorithm's Open MPI picks.
 *
 * Who calls MPI: the main thread, and only it, so MPI_THREAD_FUNNELED is
 * enough (asked for, and `provided` checked). The apply callback runs on
 * whichever worker completed a partial sum, several at once; rather than
 * require MPI_THREAD_MULTIPLE (which an MPI need not provide, and which
 * turns on locking inside Open MPI), the worker that completes a bucket
 * only puts its index on a queue (a mutex, four times a step) and wakes
 * the main thread, which takes no unit: it sleeps until a bucket comes,
 * starts it, and after each start tests the started requests once (Open
 * MPI here has no progress thread: a nonblocking collective moves only
 * inside MPI calls).
 *
 * One communicator per bucket (MPI_Comm_dup). The order in which a rank's
 * buckets complete depends on its threads' timing, and collectives on one
 * communicator must start in the same order on every rank; each bucket's
 * communicator carries one exchange per step, so the order across
 * buckets is free.
 *
 * The mean. Each unit divides its samples' squared error by the batch's
 * size (64): the sum over the units is the batch's mean gradient.
 *
 * The promise: for a given data order, seed and unit definition, the
 * weights are bitwise the same on every rank, on every run, at every R
 * (1 to 16) and T, with any of Open MPI's all-reduce algorithms (libnbc's
 * for MPI_Iallreduce, tuned's for MPI_Allreduce, or its default choice),
 * and equal to the same fold computed in one process (--simulate-ranks
 * R) and to one process of one thread. Each reducer folds its units over
 * the job's tree whatever the timing and whichever thread took which
 * unit, the ranks' partial sums are folded over the rest of the same
 * tree, element by element, whatever the slices or bucket sizes, and the
 * update is the same plain arithmetic on every rank. What changes the
 * weights: the units (their samples and count), the compiler and its
 * flags, and in a trainer on BLAS its build and thread count.
 * tests/mpi-sums.sh checks it: one fingerprint at 1 x 1, 1 x 4, 2 x 2,
 * 4 x 1, 3 x 1 and 5 x 3, and at 2 x 2 and 4 x 1 under every algorithm.
 * With --allreduce mpi the weights may change with the algorithm and R.
 *
 * A failed step: a rank whose workers fail (--fail-rank R --fail-step S
 * makes the rank's last unit fail on purpose) still takes part in every
 * exchange, on zeros, so that the collectives match; beside them each
 * rank puts whether its step succeeded into an integer all-reduce
 * (MINLOC, exact under any algorithm), and no rank applies the step
 * unless all did. Every rank then stops at that step, rank 0 saying which
 * rank failed, and the job exits with status 1.
 *
 * It checks itself and exits non-zero when a check fails:
 * - after every step the parameters are bitwise identical on every rank
 *   (an all-reduce of their bit patterns, MIN against MAX);
 * - after step 1 they match one full-batch SGD step computed in a single
 *   process (here, by every rank on its own) to 1e-6;
 * - the full-batch loss after the last step is below the first.
 *
 *   mpirun -np R ./mpi_data_parallel [--threads T] [steps]
 *       [--allreduce tree|mpi]           (default: tree)
 *   mpirun -np 1 ./mpi_data_parallel --simulate-ranks R [--threads T] [steps]
 *   mpirun -np R ./mpi_data_parallel --bench-bucket N [exchanges]
 *
 * (defaults: 2 threads, 50 steps; R at most 16). --bench-bucket times the
 * two ways of summing one bucket of N doubles across the ranks, taking
 * turns (scripts/bench-mpi.sh runs it).
 */
#include <adg.h>
#include <inttypes.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxed.h"
#include "sync.h" /* examples/tensor: backward_hooked */

#define IN	      4
#define HIDDEN	      8
#define SAMPLES	      64
#define UNIT_SAMPLES  4			       /* a unit: 4 samples in a row */
#define UNITS	      (SAMPLES / UNIT_SAMPLES) /* 16, a power of two */
#define MAX_RANKS     UNITS
#define LOG2_UNITS    4
#define MAX_PARTIALS  8 /* a rank's partial sums: 2 log2(UNITS) at most */
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

/* ------------------------------------------------------- the job's units */

#define EMPI	  (ADG_EUSER - 1) /* an MPI call failed */
#define EINJECTED (ADG_EUSER - 2) /* --fail-step's failure */
#define EFAILED	  (ADG_EUSER - 3) /* the step failed on some rank */
#define ENOSUM	  (ADG_EUSER - 4) /* a partial sum without a gradient */

/* Some units of the job: first to first + count - 1. */
struct span {
	int first, count;
};

/* The job's units and who holds them: rank r holds units lo[r] to
 * hi[r] - 1, contiguous, and its reducer hands apply one partial sum per
 * parameter for each of parts[r] (adg_reducer_options.total_units): the
 * largest subtrees of the job's tree (over UNITS leaves, a power of two)
 * whose units are all the rank's, in the order of their units. Fixed by
 * R alone, the same on every rank. */
struct job {
	int ranks;
	int lo[MAX_RANKS], hi[MAX_RANKS];
	struct span parts[MAX_RANKS][MAX_PARTIALS];
	int n_parts[MAX_RANKS];
};

/* Appends to out (n of them so far) the largest subtrees within [lo, hi)
 * of the node over units first to first + count - 1; returns the new n. */
static int job_partials(int first, int count, int lo, int hi, struct span *out,
			int n)
{
	if (first + count <= lo || first >= hi)
		return n; /* none of the range */
	if (lo <= first && first + count <= hi) {
		out[n] = (struct span){first, count};
		return n + 1;
	}
	n = job_partials(first, count / 2, lo, hi, out, n);
	return job_partials(first + count / 2, count / 2, lo, hi, out, n);
}

static void job_init(struct job *j, int ranks)
{
	j->ranks = ranks;
	for (int r = 0; r < ranks; r++) {
		j->lo[r] = r * UNITS / ranks;
		j->hi[r] = (r + 1) * UNITS / ranks;
		j->n_parts[r] = job_partials(0, UNITS, j->lo[r], j->hi[r],
					     j->parts[r], 0);
	}
}

/* Which of rank r's partial sums starts at unit first. */
static int job_part_at(const struct job *j, int r, int first)
{
	int k = 0;
	while (j->parts[r][k].first != first)
		k++; /* there: every partial sum apply sees is one of them */
	return k;
}

/* ------------------------------------------------ sums across ranks */

/* How a bucket's partial sums become its sums:
 * - SUM_TREE (the default): every rank's partial sums are gathered to
 *   every rank (MPI_Iallgatherv, which only moves bytes, whichever
 *   algorithm Open MPI picks), and each rank folds them over the rest of
 *   the job's tree, in its order, element by element: the sums one
 *   reducer of all the units would give, whatever R.
 * - SUM_MPI: each rank folds its own partial sums in their order and
 *   MPI_Iallreduce with MPI_SUM adds the ranks' in the order of its
 *   algorithm (ring, recursive doubling, Rabenseifner, ...: Open MPI picks
 *   by message size, rank count, version and tuning files), so the
 *   weights' last bits change with it, and with R.
 * This lives in the example, not in libadg: libadg builds and tests
 * without MPI, and the reducer already hands each rank's partial sums to
 * the trainer, which owns the communicator and its threading level. */
enum sum_mode { SUM_TREE, SUM_MPI };

/* One bucket's exchange: its count parameters' sums over the job's units
 * into sum. A rank's part of it, send: for each parameter, each of the
 * rank's partial sums (every unit reaches every parameter of this model,
 * so there is always one: reducer_apply checks).
 * SUM_TREE is a reduce-scatter by hand: slice q of the parameters,
 * [slice_lo(q), slice_lo(q + 1)), of every rank's part goes to rank q
 * (MPI_Ialltoallv, rank by rank into gather), which folds its slice over
 * the job's tree; then every rank's folded slice goes to every rank
 * (MPI_Iallgatherv). Both only move bytes. A small bucket (at most
 * SMALL_BUCKET doubles of partial sums from all ranks) takes one phase
 * instead, since there a phase's latency is the cost: every rank's part
 * goes to every rank (MPI_Iallgatherv into whole), and each rank folds
 * the whole bucket, the same fold. */
#define SMALL_BUCKET 4096

struct exchange {
	MPI_Comm comm;
	const struct job *job;
	int rank, world, count;
	double *send;	     /* this rank's part */
	double *gather;	     /* this rank's slice of every rank's part */
	int *to, *to_at;     /* send's slice for each rank: doubles, start */
	int *from, *from_at; /* gather's part from each rank: doubles, start */
	int *slice, *offset; /* each rank's slice of sum: length, start */
	double *whole;	     /* small or simulated: every rank's send whole */
	int *whole_size, *whole_at; /* small: each rank's part in whole */
	double *mine;		    /* SUM_MPI: this rank's sums */
	double *scratch; /* the fold's sums, log2(UNITS) + 2 levels */
	double *sum;	 /* the bucket's sums: count of them */
	int phase; /* 0 idle, 1 slices moving, 2 gathering, 3 all moving */
};

/* Where parameter p's partial sums are, rank by rank: rank r's from
 * parameter p0 on, at base[r], as in send. */
struct parts_view {
	const double *base[MAX_RANKS];
	int p0;
};

static int slice_lo(const struct exchange *x, int q)
{
	return (int)((long long)q * x->count / x->world);
}

static void exchange_free(struct exchange *x)
{
	free(x->send);
	free(x->gather);
	free(x->to);
	free(x->whole);
	free(x->whole_size);
	free(x->mine);
	free(x->scratch);
}

/* Lays out the slices of send, gather and sum, rank by rank; returns
 * gather's size in doubles. */
static int exchange_layout(struct exchange *x)
{
	const struct job *j = x->job;
	int mine = slice_lo(x, x->rank + 1) - slice_lo(x, x->rank), total = 0;
	for (int q = 0; q < x->world; q++) {
		int len = slice_lo(x, q + 1) - slice_lo(x, q);
		x->to[q] = len * j->n_parts[x->rank];
		x->to_at[q] = slice_lo(x, q) * j->n_parts[x->rank];
		x->from[q] = mine * j->n_parts[q];
		x->from_at[q] = total;
		total += x->from[q];
		x->slice[q] = len;
		x->offset[q] = slice_lo(x, q);
	}
	return total;
}

/* The exchange of count parameters' sums into sum, for rank of job (all
 * of its ranks in this process: simulated). 0, or ADG_ENOMEM (x is then
 * freed). */
static int exchange_init(struct exchange *x, MPI_Comm comm,
			 const struct job *job, int rank, int simulated,
			 int count, double *sum)
{
	*x = (struct exchange){.comm = comm,
			       .job = job,
			       .rank = rank,
			       .world = job->ranks,
			       .count = count,
			       .sum = sum};
	size_t n = (size_t)job->ranks;
	x->send = malloc((size_t)count * MAX_PARTIALS * sizeof(double));
	x->to = malloc(6 * n * sizeof(int));
	x->mine = malloc((size_t)count * sizeof(double));
	x->scratch = malloc((size_t)count * (LOG2_UNITS + 2) * sizeof(double));
	int small = (size_t)count * MAX_PARTIALS * n <= SMALL_BUCKET;
	if (simulated || small)
		x->whole = malloc(n * count * MAX_PARTIALS * sizeof(double));
	if (small) {
		x->whole_size = malloc(2 * n * sizeof(int));
		for (size_t r = 0; x->whole_size != NULL && r < n; r++) {
			x->whole_size[r] = count * job->n_parts[r];
			x->whole_size[n + r] = (int)r * count * MAX_PARTIALS;
		}
		x->whole_at = x->whole_size + n;
	}
	if (x->to != NULL) {
		x->to_at = x->to + n;
		x->from = x->to_at + n;
		x->from_at = x->from + n;
		x->slice = x->from_at + n;
		x->offset = x->slice + n;
		x->gather =
			malloc((size_t)exchange_layout(x) * sizeof(double) + 1);
	}
	if (x->send == NULL || x->to == NULL || x->gather == NULL ||
	    x->mine == NULL || x->scratch == NULL ||
	    ((simulated || small) && x->whole == NULL) ||
	    (small && x->whole_size == NULL)) {
		exchange_free(x);
		return ADG_ENOMEM;
	}
	return 0;
}

/* Parameters lo to hi - 1's sums over units first to first + count - 1
 * (a subtree of the job's tree) from every rank's partial sums (view),
 * into out: the partial sum that covers the units where there is one,
 * else its halves', right added into left element by element (as the
 * reducer adds, a node's right side into its left one). scratch holds
 * the right halves of the levels below. Returns whether any unit of the
 * job is among them (a left half always holds one). */
static int exchange_fold(const struct exchange *x, const struct parts_view *v,
			 int lo, int hi, int first, int count, double *out,
			 double *scratch)
{
	const struct job *j = x->job;
	if (first >= j->hi[j->ranks - 1])
		return 0; /* past the job's last unit: nothing */
	int r = 0;
	while (j->hi[r] <= first)
		r++;
	if (first >= j->lo[r] && first + count <= j->hi[r]) {
		int k = job_part_at(j, r, first), parts = j->n_parts[r];
		for (int p = lo; p < hi; p++)
			out[p - lo] = v->base[r][(p - v->p0) * parts + k];
		return 1;
	}
	int n = hi - lo;
	exchange_fold(x, v, lo, hi, first, count / 2, out, scratch + n);
	if (exchange_fold(x, v, lo, hi, first + count / 2, count / 2, scratch,
			  scratch + n))
		for (int p = 0; p < n; p++)
			out[p] += scratch[p];
	return 1;
}

/* Parameters lo to hi - 1's sums into sum: the fold over the job's tree,
 * the same on every rank. */
static void exchange_sum(struct exchange *x, const struct parts_view *v, int lo,
			 int hi)
{
	exchange_fold(x, v, lo, hi, 0, UNITS, x->sum + lo, x->scratch);
}

/* --simulate-ranks: rank r's send, whole, kept for exchange_whole. */
static void exchange_keep(struct exchange *x, int r)
{
	memcpy(x->whole + (size_t)r * x->count * MAX_PARTIALS, x->send,
	       (size_t)x->count * x->job->n_parts[r] * sizeof(double));
}

/* Every rank's send in whole (small, or simulated): the sums SUM_TREE
 * gives. */
static void exchange_whole(struct exchange *x)
{
	struct parts_view v = {.p0 = 0};
	for (int r = 0; r < x->world; r++)
		v.base[r] = x->whole + (size_t)r * x->count * MAX_PARTIALS;
	exchange_sum(x, &v, 0, x->count);
}

/* Starts the exchange of send into *req; 0 or EMPI. */
static int exchange_start(struct exchange *x, enum sum_mode mode,
			  MPI_Request *req)
{
	if (mode == SUM_MPI) {
		int n = x->job->n_parts[x->rank];
		for (int q = 0; q < x->count; q++) {
			x->mine[q] = x->send[q * n];
			for (int k = 1; k < n; k++)
				x->mine[q] += x->send[q * n + k];
		}
		x->phase = 2;
		return MPI_Iallreduce(x->mine, x->sum, x->count, MPI_DOUBLE,
				      MPI_SUM, x->comm, req) == MPI_SUCCESS
			       ? 0
			       : EMPI;
	}
	if (x->whole_size != NULL) {
		x->phase = 3;
		return MPI_Iallgatherv(x->send, x->whole_size[x->rank],
				       MPI_DOUBLE, x->whole, x->whole_size,
				       x->whole_at, MPI_DOUBLE, x->comm,
				       req) == MPI_SUCCESS
			       ? 0
			       : EMPI;
	}
	x->phase = 1;
	return MPI_Ialltoallv(x->send, x->to, x->to_at, MPI_DOUBLE, x->gather,
			      x->from, x->from_at, MPI_DOUBLE, x->comm,
			      req) == MPI_SUCCESS
		       ? 0
		       : EMPI;
}

/* The exchange's request completed: after the slices came, fold this
 * rank's slice over the job's tree and start gathering every rank's
 * folded slice; after that, after a small bucket's parts came (folded
 * here whole), or after MPI_Iallreduce, it is done. 0 or EMPI. */
static int exchange_advance(struct exchange *x, MPI_Request *req)
{
	if (x->phase == 3)
		exchange_whole(x);
	if (x->phase != 1) {
		x->phase = 0;
		return 0;
	}
	struct parts_view v = {.p0 = slice_lo(x, x->rank)};
	for (int r = 0; r < x->world; r++)
		v.base[r] = x->gather + x->from_at[r];
	exchange_sum(x, &v, slice_lo(x, x->rank), slice_lo(x, x->rank + 1));
	x->phase = 2;
	return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, x->sum,
			       x->slice, x->offset, MPI_DOUBLE, x->comm,
			       req) == MPI_SUCCESS
		       ? 0
		       : EMPI;
}

/* Moves the exchanges x[0..n) on, their requests in req[]: each that has
 * completed advances. block: until every one is done; else only what has
 * completed now (Open MPI here has no progress thread: a nonblocking
 * collective moves only inside MPI calls). 0 or EMPI. */
static int exchanges_progress(struct exchange *x, MPI_Request *req, int n,
			      int block)
{
	for (;;) {
		int i, flag = 1;
		int rc = block ? MPI_Waitany(n, req, &i, MPI_STATUS_IGNORE)
			       : MPI_Testany(n, req, &i, &flag,
					     MPI_STATUS_IGNORE);
		if (rc != MPI_SUCCESS)
			return EMPI;
		if (!flag || i == MPI_UNDEFINED)
			return 0; /* nothing more now, or nothing active */
		rc = exchange_advance(&x[i], &req[i]);
		if (rc != 0)
			return rc;
	}
}

/* ------------------------------------------------------ the rank */

/* One rank: its model, its threads and the step's exchange. */
struct rank {
	int rank, world, threads;
	int simulated; /* --simulate-ranks: world ranks in this process */
	struct job job;

	adg_registry *reg;
	adg_node *param[PARAMS];
	uint64_t param_id[PARAMS];
	/* Read by the workers' forward, written by the main thread between
	 * steps only (ordered by lock). */
	double w[PARAMS];
	/* The rank's reducer of its units; --simulate-ranks: one per rank
	 * simulated, red the one of the rank under way (set by the main
	 * thread before a step, ordered by lock). */
	adg_reducer *reducers[MAX_RANKS];
	adg_reducer *red;
	MPI_Comm comm[BUCKETS];
	MPI_Comm status_comm; /* the step's agreement on failure */
	enum sum_mode mode;
	struct exchange exchange[BUCKETS];
	int exchanges;		  /* whether exchange[] holds memory to free */
	int fail_rank, fail_step; /* --fail-rank, --fail-step: 0 for none */

	/* The step's exchange. Each exchange's send is written by the apply
	 * callbacks, each its own parameters' partial sums; a bucket's
	 * count, then the queue's lock, hands its values to the main
	 * thread, which alone calls MPI. The sums land in grad. */
	double grad[PARAMS];
	atomic_int reduced[BUCKETS]; /* partial sums of the bucket in send */

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

/* The reducer's ops. add folds one tree node's right side into its left
 * one; the reducer hands each value back through release, so add keeps
 * it. */
static int reducer_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(double *)value;
	return 0;
}

/* One of a parameter's partial sums is complete (apply_early: as soon as
 * it is, while the backward of earlier layers goes on): put it in its
 * bucket's send, and hand the bucket over if this was its last. */
static int reducer_apply(const adg_reduction *r, void *ctx)
{
	struct rank *s = ctx;
	int i = (int)r->param, b = bucket_of(i), q = i - bucket[b].first;
	int n = s->job.n_parts[s->rank];
	int k = job_part_at(&s->job, s->rank, (int)r->first_unit);
	if (r->sum == NULL)
		return ENOSUM; /* a unit that does not reach a parameter */
	s->exchange[b].send[q * n + k] = *(const double *)r->sum;
	/* acq_rel: the release publishes this slot; the add that makes the
	 * count whole acquires every other one's, and the lock below passes
	 * them all to the main thread. */
	int had = atomic_fetch_add_explicit(&s->reduced[b], 1,
					    memory_order_acq_rel);
	if (had + 1 < bucket[b].count * n)
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
	size_t index; /* its place among the reducer's participants */
	pthread_t thread;
};

/* Unit unit of a step: the forward and backward of its samples, whose
 * parameters' gradients go to the reducer from the hook (options). */
static int unit_step(struct worker *wk, size_t unit, unsigned long step,
		     const adg_backward_options *options)
{
	struct rank *s = wk->s;
	adg_node *loss;
	int rc = build_loss(s->reg, s->param, s->w, (int)unit * UNIT_SAMPLES,
			    UNIT_SAMPLES, 1, SAMPLES, &loss);
	if (rc != 0)
		return rc;
	/* --fail-step: the rank's last unit fails with its graph built,
	 * while other units' backward passes run and their sums go out. */
	if (step == (unsigned long)s->fail_step && s->rank == s->fail_rank &&
	    (int)unit + 1 == s->job.hi[s->rank]) {
		adg_node_unref(loss);
		return EINJECTED;
	}
	rc = backward_hooked(s->reg, loss, boxed(1.0), &boxed_ops, options);
	adg_node_unref(loss);
	return rc;
}

/* A worker's step: units as it is dealt them, a backward each, then the
 * round's end. Returns once every partial sum of the step is handed to
 * its bucket (or the round is abandoned). */
static int worker_step(struct worker *wk, unsigned long step)
{
	adg_reducer *red = wk->s->red;
	adg_backward_options options = {.size = sizeof options};
	int rc = adg_reducer_hook(red, wk->index, &options);
	size_t unit;
	while (rc == 0 && adg_reducer_next_unit(red, wk->index, &unit) == 0 &&
	       unit != ADG_REDUCER_NO_UNIT) {
		rc = unit_step(wk, unit, step, &options);
		if (rc == 0)
			rc = adg_reducer_unit_end(red, wk->index, 0);
	}
	return adg_reducer_end(red, wk->index, rc);
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
		int rc = worker_step(wk, seen);
		pthread_mutex_lock(&s->lock);
		if (rc != 0 && s->rc == 0)
			s->rc = rc;
		s->done++;
		pthread_cond_signal(&s->wake);
		pthread_mutex_unlock(&s->lock);
	}
	return NULL;
}

/* The workers' part of a step: they run the backward passes while this
 * thread, the main one, takes each bucket as its last partial sum comes
 * and, unless local, starts its exchange at once, then moves the started
 * ones on. order[] gets the buckets in the order they came, *early the
 * number started before the rank's last bucket was ready (while backward
 * passes still ran). Returns the workers' first error (the round is then
 * abandoned: some buckets never come), or EMPI. */
static int run_workers(struct rank *s, int local, MPI_Request *req, int *order,
		       int *n_started, int *early)
{
	int mpi_rc = 0;
	*n_started = 0;
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
	while (*n_started < BUCKETS) {
		while (*n_started == s->queued && s->done < s->threads)
			pthread_cond_wait(&s->wake, &s->lock);
		if (*n_started == s->queued)
			break; /* the workers are done: an abandoned round */
		int b = s->queue[*n_started];
		*early += s->queued < BUCKETS;
		order[(*n_started)++] = b;
		pthread_mutex_unlock(&s->lock);
		if (!local && mpi_rc == 0)
			mpi_rc = exchange_start(&s->exchange[b], s->mode,
						&req[b]);
		if (!local && mpi_rc == 0)
			mpi_rc = exchanges_progress(s->exchange, req, BUCKETS,
						    0);
		pthread_mutex_lock(&s->lock);
	}
	while (s->done < s->threads)
		pthread_cond_wait(&s->wake, &s->lock);
	int rc = s->rc;
	pthread_mutex_unlock(&s->lock);
	return rc != 0 ? rc : mpi_rc;
}

/* One SGD step over the whole batch across the ranks (run_workers, then
 * the exchanges). No rank applies a sum unless every rank's workers
 * succeeded: after its own are done, each rank puts whether they failed
 * into an integer all-reduce (MINLOC: exact, whatever the algorithm)
 * beside the buckets' exchanges, and all complete before the update.
 * Returns 0; EFAILED with *failed_rank the lowest rank whose step failed
 * (its own error in *own when it is this one), the weights unchanged on
 * every rank; or EMPI. */
static int train_step(struct rank *s, int *order, int *early, int *failed_rank,
		      int *own)
{
	MPI_Request req[BUCKETS], status_req;
	int n_started;
	int rc = run_workers(s, 0, req, order, &n_started, early);
	*own = rc;
	struct {
		int ok, rank;
	} mine = {rc == 0, s->rank}, all;
	if (MPI_Iallreduce(&mine, &all, 1, MPI_2INT, MPI_MINLOC, s->status_comm,
			   &status_req) != MPI_SUCCESS)
		return EMPI;
	/* A failed round still starts every bucket, on zeros, so that the
	 * ranks' collectives match. */
	int started[BUCKETS] = {0};
	for (int i = 0; i < n_started; i++)
		started[order[i]] = 1;
	int mpi_rc = rc == EMPI ? EMPI : 0;
	for (int b = 0; b < BUCKETS && mpi_rc == 0; b++) {
		if (started[b])
			continue;
		struct exchange *x = &s->exchange[b];
		memset(x->send, 0,
		       (size_t)x->count * s->job.n_parts[s->rank] *
			       sizeof(double));
		mpi_rc = exchange_start(x, s->mode, &req[b]);
		order[n_started++] = b;
	}
	if (mpi_rc == 0)
		mpi_rc = exchanges_progress(s->exchange, req, BUCKETS, 1);
	if (mpi_rc == 0 &&
	    MPI_Wait(&status_req, MPI_STATUS_IGNORE) != MPI_SUCCESS)
		mpi_rc = EMPI;
	if (mpi_rc != 0)
		return mpi_rc;
	if (!all.ok) {
		*failed_rank = all.rank;
		return EFAILED;
	}
	for (int i = 0; i < PARAMS; i++)
		s->w[i] -= LEARNING_RATE * s->grad[i];
	return 0;
}

/* --simulate-ranks R: the same step in this one process, for R ranks of
 * s->threads threads each: each rank's partial sums in turn, by the same
 * workers on that rank's reducer (s->rank set to the rank simulated), put
 * where MPI_Iallgatherv would put them, then folded over the job's tree
 * as SUM_TREE folds them, and the update. The reference the runs across
 * ranks must match to the last bit. 0 or an error code. */
static int simulate_step(struct rank *s, int *order, int *early)
{
	MPI_Request req[BUCKETS];
	int n_started, local = 0; /* nothing starts early: no exchange */
	(void)early;
	for (int r = 0; r < s->world; r++) {
		s->rank = r;
		s->red = s->reducers[r];
		int rc = run_workers(s, 1, req, order, &n_started, &local);
		if (rc != 0)
			return rc;
		for (int b = 0; b < BUCKETS; b++)
			exchange_keep(&s->exchange[b], r);
	}
	for (int b = 0; b < BUCKETS; b++)
		exchange_whole(&s->exchange[b]);
	for (int i = 0; i < PARAMS; i++)
		s->w[i] -= LEARNING_RATE * s->grad[i];
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

struct options {
	int threads, steps;
	enum sum_mode mode;
	int simulate_ranks;	  /* --simulate-ranks R; 0: across ranks */
	int fail_rank, fail_step; /* --fail-rank, --fail-step */
	int bench_bucket;	  /* --bench-bucket N; 0: train */
};

/* A whole number in [lo, hi] from text into *v; 0 or -1. */
static int number(const char *text, int lo, int hi, int *v)
{
	char *end;
	long n = strtol(text, &end, 10);
	if (end == text || *end != '\0' || n < lo || n > hi)
		return -1;
	*v = (int)n;
	return 0;
}

/* Parses the options (see main) into o; 0, or -1 on bad usage. */
static int parse(int argc, char **argv, struct options *o)
{
	static const struct {
		const char *name;
		size_t at; /* of the int it sets */
		int lo;
	} numbers[] = {
		{"--threads", offsetof(struct options, threads), 1},
		{"--simulate-ranks", offsetof(struct options, simulate_ranks),
		 1},
		{"--fail-rank", offsetof(struct options, fail_rank), 0},
		{"--fail-step", offsetof(struct options, fail_step), 1},
		{"--bench-bucket", offsetof(struct options, bench_bucket), 1},
	};
	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		if (arg[0] != '-') {
			if (number(arg, 1, 1000000, &o->steps) != 0)
				return -1;
			continue;
		}
		if (i + 1 >= argc)
			return -1;
		const char *value = argv[++i];
		if (strcmp(arg, "--allreduce") == 0) {
			if (strcmp(value, "tree") == 0)
				o->mode = SUM_TREE;
			else if (strcmp(value, "mpi") == 0)
				o->mode = SUM_MPI;
			else
				return -1;
			continue;
		}
		size_t k = 0, n = sizeof numbers / sizeof numbers[0];
		while (k < n && strcmp(arg, numbers[k].name) != 0)
			k++;
		if (k == n || number(value, numbers[k].lo, 100000000,
				     (int *)((char *)o + numbers[k].at)) != 0)
			return -1;
	}
	return o->threads <= MAX_THREADS ? 0 : -1;
}

/* Makes the communicators (first: MPI_Comm_dup is collective, so every
 * rank calls it whatever fails after), the registry, the leaves and the
 * reducer. */
static int rank_init(struct rank *s)
{
	int rc = 0;
	s->status_comm = MPI_COMM_NULL;
	for (int b = 0; b < BUCKETS; b++)
		s->comm[b] = MPI_COMM_NULL;
	for (int b = 0; b < BUCKETS; b++)
		if (MPI_Comm_dup(MPI_COMM_WORLD, &s->comm[b]) != MPI_SUCCESS)
			rc = EMPI;
	if (MPI_Comm_dup(MPI_COMM_WORLD, &s->status_comm) != MPI_SUCCESS)
		rc = EMPI;
	for (int b = 0; b < BUCKETS && rc == 0; b++) {
		rc = exchange_init(&s->exchange[b], s->comm[b], &s->job,
				   s->rank, s->simulated, bucket[b].count,
				   s->grad + bucket[b].first);
		if (rc != 0)
			while (b-- > 0)
				exchange_free(&s->exchange[b]);
	}
	s->exchanges = rc == 0;
	if (rc == 0)
		rc = adg_registry_new(NULL, &s->reg);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		rc = adg_leaf(s->reg, &s->param[i]);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		rc = adg_node_id(s->param[i], &s->param_id[i]);
	/* The rank's units of the job's, whose partial sums apply hands to
	 * the buckets as soon as each is complete (apply_early: the update
	 * waits for every rank's agreement anyway, in train_step); with
	 * --simulate-ranks, one reducer per rank simulated. Every parameter
	 * is one scalar: none is cut into slices. */
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = (size_t)s->threads,
		.total_units = UNITS,
		.param_ids = s->param_id,
		.n_params = PARAMS,
		.ops = {.add = reducer_add,
			.apply = reducer_apply,
			.release = reducer_release,
			.ctx = s},
		.apply_early = 1,
	};
	int first = s->simulated ? 0 : s->rank;
	int last = s->simulated ? s->world - 1 : s->rank;
	for (int r = first; r <= last && rc == 0; r++) {
		o.first_unit = (size_t)s->job.lo[r];
		o.n_units = (size_t)(s->job.hi[r] - s->job.lo[r]);
		rc = adg_reducer_new(&o, &s->reducers[r - first]);
	}
	s->red = s->reducers[0];
	return rc;
}

static int rank_free(struct rank *s)
{
	int failures = 0;
	for (int b = 0; b < BUCKETS && s->exchanges; b++)
		exchange_free(&s->exchange[b]);
	for (int b = 0; b < BUCKETS; b++)
		if (s->comm[b] != MPI_COMM_NULL)
			MPI_Comm_free(&s->comm[b]);
	if (s->status_comm != MPI_COMM_NULL)
		MPI_Comm_free(&s->status_comm);
	for (int r = 0; r < MAX_RANKS; r++)
		if (adg_reducer_free(s->reducers[r]) != 0)
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
	return rc == EMPI	 ? "an MPI call failed"
	       : rc == EINJECTED ? "failed on purpose (--fail-step)"
	       : rc == ENOSUM	 ? "a unit reached no parameter of a bucket"
				 : adg_strerror(rc);
}

static int compare_doubles(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The median of v[0..n), which it sorts. */
static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof *v, compare_doubles);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* --bench-bucket N: one bucket of N doubles summed across the ranks,
 * steps times each way, the two ways taking turns (each starting after a
 * barrier); prints each way's median time on rank 0 and their ratio.
 * Each rank holds one unit of a job of world units, one partial sum per
 * value. 0 or an error code. */
static int bench_bucket(int n, int steps, int me, int world)
{
	double *sum = malloc((size_t)n * sizeof *sum),
	       *took = malloc(2 * (size_t)steps * sizeof *took);
	MPI_Comm comm = MPI_COMM_NULL;
	struct job job = {.ranks = world};
	for (int r = 0; r < world; r++) {
		job.lo[r] = r;
		job.hi[r] = r + 1;
		job.parts[r][0] = (struct span){r, 1};
		job.n_parts[r] = 1;
	}
	struct exchange x;
	int rc = sum && took ? 0 : ADG_ENOMEM;
	if (MPI_Comm_dup(MPI_COMM_WORLD, &comm) != MPI_SUCCESS)
		rc = EMPI;
	if (rc == 0)
		rc = exchange_init(&x, comm, &job, me, 0, n, sum);
	int have_x = rc == 0;
	for (int i = 0; i < n && rc == 0; i++)
		x.send[i] = (me + 1) * 1e-3 * (i % 997);
	for (int k = 0; k < 2 * steps && rc == 0; k++) {
		/* the tree first on even rounds, MPI_Iallreduce on odd ones */
		enum sum_mode mode = (k % 2) ^ (k / 2 % 2) ? SUM_MPI : SUM_TREE;
		MPI_Request req = MPI_REQUEST_NULL;
		if (MPI_Barrier(comm) != MPI_SUCCESS)
			rc = EMPI;
		double start = MPI_Wtime();
		if (rc == 0)
			rc = exchange_start(&x, mode, &req);
		if (rc == 0)
			rc = exchanges_progress(&x, &req, 1, 1);
		took[(mode == SUM_MPI) * steps + k / 2] =
			(MPI_Wtime() - start) * 1e6;
	}
	if (rc == 0 && me == 0) {
		double tree = median(took, steps),
		       mpi = median(took + steps, steps);
		printf("bench bucket=%d doubles ranks=%d steps=%d "
		       "tree_us=%.1f mpi_us=%.1f tree_over_mpi=%.3f\n",
		       n, world, steps, tree, mpi, tree / mpi);
	}
	if (have_x)
		exchange_free(&x);
	if (comm != MPI_COMM_NULL)
		MPI_Comm_free(&comm);
	free(sum);
	free(took);
	return rc;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: mpi_data_parallel [--threads T] [--allreduce "
		"tree|mpi] [--simulate-ranks R]\n"
		"                         [--fail-rank R --fail-step S] "
		"[--bench-bucket N] [steps]\n"
		"  T <= %d, ranks x T dividing %d\n",
		MAX_THREADS, MAX_RANKS);
}

/*   mpirun -np R ./mpi_data_parallel [options] [steps]
 * (defaults: 2 threads, sums over the tree, 50 steps); see the top of the
 * file.
 * Exit status 0 when every check passed; 1 otherwise; 2 on bad usage. */
int main(int argc, char **argv)
{
	int provided, me, world;
	MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	struct options o = {.threads = 2, .steps = 50, .mode = SUM_TREE};
	if (provided < MPI_THREAD_FUNNELED) {
		if (me == 0)
			fprintf(stderr,
				"mpi_data_parallel: this MPI gives thread "
				"level %d, below MPI_THREAD_FUNNELED\n",
				provided);
		MPI_Finalize();
		return 1;
	}
	int ranks = o.simulate_ranks;
	if (parse(argc, argv, &o) == 0) {
		ranks = o.simulate_ranks ? o.simulate_ranks : world;
		if (o.simulate_ranks && world != 1)
			ranks = 0; /* simulating wants one process */
	}
	if (ranks == 0 || ranks > MAX_RANKS) {
		if (me == 0)
			usage();
		MPI_Finalize();
		return 2;
	}
	if (o.bench_bucket) {
		int rc = bench_bucket(o.bench_bucket, o.steps, me, world);
		if (rc != 0)
			fprintf(stderr, "rank %d: %s\n", me, describe(rc));
		MPI_Finalize();
		return rc == 0 ? 0 : 1;
	}
	make_data();

	struct rank s = {.rank = me,
			 .world = ranks,
			 .simulated = o.simulate_ranks != 0,
			 .threads = o.threads,
			 .mode = o.mode,
			 .fail_rank = o.fail_rank,
			 .fail_step = o.fail_step};
	struct worker workers[MAX_THREADS];
	int n_workers = 0, failures = 0;
	double reference[PARAMS];
	double *took = malloc((size_t)o.steps * sizeof *took);
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.go, NULL);
	pthread_cond_init(&s.wake, NULL);
	job_init(&s.job, ranks);
	int rc = rank_init(&s);
	if (rc == 0 && took == NULL)
		rc = ADG_ENOMEM;
	init_params(s.w);
	memcpy(reference, s.w, sizeof s.w);
	if (rc == 0)
		rc = full_batch_step(s.reg, s.param, reference);
	for (int t = 0; t < s.threads && rc == 0; t++) {
		struct worker *wk = &workers[t];
		*wk = (struct worker){.s = &s};
		wk->index = (size_t)t;
		if (pthread_create(&wk->thread, NULL, worker_main, wk) != 0)
			rc = ADG_ENOMEM;
		if (rc == 0)
			n_workers++;
	}
	double first_loss = full_loss(s.w);

	/* Every rank goes through the same steps, and leaves at the same
	 * one: a step's failure anywhere is agreed inside train_step, and
	 * a failed set-up shows in the check's all-reduce. */
	int all_ok = 1, step, early = 0, failed_rank = -1, own = 0;
	for (step = 1; step <= o.steps; step++) {
		int order[BUCKETS];
		double start = MPI_Wtime();
		if (rc == 0 && o.simulate_ranks)
			rc = simulate_step(&s, order, &early);
		else if (rc == 0)
			rc = train_step(&s, order, &early, &failed_rank, &own);
		took[step - 1] = (MPI_Wtime() - start) * 1e6;
		if (rc == EFAILED)
			break; /* on every rank, at this step */
		int same = 1, check = agree(s.w, rc == 0, &same, &all_ok);
		if (rc == 0)
			rc = check;
		if (check != 0 || !all_ok)
			break;
		if (!same) {
			if (me == 0)
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
			if (me == 0)
				printf("step 1: largest difference from a "
				       "single-process full-batch step: %.3g\n",
				       worst);
			if (worst > 1e-6)
				failures++;
		}
		if (me == 0 && (step == 1 || step % 10 == 0)) {
			printf("step %d: full-batch loss %.6f; buckets "
			       "reduced:",
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
	const char *how = o.simulate_ranks     ? "simulated in one process"
			  : o.mode == SUM_TREE ? "sums over the job's tree"
					       : "MPI_Iallreduce";
	if (rc == 0 && all_ok && me == 0)
		printf("loss %.6f -> %.6f over %d steps on %d ranks x %d "
		       "threads (%s); %d of %d exchanges started before the "
		       "rank's last bucket was ready; %.1f us a step "
		       "(median); weights fingerprint %016" PRIx64 "\n",
		       first_loss, last_loss, o.steps, ranks, s.threads, how,
		       early, o.steps * BUCKETS, median(took, o.steps),
		       fingerprint(s.w));
	if (rc == 0 && all_ok && !(last_loss < first_loss))
		failures++;
	if (rc == EFAILED) {
		/* Agreed: every rank stopped here, none applied the step. */
		if (own != 0)
			fprintf(stderr, "rank %d: step %d: %s\n", me, step,
				describe(own));
		if (me == 0)
			fprintf(stderr,
				"step %d failed on rank %d; no rank applied "
				"it; the weights are those after step %d on "
				"every rank, fingerprint %016" PRIx64 "\n",
				step, failed_rank, step - 1, fingerprint(s.w));
		failures++;
	} else if (rc != 0) {
		fprintf(stderr, "rank %d: %s\n", me, describe(rc));
		failures++;
	} else if (!all_ok) {
		if (me == 0)
			fprintf(stderr, "step %d failed on another rank\n",
				step);
		failures++;
	}
	failures += rank_free(&s);
	free(took);
	pthread_cond_destroy(&s.wake);
	pthread_cond_destroy(&s.go);
	pthread_mutex_destroy(&s.lock);

	int all_failures;
	MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM,
		      MPI_COMM_WORLD);
	/* A verdict, not a test count: a run that fails on purpose
	 * (--fail-step) is one its test expects. */
	if (me == 0) {
		if (all_failures == 0)
			printf("mpi: ok\n");
		else
			printf("mpi: %d failures across the ranks\n",
			       all_failures);
	}
	MPI_Finalize();
	return all_failures == 0 ? 0 : 1;
}
