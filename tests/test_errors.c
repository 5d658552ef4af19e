/* 9. Every error code, on bad input to every public function; and on
 * allocation failure the registry is left as it was. */
#include "fixture.h"

#include <stdio.h>
#include <string.h>

static int noop_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static const adg_step noop = {
	.backward = noop_backward, .release = NULL, .user = NULL};

Test(errors, strerror_names_every_code)
{
	/* Every code of the table: a new one is tested without an edit. */
#define CODE(name, value, message) ADG_##name,
	const int codes[] = {ADG_ERROR_MAP(CODE)};
#undef CODE
	const size_t n = sizeof codes / sizeof *codes;
	cr_assert_eq(n, 13, "ADG_OK and the twelve error codes");
	for (size_t i = 0; i < n; i++) {
		const char *s = adg_strerror(codes[i]);
		cr_assert_not_null(s);
		cr_expect_str_neq(s, "unknown error", "code %d", codes[i]);
		cr_expect_eq(codes[i], -(int)i, "codes are 0, -1, -2, ...");
		for (size_t k = 0; k < i; k++)
			cr_expect_str_neq(s, adg_strerror(codes[k]));
	}
	cr_expect_str_eq(adg_strerror(ADG_ENOMEM), "out of memory");
	cr_expect_str_eq(adg_strerror(ADG_EUSER), "unknown error");
	cr_expect_str_eq(adg_strerror(1), "unknown error");
}

Test(errors, error_name_spells_the_enum)
{
#define NAMED(name, value, message)                                            \
	cr_expect_str_eq(adg_error_name(ADG_##name), "ADG_" #name);
	ADG_ERROR_MAP(NAMED)
#undef NAMED
	cr_expect_str_eq(adg_error_name(ADG_EUNAVAILABLE), "ADG_EUNAVAILABLE");
	cr_expect_str_eq(adg_error_name(ADG_EUSER), "ADG_UNKNOWN");
	cr_expect_str_eq(adg_error_name(7), "ADG_UNKNOWN");
}

Test(errors, version_matches_the_header)
{
	char want[32];
	snprintf(want, sizeof want, "%d.%d.%d", ADG_VERSION_MAJOR,
		 ADG_VERSION_MINOR, ADG_VERSION_PATCH);
	cr_expect_str_eq(adg_version(), want);
}

Test(errors, registry_new_and_free)
{
	adg_registry *r;
	cr_expect_eq(adg_registry_new(NULL, NULL), ADG_EINVAL);
	failing_alloc fa = {0};
	adg_registry_options half = {.size = sizeof half,
				     .allocator = failing_allocator(&fa)};
	half.allocator.free = NULL;
	r = (adg_registry *)&r;
	cr_expect_eq(adg_registry_new(&half, &r), ADG_EINVAL);
	cr_expect_null(r);
	cr_expect_eq(adg_registry_free(NULL), 0);

	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	adg_node *n;
	cr_assert_eq(adg_leaf(r, &n), 0);
	cr_expect_eq(adg_registry_free(r), ADG_EBUSY);
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(r, &st), 0,
		     "a busy registry is left intact");
	cr_expect_eq(st.live_nodes, 1);
	adg_node_unref(n);
	cr_expect_eq(adg_registry_free(r), 0);
}

Test(errors, stats)
{
	adg_registry *r;
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_expect_eq(adg_registry_stats(NULL, &st), ADG_EINVAL);
	cr_expect_eq(adg_registry_stats(r, NULL), ADG_EINVAL);
	adg_registry_free(r);
}

Test(errors, leaf)
{
	adg_registry *r;
	adg_node *n = (adg_node *)&n;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_expect_eq(adg_leaf(NULL, &n), ADG_EINVAL);
	cr_expect_null(n);
	cr_expect_eq(adg_leaf(r, NULL), ADG_EINVAL);
	adg_registry_free(r);
}

Test(errors, op_bad_arguments)
{
	adg_registry *r, *other;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	adg_node *a, *b, *foreign, *out = (adg_node *)&out;
	cr_assert_eq(adg_leaf(r, &a), 0);
	cr_assert_eq(adg_leaf(r, &b), 0);
	cr_assert_eq(adg_leaf(other, &foreign), 0);
	adg_node *pair[2] = {a, b};
	adg_node *with_null[2] = {a, NULL};
	adg_node *mixed[2] = {a, foreign};
	adg_step no_backward = {
		.backward = NULL, .release = NULL, .user = NULL};

	cr_expect_eq(adg_op(NULL, pair, 2, &noop, &out), ADG_EINVAL);
	cr_expect_null(out);
	cr_expect_eq(adg_op(r, NULL, 2, &noop, &out), ADG_EINVAL);
	cr_expect_eq(adg_op(r, pair, 0, &noop, &out), ADG_EINVAL);
	cr_expect_eq(adg_op(r, pair, 2, NULL, &out), ADG_EINVAL);
	cr_expect_eq(adg_op(r, pair, 2, &no_backward, &out), ADG_EINVAL);
	cr_expect_eq(adg_op(r, pair, 2, &noop, NULL), ADG_EINVAL);
	cr_expect_eq(adg_op(r, with_null, 2, &noop, &out), ADG_EINVAL);
	cr_expect_eq(adg_op(r, mixed, 2, &noop, &out), ADG_EFOREIGN);
	cr_expect_null(out);
	cr_expect_eq(adg_op(other, pair, 2, &noop, &out), ADG_EFOREIGN);
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(r, &st);
	cr_expect_eq(st.live_nodes, 2, "failed ops created nothing");
	cr_expect_eq(st.live_steps, 0);
	cr_expect_eq(st.live_graphs, 0);

	adg_node_unref(a);
	adg_node_unref(b);
	adg_node_unref(foreign);
	cr_expect_eq(adg_registry_free(r), 0);
	cr_expect_eq(adg_registry_free(other), 0);
}

Test(errors, node_functions)
{
	uint64_t id;
	cr_expect_eq(adg_node_ref(NULL), ADG_EINVAL);
	cr_expect_eq(adg_node_unref(NULL), ADG_EINVAL);
	cr_expect_eq(adg_node_id(NULL, &id), ADG_EINVAL);
	cr_expect_eq(adg_node_graph_id(NULL, &id), ADG_EINVAL);
	adg_registry *r;
	adg_node *a;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_assert_eq(adg_leaf(r, &a), 0);
	cr_expect_eq(adg_node_id(a, NULL), ADG_EINVAL);
	cr_expect_eq(adg_node_graph_id(a, NULL), ADG_EINVAL);
	cr_expect_eq(adg_node_id(a, &id), 0);
	cr_expect_eq(id, 1, "ids start at 1");
	adg_node_unref(a);
	adg_registry_free(r);
}

Test(errors, ids_run_out)
{
	adg_registry *r;
	adg_registry_options o = {.size = sizeof o, .max_node_id = 3};
	cr_assert_eq(adg_registry_new(&o, &r), 0);
	adg_node *a, *b, *c, *d = (adg_node *)&d;
	cr_assert_eq(adg_leaf(r, &a), 0);
	cr_assert_eq(adg_leaf(r, &b), 0);
	cr_expect_eq(adg_op(r, &a, 1, &noop, &c), 0);
	cr_expect_eq(adg_leaf(r, &d), ADG_ENOIDS);
	cr_expect_null(d);
	cr_expect_eq(adg_op(r, &a, 1, &noop, &d), ADG_ENOIDS);
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(r, &st);
	cr_expect_eq(st.live_nodes, 3);
	cr_expect_eq(st.live_steps, 1);
	adg_node_unref(c);
	adg_node_unref(b);
	adg_node_unref(a);
	cr_expect_eq(adg_registry_free(r), 0);
}

Test(errors, ids_run_out_at_uint64_max)
{
	adg_registry *r;
	adg_registry_options o = {.size = sizeof o, .max_node_id = UINT64_MAX};
	cr_assert_eq(adg_registry_new(&o, &r), 0);
	adg_node *a;
	cr_assert_eq(adg_leaf(r, &a), 0);
	uint64_t id;
	adg_node_id(a, &id);
	cr_expect_eq(id, 1);
	adg_node_unref(a);
	adg_registry_free(r);
}

static void free_only(void *value, void *ctx)
{
	(void)ctx;
	scalar_ops.free(value, NULL);
}

Test(errors, backward_bad_arguments)
{
	atomic_store(&scalar_values_live, 0);
	adg_registry *r, *other;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	adg_node *a, *y;
	cr_assert_eq(adg_leaf(r, &a), 0);
	cr_assert_eq(adg_op(r, &a, 1, &noop, &y), 0);
	adg_grads *g = (adg_grads *)&g;
	adg_grad_ops no_add = {NULL, free_only, NULL};
	adg_grad_ops no_free = {scalar_ops.add, NULL, NULL};

	/* Without usable ops the seed stays the caller's. */
	double *seed = scalar_box(1);
	cr_expect_eq(adg_backward(r, y, seed, NULL, &g), ADG_EINVAL);
	cr_expect_null(g);
	cr_expect_eq(adg_backward(r, y, seed, &no_add, &g), ADG_EINVAL);
	cr_expect_eq(adg_backward(r, y, seed, &no_free, &g), ADG_EINVAL);
	cr_expect_eq(atomic_load(&scalar_values_live), 1);
	/* Otherwise it is freed on error. */
	cr_expect_eq(adg_backward(NULL, y, seed, &scalar_ops, &g), ADG_EINVAL);
	cr_expect_eq(adg_backward(r, NULL, scalar_box(1), &scalar_ops, &g),
		     ADG_EINVAL);
	cr_expect_eq(adg_backward(r, y, NULL, &scalar_ops, &g), ADG_EINVAL);
	cr_expect_eq(adg_backward(r, y, scalar_box(1), &scalar_ops, NULL),
		     ADG_EINVAL);
	cr_expect_eq(adg_backward(other, y, scalar_box(1), &scalar_ops, &g),
		     ADG_EFOREIGN);
	cr_expect_eq(adg_backward(other, a, scalar_box(1), &scalar_ops, &g),
		     ADG_EFOREIGN);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(r, &st);
	cr_expect_eq(st.live_steps, 1, "nothing was taken");

	cr_expect_eq(adg_backward(r, y, scalar_box(1), &scalar_ops, &g), 0);
	adg_grads_free(g);
	cr_expect_eq(adg_backward(r, y, scalar_box(1), &scalar_ops, &g),
		     ADG_ECONSUMED);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	adg_node_unref(y);
	adg_node_unref(a);
	adg_registry_free(r);
	adg_registry_free(other);
}

/* What adg_callback_site answered a step's release: a release's failure
 * is no backward's. */
static int release_site_rc;

static void site_release(void *user)
{
	adg_failure *where = user;
	release_site_rc = adg_callback_site(where);
}

static int site_noop(adg_step_call *call, void *user)
{
	(void)call;
	return adg_callback_site(user); /* 0: a step is a site */
}

Test(errors, callback_site_outside_a_callback)
{
	adg_failure where, junk;
	memset(&junk, 0x5a, sizeof junk);
	junk.size = sizeof junk;
	where = junk;
	cr_expect_eq(adg_callback_site(NULL), ADG_EINVAL);
	cr_expect_eq(adg_callback_site(&where), ADG_EINVAL, "no backward");
	cr_expect_eq(memcmp(&where, &junk, sizeof where), 0, "untouched");

	adg_registry *r;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	adg_node *a, *y;
	cr_assert_eq(adg_leaf(r, &a), 0);
	adg_step step = {
		.backward = site_noop, .release = site_release, .user = &where};
	cr_assert_eq(adg_op(r, &a, 1, &step, &y), 0);
	adg_grads *g;
	release_site_rc = 1;
	cr_expect_eq(adg_backward(r, y, scalar_box(1), &scalar_ops, &g), 0);
	cr_expect_eq(release_site_rc, ADG_EINVAL, "in the release");
	cr_expect_eq(where.site, ADG_FAILED_STEP, "in the step");
	where = junk;
	cr_expect_eq(adg_callback_site(&where), ADG_EINVAL, "after it");
	cr_expect_eq(memcmp(&where, &junk, sizeof where), 0, "untouched");
	adg_grads_free(g);
	adg_node_unref(y);
	adg_node_unref(a);
	cr_expect_eq(adg_registry_free(r), 0);
}

static int positive_add(void **sum, void *value, void *ctx)
{
	(void)sum;
	(void)ctx;
	scalar_ops.free(value, NULL);
	return 5;
}

Test(errors, grads_functions)
{
	atomic_store(&scalar_values_live, 0);
	void *v = &v;
	size_t n;
	cr_expect_eq(adg_grads_get(NULL, 1, &v), ADG_EINVAL);
	cr_expect_null(v);
	cr_expect_eq(adg_grads_take(NULL, 1, &v), ADG_EINVAL);
	cr_expect_eq(adg_grads_register(NULL, 1, &v), ADG_EINVAL);
	cr_expect_eq(adg_grads_count(NULL, &n), ADG_EINVAL);
	cr_expect_eq(adg_grads_free(NULL), 0);

	adg_registry *r;
	adg_node *a;
	adg_grads *g;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_assert_eq(adg_leaf(r, &a), 0);
	adg_grad_ops ops = scalar_ops;
	ops.add = positive_add;
	cr_assert_eq(adg_backward(r, a, scalar_box(1), &ops, &g), 0);
	cr_expect_eq(adg_grads_get(g, 1, NULL), ADG_EINVAL);
	cr_expect_eq(adg_grads_get(g, 0, &v), ADG_EINVAL);
	cr_expect_eq(adg_grads_get(g, 99, &v), ADG_ENOTFOUND);
	cr_expect_eq(adg_grads_take(g, 1, NULL), ADG_EINVAL);
	cr_expect_eq(adg_grads_take(g, 0, &v), ADG_EINVAL);
	cr_expect_eq(adg_grads_take(g, 99, &v), ADG_ENOTFOUND);
	cr_expect_eq(adg_grads_register(g, 5, NULL), ADG_EINVAL);
	cr_expect_eq(adg_grads_register(g, 0, scalar_box(1)), ADG_EINVAL);
	cr_expect_eq(adg_grads_count(g, NULL), ADG_EINVAL);
	cr_expect_eq(adg_grads_register(g, 1, scalar_box(1)), ADG_ECALLBACK);
	cr_expect_eq(adg_grads_count(g, &n), 0);
	cr_expect_eq(n, 1);
	cr_expect_eq(atomic_load(&scalar_values_live), 1,
		     "rejected values were freed");
	adg_grads_free(g);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	adg_node_unref(a);
	adg_registry_free(r);
}

/* ENOMEM: fail each allocation of an operation in turn; each failure
 * reports ADG_ENOMEM and leaves the counts as they were, and the
 * operation then succeeds. */
static void with_failing_registry(void)
{
	adg_registry_options o = {.size = sizeof o,
				  .allocator =
					  failing_allocator(&fixture_alloc)};
	fixture_open(&o);
}

TestSuite(nomem, .init = with_failing_registry);

static void expect_same_stats(const struct adg_stats *a,
			      const struct adg_stats *b)
{
	cr_expect_eq(a->live_nodes, b->live_nodes);
	cr_expect_eq(a->live_steps, b->live_steps);
	cr_expect_eq(a->live_graphs, b->live_graphs);
	cr_expect_eq(a->merges, b->merges);
	cr_expect_eq(a->nodes_freed, b->nodes_freed);
}

CHECKED_TEST(nomem, leaf_and_op)
{
	adg_node *a, *b;
	atomic_store(&fixture_alloc.fail_in, 1);
	cr_expect_eq(adg_leaf(reg, &a), ADG_ENOMEM);
	cr_assert_eq(adg_leaf(reg, &a), 0);
	cr_assert_eq(adg_leaf(reg, &b), 0);
	adg_node *ab[2] = {a, b};
	adg_node *x, *y, *z;
	/* A new graph: node, then graph. */
	for (int k = 1;; k++) {
		struct adg_stats before = {.size = sizeof before},
				 after = {.size = sizeof after};
		adg_registry_stats(reg, &before);
		atomic_store(&fixture_alloc.fail_in, k);
		int rc = adg_op(reg, ab, 2, &noop, &x);
		atomic_store(&fixture_alloc.fail_in, 0);
		if (rc == 0)
			break;
		cr_assert_eq(rc, ADG_ENOMEM);
		adg_registry_stats(reg, &after);
		expect_same_stats(&before, &after);
		cr_assert_lt(k, 10);
	}
	cr_assert_eq(adg_op(reg, ab, 2, &noop, &y), 0);
	/* A merge needs no allocation beyond the node's: a node of a size
	 * with no slab yet (three parents) fails, and nothing merges... */
	adg_node *xyx[3] = {x, y, x};
	atomic_store(&fixture_alloc.fail_in, 1);
	cr_expect_eq(adg_op(reg, xyx, 3, &noop, &z), ADG_ENOMEM);
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(reg, &st);
	cr_expect_eq(st.merges, 0);
	cr_expect_eq(st.live_graphs, 2);
	/* ...and one whose slab has room (x's and y's) allocates nothing. */
	adg_node *xy[2] = {x, y};
	atomic_store(&fixture_alloc.fail_in, 1);
	cr_assert_eq(adg_op(reg, xy, 2, &noop, &z), 0);
	atomic_store(&fixture_alloc.fail_in, 0);
	adg_registry_stats(reg, &st);
	cr_expect_eq(st.merges, 1);
	/* Many parents (more than fit on the stack) use the allocator. */
	adg_node *many[20];
	for (int i = 0; i < 20; i++)
		many[i] = i % 2 ? x : z;
	adg_node *w;
	int failures = 0;
	for (int k = 1;; k++) {
		atomic_store(&fixture_alloc.fail_in, k);
		int rc = adg_op(reg, many, 20, &noop, &w);
		atomic_store(&fixture_alloc.fail_in, 0);
		if (rc == 0)
			break;
		cr_assert_eq(rc, ADG_ENOMEM);
		failures++;
	}
	cr_expect_eq(failures, 2, "node, then the parents' graph set");
	adg_node *all[] = {a, b, x, y, z, w};
	for (int i = 0; i < 6; i++)
		adg_node_unref(all[i]);
}

CHECKED_TEST(nomem, backward_takes_nothing_when_it_fails)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = s_mul(reg, a, b), y = s_mul(reg, x, a);
	struct adg_stats before = {.size = sizeof before},
			 after = {.size = sizeof after};
	adg_registry_stats(reg, &before);
	atomic_store(&fixture_alloc.fail_in, 1);
	adg_grads *g = (adg_grads *)&g;
	cr_expect_eq(s_backward(reg, y, &g), ADG_ENOMEM);
	cr_expect_null(g);
	adg_registry_stats(reg, &after);
	expect_same_stats(&before, &after);
	cr_expect_eq(atomic_load(&scalar_values_live), 0, "seed freed");
	cr_expect_neq(s_graph(y), 0, "the tape went back");
	cr_assert_eq(s_backward(reg, y, &g), 0);
	cr_expect_eq(s_grad(g, a), 12.0);
	adg_grads_free(g);
	/* A leaf root needs a container too. */
	atomic_store(&fixture_alloc.fail_in, 1);
	cr_expect_eq(s_backward(reg, a, &g), ADG_ENOMEM);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	scalar all[] = {a, b, x, y};
	for (int i = 0; i < 4; i++)
		s_drop(all[i]);
}

CHECKED_TEST(nomem, grads_growth)
{
	scalar a = s_leaf(reg, 2);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, a, &g), 0);
	int failed = 0;
	for (uint64_t id = 100; id < 200; id++) {
		atomic_store(&fixture_alloc.fail_in, 1);
		int rc = adg_grads_register(g, id, scalar_box(1));
		atomic_store(&fixture_alloc.fail_in, 0);
		if (rc == ADG_ENOMEM) {
			failed++;
			cr_assert_eq(adg_grads_register(g, id, scalar_box(1)),
				     0);
		} else {
			cr_assert_eq(rc, 0);
		}
	}
	cr_expect_gt(failed, 0, "growing the table allocates");
	size_t n;
	adg_grads_count(g, &n);
	cr_expect_eq(n, 101);
	adg_grads_free(g);
	s_drop(a);
}

/* A failing add inside a step ends the backward with its code. */
static int failing_add(void **sum, void *value, void *ctx)
{
	(void)sum;
	(void)ctx;
	scalar_ops.free(value, NULL);
	return ADG_EUSER - 1;
}

CHECKED_TEST(nomem, add_failure_in_a_step_stops_the_backward)
{
	scalar a = s_leaf(reg, 2);
	scalar y = s_mul(reg, a, a);
	adg_grad_ops ops = scalar_ops;
	ops.add = failing_add;
	adg_grads *g;
	cr_expect_eq(adg_backward(reg, y.node, scalar_box(1), &ops, &g),
		     ADG_EUSER - 1);
	cr_expect_eq(atomic_load(&scalar_values_live), 0);
	cr_expect_eq(atomic_load(&scalar_steps_live), 0);
	s_drop(y);
	s_drop(a);
}
