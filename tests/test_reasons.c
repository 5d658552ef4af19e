/* Every error's reason (adg_errmsg): for each ADG_EINVAL path of every
 * public function, and the other codes' where they are reached, the reason
 * names the function, the argument and what was wrong; a success does not
 * clear it, and each thread reads its own. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <string.h>

/* rc is code, and the thread's reason begins with "func: " and holds each
 * of the NULL-ended words. */
static void expect_reason_at(int line, int rc, int code, const char *func, ...)
{
	const char *why = adg_errmsg();
	cr_expect_eq(rc, code, "line %d: %s returned %d (%s), not %d", line,
		     func, rc, why, code);
	size_t n = strlen(func);
	cr_expect(strncmp(why, func, n) == 0 && why[n] == ':',
		  "line %d: reason \"%s\" does not name %s", line, why, func);
	va_list ap;
	va_start(ap, func);
	for (const char *w = va_arg(ap, const char *); w != NULL;
	     w = va_arg(ap, const char *))
		cr_expect(strstr(why, w) != NULL,
			  "line %d: reason \"%s\" lacks \"%s\"", line, why, w);
	va_end(ap);
}

#define EXPECT_REASON(rc, code, func, ...)                                     \
	expect_reason_at(__LINE__, (rc), (code), (func), __VA_ARGS__, NULL)

static int noop_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static const adg_step noop = {.backward = noop_backward, .name = "noop"};

static void free_only(void *value, void *ctx)
{
	(void)ctx;
	scalar_ops.free(value, NULL);
}

/* ------------------------------------------------------------ registry */

Test(reasons, none_before_the_first_error)
{
	/* Each test runs in a process of its own: nothing failed here. */
	cr_expect_str_eq(adg_errmsg(), "");
	cr_expect_str_eq(adg_strerror(ADG_EUSER), "unknown error");
	cr_expect_str_eq(adg_errmsg(), "", "adg_strerror writes none");
}

Test(reasons, registry)
{
	adg_registry *r;
	EXPECT_REASON(adg_registry_new(NULL, NULL), ADG_EINVAL,
		      "adg_registry_new", "out is NULL");
	failing_alloc fa = {0};
	adg_registry_options o = {.size = sizeof o,
				  .allocator = failing_allocator(&fa)};
	o.allocator.free = NULL;
	EXPECT_REASON(adg_registry_new(&o, &r), ADG_EINVAL, "adg_registry_new",
		      "options->allocator", "alloc without free");
	o = (adg_registry_options){.size = sizeof(adg_registry_options),
				   .checkpointing = 7};
	EXPECT_REASON(adg_registry_new(&o, &r), ADG_EINVAL, "adg_registry_new",
		      "options->checkpointing 7");
	adg_grad_ops no_add = {NULL, free_only, NULL};
	adg_grad_ops no_free = {scalar_ops.add, NULL, NULL};
	o = (adg_registry_options){.size = sizeof(adg_registry_options),
				   .grad_ops = &no_add};
	EXPECT_REASON(adg_registry_new(&o, &r), ADG_EINVAL, "adg_registry_new",
		      "options->grad_ops has no add");
	o.grad_ops = &no_free;
	EXPECT_REASON(adg_registry_new(&o, &r), ADG_EINVAL, "adg_registry_new",
		      "options->grad_ops has no free");
	o = (adg_registry_options){.size = sizeof(adg_registry_options),
				   .allocator = failing_allocator(&fa)};
	atomic_store(&fa.fail_in, 1);
	EXPECT_REASON(adg_registry_new(&o, &r), ADG_ENOMEM, "adg_registry_new",
		      "no memory for the registry");

	adg_allocator a;
	struct adg_stats st = {.size = sizeof st};
	EXPECT_REASON(adg_registry_allocator(NULL, &a), ADG_EINVAL,
		      "adg_registry_allocator", "registry is NULL");
	EXPECT_REASON(adg_registry_stats(NULL, &st), ADG_EINVAL,
		      "adg_registry_stats", "registry is NULL");
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	EXPECT_REASON(adg_registry_allocator(r, NULL), ADG_EINVAL,
		      "adg_registry_allocator", "out is NULL");
	EXPECT_REASON(adg_registry_stats(r, NULL), ADG_EINVAL,
		      "adg_registry_stats", "out is NULL");
	adg_node *n;
	cr_assert_eq(adg_leaf(r, &n), 0);
	EXPECT_REASON(adg_registry_free(r), ADG_EBUSY, "adg_registry_free",
		      "1 nodes still live");
	adg_node_unref(n);
	cr_expect_eq(adg_registry_free(r), 0);
}

/* ---------------------------------------------------------------- nodes */

Test(reasons, nodes)
{
	uint64_t id;
	adg_registry *r, *other;
	adg_node *n;
	EXPECT_REASON(adg_leaf(NULL, &n), ADG_EINVAL, "adg_leaf",
		      "registry is NULL");
	EXPECT_REASON(adg_node_ref(NULL), ADG_EINVAL, "adg_node_ref",
		      "node is NULL");
	EXPECT_REASON(adg_node_unref(NULL), ADG_EINVAL, "adg_node_unref",
		      "node is NULL");
	EXPECT_REASON(adg_node_id(NULL, &id), ADG_EINVAL, "adg_node_id",
		      "node is NULL");
	EXPECT_REASON(adg_node_graph_id(NULL, &id), ADG_EINVAL,
		      "adg_node_graph_id", "node is NULL");
	EXPECT_REASON(adg_node_registry(NULL, &r), ADG_EINVAL,
		      "adg_node_registry", "node is NULL");
	adg_registry_options o = {.size = sizeof o, .max_node_id = 1};
	cr_assert_eq(adg_registry_new(&o, &r), 0);
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	EXPECT_REASON(adg_leaf(r, NULL), ADG_EINVAL, "adg_leaf", "out is NULL");
	cr_assert_eq(adg_leaf(r, &n), 0);
	EXPECT_REASON(adg_node_id(n, NULL), ADG_EINVAL, "adg_node_id",
		      "id is NULL");
	EXPECT_REASON(adg_node_graph_id(n, NULL), ADG_EINVAL,
		      "adg_node_graph_id", "graph_id is NULL");
	EXPECT_REASON(adg_node_registry(n, NULL), ADG_EINVAL,
		      "adg_node_registry", "registry is NULL");
	adg_node *m;
	EXPECT_REASON(adg_leaf(r, &m), ADG_ENOIDS, "adg_leaf",
		      "no node id left");

	adg_node *f;
	cr_assert_eq(adg_leaf(other, &f), 0);
	adg_node *pair[2] = {n, n}, *with_null[2] = {n, NULL},
		 *mixed[2] = {n, f};
	adg_step no_backward = {.backward = NULL};
	EXPECT_REASON(adg_op(NULL, pair, 2, &noop, &m), ADG_EINVAL, "adg_op",
		      "registry is NULL");
	EXPECT_REASON(adg_op(r, NULL, 2, &noop, &m), ADG_EINVAL, "adg_op",
		      "parents is NULL");
	EXPECT_REASON(adg_op(r, pair, 2, NULL, &m), ADG_EINVAL, "adg_op",
		      "step is NULL");
	EXPECT_REASON(adg_op(r, pair, 2, &noop, NULL), ADG_EINVAL, "adg_op",
		      "out is NULL");
	EXPECT_REASON(adg_op(r, pair, 0, &noop, &m), ADG_EINVAL, "adg_op",
		      "n_parents is 0");
	/* Refused before any parent is read. */
	EXPECT_REASON(adg_op(r, pair, (size_t)UINT32_MAX + 1, &noop, &m),
		      ADG_EINVAL, "adg_op", "n_parents is 4294967296");
	EXPECT_REASON(adg_op_with(r, pair, 2, &noop, NULL, NULL), ADG_EINVAL,
		      "adg_op_with", "out is NULL");
	EXPECT_REASON(adg_op_moving(NULL, pair, 2, 0, &noop, &m), ADG_EINVAL,
		      "adg_op_moving", "registry is NULL");
	EXPECT_REASON(adg_op(r, pair, 2, &no_backward, &m), ADG_EINVAL,
		      "adg_op", "step->backward is NULL");
	EXPECT_REASON(adg_op(r, with_null, 2, &noop, &m), ADG_EINVAL, "adg_op",
		      "parents[1] is NULL");
	EXPECT_REASON(adg_op(r, mixed, 2, &noop, &m), ADG_EFOREIGN, "adg_op",
		      "parents[1] (node 1) belongs to another registry");
	EXPECT_REASON(adg_op(r, pair, 2, &noop, &m), ADG_ENOIDS, "adg_op",
		      "no node id left");
	EXPECT_REASON(adg_op_moving(r, pair, 2, 4, &noop, &m), ADG_EINVAL,
		      "adg_op_moving", "moved has bit 2 set", "n_parents (2)");
	adg_node_unref(f);
	adg_node_unref(n);
	cr_expect_eq(adg_registry_free(r), 0);
	cr_expect_eq(adg_registry_free(other), 0);
}

/* -------------------------------------------------------- checkpointing */

static void output_free(void *value, void *ctx)
{
	(void)ctx;
	scalar_ops.free(value, NULL);
}

static int rebuild(adg_recompute_call *call, void *user)
{
	(void)user;
	call->output = scalar_box(1);
	return 0;
}

CHECKED_TEST(reasons, op_with, .init = fixture_open_default)
{
	adg_node *x, *plain, *offers, *m;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_op(reg, &x, 1, &noop, &plain), 0);
	adg_output kept = {.value = scalar_box(2), .free = output_free};
	adg_op_options o = {.size = sizeof o, .output = &kept};
	cr_assert_eq(adg_op_with(reg, &x, 1, &noop, &o, &offers), 0);
	adg_node *parents[3] = {x, plain, offers};

	adg_output bad = {.value = &bad};
	o = (adg_op_options){.size = sizeof(adg_op_options), .output = &bad};
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->output has no free");
	bad = (adg_output){.free = output_free};
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with",
		      "options->output has neither value nor recompute");
	o = (adg_op_options){.size = sizeof(adg_op_options), .want_self = 1};
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->want_self",
		      "options->output is NULL");
	o = (adg_op_options){.size = sizeof(adg_op_options),
			     .n_want_parents = 2};
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->want_parents is NULL",
		      "n_want_parents 2");
	uint32_t wants[] = {2, 3, 0, 1};
	o = (adg_op_options){.size = sizeof(adg_op_options),
			     .want_parents = wants,
			     .n_want_parents = (size_t)UINT32_MAX + 1};
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->n_want_parents",
		      "above UINT32_MAX");
	o.n_want_parents = 2;
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->want_parents[1] is 3",
		      "past the last slot (3 parents)");
	o.want_parents = wants + 2;
	o.n_want_parents = 1;
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->want_parents[0] names parent 0",
		      "a leaf, which offers no output");
	o.want_parents = wants + 3;
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with", "options->want_parents[0] names parent 1",
		      "which offers no output");
	adg_output rebuilt = {.free = output_free, .recompute = rebuild};
	o = (adg_op_options){.size = sizeof(adg_op_options),
			     .output = &rebuilt};
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with",
		      "parent 1 (node 2) offers no output to recompute from");
	o.moved = 1; /* moves nothing on error */
	EXPECT_REASON(adg_op_with(reg, parents, 3, &noop, &o, &m), ADG_EINVAL,
		      "adg_op_with",
		      "parent 1 (node 2) offers no output to recompute from");
	adg_node_unref(offers);
	adg_node_unref(plain);
	adg_node_unref(x);
}

/* What output_asker saw: adg_output_get's result and reason, per call. */
struct asked {
	int rc[4];
	char why[4][ADG_ERRMSG_MAX];
	uint64_t self;
};

static void note(struct asked *a, int k, int rc)
{
	a->rc[k] = rc;
	strcpy(a->why[k], adg_errmsg());
}

static int output_asker(adg_step_call *call, void *user)
{
	struct asked *a = user;
	void *v;
	note(a, 0, adg_output_get(NULL, call->node_id, &v));
	note(a, 1, adg_output_get(call, call->node_id, NULL));
	note(a, 2, adg_output_get(call, call->node_id, &v));
	adg_step_call fake = *call;
	fake.context = NULL;
	note(a, 3, adg_output_get(&fake, call->node_id, &v));
	return 0;
}

CHECKED_TEST(reasons, output_get, .init = fixture_open_default)
{
	struct asked a = {0};
	adg_step step = {.backward = output_asker, .user = &a};
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_op(reg, &x, 1, &step, &y), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g), 0);
	adg_grads_free(g);
	const char *want[] = {"adg_output_get: call is NULL",
			      "adg_output_get: value is NULL",
			      "adg_output_get: node 2 asked for no output",
			      "adg_output_get: call is not a step's"};
	for (int k = 0; k < 4; k++) {
		cr_expect_eq(a.rc[k], ADG_EINVAL);
		cr_expect(strstr(a.why[k], want[k]) == a.why[k], "%s: %s",
			  want[k], a.why[k]);
	}
	adg_node_unref(y);

	/* An output the step did not ask for. */
	adg_output kept = {.value = scalar_box(2), .free = output_free};
	adg_op_options o = {.size = sizeof o, .output = &kept};
	cr_assert_eq(adg_op_with(reg, &x, 1, &step, &o, &y), 0);
	cr_assert_eq(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g), 0);
	adg_grads_free(g);
	cr_expect_eq(a.rc[2], ADG_EINVAL);
	cr_expect(strstr(a.why[2], "id 3 is not an output node 3's step "
				   "asked for") != NULL,
		  "%s", a.why[2]);
	adg_node_unref(y);
	adg_node_unref(x);
}

static int rebuild_fails(adg_recompute_call *call, void *user)
{
	(void)call;
	(void)user;
	return ADG_EUSER - 6;
}

/* Asks for its parent's output, which its rebuild fails to make, and
 * passes the code on. */
static int ask_parent(adg_step_call *call, void *user)
{
	(void)user;
	void *v;
	return adg_output_get(call, call->parent_ids[0], &v);
}

/* A recompute's code: adg_output_get names the node it rebuilt, and the
 * backward the step that passed the code on, the give's reason after. */
Test(reasons, a_rebuild_that_fails)
{
	adg_registry *r;
	adg_registry_options ro = {.size = sizeof ro,
				   .checkpointing = ADG_CHECKPOINT_BALANCED};
	cr_assert_eq(adg_registry_new(&ro, &r), 0);
	adg_node *x, *h, *y;
	cr_assert_eq(adg_leaf(r, &x), 0);
	adg_output dropped = {.value = scalar_box(1),
			      .free = output_free,
			      .recompute = rebuild_fails,
			      .memory_bound = 1};
	adg_op_options o = {.size = sizeof o, .output = &dropped};
	cr_assert_eq(adg_op_with(r, &x, 1, &noop, &o, &h), 0);
	uint32_t want = 0;
	adg_op_options asks = {.size = sizeof asks,
			       .want_parents = &want,
			       .n_want_parents = 1};
	adg_step step = {.backward = ask_parent, .name = "asks"};
	cr_assert_eq(adg_op_with(r, &h, 1, &step, &asks, &y), 0);
	adg_grads *g;
	EXPECT_REASON(adg_backward(r, y, scalar_box(1), &scalar_ops, &g),
		      ADG_EUSER - 6, "adg_backward",
		      "step 'asks' of node 3 returned -1006: adg_output_get: "
		      "rebuilding node 2's output failed with -1006");
	adg_node_unref(y);
	adg_node_unref(h);
	adg_node_unref(x);
	cr_expect_eq(adg_registry_free(r), 0);
}

/* ------------------------------------------------------------- backward */

static int fail_with(adg_step_call *call, void *user)
{
	(void)call;
	return (int)(intptr_t)user;
}

/* A step that gives to a slot past its parents and passes the code on. */
static int give_far(adg_step_call *call, void *user)
{
	(void)user;
	return adg_step_give(call, 3, scalar_box(1));
}

CHECKED_TEST(reasons, backward, .init = fixture_open_default)
{
	adg_registry *other;
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_op(reg, &x, 1, &noop, &y), 0);
	adg_grads *g;
	adg_grad_ops no_add = {NULL, free_only, NULL};
	adg_grad_ops no_free = {scalar_ops.add, NULL, NULL};
	double *seed = scalar_box(1);
	EXPECT_REASON(adg_backward(reg, y, seed, NULL, &g), ADG_EINVAL,
		      "adg_backward", "ops is NULL",
		      "the registry has no grad_ops");
	EXPECT_REASON(adg_backward(reg, y, seed, &no_add, &g), ADG_EINVAL,
		      "adg_backward", "ops has no add");
	EXPECT_REASON(adg_backward_with(reg, y, seed, &no_free, NULL, &g),
		      ADG_EINVAL, "adg_backward_with", "ops has no free");
	scalar_ops.free(seed, NULL);
	EXPECT_REASON(adg_backward(NULL, y, scalar_box(1), &scalar_ops, &g),
		      ADG_EINVAL, "adg_backward", "registry is NULL");
	EXPECT_REASON(adg_backward(reg, NULL, scalar_box(1), &scalar_ops, &g),
		      ADG_EINVAL, "adg_backward", "root is NULL");
	EXPECT_REASON(adg_backward(reg, y, NULL, &scalar_ops, &g), ADG_EINVAL,
		      "adg_backward", "seed is NULL");
	EXPECT_REASON(adg_backward(reg, y, scalar_box(1), &scalar_ops, NULL),
		      ADG_EINVAL, "adg_backward", "out is NULL");
	EXPECT_REASON(adg_backward(other, y, scalar_box(1), &scalar_ops, &g),
		      ADG_EFOREIGN, "adg_backward",
		      "root (node 2) belongs to another registry");
	adg_executor no_submit = {0};
	adg_backward_options o = {.size = sizeof o, .executor = &no_submit};
	EXPECT_REASON(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		ADG_EINVAL, "adg_backward_with",
		"options->executor has no submit");
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(1, &pool), 0);
	adg_executor many;
	cr_assert_eq(adg_pool_executor(pool, &many), 0);
	many.n_workers = ADG_EXECUTOR_MAX_WORKERS + 1;
	o.executor = &many;
	EXPECT_REASON(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		ADG_EINVAL, "adg_backward_with",
		"options->executor->n_workers is 257");
	cr_expect_eq(adg_pool_free(pool), 0);

	cr_assert_eq(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g), 0);
	adg_grads_free(g);
	EXPECT_REASON(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g),
		      ADG_ECONSUMED, "adg_backward",
		      "root (node 2)'s step was consumed");
	adg_node_unref(y);

	/* A step's own code, and a libadg call's reason passed on. */
	adg_step mul = {.backward = fail_with,
			.user = (void *)(intptr_t)-1003,
			.name = "mul"};
	cr_assert_eq(adg_op(reg, &x, 1, &mul, &y), 0);
	EXPECT_REASON(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g),
		      -1003, "adg_backward",
		      "step 'mul' of node 3 returned -1003");
	adg_node_unref(y);
	adg_step far = {.backward = give_far, .name = "far"};
	cr_assert_eq(adg_op(reg, &x, 1, &far, &y), 0);
	EXPECT_REASON(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g),
		      ADG_EINVAL, "adg_backward",
		      "step 'far' of node 4 returned ADG_EINVAL (-1): "
		      "adg_step_give: slot 3 out of range: node 4 has 1 "
		      "parents");
	adg_node_unref(y);
	adg_node_unref(x);
	cr_expect_eq(adg_registry_free(other), 0);
}

/* Whether s is whole UTF-8: no character cut. */
static bool whole_utf8(const char *s)
{
	for (const unsigned char *c = (const unsigned char *)s; *c != 0;) {
		int n = *c < 0x80 ? 1 : *c >= 0xf0 ? 4 : *c >= 0xe0 ? 3 : 2;
		for (int k = 1; k < n; k++)
			if ((c[k] & 0xc0) != 0x80)
				return false;
		c += n;
	}
	return true;
}

/* A name longer than a reason holds, in two-byte characters: cut between
 * characters, wherever it is cut. */
CHECKED_TEST(reasons, a_long_name_is_cut_between_characters,
	     .init = fixture_open_default)
{
	/* U+00E9s, after no ASCII byte or one: the cut lands on either
	 * byte of a character. */
	static char names[2][1002];
	for (int shift = 0; shift < 2; shift++) {
		names[shift][0] = 'a';
		for (int k = 0; k < 500; k++)
			memcpy(names[shift] + shift + 2 * k, "\xc3\xa9", 2);
	}
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	for (int shift = 0; shift < 2; shift++) {
		adg_step step = {.backward = fail_with,
				 .user = (void *)(intptr_t)-1003,
				 .name = names[shift]};
		cr_assert_eq(adg_op(reg, &x, 1, &step, &y), 0);
		adg_grads *g;
		EXPECT_REASON(
			adg_backward(reg, y, scalar_box(1), &scalar_ops, &g),
			-1003, "adg_backward",
			shift ? "step 'a\xc3\xa9" : "step '\xc3\xa9");
		cr_expect_lt(strlen(adg_errmsg()), (size_t)ADG_ERRMSG_MAX);
		cr_expect(whole_utf8(adg_errmsg()), "%s", adg_errmsg());
		adg_node_unref(y);
	}
	adg_node_unref(x);
}

static int refuse_ready(uint64_t id, void **grad, void *ctx)
{
	(void)id;
	(void)grad;
	(void)ctx;
	return -1010;
}

static int refuse_step(const adg_step_event *event, void *ctx)
{
	(void)event;
	(void)ctx;
	return 4; /* positive: ADG_ECALLBACK */
}

CHECKED_TEST(reasons, backward_hooks, .init = fixture_open_default)
{
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	adg_grads *g;
	adg_backward_options o = {.size = sizeof o, .on_ready = refuse_ready};
	cr_assert_eq(adg_op(reg, &x, 1, &noop, &y), 0);
	EXPECT_REASON(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		-1010, "adg_backward_with",
		"on_ready for node 2 returned -1010");
	adg_node_unref(y);
	o = (adg_backward_options){.size = sizeof(adg_backward_options),
				   .on_step = refuse_step};
	cr_assert_eq(adg_op(reg, &x, 1, &noop, &y), 0);
	EXPECT_REASON(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		ADG_ECALLBACK, "adg_backward_with",
		"on_step around step 'noop' of node 3 returned ADG_ECALLBACK");
	adg_node_unref(y);
	adg_node_unref(x);
}

static int add_fails(void **sum, void *value, void *ctx)
{
	(void)sum;
	(void)ctx;
	scalar_ops.free(value, NULL);
	return ADG_EUSER - 7;
}

/* Gives every slot, whatever the give returns. */
static int give_all(adg_step_call *call, void *user)
{
	(void)user;
	for (size_t k = 0; k < call->n_parents; k++)
		adg_step_give(call, k, scalar_box(1));
	return 0;
}

/* An add's code: without an executor the give's, which the step passes
 * on or not; with one the backward's, named by the gradient it folds. */
CHECKED_TEST(reasons, an_add_that_fails, .init = fixture_open_default)
{
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	adg_node *xx[2] = {x, x};
	adg_step step = {.backward = give_all, .name = "twice"};
	cr_assert_eq(adg_op(reg, xx, 2, &step, &y), 0);
	adg_grad_ops ops = scalar_ops;
	ops.add = add_fails;
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(1, &pool), 0);
	adg_executor ex;
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	ex.n_workers = 0;
	adg_backward_options o = {
		.size = sizeof o, .executor = &ex, .retain = 1};
	adg_grads *g;
	EXPECT_REASON(adg_backward_with(reg, y, scalar_box(1), &ops, &o, &g),
		      ADG_EUSER - 7, "adg_backward_with",
		      "ops->add folding a gradient into node 1 returned -1007");
	cr_expect_eq(adg_pool_free(pool), 0);
	adg_node_unref(y);
	adg_node_unref(x);
}

/* What a step saw of adg_step_give's failures. */
struct gives {
	int rc[5];
	char why[5][ADG_ERRMSG_MAX];
};

static void gave(struct gives *s, int k, int rc)
{
	s->rc[k] = rc;
	strcpy(s->why[k], adg_errmsg());
}

static int bad_gives(adg_step_call *call, void *user)
{
	struct gives *s = user;
	double *kept = scalar_box(1); /* no call: the caller's still */
	gave(s, 0, adg_step_give(NULL, 0, kept));
	scalar_ops.free(kept, NULL);
	gave(s, 1, adg_step_give(call, 0, NULL));
	gave(s, 2, adg_step_give(call, 2, scalar_box(1)));
	cr_assert_eq(adg_step_give(call, 0, scalar_box(1)), 0);
	cr_assert_eq(adg_step_give(call, 1, scalar_box(1)), 0);
	gave(s, 3, adg_step_give(call, 1, scalar_box(1)));
	adg_step_call fake = *call;
	fake.context = NULL;
	double *v = scalar_box(1);
	gave(s, 4, adg_step_give(&fake, 0, v));
	scalar_ops.free(v, NULL); /* not a step's: the caller's still */
	return 0;
}

CHECKED_TEST(reasons, step_give, .init = fixture_open_default)
{
	struct gives s = {0};
	adg_step step = {.backward = bad_gives, .user = &s};
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	adg_node *xx[2] = {x, x};
	cr_assert_eq(adg_op(reg, xx, 2, &step, &y), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g), 0);
	adg_grads_free(g);
	const char *want[] = {
		"adg_step_give: call is NULL",
		"adg_step_give: value is NULL",
		"adg_step_give: slot 2 out of range: node 2 has 2 parents",
		("adg_step_give: slot 1 given twice: every slot of node 2 "
		 "naming parent 1 is taken"),
		"adg_step_give: call is not a step's",
	};
	for (int k = 0; k < 5; k++) {
		cr_expect_eq(s.rc[k], ADG_EINVAL);
		cr_expect(strstr(s.why[k], want[k]) == s.why[k], "%s: %s",
			  want[k], s.why[k]);
	}
	adg_node_unref(y);
	adg_node_unref(x);
}

/* ----------------------------------------------------------- the check */

static int reject_nan(const void *value, void *ctx)
{
	(void)ctx;
	double v = *(const double *)value;
	return v != v ? ADG_EVALUE : 0;
}

/* What give_nan's gives returned, on the step's thread. */
struct nan_give {
	int first, rc;
	char why[ADG_ERRMSG_MAX];
};

/* Gives slot 0 a good value, slot 1 a NaN. */
static int give_nan(adg_step_call *call, void *user)
{
	struct nan_give *g = user;
	g->first = adg_step_give(call, 0, scalar_box(1));
	g->rc = adg_step_give(call, 1, scalar_box(__builtin_nan("")));
	strcpy(g->why, adg_errmsg());
	return 0;
}

CHECKED_TEST(reasons, the_value_check_names_step_slot_and_parent,
	     .init = fixture_open_default)
{
	adg_node *x, *w, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_leaf(reg, &w), 0);
	struct nan_give gave_nan = {0};
	adg_step bad = {.backward = give_nan, .user = &gave_nan, .name = "bad"};
	adg_node *xw[2] = {x, w};
	cr_assert_eq(adg_op(reg, xw, 2, &bad, &y), 0);
	adg_backward_options o = {
		.size = sizeof o, .value_check = reject_nan, .retain = 1};
	adg_grads *g;
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	adg_executor ex;
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	for (int mode = 0; mode < 2; mode++) {
		o.executor = mode == 0 ? NULL : &ex;
		EXPECT_REASON(adg_backward_with(reg, y, scalar_box(1),
						&scalar_ops, &o, &g),
			      ADG_EVALUE, "adg_backward_with",
			      "the value check rejected the gradient that "
			      "step 'bad' of node 3 gave for parent slot 1 "
			      "(node 2) with ADG_EVALUE (-12)");
		cr_expect_eq(gave_nan.first, 0);
		cr_expect_eq(gave_nan.rc, ADG_EVALUE);
		cr_expect_str_eq(gave_nan.why,
				 "adg_step_give: the value check rejected the "
				 "gradient that step 'bad' of node 3 gave for "
				 "parent slot 1 (node 2) with ADG_EVALUE (-12) "
				 "(value freed)");
	}
	cr_expect_eq(adg_pool_free(pool), 0);
	adg_node_unref(y);
	adg_node_unref(w);
	adg_node_unref(x);
}

/* --------------------------------------------------------- callback site */

static int site_in_ready(uint64_t id, void **grad, void *ctx)
{
	(void)id;
	(void)grad;
	adg_failure where = {.size = sizeof where};
	int *rc = ctx;
	*rc = adg_callback_site(&where);
	return 0;
}

CHECKED_TEST(reasons, callback_site, .init = fixture_open_default)
{
	adg_failure where = {.size = sizeof where};
	EXPECT_REASON(adg_callback_site(NULL), ADG_EINVAL, "adg_callback_site",
		      "where is NULL");
	EXPECT_REASON(adg_callback_site(&where), ADG_EINVAL,
		      "adg_callback_site", "no backward's callback runs");
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_op(reg, &x, 1, &noop, &y), 0);
	int rc = 0;
	adg_backward_options o = {.size = sizeof o,
				  .on_ready = site_in_ready,
				  .on_ready_ctx = &rc};
	adg_grads *g;
	cr_assert_eq(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		0);
	cr_expect_eq(rc, ADG_EINVAL);
	cr_expect(strstr(adg_errmsg(), "adg_callback_site: between a "
				       "backward's callbacks") == adg_errmsg(),
		  "%s", adg_errmsg());
	adg_grads_free(g);
	adg_node_unref(y);
	adg_node_unref(x);
}

/* --------------------------------------------------------- seeing graphs */

static int visit_fails(const adg_graph_node *node, void *ctx)
{
	(void)node;
	(void)ctx;
	return -1020;
}

static int write_fails(const char *text, size_t len, void *ctx)
{
	(void)text;
	(void)len;
	(void)ctx;
	return -1030;
}

CHECKED_TEST(reasons, graphs, .init = fixture_open_default)
{
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_op(reg, &x, 1, &noop, &y), 0);
	EXPECT_REASON(adg_graph_visit(NULL, visit_fails, NULL), ADG_EINVAL,
		      "adg_graph_visit", "node is NULL");
	EXPECT_REASON(adg_graph_visit(y, NULL, NULL), ADG_EINVAL,
		      "adg_graph_visit", "visit is NULL");
	EXPECT_REASON(adg_graph_visit(x, visit_fails, NULL), ADG_EINVAL,
		      "adg_graph_visit", "node 1 is a leaf, in no graph");
	EXPECT_REASON(adg_graph_visit(y, visit_fails, NULL), -1020,
		      "adg_graph_visit", "visit returned -1020 for node 2");
	EXPECT_REASON(adg_graph_write_dot(NULL, write_fails, NULL), ADG_EINVAL,
		      "adg_graph_write_dot", "node is NULL");
	EXPECT_REASON(adg_graph_write_dot(y, NULL, NULL), ADG_EINVAL,
		      "adg_graph_write_dot", "write is NULL");
	EXPECT_REASON(adg_graph_write_dot_with(x, NULL, write_fails, NULL),
		      ADG_EINVAL, "adg_graph_write_dot_with",
		      "node 1 is a leaf");
	EXPECT_REASON(adg_graph_write_dot_with(y, NULL, write_fails, NULL),
		      -1030, "adg_graph_write_dot_with",
		      "write returned -1030");
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g), 0);
	adg_grads_free(g);
	EXPECT_REASON(adg_graph_visit(y, visit_fails, NULL), ADG_ECONSUMED,
		      "adg_graph_visit", "node 2's step was consumed");
	adg_node_unref(y);
	adg_node_unref(x);
}

/* ------------------------------------------------------------- gradients */

static int positive_add(void **sum, void *value, void *ctx)
{
	(void)sum;
	(void)ctx;
	scalar_ops.free(value, NULL);
	return 5;
}

CHECKED_TEST(reasons, grads, .init = fixture_open_default)
{
	void *v;
	size_t n;
	adg_registry *other;
	cr_assert_eq(adg_registry_new(NULL, &other), 0);
	adg_node *x, *f;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_leaf(other, &f), 0);
	EXPECT_REASON(adg_grads_get(NULL, 1, &v), ADG_EINVAL, "adg_grads_get",
		      "grads is NULL");
	EXPECT_REASON(adg_grads_take(NULL, 1, &v), ADG_EINVAL, "adg_grads_take",
		      "grads is NULL");
	EXPECT_REASON(adg_grads_get_node(NULL, x, &v), ADG_EINVAL,
		      "adg_grads_get_node", "grads is NULL");
	EXPECT_REASON(adg_grads_take_node(NULL, x, &v), ADG_EINVAL,
		      "adg_grads_take_node", "grads is NULL");
	EXPECT_REASON(adg_grads_register(NULL, 1, &v), ADG_EINVAL,
		      "adg_grads_register", "grads is NULL");
	EXPECT_REASON(adg_grads_count(NULL, &n), ADG_EINVAL, "adg_grads_count",
		      "grads is NULL");

	adg_grads *g;
	adg_grad_ops ops = scalar_ops;
	ops.add = positive_add;
	cr_assert_eq(adg_backward(reg, x, scalar_box(1), &ops, &g), 0);
	EXPECT_REASON(adg_grads_get(g, 1, NULL), ADG_EINVAL, "adg_grads_get",
		      "value is NULL");
	EXPECT_REASON(adg_grads_get(g, 0, &v), ADG_EINVAL, "adg_grads_get",
		      "id is 0");
	EXPECT_REASON(adg_grads_get(g, 99, &v), ADG_ENOTFOUND, "adg_grads_get",
		      "no gradient is held for id 99");
	EXPECT_REASON(adg_grads_take(g, 1, NULL), ADG_EINVAL, "adg_grads_take",
		      "value is NULL");
	EXPECT_REASON(adg_grads_take(g, 0, &v), ADG_EINVAL, "adg_grads_take",
		      "id is 0");
	EXPECT_REASON(adg_grads_take(g, 99, &v), ADG_ENOTFOUND,
		      "adg_grads_take", "no gradient is held for id 99");
	EXPECT_REASON(adg_grads_get_node(g, NULL, &v), ADG_EINVAL,
		      "adg_grads_get_node", "node is NULL");
	EXPECT_REASON(adg_grads_take_node(g, x, NULL), ADG_EINVAL,
		      "adg_grads_take_node", "value is NULL");
	EXPECT_REASON(adg_grads_get_node(g, f, &v), ADG_EFOREIGN,
		      "adg_grads_get_node",
		      "node 1 belongs to another registry");
	EXPECT_REASON(adg_grads_register(g, 5, NULL), ADG_EINVAL,
		      "adg_grads_register", "value is NULL");
	EXPECT_REASON(adg_grads_register(g, 0, scalar_box(1)), ADG_EINVAL,
		      "adg_grads_register", "id is 0");
	EXPECT_REASON(adg_grads_register(g, 1, scalar_box(1)), ADG_ECALLBACK,
		      "adg_grads_register",
		      "ops->add returned ADG_ECALLBACK (-9) folding a gradient "
		      "into id 1");
	EXPECT_REASON(adg_grads_count(g, NULL), ADG_EINVAL, "adg_grads_count",
		      "count is NULL");
	cr_expect_eq(adg_grads_take_node(g, x, &v), 0);
	scalar_ops.free(v, NULL);
	EXPECT_REASON(adg_grads_take_node(g, x, &v), ADG_ENOTFOUND,
		      "adg_grads_take_node", "no gradient is held for id 1");
	adg_grads_free(g);
	adg_node_unref(f);
	adg_node_unref(x);
	cr_expect_eq(adg_registry_free(other), 0);
}

/* What a step saw using its view (call->grads with an executor), which
 * is deprecated and will go: the field warns. */
struct viewed {
	int rc[8];
	char why[8][ADG_ERRMSG_MAX];
};

static void saw(struct viewed *s, int k, int rc)
{
	s->rc[k] = rc;
	strcpy(s->why[k], adg_errmsg());
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static int use_view(adg_step_call *call, void *user)
{
	struct viewed *s = user;
	adg_grads *view = call->grads;
	void *v;
	size_t n;
	saw(s, 0, adg_grads_get(view, 1, &v));
	saw(s, 1, adg_grads_count(view, &n));
	saw(s, 2, adg_grads_free(view));
	saw(s, 3, adg_grads_register(view, 99, scalar_box(1)));
	cr_assert_eq(
		adg_grads_register(view, call->parent_ids[0], scalar_box(1)),
		0);
	saw(s, 4, adg_grads_register(view, call->parent_ids[0], scalar_box(1)));
	saw(s, 5, adg_grads_take_node(view, NULL, &v));
	saw(s, 6, adg_grads_take(view, 1, &v));
	saw(s, 7, adg_grads_get_node(view, NULL, &v));
	return 0;
}
#pragma GCC diagnostic pop

CHECKED_TEST(reasons, a_steps_view, .init = fixture_open_default)
{
	struct viewed s = {0};
	adg_step step = {.backward = use_view, .user = &s};
	adg_node *x, *y;
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_op(reg, &x, 1, &step, &y), 0);
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(1, &pool), 0);
	adg_executor ex;
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	ex.n_workers = 0; /* the calling thread alone, a step's view */
	adg_backward_options o = {.size = sizeof o, .executor = &ex};
	adg_grads *g;
	cr_assert_eq(
		adg_backward_with(reg, y, scalar_box(1), &scalar_ops, &o, &g),
		0);
	adg_grads_free(g);
	cr_expect_eq(adg_pool_free(pool), 0);
	const char *want[] = {
		"adg_grads_get: grads is a step's view",
		"adg_grads_count: grads is a step's view",
		"adg_grads_free: grads is a step's view",
		"adg_grads_register: id 99 is not a parent of node 2",
		("adg_grads_register: id 1 is a parent of node 2 whose slots "
		 "are all taken"),
		"adg_grads_take_node: grads is a step's view",
		"adg_grads_take: grads is a step's view",
		"adg_grads_get_node: grads is a step's view",
	};
	for (int k = 0; k < 8; k++) {
		cr_expect_eq(s.rc[k], ADG_EINVAL);
		cr_expect(strstr(s.why[k], want[k]) == s.why[k], "%s: %s",
			  want[k], s.why[k]);
	}
	adg_node_unref(y);
	adg_node_unref(x);
}

/* ------------------------------------------------------------------ pool */

struct self_free {
	adg_pool *pool;
	int rc;
	char why[ADG_ERRMSG_MAX];
	atomic_int done;
};

static void free_from_inside(void *arg)
{
	struct self_free *s = arg;
	s->rc = adg_pool_free(s->pool);
	strcpy(s->why, adg_errmsg());
	atomic_store(&s->done, 1);
}

Test(reasons, pool)
{
	adg_pool *pool;
	adg_executor ex;
	EXPECT_REASON(adg_pool_new(0, &pool), ADG_EINVAL, "adg_pool_new",
		      "n_threads is 0");
	EXPECT_REASON(adg_pool_new(1, NULL), ADG_EINVAL, "adg_pool_new",
		      "out is NULL");
	EXPECT_REASON(adg_pool_new_with(NULL, &pool), ADG_EINVAL,
		      "adg_pool_new_with", "options is NULL");
	adg_pool_options o = {.size = sizeof o,
			      .n_threads = ADG_EXECUTOR_MAX_WORKERS + 1};
	EXPECT_REASON(adg_pool_new_with(&o, &pool), ADG_EINVAL,
		      "adg_pool_new_with", "n_threads is 257");
	failing_alloc fa = {0};
	o = (adg_pool_options){.size = sizeof(adg_pool_options),
			       .n_threads = 1,
			       .allocator = failing_allocator(&fa)};
	o.allocator.alloc = NULL;
	EXPECT_REASON(adg_pool_new_with(&o, &pool), ADG_EINVAL,
		      "adg_pool_new_with", "options->allocator",
		      "free without alloc");
	EXPECT_REASON(adg_pool_executor(NULL, &ex), ADG_EINVAL,
		      "adg_pool_executor", "pool is NULL");
	cr_assert_eq(adg_pool_new(1, &pool), 0);
	EXPECT_REASON(adg_pool_executor(pool, NULL), ADG_EINVAL,
		      "adg_pool_executor", "out is NULL");
	cr_assert_eq(adg_pool_executor(pool, &ex), 0);
	struct self_free s = {.pool = pool};
	cr_assert_eq(ex.submit(free_from_inside, &s, ex.ctx), 0);
	while (!atomic_load(&s.done))
		sched_yield();
	cr_expect_eq(s.rc, ADG_EINVAL);
	cr_expect_str_eq(s.why, "adg_pool_free: called from one of the "
				"pool's own threads");
	cr_expect_eq(adg_pool_free(pool), 0);
}

/* --------------------------------------------------------------- reducer */

static int r_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	*(double *)*sum += *(const double *)value;
	return 0;
}

static int r_apply(const adg_reduction *reduction, void *ctx)
{
	(void)reduction;
	(void)ctx;
	return 0;
}

static void r_release(void *value, size_t participant, void *ctx)
{
	(void)participant;
	(void)ctx;
	scalar_ops.free(value, NULL);
}

static int r_add_slice(void *sum, const void *value, size_t slice,
		       size_t n_slices, void *ctx)
{
	(void)sum;
	(void)value;
	(void)slice;
	(void)n_slices;
	(void)ctx;
	return 0;
}

static adg_reducer_options r_options(const uint64_t *ids, size_t n)
{
	return (adg_reducer_options){
		.size = sizeof(adg_reducer_options),
		.n_participants = 2,
		.param_ids = ids,
		.n_params = n,
		.ops = {.add = r_add, .apply = r_apply, .release = r_release},
	};
}

#define EXPECT_NEW(o, ...)                                                     \
	EXPECT_REASON(adg_reducer_new(&(o), &red), ADG_EINVAL,                 \
		      "adg_reducer_new", __VA_ARGS__)

Test(reasons, reducer_new)
{
	adg_reducer *red;
	const uint64_t ids[] = {5, 7, 9, 7};
	adg_reducer_options o = r_options(ids, 3);
	EXPECT_REASON(adg_reducer_new(NULL, &red), ADG_EINVAL,
		      "adg_reducer_new", "options is NULL");
	EXPECT_REASON(adg_reducer_new(&o, NULL), ADG_EINVAL, "adg_reducer_new",
		      "out is NULL");
	o.n_participants = 0;
	EXPECT_NEW(o, "options->n_participants is 0");
	o = r_options(ids, 0);
	EXPECT_NEW(o, "options->n_params is 0");
	o = r_options(ids, 3);
	o.n_units = ADG_REDUCER_MAX_UNITS + 1;
	EXPECT_NEW(o, "options->n_units is 1048577");
	o = r_options(NULL, 3);
	EXPECT_NEW(o, "options->param_ids is NULL");
	o = r_options(ids, 3);
	o.ops.add = NULL;
	EXPECT_NEW(o, "options->ops.add is NULL");
	o = r_options(ids, 3);
	o.ops.apply = NULL;
	EXPECT_NEW(o, "options->ops.apply is NULL");
	o = r_options(ids, 3);
	o.ops.release = NULL;
	EXPECT_NEW(o, "options->ops.release is NULL");
	failing_alloc fa = {0};
	o = r_options(ids, 3);
	o.allocator.alloc = failing_allocator(&fa).alloc;
	EXPECT_NEW(o, "options->allocator has alloc without free");
	o = r_options(ids, 3);
	o.first_unit = 2;
	EXPECT_NEW(o, "options->first_unit is 2 without total_units");
	o.n_units = 0;
	o.total_units = 8;
	EXPECT_NEW(o, "options->total_units is 8 but n_units is 0");
	o.n_units = 4;
	o.total_units = ADG_REDUCER_MAX_UNITS + 1;
	EXPECT_NEW(o, "options->total_units is 1048577");
	o.total_units = 5;
	EXPECT_NEW(o, "units 2 to 5 (first_unit 2, n_units 4) do not fit in "
		      "total_units 5");
	const uint64_t zero[] = {5, 0};
	o = r_options(zero, 2);
	EXPECT_NEW(o, "param_ids[1] is 0");
	o = r_options(ids, 4);
	EXPECT_NEW(o, "param_ids[3] repeats param_ids[1] (id 7)");
	size_t slices[] = {1, 0, 2};
	o = r_options(ids, 3);
	o.param_slices = slices;
	EXPECT_NEW(o, "param_slices[1] is 0");
	slices[1] = ADG_REDUCER_MAX_SLICES + 1;
	EXPECT_NEW(o, "param_slices[1] is 1025");
	slices[1] = 1;
	EXPECT_NEW(o, "a parameter is in slices but options->ops.add_slice "
		      "is NULL");
	o.ops.add_slice = r_add_slice;
	o.n_units = 4;
	o.total_units = 8;
	EXPECT_NEW(o, "a parameter is in slices in a reducer of a range");
}

/* release calling adg_reducer_end, from inside its participant's end. */
struct late_end {
	adg_reducer *red;
	int rc;
	char why[ADG_ERRMSG_MAX];
};

static void release_then_end(void *value, size_t participant, void *ctx)
{
	struct late_end *s = ctx;
	scalar_ops.free(value, NULL);
	s->rc = adg_reducer_end(s->red, participant, 0);
	strcpy(s->why, adg_errmsg());
}

Test(reasons, reducer_calls)
{
	const uint64_t ids[] = {5, 7};
	adg_reducer_options o = r_options(ids, 2);
	o.n_participants = 1;
	adg_reducer *plain, *dealt;
	cr_assert_eq(adg_reducer_new(&o, &plain), 0);
	o.n_units = 2;
	cr_assert_eq(adg_reducer_new(&o, &dealt), 0);
	adg_backward_options bo = {.size = sizeof bo};
	size_t unit;
	uint64_t rounds;
	adg_failure step = {.size = sizeof step};
	adg_reducer_failure round = {.size = sizeof round};
	EXPECT_REASON(adg_reducer_hook(NULL, 0, &bo), ADG_EINVAL,
		      "adg_reducer_hook", "reducer is NULL");
	EXPECT_REASON(adg_reducer_hook(plain, 1, &bo), ADG_EINVAL,
		      "adg_reducer_hook",
		      "participant 1 out of range (1 participants)");
	EXPECT_REASON(adg_reducer_hook(plain, 0, NULL), ADG_EINVAL,
		      "adg_reducer_hook", "options is NULL");
	double *v = scalar_box(1);
	EXPECT_REASON(adg_reducer_give(NULL, 0, 5, v), ADG_EINVAL,
		      "adg_reducer_give", "reducer is NULL");
	EXPECT_REASON(adg_reducer_give(plain, 3, 5, v), ADG_EINVAL,
		      "adg_reducer_give", "participant 3 out of range");
	EXPECT_REASON(adg_reducer_give(plain, 0, 5, NULL), ADG_EINVAL,
		      "adg_reducer_give", "value is NULL");
	EXPECT_REASON(adg_reducer_give(plain, 0, 6, v), ADG_EINVAL,
		      "adg_reducer_give", "id 6 is not a parameter");
	EXPECT_REASON(adg_reducer_give(dealt, 0, 5, v), ADG_ESTATE,
		      "adg_reducer_give", "participant 0 has no unit");
	EXPECT_REASON(adg_reducer_next_unit(NULL, 0, &unit), ADG_EINVAL,
		      "adg_reducer_next_unit", "reducer is NULL");
	EXPECT_REASON(adg_reducer_next_unit(dealt, 1, &unit), ADG_EINVAL,
		      "adg_reducer_next_unit", "participant 1 out of range");
	EXPECT_REASON(adg_reducer_next_unit(dealt, 0, NULL), ADG_EINVAL,
		      "adg_reducer_next_unit", "unit is NULL");
	EXPECT_REASON(adg_reducer_next_unit(plain, 0, &unit), ADG_ESTATE,
		      "adg_reducer_next_unit", "the reducer has no units");
	EXPECT_REASON(adg_reducer_unit_end(NULL, 0, 0), ADG_EINVAL,
		      "adg_reducer_unit_end", "reducer is NULL");
	EXPECT_REASON(adg_reducer_unit_end_with(dealt, 2, &step), ADG_EINVAL,
		      "adg_reducer_unit_end_with",
		      "participant 2 out of range");
	EXPECT_REASON(adg_reducer_unit_end(plain, 0, 0), ADG_ESTATE,
		      "adg_reducer_unit_end", "the reducer has no units");
	EXPECT_REASON(adg_reducer_unit_end(dealt, 0, 0), ADG_ESTATE,
		      "adg_reducer_unit_end", "participant 0 has no unit");
	cr_assert_eq(adg_reducer_next_unit(dealt, 0, &unit), 0);
	EXPECT_REASON(adg_reducer_next_unit(dealt, 0, &unit), ADG_ESTATE,
		      "adg_reducer_next_unit",
		      "participant 0 has not ended unit 0");
	cr_assert_eq(adg_reducer_give(dealt, 0, 5, v), 0);
	double *w = scalar_box(2);
	EXPECT_REASON(adg_reducer_give(dealt, 0, 5, w), ADG_ESTATE,
		      "adg_reducer_give",
		      "participant 0's unit 0 already has parameter id 5");
	scalar_ops.free(w, NULL);
	EXPECT_REASON(adg_reducer_free(dealt), ADG_EBUSY, "adg_reducer_free",
		      "a round has begun and not ended");
	EXPECT_REASON(adg_reducer_end(NULL, 0, 0), ADG_EINVAL,
		      "adg_reducer_end", "reducer is NULL");
	EXPECT_REASON(adg_reducer_end_with(dealt, 1, NULL, &round), ADG_EINVAL,
		      "adg_reducer_end_with", "participant 1 out of range");
	cr_expect_eq(round.code, 0);
	cr_expect_eq(round.site, ADG_REDUCER_FAILED_NOWHERE);
	/* The round ends with unit 1 never dealt: not done. */
	EXPECT_REASON(adg_reducer_end_with(dealt, 0, NULL, &round), ADG_ESTATE,
		      "adg_reducer_end_with",
		      "round 0 abandoned with ADG_ESTATE (-10)",
		      "units not done");
	cr_expect_eq(round.site, ADG_REDUCER_FAILED_UNITS);
	cr_expect_eq(round.participant, SIZE_MAX);
	EXPECT_REASON(adg_reducer_rounds(NULL, &rounds), ADG_EINVAL,
		      "adg_reducer_rounds", "reducer is NULL");
	EXPECT_REASON(adg_reducer_rounds(plain, NULL), ADG_EINVAL,
		      "adg_reducer_rounds", "rounds is NULL");
	cr_expect_eq(adg_reducer_free(dealt), 0);
	cr_expect_eq(adg_reducer_free(plain), 0);

	/* A second end, from release inside the first. */
	struct late_end s = {0};
	o = r_options(ids, 2);
	o.n_participants = 1;
	o.ops.release = release_then_end;
	o.ops.ctx = &s;
	cr_assert_eq(adg_reducer_new(&o, &s.red), 0);
	cr_assert_eq(adg_reducer_give(s.red, 0, 5, scalar_box(1)), 0);
	cr_expect_eq(adg_reducer_end(s.red, 0, 0), 0);
	cr_expect_eq(s.rc, ADG_ESTATE);
	cr_expect_str_eq(s.why, "adg_reducer_end: participant 0 is already "
				"ending this round");
	cr_expect_eq(adg_reducer_free(s.red), 0);
}

/* -------------------------------------------------- success and threads */

CHECKED_TEST(reasons, a_success_does_not_clear_it, .init = fixture_open_default)
{
	adg_node *x;
	uint64_t id;
	cr_expect_eq(adg_node_id(NULL, &id), ADG_EINVAL);
	char before[ADG_ERRMSG_MAX];
	strcpy(before, adg_errmsg());
	const char *at = adg_errmsg();
	cr_assert_eq(adg_leaf(reg, &x), 0);
	cr_assert_eq(adg_node_id(x, &id), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, x, scalar_box(1), &scalar_ops, &g), 0);
	cr_assert_eq(adg_grads_free(g), 0);
	cr_assert_eq(adg_node_unref(x), 0);
	cr_expect_str_eq(adg_errmsg(), before, "successes wrote nothing");
	cr_expect_eq(adg_errmsg(), at, "the same string, still valid");
	cr_expect_str_eq(at, "adg_node_id: node is NULL");
}

/* Two threads fail differently at once, many times over, and each reads
 * its own reason back. */
struct two {
	pthread_barrier_t start;
	int bad[2];
};

static void *fail_own_way(void *arg)
{
	struct thread *t = arg;
	struct two *s = t->s;
	pthread_barrier_wait(&s->start);
	for (int k = 0; k < 2000; k++) {
		uint64_t id;
		adg_registry *r;
		const char *want;
		if (t->i == 0) {
			adg_node_id(NULL, &id);
			want = "adg_node_id: node is NULL";
		} else {
			adg_node_registry(NULL, &r);
			want = "adg_node_registry: node is NULL";
		}
		if (strcmp(adg_errmsg(), want) != 0)
			s->bad[t->i]++;
	}
	return NULL;
}

Test(reasons, each_thread_reads_its_own)
{
	struct two s = {0};
	pthread_barrier_init(&s.start, NULL, 2);
	uint64_t id;
	cr_expect_eq(adg_node_id(NULL, &id), ADG_EINVAL);
	run_threads(2, fail_own_way, &s);
	pthread_barrier_destroy(&s.start);
	cr_expect_eq(s.bad[0], 0);
	cr_expect_eq(s.bad[1], 0);
	cr_expect_str_eq(adg_errmsg(), "adg_node_id: node is NULL",
			 "the main thread's, untouched by the others'");
}
