/* libadg quick start: y = a * b, then backward from y gives dy/da = b and
 * dy/db = a. Gradients here are heap-allocated doubles. */
#include <adg.h>
#include <stdio.h>
#include <stdlib.h>

static int add(void **sum, void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(double *)value;
	free(value);
	return 0;
}

static void drop(void *value, void *ctx)
{
	(void)ctx;
	free(value);
}

static void *boxed(double v)
{
	double *p = malloc(sizeof *p);
	if (p != NULL)
		*p = v;
	return p;
}

/* The step of y = a * b: its user pointer holds the forward values. */
static int mul_backward(adg_step_call *call, void *user)
{
	const double *ab = user;
	double g = call->grad ? *(double *)call->grad : 0;
	for (int i = 0; i < 2; i++) {
		void *grad = boxed(g * ab[1 - i]);
		if (grad == NULL)
			return ADG_ENOMEM;
		int rc = adg_step_give(call, i, grad);
		if (rc != 0)
			return rc;
	}
	return 0;
}

#define CHECK(call)                                                            \
	do {                                                                   \
		int rc_ = (call);                                              \
		if (rc_ != 0) {                                                \
			fprintf(stderr, "%s: %s (%s)\n", #call,                \
				adg_strerror(rc_), adg_errmsg());              \
			return 1;                                              \
		}                                                              \
	} while (0)

/* The gradient arithmetic belongs to the value type: it goes on the
 * registry, for every backward. */
static const adg_grad_ops ops = {.add = add, .free = drop};
static const adg_registry_options options = {.size = sizeof options,
					     .grad_ops = &ops};
static double ab[2] = {3.0, 4.0}; /* forward values of a and b */

int main(void)
{
	adg_registry *reg;
	adg_node *a, *b, *y;
	CHECK(adg_registry_new(&options, &reg));
	CHECK(adg_leaf(reg, &a));
	CHECK(adg_leaf(reg, &b));
	adg_step step = {.backward = mul_backward, .user = ab};
	CHECK(adg_op(reg, (adg_node *[]){a, b}, 2, &step, &y));
	adg_grads *grads;
	void *da, *db;
	CHECK(adg_backward(reg, y, boxed(1.0), NULL, &grads));
	CHECK(adg_grads_get_node(grads, a, &da));
	CHECK(adg_grads_get_node(grads, b, &db));
	printf("dy/da = %g, dy/db = %g\n", *(double *)da, *(double *)db);
	adg_grads_free(grads);
	adg_node_unref(y), adg_node_unref(a), adg_node_unref(b);
	CHECK(adg_registry_free(reg));
	return 0;
}
