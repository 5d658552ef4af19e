#include "scalar.h"

#include <criterion/criterion.h>
#include <stdlib.h>

atomic_long scalar_values_live;
atomic_long scalar_steps_live;

double *scalar_box(double v)
{
	double *p = malloc(sizeof *p);
	cr_assert_not_null(p);
	*p = v;
	atomic_fetch_add(&scalar_values_live, 1);
	return p;
}

static int scalar_add(void **sum, void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(double *)value;
	free(value);
	atomic_fetch_sub(&scalar_values_live, 1);
	return 0;
}

static void scalar_free(void *value, void *ctx)
{
	(void)ctx;
	free(value);
	atomic_fetch_sub(&scalar_values_live, 1);
}

const adg_grad_ops scalar_ops = {scalar_add, scalar_free, NULL};

struct hv *hv_new(uint64_t h)
{
	struct hv *v = malloc(sizeof *v);
	cr_assert_not_null(v);
	v->h = h;
	v->freed = NULL;
	atomic_fetch_add(&scalar_values_live, 1);
	return v;
}

void hv_free(void *value, void *ctx)
{
	(void)ctx;
	struct hv *v = value;
	if (v->freed != NULL)
		atomic_fetch_add(v->freed, 1);
	free(v);
	atomic_fetch_sub(&scalar_values_live, 1);
}

int hv_add(void **sum, void *value, void *ctx)
{
	struct hv *s = *sum;
	s->h = s->h * 31 + ((struct hv *)value)->h;
	hv_free(value, ctx);
	return 0;
}

const adg_grad_ops hv_ops = {hv_add, hv_free, NULL};

atomic_long scalar_outputs_live, scalar_outputs_made, scalar_outputs_peak;

double *s_output_new(double v)
{
	double *p = malloc(sizeof *p);
	cr_assert_not_null(p);
	*p = v;
	long live = atomic_fetch_add(&scalar_outputs_live, 1) + 1;
	atomic_fetch_add(&scalar_outputs_made, 1);
	long peak = atomic_load(&scalar_outputs_peak);
	while (live > peak &&
	       !atomic_compare_exchange_weak(&scalar_outputs_peak, &peak, live))
		;
	return p;
}

void s_output_free(void *v, void *ctx)
{
	(void)ctx;
	free(v);
	atomic_fetch_sub(&scalar_outputs_live, 1);
}

struct prod_step *prod_step_new(const scalar *factors, size_t n)
{
	struct prod_step *s = malloc(sizeof *s + n * sizeof(double));
	cr_assert_not_null(s);
	s->n = n;
	atomic_init(&s->runs, 0);
	atomic_init(&s->releases, 0);
	for (size_t i = 0; i < n; i++)
		s->values[i] = factors[i].value;
	atomic_fetch_add(&scalar_steps_live, 1);
	return s;
}

int prod_backward(adg_step_call *call, void *user)
{
	struct prod_step *s = user;
	atomic_fetch_add(&s->runs, 1);
	cr_assert_eq(call->n_parents, s->n);
	if (call->grad == NULL)
		return 0;
	double g = *(double *)call->grad;
	for (size_t i = 0; i < s->n; i++) {
		double d = g;
		for (size_t k = 0; k < s->n; k++)
			if (k != i)
				d *= s->values[k];
		int rc = adg_step_give(call, i, scalar_box(d));
		if (rc != 0)
			return rc;
	}
	return 0;
}

void prod_release(void *user)
{
	struct prod_step *s = user;
	cr_assert_eq(atomic_fetch_add(&s->releases, 1), 0,
		     "a step was released twice");
	atomic_fetch_sub(&scalar_steps_live, 1);
	free(s);
}

static int sum_backward(adg_step_call *call, void *user)
{
	(void)user;
	return s_pass_on(call);
}

int s_pass_on(adg_step_call *call)
{
	if (call->grad == NULL)
		return 0;
	double g = *(double *)call->grad;
	for (size_t i = 0; i < call->n_parents; i++) {
		int rc = adg_step_give(call, i, scalar_box(g));
		if (rc != 0)
			return rc;
	}
	return 0;
}

static void count_release(void *user)
{
	(void)user;
	atomic_fetch_sub(&scalar_steps_live, 1);
}

scalar s_leaf(adg_registry *r, double value)
{
	scalar x = {.value = value};
	cr_assert_eq(adg_leaf(r, &x.node), 0);
	cr_assert_eq(adg_node_id(x.node, &x.id), 0);
	return x;
}

scalar s_prod(adg_registry *r, const scalar *factors, size_t n)
{
	return s_prod_moving(r, factors, n, 0);
}

scalar s_prod_moving(adg_registry *r, const scalar *factors, size_t n,
		     uint64_t moved)
{
	adg_node *parents[16];
	cr_assert(n <= 16);
	scalar y = {.value = 1};
	for (size_t i = 0; i < n; i++) {
		parents[i] = factors[i].node;
		y.value *= factors[i].value;
	}
	adg_step step = {.backward = prod_backward,
			 .release = prod_release,
			 .user = prod_step_new(factors, n)};
	/* Nothing moved: adg_op itself, which most tests exercise. */
	int rc = moved == 0
			 ? adg_op(r, parents, n, &step, &y.node)
			 : adg_op_moving(r, parents, n, moved, &step, &y.node);
	cr_assert_eq(rc, 0, "%s: %s", moved == 0 ? "adg_op" : "adg_op_moving",
		     adg_strerror(rc));
	cr_assert_eq(adg_node_id(y.node, &y.id), 0);
	return y;
}

scalar s_mul(adg_registry *r, scalar a, scalar b)
{
	scalar f[2] = {a, b};
	return s_prod(r, f, 2);
}

scalar s_add(adg_registry *r, scalar a, scalar b)
{
	scalar y = {.value = a.value + b.value};
	adg_node *parents[2] = {a.node, b.node};
	atomic_fetch_add(&scalar_steps_live, 1);
	adg_step step = {.backward = sum_backward,
			 .release = count_release,
			 .user = NULL};
	cr_assert_eq(adg_op(r, parents, 2, &step, &y.node), 0);
	cr_assert_eq(adg_node_id(y.node, &y.id), 0);
	return y;
}

void s_drop(scalar x)
{
	cr_assert_eq(adg_node_unref(x.node), 0);
}

uint64_t s_graph(scalar x)
{
	uint64_t g = UINT64_MAX;
	cr_assert_eq(adg_node_graph_id(x.node, &g), 0);
	return g;
}

int s_backward(adg_registry *r, scalar root, adg_grads **out)
{
	return adg_backward(r, root.node, scalar_box(1.0), &scalar_ops, out);
}

double s_grad(const adg_grads *g, scalar x)
{
	void *v = NULL;
	int rc = adg_grads_get(g, x.id, &v);
	cr_assert_eq(rc, 0, "no gradient for node %llu: %s",
		     (unsigned long long)x.id, adg_strerror(rc));
	return *(double *)v;
}

static void *fa_alloc(size_t size, void *ctx)
{
	failing_alloc *st = ctx;
	if (atomic_load(&st->fail_in) > 0 &&
	    atomic_fetch_sub(&st->fail_in, 1) == 1)
		return NULL;
	size_t *p = malloc(size + 16);
	if (p == NULL)
		return NULL;
	p[0] = size;
	atomic_fetch_add(&st->live_bytes, (long)size);
	atomic_fetch_add(&st->allocations, 1);
	return (char *)p + 16;
}

static void fa_free(void *ptr, size_t size, void *ctx)
{
	failing_alloc *st = ctx;
	size_t *p = (size_t *)((char *)ptr - 16);
	cr_assert_eq(p[0], size, "free was told another size than alloc");
	atomic_fetch_sub(&st->live_bytes, (long)size);
	free(p);
}

adg_allocator failing_allocator(failing_alloc *state)
{
	return (adg_allocator){fa_alloc, fa_free, state};
}

void assert_stats(adg_registry *r, uint64_t nodes, uint64_t steps,
		  uint64_t graphs)
{
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(r, &st), 0);
	cr_assert_eq(st.live_nodes, nodes, "live nodes %llu, want %llu",
		     (unsigned long long)st.live_nodes,
		     (unsigned long long)nodes);
	cr_assert_eq(st.live_steps, steps, "live steps %llu, want %llu",
		     (unsigned long long)st.live_steps,
		     (unsigned long long)steps);
	cr_assert_eq(st.live_graphs, graphs, "live graphs %llu, want %llu",
		     (unsigned long long)st.live_graphs,
		     (unsigned long long)graphs);
}
