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
			fprintf(stderr, "%s: %s\n", #call, adg_strerror(rc_)); \
			return 1;                                              \
		}                                                              \
	} while (0)

int main(void)
{
	adg_registry *reg;
	adg_node *a, *b, *y;
	CHECK(adg_registry_new(NULL, &reg));
	CHECK(adg_leaf(reg, &a));
	CHECK(adg_leaf(reg, &b));

	static double ab[2] = {3.0, 4.0}; /* forward values of a and b */
	adg_node *parents[2] = {a, b};
	adg_step step = {.backward = mul_backward, .user = ab};
	CHECK(adg_op(reg, parents, 2, &step, &y));

	adg_grad_ops ops = {.add = add, .free = drop};
	adg_grads *grads;
	CHECK(adg_backward(reg, y, boxed(1.0), &ops, &grads));

	uint64_t id;
	void *grad;
	CHECK(adg_node_id(a, &id));
	CHECK(adg_grads_get(grads, id, &grad));
	printf("dy/da = %g\n", *(double *)grad); /* 4 */
	CHECK(adg_node_id(b, &id));
	CHECK(adg_grads_get(grads, id, &grad));
	printf("dy/db = %g\n", *(double *)grad); /* 3 */

	adg_grads_free(grads);
	adg_node_unref(y);
	adg_node_unref(a);
	adg_node_unref(b);
	CHECK(adg_registry_free(reg));
	return 0;
}
