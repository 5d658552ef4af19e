/* The dual layer: see dual.h. */
#include "dual.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

atomic_long dual_values_live, dual_steps_live;
atomic_long dual_runs_retained, dual_runs_consuming;
atomic_long dual_errors;

void dual_reset(void)
{
	atomic_store(&dual_values_live, 0);
	atomic_store(&dual_steps_live, 0);
	atomic_store(&dual_runs_retained, 0);
	atomic_store(&dual_runs_consuming, 0);
	atomic_store(&dual_errors, 0);
}

enum dual_kind {
	DUAL_ADD,   /* p0 + p1 */
	DUAL_MUL,   /* p0 * p1 */
	DUAL_SCALE, /* c * p0 */
	DUAL_SHIFT, /* p0 + c */
	DUAL_SIN,   /* sin p0 */
	DUAL_COS,   /* cos p0 */
};

/* A step's closure: its parents (each with a handle of the closure's own,
 * so that a leaf parent outlives the caller's handles) and the constant. */
struct dual_step {
	enum dual_kind kind;
	size_t n;
	double c;
	struct dual p[2];
};

static const char *dual_name(enum dual_kind kind)
{
	switch (kind) {
	case DUAL_ADD:
		return "dual_add";
	case DUAL_MUL:
		return "dual_mul";
	case DUAL_SCALE:
		return "dual_scale";
	case DUAL_SHIFT:
		return "dual_shift";
	case DUAL_SIN:
		return "dual_sin";
	case DUAL_COS:
		return "dual_cos";
	}
	return NULL;
}

struct dual dual_const(double v)
{
	return (struct dual){NULL, v};
}

int dual_copy(struct dual x, struct dual *out)
{
	if (x.node != NULL) {
		int rc = adg_node_ref(x.node);
		if (rc != 0)
			return rc;
	}
	*out = x;
	return 0;
}

int dual_drop(struct dual *x)
{
	int rc = 0;
	if (x->node != NULL)
		rc = adg_node_unref(x->node);
	x->node = NULL;
	return rc;
}

uint64_t dual_id(struct dual x)
{
	uint64_t id = 0;
	if (x.node != NULL && adg_node_id(x.node, &id) != 0)
		return 0;
	return id;
}

int dual_leaf(adg_registry *r, double v, struct dual *out)
{
	adg_node *node = NULL;
	int rc = adg_leaf(r, &node);
	if (rc != 0)
		return rc;
	*out = (struct dual){node, v};
	return 0;
}

static void dual_release(void *user)
{
	struct dual_step *s = user;
	for (size_t i = 0; i < s->n; i++)
		if (dual_drop(&s->p[i]) != 0)
			atomic_fetch_add(&dual_errors, 1);
	free(s);
	atomic_fetch_sub(&dual_steps_live, 1);
}

static int dual_backward(adg_step_call *call, void *user);

/* Records one op of value v over the parents p[0..n) (each with a node). */
static int record(adg_registry *r, enum dual_kind kind, double c,
		  const struct dual *p, size_t n, double v, struct dual *out)
{
	struct dual_step *s = malloc(sizeof *s);
	if (s == NULL)
		return ADG_ENOMEM;
	*s = (struct dual_step){.kind = kind, .n = n, .c = c};
	adg_node *parents[2];
	size_t held = 0;
	int rc = 0;
	for (; held < n; held++) {
		rc = dual_copy(p[held], &s->p[held]);
		if (rc != 0)
			goto out_drop;
		parents[held] = p[held].node;
	}
	adg_step step = {.backward = dual_backward,
			 .release = dual_release,
			 .user = s,
			 .name = dual_name(kind)};
	adg_node *node = NULL;
	atomic_fetch_add(&dual_steps_live, 1);
	rc = adg_op(r, parents, n, &step, &node);
	if (rc != 0) {
		atomic_fetch_sub(&dual_steps_live, 1);
		goto out_drop;
	}
	*out = (struct dual){node, v};
	return 0;

out_drop:
	while (held > 0)
		(void)dual_drop(&s->p[--held]);
	free(s);
	return rc;
}

int dual_add(adg_registry *r, struct dual a, struct dual b, struct dual *out)
{
	double v = a.value + b.value;
	if (a.node == NULL && b.node == NULL) {
		*out = dual_const(v);
		return 0;
	}
	if (b.node == NULL)
		return record(r, DUAL_SHIFT, b.value, &a, 1, v, out);
	if (a.node == NULL)
		return record(r, DUAL_SHIFT, a.value, &b, 1, v, out);
	const struct dual p[2] = {a, b};
	return record(r, DUAL_ADD, 0, p, 2, v, out);
}

int dual_mul(adg_registry *r, struct dual a, struct dual b, struct dual *out)
{
	double v = a.value * b.value;
	if (a.node == NULL && b.node == NULL) {
		*out = dual_const(v);
		return 0;
	}
	if (b.node == NULL)
		return record(r, DUAL_SCALE, b.value, &a, 1, v, out);
	if (a.node == NULL)
		return record(r, DUAL_SCALE, a.value, &b, 1, v, out);
	const struct dual p[2] = {a, b};
	return record(r, DUAL_MUL, 0, p, 2, v, out);
}

int dual_scale(adg_registry *r, struct dual a, double c, struct dual *out)
{
	return dual_mul(r, a, dual_const(c), out);
}

int dual_neg(adg_registry *r, struct dual a, struct dual *out)
{
	return dual_scale(r, a, -1.0, out);
}

int dual_sin(adg_registry *r, struct dual a, struct dual *out)
{
	if (a.node == NULL) {
		*out = dual_const(sin(a.value));
		return 0;
	}
	return record(r, DUAL_SIN, 0, &a, 1, sin(a.value), out);
}

int dual_cos(adg_registry *r, struct dual a, struct dual *out)
{
	if (a.node == NULL) {
		*out = dual_const(cos(a.value));
		return 0;
	}
	return record(r, DUAL_COS, 0, &a, 1, cos(a.value), out);
}

struct dual *dual_box(struct dual x)
{
	struct dual *b = malloc(sizeof *b);
	if (b == NULL)
		return NULL;
	*b = x;
	atomic_fetch_add(&dual_values_live, 1);
	return b;
}

void dual_unbox(struct dual *boxed, struct dual *out)
{
	*out = *boxed;
	free(boxed);
	atomic_fetch_sub(&dual_values_live, 1);
}

/* The gradient of parent slot k, g * ∂y/∂p_k, built from g and the saved
 * parents; with a constant g, from the parents' values alone, so that
 * nothing is recorded. */
static int partial(adg_registry *r, const struct dual_step *s, size_t k,
		   struct dual g, struct dual *out)
{
	bool record_ops = g.node != NULL;
	struct dual p[2];
	for (size_t i = 0; i < s->n; i++)
		p[i] = record_ops ? s->p[i] : dual_const(s->p[i].value);
	struct dual t = dual_const(0);
	int rc;

	switch (s->kind) {
	case DUAL_ADD:
	case DUAL_SHIFT:
		return dual_copy(g, out);
	case DUAL_MUL:
		return dual_mul(r, g, p[1 - k], out);
	case DUAL_SCALE:
		return dual_scale(r, g, s->c, out);
	case DUAL_SIN:
		rc = dual_cos(r, p[0], &t);
		if (rc == 0)
			rc = dual_mul(r, g, t, out);
		break;
	case DUAL_COS: {
		struct dual u = dual_const(0);
		rc = dual_sin(r, p[0], &t);
		if (rc == 0)
			rc = dual_mul(r, g, t, &u);
		if (rc == 0)
			rc = dual_neg(r, u, out);
		int urc = dual_drop(&u);
		if (rc == 0)
			rc = urc;
		break;
	}
	default:
		return ADG_EINVAL;
	}
	int trc = dual_drop(&t);
	return rc != 0 ? rc : trc;
}

/* Gives one gradient per parent slot, in slot order. */
static int dual_backward(adg_step_call *call, void *user)
{
	struct dual_step *s = user;
	atomic_fetch_add(
		call->retained ? &dual_runs_retained : &dual_runs_consuming, 1);
	if (call->n_parents != s->n)
		return ADG_EINVAL;
	if (call->grad == NULL)
		return 0;
	const struct dual *g = call->grad;
	for (size_t k = 0; k < s->n; k++) {
		struct dual d;
		int rc = partial(call->registry, s, k, *g, &d);
		if (rc != 0)
			return rc;
		struct dual *boxed = dual_box(d);
		if (boxed == NULL) {
			(void)dual_drop(&d);
			return ADG_ENOMEM;
		}
		rc = adg_step_give(call, k, boxed);
		if (rc != 0)
			return rc;
	}
	return 0;
}

static void dual_free_value(void *value, void *ctx)
{
	(void)ctx;
	struct dual d;
	dual_unbox(value, &d);
	if (dual_drop(&d) != 0)
		atomic_fetch_add(&dual_errors, 1);
}

/* *sum = *sum + value, recorded when either has a node. */
static int dual_add_values(void **sum, void *value, void *ctx)
{
	struct dual *s = *sum, v;
	dual_unbox(value, &v);
	struct dual total;
	int rc = dual_add(ctx, *s, v, &total);
	int vrc = dual_drop(&v);
	if (rc != 0)
		return rc;
	int src = dual_drop(s);
	*s = total;
	return vrc != 0 ? vrc : src;
}

adg_grad_ops dual_ops(adg_registry *registry)
{
	return (adg_grad_ops){dual_add_values, dual_free_value, registry};
}
