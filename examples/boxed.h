/*
 * Gradients as heap doubles: the gradient values and adg_grad_ops that
 * the examples share. (examples/quickstart.c spells the same out for
 * itself, since the README quotes it whole.) Copy it with an example.
 */
#ifndef ADG_EXAMPLE_BOXED_H
#define ADG_EXAMPLE_BOXED_H

#include <adg.h>
#include <stdlib.h>

/* A gradient value holding v; NULL when out of memory. */
static inline void *boxed(double v)
{
	double *p = malloc(sizeof *p);
	if (p != NULL)
		*p = v;
	return p;
}

static inline int boxed_add(void **sum, void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(double *)value;
	free(value);
	return 0;
}

static inline void boxed_free(void *value, void *ctx)
{
	(void)ctx;
	free(value);
}

static const adg_grad_ops boxed_ops = {boxed_add, boxed_free, NULL};

#endif
