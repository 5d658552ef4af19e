/* adg: the library, through its public API only. */
#include "adg_grads.h"
#include "bench.h"

#include <adg.h>
#include <stdlib.h>
#include <string.h>

static int grad_add(void **sum, void *value, void *ctx)
{
	(void)ctx;
	*sum = bench_grad_encode(bench_grad_decode(*sum) +
				 bench_grad_decode(value));
	return 0;
}

static void grad_free(void *value, void *ctx)
{
	(void)value;
	(void)ctx;
}

const adg_grad_ops bench_adg_grad_ops = {grad_add, grad_free, NULL};

static int trampoline(adg_step_call *call, void *user)
{
	const bench_step *step = user;
	bench_call c = {
		.impl = &bench_adg,
		.sink = call,
		.grad = call->grad != NULL ? bench_grad_decode(call->grad) : 0,
		.parent_ids = call->parent_ids,
		.n_parents = call->n_parents,
	};
	return step->run(&c, step);
}

bool bench_adg_heap_slabs;

static void *heap_alloc(size_t size, void *ctx)
{
	(void)ctx;
	return malloc(size);
}

static void heap_free(void *p, size_t size, void *ctx)
{
	(void)size;
	(void)ctx;
	free(p);
}

static void *a_open(void)
{
	adg_registry_options o = {
		.size = sizeof o,
		.allocator = {.alloc = heap_alloc, .free = heap_free}};
	adg_registry *r;
	return adg_registry_new(bench_adg_heap_slabs ? &o : NULL, &r) == 0
		       ? r
		       : NULL;
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
	adg_step s = {
		.backward = trampoline, .release = NULL, .user = (void *)step};
	adg_node *out;
	return adg_op(reg, (adg_node *const *)parents, n, &s, &out) == 0 ? out
									 : NULL;
}

static void *a_op_moving(void *reg, void *const *parents, size_t n,
			 uint64_t moved, const bench_step *step)
{
	adg_step s = {
		.backward = trampoline, .release = NULL, .user = (void *)step};
	adg_node *out;
	return adg_op_moving(reg, (adg_node *const *)parents, n, moved, &s,
			     &out) == 0
		       ? out
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
	return adg_backward(reg, root, bench_grad_encode(1.0),
			    &bench_adg_grad_ops, (adg_grads **)grads);
}

int bench_adg_backward_ready(void *reg, void *root,
			     int (*ready)(uint64_t id, void **grad, void *ctx),
			     void *ctx, void **grads)
{
	adg_backward_options o = {.size = sizeof o,
				  .on_ready = ready,
				  .on_ready_ctx = ctx,
				  .leaves_only = 1};
	return adg_backward_with(reg, root, bench_grad_encode(1.0),
				 &bench_adg_grad_ops, &o, (adg_grads **)grads);
}

int bench_adg_backward_exec(void *reg, void *root,
			    const struct adg_executor *ex, bool retain,
			    void **grads)
{
	if (ex == NULL && !retain)
		return a_backward(reg, root, grads);
	adg_backward_options o = {
		.size = sizeof o, .executor = ex, .retain = retain};
	return adg_backward_with(reg, root, bench_grad_encode(1.0),
				 &bench_adg_grad_ops, &o, (adg_grads **)grads);
}

static double a_grad(void *grads, uint64_t id)
{
	void *v;
	return adg_grads_get(grads, id, &v) == 0 ? bench_grad_decode(v) : 0;
}

static void a_grads_free(void *grads)
{
	adg_grads_free(grads);
}

/* By slot, in the order the workloads' steps give them (slot order): the
 * path that compares no id. */
static void a_add_grad(const bench_call *call, size_t slot, double g)
{
	adg_step_give(call->sink, slot, bench_grad_encode(g));
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
	.op_moving = a_op_moving,
	.id = a_id,
	.backward = a_backward,
	.grad = a_grad,
	.grads_free = a_grads_free,
	.add_grad = a_add_grad,
	.graph_id = a_graph_id,
	.thread_begin = nothing,
	.thread_end = nothing,
};

/* ------------------------------------------------------ checkpointing */

/* The checkpoint workload: a product of two leaves, a chain of k adds
 * (memory-bound, each able to rebuild its output from its input's), and a
 * product with a third leaf whose step asks for the chain's last output;
 * backward, drop, repeat. Outputs are heap doubles, counted, so that the
 * peak number alive shows what each strategy keeps. One thread. */
static long outputs_live, outputs_peak;

static void *output_new(double v)
{
	double *p = malloc(sizeof *p);
	if (p == NULL)
		abort();
	*p = v;
	if (++outputs_live > outputs_peak)
		outputs_peak = outputs_live;
	return p;
}

static void output_free(void *p, void *ctx)
{
	(void)ctx;
	free(p);
	outputs_live--;
}

static double grad_in(const adg_step_call *call)
{
	return call->grad != NULL ? bench_grad_decode(call->grad) : 0;
}

static int add_backward(adg_step_call *call, void *user)
{
	(void)user;
	return adg_step_give(call, 0, bench_grad_encode(grad_in(call)));
}

static int add_recompute(adg_recompute_call *call, void *user)
{
	(void)user;
	call->output = output_new(*(double *)call->parent_outputs[0] + 1);
	return 0;
}

static const double ck_a = 2, ck_w = 3, ck_w2 = 5;

static int leaves_backward(adg_step_call *call, void *user)
{
	(void)user;
	double g = grad_in(call);
	adg_step_give(call, 0, bench_grad_encode(g * ck_w));
	return adg_step_give(call, 1, bench_grad_encode(g * ck_a));
}

static int last_backward(adg_step_call *call, void *user)
{
	(void)user;
	void *x;
	int rc = adg_output_get(call, call->parent_ids[0], &x);
	if (rc != 0)
		return rc;
	double g = grad_in(call);
	adg_step_give(call, 0, bench_grad_encode(g * ck_w2));
	return adg_step_give(call, 1, bench_grad_encode(g * *(double *)x));
}

double bench_checkpoint(int strategy, int k, int ms, long *peak)
{
	adg_registry_options o = {.size = sizeof o, .checkpointing = strategy};
	adg_registry *reg;
	if (adg_registry_new(&o, &reg) != 0)
		abort();
	adg_node *a, *w, *w2;
	adg_leaf(reg, &a);
	adg_leaf(reg, &w);
	adg_leaf(reg, &w2);
	outputs_live = outputs_peak = 0;
	uint64_t nodes = 0, t0 = bench_now_ns(),
		 end = t0 + (uint64_t)ms * 1000000;
	const uint32_t want0 = 0;
	while (bench_now_ns() < end) {
		adg_node *p[2] = {a, w}, *prev, *y;
		adg_output oc = {output_new(ck_a * ck_w), output_free, NULL, 0,
				 NULL};
		adg_op_options keep = {sizeof keep, &oc, 0, NULL, 0, 0};
		adg_step s0 = {.backward = leaves_backward,
			       .release = NULL,
			       .user = NULL};
		adg_op_with(reg, p, 2, &s0, &keep, &prev);
		double v = ck_a * ck_w;
		for (int i = 0; i < k; i++) {
			v += 1;
			adg_output om = {output_new(v), output_free,
					 add_recompute, 1, NULL};
			adg_op_options mo = {sizeof mo, &om, 0, NULL, 0, 0};
			adg_step sm = {.backward = add_backward,
				       .release = NULL,
				       .user = NULL};
			adg_node *next;
			adg_op_with(reg, &prev, 1, &sm, &mo, &next);
			adg_node_unref(prev);
			prev = next;
		}
		adg_node *pl[2] = {prev, w2};
		adg_output ol = {output_new(v * ck_w2), output_free, NULL, 0,
				 NULL};
		adg_op_options lo = {sizeof lo, &ol, 0, &want0, 1, 0};
		adg_step sl = {.backward = last_backward,
			       .release = NULL,
			       .user = NULL};
		adg_op_with(reg, pl, 2, &sl, &lo, &y);
		adg_node_unref(prev);
		adg_grads *g;
		if (adg_backward(reg, y, bench_grad_encode(1.0),
				 &bench_adg_grad_ops, &g) == 0)
			adg_grads_free(g);
		adg_node_unref(y);
		nodes += (uint64_t)k + 2;
	}
	double secs = (double)(bench_now_ns() - t0) * 1e-9;
	adg_node_unref(a);
	adg_node_unref(w);
	adg_node_unref(w2);
	if (adg_registry_free(reg) != 0 || outputs_live != 0)
		abort(); /* the workload leaked: the figures would lie */
	*peak = outputs_peak;
	return (double)nodes / secs;
}
