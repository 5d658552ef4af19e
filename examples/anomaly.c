/* Stopping a backward at the first step that makes a NaN, and naming it,
 * as torch.autograd.detect_anomaly does.
 *
 * f = sqrt(x) * y + log(y) at x = 0: sqrt's derivative there is 1/(2
 * sqrt(0)) = inf, and inf times the zero gradient that reaches it is NaN.
 * Each step checks the gradients it sends on and notes a NaN where the
 * hook will look: on_step runs on the thread that ran the step, right
 * after it, so a thread-local flag is enough, with or without an
 * executor. The hook then returns an error, which stops the backward
 * there, and the program prints the step's name.
 *
 * Usage: anomaly (exits 0 when it found the NaN in "sqrt"). */
#include <adg.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxed.h"

#define ANOMALY (ADG_EUSER - 1)

static _Thread_local bool made_nan;

/* d out / d parent k = slope[k]; the step notes a NaN it sends on. */
struct op {
	size_t n;
	double slope[2];
};

static int backward(adg_step_call *call, void *user)
{
	const struct op *op = user;
	double g = call->grad ? *(double *)call->grad : 0;
	for (size_t k = 0; k < op->n; k++) {
		double v = g * op->slope[k];
		void *d = boxed(v);
		if (d == NULL)
			return ADG_ENOMEM;
		if (isnan(v))
			made_nan = true;
		int rc = adg_step_give(call, k, d);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static adg_node *op(adg_registry *reg, const char *name, adg_node *a, double da,
		    adg_node *b, double db)
{
	struct op *o = malloc(sizeof *o);
	if (o == NULL)
		return NULL;
	*o = (struct op){.n = b ? 2 : 1, .slope = {da, db}};
	adg_node *parents[2] = {a, b}, *out;
	adg_step step = {
		.backward = backward, .release = free, .user = o, .name = name};
	if (adg_op(reg, parents, o->n, &step, &out) != 0) {
		free(o);
		return NULL;
	}
	return out;
}

/* The first step, in the order steps run, that made a NaN. */
struct anomaly {
	uint64_t id;
	char name[32];
};

static int check(const adg_step_event *e, void *ctx)
{
	struct anomaly *a = ctx;
	if (!e->after) {
		made_nan = false;
		return 0;
	}
	if (!made_nan)
		return 0;
	a->id = e->node_id;
	snprintf(a->name, sizeof a->name, "%s", e->name ? e->name : "?");
	return ANOMALY;
}

int main(void)
{
	adg_registry *reg;
	if (adg_registry_new(NULL, &reg) != 0)
		return 1;
	adg_node *x = NULL, *y = NULL;
	adg_leaf(reg, &x);
	adg_leaf(reg, &y);
	const double xv = 0, yv = 0;
	/* s = sqrt(x): ds/dx = 1 / (2 sqrt(x)), infinite at 0. */
	adg_node *s = op(reg, "sqrt", x, 1 / (2 * sqrt(xv)), NULL, 0);
	/* m = s * y: dm/ds = y = 0, dm/dy = s. */
	adg_node *m = s ? op(reg, "mul", s, yv, y, sqrt(xv)) : NULL;
	/* f = m + log(y + 1): a sum with a harmless branch. */
	adg_node *l = op(reg, "log1p", y, 1 / (yv + 1), NULL, 0);
	adg_node *f = m && l ? op(reg, "add", m, 1, l, 1) : NULL;

	int rc = f != NULL ? 0 : ADG_ENOMEM;
	struct anomaly found = {0};
	if (rc == 0) {
		adg_backward_options o = {.on_step = check,
					  .on_step_ctx = &found};
		adg_grads *grads = NULL;
		void *seed = boxed(1);
		rc = seed ? adg_backward_with(reg, f, seed, &boxed_ops, &o,
					      &grads)
			  : ADG_ENOMEM;
		adg_grads_free(grads);
	}
	int status = 1;
	if (rc == ANOMALY) {
		printf("anomaly: step %llu (\"%s\") made a NaN gradient\n",
		       (unsigned long long)found.id, found.name);
		status = strcmp(found.name, "sqrt") == 0 ? 0 : 1;
	} else {
		fprintf(stderr, "anomaly: no NaN found (%s)\n",
			adg_strerror(rc));
	}
	for (adg_node **n = (adg_node *[]){f, l, m, s, x, y}, **e = n + 6;
	     n < e; n++)
		if (*n != NULL)
			adg_node_unref(*n);
	if (adg_registry_free(reg) != 0)
		status = 1;
	return status;
}
