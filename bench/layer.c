/*
 * The cpp workload's C side: what adg.hpp's layer costs is measured
 * against it (layer.cpp). One thread records a chain of n two-parent
 * products (y_k = y_{k-1} * b, on two leaves), runs its backward and drops
 * it, again and again; ns per op covers the recording, the backward and
 * the frees. The C trainer's way: gradients are doubles in the pointer
 * itself (no allocation: adg_grads.h, as the bench's adg side), and each step's
 * forward values live in one array per graph, not in an allocation per op.
 */
#include "adg_grads.h"
#include "bench.h"

#include <adg.h>
#include <stdlib.h>
#include <string.h>

/* A product's forward values, parent 0's and parent 1's. */
struct product {
	double a, b;
};

static int product_backward(adg_step_call *call, void *user)
{
	const struct product *p = user;
	double g = call->grad != NULL ? bench_grad_decode(call->grad) : 0;
	int rc = adg_step_give(call, 0, bench_grad_encode(g * p->b));
	return rc != 0 ? rc
		       : adg_step_give(call, 1, bench_grad_encode(g * p->a));
}

/* One graph of n products: recorded, run backward, dropped. Returns 0 or
 * the first error. */
static int layer_c_once(adg_registry *reg, struct product *values, int n)
{
	adg_node *x, *w, *y;
	if (adg_leaf(reg, &x) != 0 || adg_leaf(reg, &w) != 0)
		return -1;
	y = x;
	adg_node_ref(x);
	double yv = 1.0, wv = 1.0000001;
	int rc = 0;
	for (int k = 0; k < n && rc == 0; k++) {
		values[k] = (struct product){yv, wv};
		adg_node *parents[2] = {y, w}, *next;
		adg_step step = {.backward = product_backward,
				 .user = &values[k]};
		rc = adg_op(reg, parents, 2, &step, &next);
		if (rc == 0) {
			adg_node_unref(y);
			y = next;
			yv *= wv;
		}
	}
	adg_grads *g = NULL;
	if (rc == 0)
		rc = adg_backward(reg, y, bench_grad_encode(1.0),
				  &bench_adg_grad_ops, &g);
	adg_grads_free(g);
	adg_node_unref(y);
	adg_node_unref(w);
	adg_node_unref(x);
	return rc;
}

double bench_layer_c_ns(int n, int ms)
{
	adg_registry *reg;
	struct product *values = malloc((size_t)n * sizeof *values);
	if (values == NULL || adg_registry_new(NULL, &reg) != 0) {
		free(values);
		return -1;
	}
	long ops = 0;
	uint64_t t0 = bench_now_ns(), end = t0 + (uint64_t)ms * 1000000u;
	uint64_t t = t0;
	while (t < end) {
		if (layer_c_once(reg, values, n) != 0) {
			ops = 0;
			break;
		}
		ops += n;
		t = bench_now_ns();
	}
	adg_registry_free(reg);
	free(values);
	return ops > 0 ? (double)(t - t0) / (double)ops : -1;
}

/* The C++ sides, layer.cpp's and gather.cpp's, when built. */
#ifdef ADG_BENCH_CPP
double bench_layer_cpp_ns(int n, int ms);
double (*const bench_layer_cpp)(int n, int ms) = bench_layer_cpp_ns;
double (*const bench_gather_cpp)(int form, int n,
				 int ms) = bench_gather_cpp_nodes;
#else
double (*const bench_layer_cpp)(int n, int ms) = NULL;
double (*const bench_gather_cpp)(int form, int n, int ms) = NULL;
#endif
