/*
 * A scalar backend for the tests: gradients are heap-allocated doubles, so
 * AddressSanitizer sees every leak and double free, and counters tell the
 * tests how many values and step closures are alive.
 */
#ifndef ADG_TEST_SCALAR_H
#define ADG_TEST_SCALAR_H

#include <adg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Gradient values and step closures not yet freed, in this process. */
extern atomic_long scalar_values_live;
extern atomic_long scalar_steps_live;

extern const adg_grad_ops scalar_ops;

double *scalar_box(double v);

/* Hashed gradients (hv_ops), for tests of the order a node's
 * contributions are folded in: heap objects holding a hash h, folded as
 * sum = sum * 31 + value, neither commutative nor associative, so that a
 * change in that order changes the result. Counted in scalar_values_live
 * as the scalar ones are. */
struct hv {
	uint64_t h;
	atomic_int *freed; /* counts this value's free; NULL: not watched */
};
struct hv *hv_new(uint64_t h);
void hv_free(void *value, void *ctx);
int hv_add(void **sum, void *value, void *ctx);
extern const adg_grad_ops hv_ops;

/* Forward outputs for checkpointed ops (adg_output): heap doubles, so that
 * AddressSanitizer sees them, counted alive, made in all, and the most
 * alive at once, so that leaks, double frees and peaks show. */
extern atomic_long scalar_outputs_live, scalar_outputs_made,
	scalar_outputs_peak;
double *s_output_new(double v);
void s_output_free(void *v, void *ctx);

/* A forward value and the node that records it. */
typedef struct scalar {
	adg_node *node;
	double value;
	uint64_t id;
} scalar;

/* Each helper asserts success (the tests check errors by calling the API
 * directly). */
scalar s_leaf(adg_registry *r, double value);
scalar s_mul(adg_registry *r, scalar a, scalar b);
scalar s_add(adg_registry *r, scalar a, scalar b);
/* The product of n factors, one node with n parents. */
scalar s_prod(adg_registry *r, const scalar *factors, size_t n);
/* s_prod through adg_op_moving: the handles of the factors whose bit is
 * set in moved go to the new node. */
scalar s_prod_moving(adg_registry *r, const scalar *factors, size_t n,
		     uint64_t moved);
void s_drop(scalar x);
uint64_t s_graph(scalar x);

/* Runs backward from root with seed 1. */
int s_backward(adg_registry *r, scalar root, adg_grads **out);
/* The gradient the container holds for x; asserts there is one. */
double s_grad(const adg_grads *g, scalar x);

/* A sum's step: registers call's gradient for each parent slot. */
int s_pass_on(adg_step_call *call);

/* A step closure for the product of n parents, to build custom ops. */
struct prod_step {
	size_t n;
	atomic_int runs;
	atomic_int releases;
	double values[];
};
struct prod_step *prod_step_new(const scalar *factors, size_t n);
int prod_backward(adg_step_call *call, void *user);
void prod_release(void *user);

/* An allocator whose next `fail_in`-th allocation fails (0: never). */
typedef struct failing_alloc {
	atomic_long fail_in;
	atomic_long live_bytes;
	atomic_long allocations;
} failing_alloc;
adg_allocator failing_allocator(failing_alloc *state);

void assert_stats(adg_registry *r, uint64_t nodes, uint64_t steps,
		  uint64_t graphs);

#endif
