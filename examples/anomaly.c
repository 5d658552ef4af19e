/* Stopping a backward at the first step that makes a NaN, and naming it,
 * as torch.autograd.detect_anomaly does.
 *
 * f = sqrt(x) * y + log(y) at x = 0: sqrt's derivative there is 1/(2
 * sqrt(0)) = inf, and inf times the zero gradient that reaches it is NaN.
 * The backward's value check (adg_backward_options.value_check) sees
 * every gradient a step gives and rejects a NaN: the backward stops at
 * that step and its report names it, with or without an executor. The
 * steps themselves know nothing of it, and a backward without the check
 * pays nothing for it.
 *
 * Usage: anomaly (exits 0 when it found the NaN in "sqrt"). */
#include <adg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "boxed.h"

/* d out / d parent k = slope[k]. */
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

/* Called with each gradient a step gives, on the step's thread. */
static int reject_nonfinite(const void *value, void *ctx)
{
	(void)ctx;
	return isfinite(*(const double *)value) ? 0 : ADG_EVALUE;
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
	adg_failure found = {.size = sizeof found};
	if (rc == 0) {
		adg_backward_options o = {.size = sizeof o,
					  .value_check = reject_nonfinite,
					  .failure = &found};
		adg_grads *grads = NULL;
		void *seed = boxed(1);
		rc = seed ? adg_backward_with(reg, f, seed, &boxed_ops, &o,
					      &grads)
			  : ADG_ENOMEM;
		adg_grads_free(grads);
	}
	int status = 1;
	if (rc == ADG_EVALUE && found.site == ADG_FAILED_CHECK) {
		printf("anomaly: step %llu (\"%s\") gave a gradient that is "
		       "not finite\n",
		       (unsigned long long)found.node_id,
		       found.name ? found.name : "?");
		status = found.name && strcmp(found.name, "sqrt") == 0 ? 0 : 1;
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
