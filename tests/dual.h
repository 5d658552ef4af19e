/*
 * A scalar autodiff layer on libadg whose gradients are themselves nodes,
 * for higher-order gradients (issue 13): d²/dx², Hessian-vector products,
 * gradient penalties.
 *
 * A struct dual is a forward value and the node that records it, or a
 * constant (node NULL) that no backward sees. Each op's step keeps its
 * parents (a handle to each, and its value) and builds the parents'
 * gradients from them with the same ops, so that a gradient is a dual too.
 * Whether it records them is up to the gradient it is given: a gradient
 * with a node (a seed over a leaf of value 1, and all that a backward
 * builds from it) makes every step record its partial derivatives as ops
 * whose parents are the step's own parents, nodes of the graph being run;
 * a constant gradient (dual_const seed) makes steps compute plain numbers.
 * Record in a retained backward (adg_backward_options.retain): its steps
 * stay registered, so a backward from a gradient's node can go back
 * through them. A consuming backward may record too, but the ops it
 * records on the parents it consumed cannot be run backward
 * (ADG_EUNAVAILABLE).
 *
 * Gradient values (what adg_grads holds) are heap struct dual *, counted in
 * dual_values_live; dual_ops(registry) adds them by recording a dual_add,
 * so that a sum of gradients is differentiable too. Every function returns
 * 0 or a libadg (or ADG_ENOMEM) code and asserts nothing, so that steps
 * and ops may use it on any thread; what a callback cannot report
 * (a failed unref in a release) it counts in dual_errors.
 */
#ifndef ADG_TEST_DUAL_H
#define ADG_TEST_DUAL_H

#include <adg.h>
#include <stdatomic.h>

struct dual {
	adg_node *node; /* owned handle; NULL: a constant */
	double value;
};

/* In this process: heap duals (gradient values) not yet freed, dual steps
 * not yet released, step runs by call->retained, and failures callbacks
 * could not report. */
extern atomic_long dual_values_live, dual_steps_live;
extern atomic_long dual_runs_retained, dual_runs_consuming;
extern atomic_long dual_errors;

/* Zeroes the counters above. */
void dual_reset(void);

/* Gradient arithmetic for registry's backward passes (ctx is registry). */
adg_grad_ops dual_ops(adg_registry *registry);

/* A leaf of value v (a parameter; the seed of a backward that records). */
int dual_leaf(adg_registry *r, double v, struct dual *out);
/* A constant: no node. */
struct dual dual_const(double v);
/* Another handle to x's node (for a constant, x itself). */
int dual_copy(struct dual x, struct dual *out);
/* Drops x's handle, if it has one, and makes x a constant. */
int dual_drop(struct dual *x);
/* x's node id; 0 for a constant. */
uint64_t dual_id(struct dual x);

/* Ops: a + b, a * b, c * a, sin a, cos a, -a. An op of constants is a
 * constant; an op with an operand that has a node records one op, whose
 * step keeps a handle to each operand that has one (a constant operand is
 * folded into the op: a * 2 is scale 2). The operands stay the caller's;
 * *out holds a new handle. */
int dual_add(adg_registry *r, struct dual a, struct dual b, struct dual *out);
int dual_mul(adg_registry *r, struct dual a, struct dual b, struct dual *out);
int dual_scale(adg_registry *r, struct dual a, double c, struct dual *out);
int dual_sin(adg_registry *r, struct dual a, struct dual *out);
int dual_cos(adg_registry *r, struct dual a, struct dual *out);
int dual_neg(adg_registry *r, struct dual a, struct dual *out);

/* A gradient value for adg_backward or adg_step_give: a heap copy of
 * x that takes x's handle. NULL when malloc fails (x is untouched). */
struct dual *dual_box(struct dual x);
/* Frees a boxed dual, handing its handle (if any) to *out. */
void dual_unbox(struct dual *boxed, struct dual *out);

#endif
