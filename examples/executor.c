/* One large graph, its backward on several threads: a batch loss
 * L = sum over samples b of (w . x_b)^2, each sample a branch of the graph
 * (a chain of multiply-adds over the parameters w), joined at one sum.
 * The program runs the same backward without an executor, then on
 * libadg's pool with 1, 2 and 4 threads, and checks that the gradients
 * dL/dw_i = sum_b 2 (w . x_b) x_bi come out bitwise the same each time:
 * libadg folds each gradient in tape order, whatever the threads do.
 * Usage: executor [samples] (default 64). */
#include <adg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxed.h"

#define PARAMS 16

static adg_registry *reg;
static adg_node *w[PARAMS];
static double w_value[PARAMS];

/* Sample b's input for parameter i: a fixed formula, the same every run. */
static double input(int b, int i)
{
	return (double)((b * 7 + i * 3) % 11) / 11 - 0.5;
}

/* A step's closure: what the chain link needs to pass gradients on. */
struct link {
	double x;     /* the sample's input for this parameter */
	double twice; /* at the square: 2 (w . x) */
	int kind;     /* 0: acc + w x; 1: w x (the chain's start); 2: acc^2;
			 3: the batch sum */
};

/* The backward of one link. Each registration is one per parent slot, as
 * a step must with an executor. */
static int backward(adg_step_call *call, void *user)
{
	const struct link *l = user;
	double g = call->grad != NULL ? *(double *)call->grad : 0;
	for (size_t k = 0; k < call->n_parents; k++) {
		double d;
		if (l->kind == 3)
			d = g; /* d sum / d part = 1 */
		else if (l->kind == 2)
			d = g * l->twice; /* d acc^2 / d acc */
		else if (k == call->n_parents - 1)
			d = g * l->x; /* d (w x) / d w */
		else
			d = g; /* d (acc + w x) / d acc */
		void *v = boxed(d);
		if (v == NULL)
			return ADG_ENOMEM;
		int rc = adg_step_give(call, k, v);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static adg_node *op(adg_node *const *parents, size_t n, struct link *l)
{
	adg_step step = {.backward = backward, .release = free, .user = l};
	adg_node *out;
	if (adg_op(reg, parents, n, &step, &out) != 0) {
		free(l);
		return NULL;
	}
	return out;
}

static struct link *link_new(struct link l)
{
	struct link *p = malloc(sizeof *p);
	if (p != NULL)
		*p = l;
	return p;
}

/* Builds L for the batch and runs its backward; fills grad[]. */
static int batch_backward(int samples, const adg_executor *executor,
			  double grad[PARAMS])
{
	adg_node **square = calloc((size_t)samples, sizeof *square);
	int rc = square != NULL ? 0 : ADG_ENOMEM;
	for (int b = 0; b < samples && rc == 0; b++) {
		double dot = 0;
		adg_node *acc = NULL;
		for (int i = 0; i < PARAMS && rc == 0; i++) {
			double x = input(b, i);
			dot += w_value[i] * x;
			struct link *l = link_new(
				(struct link){.x = x, .kind = acc ? 0 : 1});
			adg_node *parents[2] = {acc, w[i]};
			adg_node *next =
				l ? op(acc ? parents : &w[i], acc ? 2 : 1, l)
				  : NULL;
			if (acc != NULL)
				adg_node_unref(acc);
			acc = next;
			rc = acc != NULL ? 0 : ADG_ENOMEM;
		}
		struct link *l = rc == 0 ? link_new((struct link){
						   .twice = 2 * dot, .kind = 2})
					 : NULL;
		square[b] = l ? op(&acc, 1, l) : NULL;
		if (acc != NULL)
			adg_node_unref(acc);
		if (square[b] == NULL)
			rc = ADG_ENOMEM;
	}
	adg_node *loss = NULL;
	if (rc == 0) {
		struct link *l = link_new((struct link){.kind = 3});
		loss = l ? op(square, (size_t)samples, l) : NULL;
		rc = loss != NULL ? 0 : ADG_ENOMEM;
	}
	for (int b = 0; b < samples && square != NULL; b++)
		if (square[b] != NULL)
			adg_node_unref(square[b]);
	free(square);
	adg_grads *grads = NULL;
	if (rc == 0) {
		adg_backward_options o = {.size = sizeof o,
					  .executor = executor};
		rc = adg_backward_with(reg, loss, boxed(1), &boxed_ops, &o,
				       &grads);
	}
	for (int i = 0; i < PARAMS && rc == 0; i++) {
		void *v;
		rc = adg_grads_get_node(grads, w[i], &v);
		if (rc == 0)
			grad[i] = *(double *)v;
	}
	adg_grads_free(grads);
	if (loss != NULL)
		adg_node_unref(loss);
	return rc;
}

int main(int argc, char **argv)
{
	int samples = argc > 1 ? atoi(argv[1]) : 64;
	if (samples < 1 || samples > 100000) {
		fprintf(stderr, "usage: executor [samples 1..100000]\n");
		return 2;
	}
	int rc = adg_registry_new(NULL, &reg);
	for (int i = 0; i < PARAMS && rc == 0; i++) {
		w_value[i] = 0.1 * (i % 5) - 0.2;
		rc = adg_leaf(reg, &w[i]);
	}
	double want[PARAMS], got[PARAMS];
	if (rc == 0)
		rc = batch_backward(samples, NULL, want);
	/* The closed form, to a rounding error: 2 (w . x_b) x_bi summed. */
	for (int i = 0; i < PARAMS && rc == 0; i++) {
		double closed = 0;
		for (int b = 0; b < samples; b++) {
			double dot = 0;
			for (int k = 0; k < PARAMS; k++)
				dot += w_value[k] * input(b, k);
			closed += 2 * dot * input(b, i);
		}
		double err = closed - want[i];
		if (err > 1e-9 || err < -1e-9) {
			fprintf(stderr, "dL/dw%d = %g, want %g\n", i, want[i],
				closed);
			rc = 1;
		}
	}
	const unsigned threads[] = {1, 2, 4};
	for (size_t t = 0; t < 3 && rc == 0; t++) {
		adg_pool *pool;
		adg_executor executor;
		rc = adg_pool_new(threads[t], &pool);
		if (rc != 0)
			break;
		adg_pool_executor(pool, &executor);
		rc = batch_backward(samples, &executor, got);
		adg_pool_free(pool);
		if (rc == 0 && memcmp(got, want, sizeof want) != 0) {
			fprintf(stderr, "%u threads: gradients differ\n",
				threads[t]);
			rc = 1;
		} else if (rc == 0) {
			printf("pool of %u: dL/dw0 = %.17g, bitwise the same "
			       "as "
			       "without an executor\n",
			       threads[t], got[0]);
		}
	}
	for (int i = 0; i < PARAMS; i++)
		if (w[i] != NULL)
			adg_node_unref(w[i]);
	if (rc < 0)
		fprintf(stderr, "executor: %s\n", adg_strerror(rc));
	if (adg_registry_free(reg) != 0)
		rc = 1;
	return rc == 0 ? 0 : 1;
}
