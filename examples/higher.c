/*
 * Gradients of gradients in C: f(x) = x³ at x = 2, and its first, second
 * and third derivatives (12, 12 and 6), each from a backward over the one
 * before.
 *
 * A value is a struct var: a number and the node that records it. A step
 * keeps its parents' vars (with node handles of its own) and gives each
 * parent g * dy/dp, computed with the same ops as the forward: g is a var
 * with a node, so those ops are recorded too, and the gradient a step gives
 * is itself a node, which a later backward can run. Three things make that
 * work:
 * - the backward that records is retained (adg_backward_options.retain):
 *   its steps stay registered, so the backward from a gradient's node can
 *   go back through them;
 * - the seed is a node (a leaf of value 1), so every gradient is recorded;
 * - the gradient arithmetic's add records a sum, so a sum of gradients is a
 *   node too.
 * Every call is checked; a failure prints its code and exits 1, as does a
 * derivative that is not the closed form's.
 */
#include <adg.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                            \
	do {                                                                   \
		int rc_ = (call);                                              \
		if (rc_ != 0) {                                                \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, \
				#call, adg_strerror(rc_));                     \
			exit(1);                                               \
		}                                                              \
	} while (0)

/* A number and the node that records it (a handle of the var's own). */
struct var {
	adg_node *node;
	double value;
};

enum kind { ADD, MUL };

/* An op's closure: its two parents, with handles of its own (a leaf's
 * children keep only its id, so the step holds the leaf). */
struct op {
	enum kind kind;
	struct var p[2];
};

static int var_record(adg_registry *r, enum kind kind, struct var a,
		      struct var b, struct var *out);

static int var_add(adg_registry *r, struct var a, struct var b, struct var *out)
{
	return var_record(r, ADD, a, b, out);
}

static int var_mul(adg_registry *r, struct var a, struct var b, struct var *out)
{
	return var_record(r, MUL, a, b, out);
}

/* A gradient value: a heap var that owns its handle. */
static struct var *var_box(struct var v)
{
	struct var *box = malloc(sizeof *box);
	if (box != NULL)
		*box = v;
	return box;
}

static void var_free(void *value, void *ctx)
{
	(void)ctx;
	struct var *v = value;
	(void)adg_node_unref(v->node);
	free(v);
}

/* The gradient of parent slot k, g * dy/dp_k: a var with a node of its
 * own, recorded from g's node and the op's parents. */
static int partial(adg_registry *r, const struct op *o, int k, struct var g,
		   struct var *out)
{
	if (o->kind == MUL)
		return var_mul(r, g, o->p[1 - k], out); /* d(ab)/da = b */
	int rc = adg_node_ref(g.node);			/* d(a + b)/da = 1: g */
	if (rc == 0)
		*out = g;
	return rc;
}

/* The step: both parents' gradients, made, then given in one call. */
static int op_backward(adg_step_call *call, void *user)
{
	const struct op *o = user;
	const struct var *g = call->grad;
	if (g == NULL)
		return 0; /* no child gave one: nothing flows to the parents */
	void *values[2] = {NULL, NULL};
	int rc = 0;
	for (int k = 0; k < 2 && rc == 0; k++) {
		struct var d;
		rc = partial(call->registry, o, k, *g, &d);
		if (rc == 0 && (values[k] = var_box(d)) == NULL) {
			(void)adg_node_unref(d.node);
			rc = ADG_ENOMEM;
		}
	}
	if (rc != 0) {
		for (int k = 0; k < 2; k++)
			if (values[k] != NULL)
				var_free(values[k], NULL);
		return rc;
	}
	/* Takes both, failing or not: nothing to clean up after it. */
	return adg_step_give_all(call, values);
}

static void op_release(void *user)
{
	struct op *o = user;
	for (int k = 0; k < 2; k++)
		(void)adg_node_unref(o->p[k].node);
	free(o);
}

static int var_record(adg_registry *r, enum kind kind, struct var a,
		      struct var b, struct var *out)
{
	struct op *o = malloc(sizeof *o);
	if (o == NULL)
		return ADG_ENOMEM;
	*o = (struct op){kind, {a, b}};
	int rc = adg_node_ref(a.node);
	if (rc == 0 && (rc = adg_node_ref(b.node)) != 0)
		(void)adg_node_unref(a.node);
	if (rc != 0) {
		free(o);
		return rc;
	}
	adg_step step = {.backward = op_backward,
			 .release = op_release,
			 .user = o,
			 .name = kind == ADD ? "add" : "mul"};
	adg_node *node;
	rc = adg_op(r, (adg_node *[]){a.node, b.node}, 2, &step, &node);
	if (rc != 0) {
		op_release(o);
		return rc;
	}
	double v = kind == ADD ? a.value + b.value : a.value * b.value;
	*out = (struct var){node, v};
	return 0;
}

/* *sum += value, recorded: a sum of gradients is a node too. ctx is the
 * registry. Owns value, failing or not. */
static int grad_add(void **sum, void *value, void *ctx)
{
	struct var *s = *sum, total;
	int rc = var_add(ctx, *s, *(struct var *)value, &total);
	var_free(value, NULL);
	if (rc != 0)
		return rc;
	(void)adg_node_unref(s->node);
	*s = total;
	return 0;
}

/* x's gradient in a retained backward from y seeded with one: a var whose
 * node records how it was computed, for the next backward. */
static struct var derivative(adg_registry *reg, const adg_grad_ops *ops,
			     struct var y, struct var x, struct var one)
{
	CHECK(adg_node_ref(one.node)); /* the seed's own handle */
	struct var *seed = var_box(one);
	if (seed == NULL)
		CHECK(ADG_ENOMEM);
	adg_backward_options retain = {.size = sizeof retain, .retain = 1};
	adg_grads *grads;
	CHECK(adg_backward_with(reg, y.node, seed, ops, &retain, &grads));
	void *value;
	CHECK(adg_grads_take_node(grads, x.node, &value));
	CHECK(adg_grads_free(grads)); /* one's gradient, and the rest */
	struct var dx = *(struct var *)value;
	free(value); /* the box; its handle is dx's now */
	return dx;
}

int main(void)
{
	adg_registry *reg;
	CHECK(adg_registry_new(NULL, &reg));
	const adg_grad_ops ops = {grad_add, var_free, reg};

	struct var x = {NULL, 2.0}, one = {NULL, 1.0}, xx, f;
	CHECK(adg_leaf(reg, &x.node));
	CHECK(adg_leaf(reg, &one.node));
	CHECK(var_mul(reg, x, x, &xx));
	CHECK(var_mul(reg, xx, x, &f));
	printf("f(x) = x^3 at x = %g: %g\n", x.value, f.value);

	/* Each derivative from the one before: f' = 3x^2, f'' = 6x, f''' = 6.
	 * Every pass is retained, so that the next can run back through the
	 * steps of f as well as through those the pass recorded. */
	static const char *const names[3] = {"f'(x)", "f''(x)", "f'''(x)"};
	const double want[3] = {3 * x.value * x.value, 6 * x.value, 6};
	struct var d[3];
	struct var from = f;
	int wrong = 0;
	for (int n = 0; n < 3; n++) {
		d[n] = derivative(reg, &ops, from, x, one);
		printf("%s = %g\n", names[n], d[n].value);
		if (d[n].value != want[n]) {
			fprintf(stderr, "%s: %g, want %g\n", names[n],
				d[n].value, want[n]);
			wrong = 1;
		}
		from = d[n];
	}

	/* Handles dropped, every graph goes, its steps released: the
	 * registry is empty. */
	for (int n = 0; n < 3; n++)
		CHECK(adg_node_unref(d[n].node));
	adg_node *mine[] = {f.node, xx.node, x.node, one.node};
	for (int i = 0; i < 4; i++)
		CHECK(adg_node_unref(mine[i]));
	CHECK(adg_registry_free(reg));
	return wrong;
}
