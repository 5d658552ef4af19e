/* adg: the library, through its public API only. */
#include "bench.h"

#include <adg.h>
#include <stdlib.h>
#include <string.h>

/* A gradient travels inside libadg's opaque pointer: the double's bits,
 * xor-ed with a NaN payload that arithmetic never yields, so that no value
 * becomes NULL. Nothing is allocated per gradient. */
#define GRAD_TAG UINT64_C(0x7ff4d1a9c0ffee01)

static void *encode(double d)
{
	uint64_t bits;
	memcpy(&bits, &d, sizeof bits);
	return (void *)(uintptr_t)(bits ^ GRAD_TAG);
}

static double decode(const void *p)
{
	uint64_t bits = (uint64_t)(uintptr_t)p ^ GRAD_TAG;
	double d;
	memcpy(&d, &bits, sizeof d);
	return d;
}

static int grad_add(void **sum, void *value, void *ctx)
{
	(void)ctx;
	*sum = encode(decode(*sum) + decode(value));
	return 0;
}

static void grad_free(void *value, void *ctx)
{
	(void)value;
	(void)ctx;
}

static const adg_grad_ops ops = {grad_add, grad_free, NULL};

static int trampoline(adg_step_call *call, void *user)
{
	const bench_step *step = user;
	bench_call c = {
		.impl = &bench_adg,
		.grads = call->grads,
		.grad = call->grad != NULL ? decode(call->grad) : 0,
		.parent_ids = call->parent_ids,
		.n_parents = call->n_parents,
	};
	return step->run(&c, step);
}

static void *a_open(void)
{
	adg_registry *r;
	return adg_registry_new(NULL, &r) == 0 ? r : NULL;
}

static void a_close(void *reg)
{
	if (adg_registry_free(reg) != 0)
		abort(); /* a workload leaked a node: the run is void */
}

static void *a_leaf(void *reg)
{
	adg_node *n;
	return adg_leaf(reg, &n) == 0 ? n : NULL;
}

static void *a_op(void *reg, void *const *parents, size_t n,
		  const bench_step *step)
{
	adg_step s = {trampoline, NULL, (void *)step};
	adg_node *out;
	return adg_op(reg, (adg_node *const *)parents, n, &s, &out) == 0 ? out
									 : NULL;
}

static void a_unref(void *reg, void *node)
{
	(void)reg;
	adg_node_unref(node);
}

static uint64_t a_id(void *node)
{
	uint64_t id = 0;
	adg_node_id(node, &id);
	return id;
}

static int a_backward(void *reg, void *root, void **grads)
{
	return adg_backward(reg, root, encode(1.0), &ops, (adg_grads **)grads);
}

int bench_adg_backward_ready(void *reg, void *root,
			     int (*ready)(uint64_t id, void **grad, void *ctx),
			     void *ctx, void **grads)
{
	adg_backward_options o = {ready, ctx, 1};
	return adg_backward_with(reg, root, encode(1.0), &ops, &o,
				 (adg_grads **)grads);
}

static double a_grad(void *grads, uint64_t id)
{
	void *v;
	return adg_grads_get(grads, id, &v) == 0 ? decode(v) : 0;
}

static void a_grads_free(void *grads)
{
	adg_grads_free(grads);
}

static void a_add_grad(void *grads, uint64_t id, double g)
{
	adg_grads_register(grads, id, encode(g));
}

static uint64_t a_graph_id(void *reg, void *node)
{
	(void)reg;
	uint64_t g = 0;
	adg_node_graph_id(node, &g);
	return g;
}

static void nothing(void *reg)
{
	(void)reg;
}

const bench_impl bench_adg = {
	.name = "adg",
	.has_graphs = true,
	.open = a_open,
	.close = a_close,
	.leaf = a_leaf,
	.op = a_op,
	.unref = a_unref,
	.id = a_id,
	.backward = a_backward,
	.grad = a_grad,
	.grads_free = a_grads_free,
	.add_grad = a_add_grad,
	.graph_id = a_graph_id,
	.thread_begin = nothing,
	.thread_end = nothing,
};
