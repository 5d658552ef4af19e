/*
 * Data-parallel training across processes with Open MPI.
 *
 * Every rank holds the same 2-layer MLP (4 inputs, 8 tanh units, 1 output)
 * and its own shard of a synthetic regression set. Per step it builds one
 * graph for its shard's mean squared error, and runs backward with a
 * gradient-ready hook: as each parameter's gradient becomes final, the hook
 * starts an MPI_Iallreduce on it, so communication overlaps the rest of the
 * backward. Then it waits for all, averages over the ranks and applies SGD.
 *
 * It checks itself and exits non-zero when a check fails:
 * - after every step the parameters are bitwise identical on every rank;
 * - after step 1 they match one full-batch SGD step computed in a single
 *   process (here, by every rank on its own) to 1e-6;
 * - the full-batch loss after the last step is below the first.
 *
 *   mpirun -np 4 ./mpi_data_parallel [steps]   (default 50)
 */
#include <adg.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxed.h"

#define IN	      4
#define HIDDEN	      8
#define SAMPLES	      64 /* divisible by 1, 2, 4 and 8 ranks */
#define PARAMS	      (HIDDEN * IN + HIDDEN + HIDDEN + 1) /* W1, b1, W2, b2 */
#define LEARNING_RATE 0.1

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
		int rc =
			adg_grads_register(call->grads, call->parent_ids[i], v);
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

/* Builds the mean squared error over samples [first, first + count) with
 * step stride, on parameter leaves param[] with values w[]; returns its
 * node in *loss. The graph is one tree per sample, summed at the top. */
static int build_loss(adg_registry *reg, adg_node **param, const double *w,
		      int first, int count, int stride, adg_node **loss)
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
		/* out = sum_j w2[j] a_j + b2; err^2 / (count) */
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
		double d = 2 * err / count;
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

/* ------------------------------------------------- the all-reduce hook */

struct exchange {
	uint64_t param_id[PARAMS];
	double send[PARAMS], recv[PARAMS];
	MPI_Request req[PARAMS];
	int started;
};

static int param_index(const struct exchange *x, uint64_t id)
{
	for (int i = 0; i < PARAMS; i++)
		if (x->param_id[i] == id)
			return i;
	return -1;
}

/* A parameter's gradient is final: send it off now, while the backward
 * goes on with the steps of earlier layers. */
static int on_ready(uint64_t id, void **grad, void *ctx)
{
	struct exchange *x = ctx;
	int i = param_index(x, id);
	if (i < 0)
		return 0; /* a leaf that is not a parameter */
	x->send[i] = *grad ? *(double *)*grad : 0;
	if (MPI_Iallreduce(&x->send[i], &x->recv[i], 1, MPI_DOUBLE, MPI_SUM,
			   MPI_COMM_WORLD, &x->req[i]) != MPI_SUCCESS)
		return ADG_EUSER - 1;
	x->started++;
	return 0;
}

/* One SGD step on this rank's shard; 0 or an error code. */
static int train_step(adg_registry *reg, adg_node **param, double *w, int rank,
		      int world, int *started)
{
	struct exchange x = {.started = 0};
	for (int i = 0; i < PARAMS; i++) {
		adg_node_id(param[i], &x.param_id[i]);
		x.req[i] = MPI_REQUEST_NULL;
	}
	adg_node *loss;
	int rc = build_loss(reg, param, w, rank, SAMPLES / world, world, &loss);
	if (rc != 0)
		return rc;
	adg_backward_options o = {
		.on_ready = on_ready, .ctx = &x, .leaves_only = 1};
	adg_grads *grads;
	rc = adg_backward_with(reg, loss, boxed(1.0), &boxed_ops, &o, &grads);
	adg_node_unref(loss);
	if (rc == 0)
		adg_grads_free(grads);
	/* Every parameter takes part in the loss, so every rank started
	 * every all-reduce, in the same order; wait for them all. */
	MPI_Waitall(PARAMS, x.req, MPI_STATUSES_IGNORE);
	*started = x.started;
	if (rc != 0 || x.started != PARAMS)
		return rc != 0 ? rc : ADG_EUSER - 2;
	for (int i = 0; i < PARAMS; i++)
		w[i] -= LEARNING_RATE * (x.recv[i] / world);
	return 0;
}

/* The same first step in one process over the whole set: the reference. */
static int full_batch_step(adg_registry *reg, adg_node **param, double *w)
{
	adg_node *loss;
	int rc = build_loss(reg, param, w, 0, SAMPLES, 1, &loss);
	if (rc != 0)
		return rc;
	adg_grads *grads;
	rc = adg_backward(reg, loss, boxed(1.0), &boxed_ops, &grads);
	adg_node_unref(loss);
	double g[PARAMS];
	for (int i = 0; i < PARAMS && rc == 0; i++) {
		uint64_t id;
		void *v;
		adg_node_id(param[i], &id);
		rc = adg_grads_get(grads, id, &v);
		g[i] = rc == 0 ? *(double *)v : 0;
	}
	if (grads != NULL && rc == 0)
		adg_grads_free(grads);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		w[i] -= LEARNING_RATE * g[i];
	return rc;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, world;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &world);
	int steps = argc > 1 ? atoi(argv[1]) : 50;
	if (steps < 1 || SAMPLES % world != 0) {
		if (rank == 0)
			fprintf(stderr, "usage: mpi_data_parallel [steps >= 1]"
					" on 1, 2, 4 or 8 ranks\n");
		MPI_Finalize();
		return 2;
	}
	make_data();

	adg_registry *reg = NULL;
	adg_node *param[PARAMS] = {0};
	double w[PARAMS], reference[PARAMS];
	int rc = adg_registry_new(NULL, &reg);
	for (int i = 0; i < PARAMS && rc == 0; i++)
		rc = adg_leaf(reg, &param[i]);
	init_params(w);
	memcpy(reference, w, sizeof w);
	if (rc == 0)
		rc = full_batch_step(reg, param, reference);
	double first_loss = full_loss(w);

	int failures = 0;
	for (int step = 1; step <= steps && rc == 0; step++) {
		int started = 0;
		rc = train_step(reg, param, w, rank, world, &started);
		if (rc != 0)
			break;
		/* Bitwise the same on every rank: compare with rank 0's. */
		double root_w[PARAMS];
		memcpy(root_w, w, sizeof w);
		MPI_Bcast(root_w, PARAMS, MPI_DOUBLE, 0, MPI_COMM_WORLD);
		int differ = memcmp(root_w, w, sizeof w) != 0, any_differ;
		MPI_Allreduce(&differ, &any_differ, 1, MPI_INT, MPI_MAX,
			      MPI_COMM_WORLD);
		if (any_differ) {
			if (rank == 0)
				printf("step %d: parameters differ between "
				       "ranks\n",
				       step);
			failures++;
		}
		if (step == 1) {
			double worst = 0;
			for (int i = 0; i < PARAMS; i++)
				worst = fmax(worst, fabs(w[i] - reference[i]));
			if (rank == 0)
				printf("step 1: largest difference from a "
				       "single-process full-batch step: %.3g\n",
				       worst);
			if (worst > 1e-6)
				failures++;
		}
		if (rank == 0 && (step == 1 || step % 10 == 0))
			printf("step %d: full-batch loss %.6f (%d all-reduces "
			       "started from the hook)\n",
			       step, full_loss(w), started);
	}
	double last_loss = full_loss(w);
	if (rc == 0 && rank == 0)
		printf("loss %.6f -> %.6f over %d steps on %d ranks\n",
		       first_loss, last_loss, steps, world);
	if (rc == 0 && !(last_loss < first_loss))
		failures++;
	if (rc != 0) {
		fprintf(stderr, "rank %d: %s\n", rank, adg_strerror(rc));
		failures++;
	}
	for (int i = 0; i < PARAMS; i++)
		if (param[i] != NULL)
			adg_node_unref(param[i]);
	if (adg_registry_free(reg) != 0)
		failures++;

	int all_failures;
	MPI_Allreduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM,
		      MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi: %d passed, %d failed\n", all_failures == 0 ? 1 : 0,
		       all_failures == 0 ? 0 : 1);
	MPI_Finalize();
	return all_failures == 0 ? 0 : 1;
}
