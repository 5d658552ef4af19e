/*
 * Parent slots: one word each, an op's pointer or a leaf's id (internal.h),
 * and the contiguous id arrays built from them: what a step's call, a
 * visitor and the encoding itself see, for leaves and ops mixed, repeated
 * parents, more parents than a thread's inline array holds (the tape's
 * scratch), with and without an executor, retained, near ADG_ID_MAX, and
 * with the scratch's reservation failing.
 */
#include <adg.h>
#include <adg/pool.h>
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h" /* white box: the slot encoding */

TestSuite(slots);

/* Gradients: heap doubles. */
static int dbl_add(void **sum, void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(double *)value;
	free(value);
	return 0;
}

static void dbl_free(void *value, void *ctx)
{
	(void)ctx;
	free(value);
}

static const adg_grad_ops dbl_ops = {dbl_add, dbl_free, NULL};

static void *dbl(double v)
{
	double *p = malloc(sizeof *p);
	cr_assert_not_null(p);
	*p = v;
	return p;
}

/* A step that checks the ids its call hands out against those it was
 * made with, then gives its gradient to every slot. */
#define MOST 24
struct expect {
	size_t n;
	uint64_t ids[MOST];
	atomic_int runs, wrong;
};

static int expect_backward(adg_step_call *call, void *user)
{
	struct expect *e = user;
	atomic_fetch_add(&e->runs, 1);
	if (call->n_parents != e->n)
		atomic_fetch_add(&e->wrong, 1);
	for (size_t k = 0; k < e->n && k < call->n_parents; k++)
		if (call->parent_ids[k] != e->ids[k])
			atomic_fetch_add(&e->wrong, 1);
	double g = *(double *)call->grad;
	for (size_t k = 0; k < call->n_parents; k++) {
		int rc = adg_step_give(call, k, dbl(g));
		if (rc != 0)
			return rc;
	}
	return 0;
}

static uint64_t id_of(adg_node *n)
{
	uint64_t id;
	cr_assert_eq(adg_node_id(n, &id), 0);
	return id;
}

/* An op over parents, expecting their ids in e. */
static adg_node *op(adg_registry *r, adg_node **parents, size_t n,
		    struct expect *e)
{
	cr_assert_leq(n, MOST);
	e->n = n;
	for (size_t k = 0; k < n; k++)
		e->ids[k] = id_of(parents[k]);
	atomic_init(&e->runs, 0);
	atomic_init(&e->wrong, 0);
	adg_step step = {.backward = expect_backward, .user = e};
	adg_node *out = NULL;
	cr_assert_eq(adg_op(r, parents, n, &step, &out), 0);
	return out;
}

static double grad_of(adg_grads *g, uint64_t id)
{
	void *v = NULL;
	cr_assert_eq(adg_grads_get(g, id, &v), 0, "no gradient for %llu",
		     (unsigned long long)id);
	return *(double *)v;
}

/*
 * The graph: leaves a, b, c; u = f(a, b) and w = f(u, c); then, for each
 * of `wide` roots' parents, `width` slots cycling through a, u, b, w, c, u,
 * a, ... (leaves and ops mixed, each repeated); root = f(x_0, ...). Each
 * x_i's step gives 1 per slot; so a's gradient is computable (below).
 */
struct wide {
	adg_registry *r;
	adg_node *a, *b, *c, *u, *w, *root, *x[4];
	struct expect eu, ew, ex[4], eroot;
	size_t width, n_x;
};

static void wide_build(struct wide *g, size_t width, size_t n_x,
		       const adg_registry_options *ro)
{
	g->width = width;
	g->n_x = n_x;
	cr_assert_eq(adg_registry_new(ro, &g->r), 0);
	cr_assert_eq(adg_leaf(g->r, &g->a), 0);
	cr_assert_eq(adg_leaf(g->r, &g->b), 0);
	cr_assert_eq(adg_leaf(g->r, &g->c), 0);
	adg_node *p[MOST] = {g->a, g->b};
	g->u = op(g->r, p, 2, &g->eu);
	p[0] = g->u;
	p[1] = g->c;
	g->w = op(g->r, p, 2, &g->ew);
	adg_node *cycle[] = {g->a, g->u, g->b, g->w, g->c, g->u, g->a};
	for (size_t i = 0; i < n_x; i++) {
		for (size_t k = 0; k < width; k++)
			p[k] = cycle[(k + i) % 7];
		g->x[i] = op(g->r, p, width, &g->ex[i]);
	}
	g->root = op(g->r, g->x, n_x, &g->eroot);
}

/* Every x_i's slot k names cycle[(k + i) % 7]: how many name each. */
static void wide_counts(const struct wide *g, double count[7])
{
	for (int j = 0; j < 7; j++)
		count[j] = 0;
	for (size_t i = 0; i < g->n_x; i++)
		for (size_t k = 0; k < g->width; k++)
			count[(k + i) % 7] += 1;
}

static void wide_check(struct wide *g, adg_grads *grads, int runs)
{
	cr_assert_eq(atomic_load(&g->eroot.runs), runs);
	cr_assert_eq(atomic_load(&g->eroot.wrong), 0);
	for (size_t i = 0; i < g->n_x; i++) {
		cr_assert_eq(atomic_load(&g->ex[i].runs), runs);
		cr_assert_eq(atomic_load(&g->ex[i].wrong), 0,
			     "x_%zu saw wrong parent ids", i);
	}
	cr_assert_eq(atomic_load(&g->eu.wrong), 0);
	cr_assert_eq(atomic_load(&g->ew.wrong), 0);
	double n[7];
	wide_counts(g, n);
	/* Slots: a 0 and 6, u 1 and 5, b 2, w 3, c 4. */
	double gw = n[3], gu = n[1] + n[5] + gw;
	/* An op's gradient went to its step; the leaves' are left. */
	cr_assert_eq(grad_of(grads, id_of(g->a)), n[0] + n[6] + gu);
	cr_assert_eq(grad_of(grads, id_of(g->b)), n[2] + gu);
	cr_assert_eq(grad_of(grads, id_of(g->c)), n[4] + gw);
}

static void wide_free(struct wide *g)
{
	adg_node_unref(g->root);
	for (size_t i = 0; i < g->n_x; i++)
		adg_node_unref(g->x[i]);
	adg_node_unref(g->w);
	adg_node_unref(g->u);
	adg_node_unref(g->a);
	adg_node_unref(g->b);
	adg_node_unref(g->c);
	cr_assert_eq(adg_registry_free(g->r), 0);
}

static void wide_run(size_t width, size_t n_x, unsigned workers, int retain)
{
	struct wide g;
	wide_build(&g, width, n_x, NULL);
	adg_pool *pool = NULL;
	adg_executor ex;
	adg_backward_options o = {.size = sizeof o, .retain = retain};
	if (workers > 0) {
		cr_assert_eq(adg_pool_new(workers, &pool), 0);
		cr_assert_eq(adg_pool_executor(pool, &ex), 0);
		o.executor = &ex;
	}
	int runs = retain ? 2 : 1;
	for (int i = 0; i < runs; i++) {
		adg_grads *grads = NULL;
		cr_assert_eq(adg_backward_with(g.r, g.root, dbl(1), &dbl_ops,
					       &o, &grads),
			     0);
		wide_check(&g, grads, i + 1);
		cr_assert_eq(adg_grads_free(grads), 0);
	}
	if (retain) { /* and consumed after */
		adg_grads *grads = NULL;
		o.retain = 0;
		cr_assert_eq(adg_backward_with(g.r, g.root, dbl(1), &dbl_ops,
					       &o, &grads),
			     0);
		wide_check(&g, grads, runs + 1);
		cr_assert_eq(adg_grads_free(grads), 0);
	}
	wide_free(&g);
	if (pool != NULL)
		cr_assert_eq(adg_pool_free(pool), 0);
}

/* A few parents: the inline array. */
Test(slots, mixed_and_repeated_inline)
{
	wide_run(7, 2, 0, 0);
	wide_run(8, 3, 0, 0);
}

/* More than 8: the tape's scratch, on one thread. */
Test(slots, wide_sequential)
{
	wide_run(MOST, 4, 0, 0);
}

/* Each worker its own scratch: four wide steps may run at once. */
Test(slots, wide_executor)
{
	wide_run(9, 4, 3, 0);
	wide_run(MOST, 4, 3, 0);
}

Test(slots, wide_retained)
{
	wide_run(MOST, 4, 0, 1);
	wide_run(MOST, 4, 3, 1);
}

/* What a visitor sees: the same ids, and leaves told from ops. */
struct visited {
	int found;
	size_t n;
	uint64_t ids[MOST];
	uint8_t kinds[MOST];
	uint64_t want;
};

static int visit_record(const adg_graph_node *node, void *ctx)
{
	struct visited *v = ctx;
	if (node->id != v->want)
		return 0;
	v->found++;
	v->n = node->n_parents;
	for (size_t k = 0; k < node->n_parents && k < MOST; k++) {
		v->ids[k] = node->parent_ids[k];
		v->kinds[k] = node->parent_kinds[k];
	}
	return 0;
}

Test(slots, visitor_ids)
{
	struct wide g;
	wide_build(&g, MOST, 2, NULL);
	for (size_t i = 0; i < 2; i++) {
		struct visited v = {.want = id_of(g.x[i])};
		cr_assert_eq(adg_graph_visit(g.root, visit_record, &v), 0);
		cr_assert_eq(v.found, 1);
		cr_assert_eq(v.n, MOST);
		for (size_t k = 0; k < MOST; k++) {
			cr_assert_eq(v.ids[k], g.ex[i].ids[k]);
			bool leaf = v.ids[k] == id_of(g.a) ||
				    v.ids[k] == id_of(g.b) ||
				    v.ids[k] == id_of(g.c);
			cr_assert_eq(v.kinds[k],
				     leaf ? ADG_PARENT_LEAF : ADG_PARENT_OP);
		}
	}
	wide_free(&g);
}

/* The encoding at the ends of the id range; and a registry that asks for
 * more than ADG_ID_MAX gets it capped (ids hand out as before). */
Test(slots, ids_near_max)
{
	cr_assert_eq(ADG_ID_MAX, (uint64_t)INT64_MAX);
	uint64_t ids[] = {1, 2, ADG_ID_MAX - 1, ADG_ID_MAX};
	for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
		struct adg_node leaf = {.id = ids[i], .n_parents = 0};
		uint64_t word = adg_parent_word(&leaf);
		cr_assert_null(adg_parent_node(word));
		cr_assert_eq(adg_parent_id(word), ids[i]);
		struct adg_node *opn = aligned_alloc(8, adg_node_size(1));
		cr_assert_not_null(opn);
		*opn = (struct adg_node){.id = ids[i], .n_parents = 1};
		word = adg_parent_word(opn);
		cr_assert_eq(adg_parent_node(word), opn);
		cr_assert_eq(adg_parent_id(word), ids[i]);
		free(opn);
	}
	adg_registry_options ro = {.size = sizeof ro,
				   .max_node_id = UINT64_MAX};
	struct wide g;
	wide_build(&g, 10, 2, &ro);
	adg_grads *grads = NULL;
	cr_assert_eq(adg_backward(g.r, g.root, dbl(1), &dbl_ops, &grads), 0);
	wide_check(&g, grads, 1);
	cr_assert_eq(adg_grads_free(grads), 0);
	wide_free(&g);
	/* The last id a registry may give: max_node_id's, then ENOIDS. */
	adg_registry *r = NULL;
	ro.max_node_id = 2;
	cr_assert_eq(adg_registry_new(&ro, &r), 0);
	adg_node *l1 = NULL, *l2 = NULL, *l3 = NULL;
	cr_assert_eq(adg_leaf(r, &l1), 0);
	cr_assert_eq(adg_leaf(r, &l2), 0);
	cr_assert_eq(adg_leaf(r, &l3), ADG_ENOIDS);
	cr_assert_null(l3);
	adg_node_unref(l1);
	adg_node_unref(l2);
	cr_assert_eq(adg_registry_free(r), 0);
}

/* An allocator that fails its Nth call once armed. */
static struct {
	atomic_long seen, fail_at; /* fail_at 0: none */
	atomic_bool failed;
} oom;

static void *oom_alloc(size_t size, void *ctx)
{
	(void)ctx;
	long at = atomic_load(&oom.fail_at);
	if (at != 0 && atomic_fetch_add(&oom.seen, 1) + 1 == at) {
		atomic_store(&oom.failed, true);
		return NULL;
	}
	return malloc(size);
}

static void oom_free(void *p, size_t size, void *ctx)
{
	(void)size;
	(void)ctx;
	free(p);
}

/* Each allocation of a backward over wide steps fails in turn (the
 * scratch for their ids among them): ADG_ENOMEM, nothing changed, and the
 * same backward then runs as if nothing had failed. */
static void oom_run(unsigned workers)
{
	adg_registry_options ro = {.size = sizeof ro,
				   .allocator = {oom_alloc, oom_free, NULL}};
	adg_pool *pool = NULL;
	adg_executor ex;
	adg_backward_options o = {.size = sizeof o};
	if (workers > 0) {
		cr_assert_eq(adg_pool_new(workers, &pool), 0);
		cr_assert_eq(adg_pool_executor(pool, &ex), 0);
		o.executor = &ex;
	}
	long n = 1;
	for (;; n++) {
		struct wide g;
		wide_build(&g, MOST, 3, &ro);
		atomic_store(&oom.seen, 0);
		atomic_store(&oom.failed, false);
		atomic_store(&oom.fail_at, n);
		adg_grads *grads = NULL;
		int rc = adg_backward_with(g.r, g.root, dbl(1), &dbl_ops, &o,
					   &grads);
		atomic_store(&oom.fail_at, 0);
		bool failed = atomic_load(&oom.failed);
		if (rc == 0) {
			/* Or absorbed: a worker's shard that could not be
			 * made falls back to the shared one. */
			wide_check(&g, grads, 1);
			cr_assert_eq(adg_grads_free(grads), 0);
			wide_free(&g);
			if (!failed)
				break;
			continue;
		}
		cr_assert_eq(rc, ADG_ENOMEM, "N=%ld: %s", n, adg_strerror(rc));
		cr_assert_null(grads);
		cr_assert_eq(atomic_load(&g.eroot.runs), 0, "N=%ld", n);
		/* Nothing was taken: the same backward runs in full. */
		cr_assert_eq(adg_backward_with(g.r, g.root, dbl(1), &dbl_ops,
					       &o, &grads),
			     0, "N=%ld: the retry failed", n);
		wide_check(&g, grads, 1);
		cr_assert_eq(adg_grads_free(grads), 0);
		wide_free(&g);
	}
	cr_assert_gt(n, 1);
	if (pool != NULL)
		cr_assert_eq(adg_pool_free(pool), 0);
}

Test(slots, oom_sequential)
{
	oom_run(0);
}
Test(slots, oom_executor)
{
	oom_run(3);
}
