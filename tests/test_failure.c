/* A failed backward names where it failed (adg_backward_options.failure):
 * which node's step, or which hook or add, with the code it returned; the
 * first failure in tape order, with an executor too, as the result is. */
#include "fixture.h"

#include <math.h>
#include <string.h>
#include <time.h>

FIXTURE_SUITE(failure, .timeout = 120);

enum mode { SEQUENTIAL, ALONE, POOL2, N_MODES };

struct runner {
	adg_pool *pool;
	adg_executor executor;
	adg_backward_options o;
	adg_failure report;
};

/* Options for mode m, reporting into r->report (filled with junk first,
 * so that a field left unset shows). */
static adg_backward_options *options_in(enum mode m, struct runner *r)
{
	memset(&r->report, 0x5a, sizeof r->report);
	r->report.size = sizeof r->report;
	r->o = (adg_backward_options){.size = sizeof r->o,
				      .failure = &r->report};
	if (m != SEQUENTIAL) {
		if (r->pool == NULL)
			cr_assert_eq(adg_pool_new(2, &r->pool), 0);
		cr_assert_eq(adg_pool_executor(r->pool, &r->executor), 0);
		if (m == ALONE)
			r->executor.n_workers = 0;
		r->o.executor = &r->executor;
	}
	return &r->o;
}

static void expect_report(const adg_failure *f, int code, adg_failure_site site,
			  uint64_t id, const char *name, enum mode m)
{
	cr_assert_eq(f->code, code, "mode %d: code %d", m, f->code);
	cr_assert_eq(f->site, site, "mode %d: site %d", m, (int)f->site);
	cr_assert_eq(f->node_id, id, "mode %d", m);
	if (name == NULL)
		cr_assert_null(f->name, "mode %d", m);
	else
		cr_assert_str_eq(f->name, name, "mode %d", m);
}

/* A step that passes its gradient on to every parent, or fails with rc,
 * after sleeping nap_us. */
struct step_plan {
	int rc;
	int nap_us;
};

static int planned_backward(adg_step_call *call, void *user)
{
	const struct step_plan *p = user;
	if (p->nap_us > 0)
		nanosleep(&(struct timespec){0, p->nap_us * 1000L}, NULL);
	if (p->rc != 0)
		return p->rc;
	return s_pass_on(call);
}

static adg_node *op_named(adg_node *const *parents, size_t n,
			  const struct step_plan *plan, const char *name)
{
	adg_node *y;
	adg_step step = {.backward = planned_backward,
			 .user = (void *)plan,
			 .name = name};
	cr_assert_eq(adg_op(reg, parents, n, &step, &y), 0);
	return y;
}

static uint64_t id_of(adg_node *n)
{
	uint64_t id;
	cr_assert_eq(adg_node_id(n, &id), 0);
	return id;
}

CHECKED_TEST(failure, names_the_failing_step_in_every_mode)
{
	static const struct step_plan ok = {0}, boom = {.rc = ADG_EUSER - 3};
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		scalar x = s_leaf(reg, 1);
		adg_node *a = op_named(&x.node, 1, &boom, "boom");
		adg_node *y = op_named(&a, 1, &ok, "top");
		adg_grads *g;
		int rc = adg_backward_with(reg, y, scalar_box(1), &scalar_ops,
					   options_in(m, &r), &g);
		cr_assert_eq(rc, ADG_EUSER - 3);
		expect_report(&r.report, rc, ADG_FAILED_STEP, id_of(a), "boom",
			      m);
		adg_node_unref(y);
		adg_node_unref(a);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

CHECKED_TEST(failure, success_and_bad_input_name_nowhere)
{
	static const struct step_plan ok = {0};
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		scalar x = s_leaf(reg, 1);
		adg_node *y = op_named(&x.node, 1, &ok, "y");
		adg_grads *g;
		cr_assert_eq(adg_backward_with(reg, y, NULL, &scalar_ops,
					       options_in(m, &r), &g),
			     ADG_EINVAL);
		expect_report(&r.report, ADG_EINVAL, ADG_FAILED_NOWHERE, 0,
			      NULL, m);
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, options_in(m, &r),
					       &g),
			     0);
		expect_report(&r.report, 0, ADG_FAILED_NOWHERE, 0, NULL, m);
		cr_assert_eq(adg_grads_free(g), 0);
		/* Consumed: nothing runs, nowhere failed. */
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, options_in(m, &r),
					       &g),
			     ADG_ECONSUMED);
		expect_report(&r.report, ADG_ECONSUMED, ADG_FAILED_NOWHERE, 0,
			      NULL, m);
		adg_node_unref(y);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

static int refuse_before(const adg_step_event *e, void *ctx)
{
	(void)ctx;
	return e->after == 0 && e->name != NULL && strcmp(e->name, "a") == 0
		       ? ADG_EUSER - 1
		       : 0;
}

static int fail_for(uint64_t id, void **grad, void *ctx)
{
	(void)grad;
	return id == *(const uint64_t *)ctx ? ADG_EUSER - 2 : 0;
}

CHECKED_TEST(failure, names_the_hook)
{
	static const struct step_plan ok = {0};
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		scalar x = s_leaf(reg, 1);
		adg_node *a = op_named(&x.node, 1, &ok, "a");
		adg_node *y = op_named(&a, 1, &ok, "y");
		adg_grads *g;
		adg_backward_options *o = options_in(m, &r);
		o->on_step = refuse_before;
		o->retain = 1;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, o, &g),
			     ADG_EUSER - 1);
		expect_report(&r.report, ADG_EUSER - 1, ADG_FAILED_ON_STEP,
			      id_of(a), "a", m);

		/* on_ready, for the leaf, then for the root. */
		uint64_t target = x.id;
		o = options_in(m, &r);
		o->on_ready = fail_for;
		o->on_ready_ctx = &target;
		o->retain = 1;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, o, &g),
			     ADG_EUSER - 2);
		expect_report(&r.report, ADG_EUSER - 2, ADG_FAILED_ON_READY,
			      x.id, NULL, m);
		target = id_of(y);
		o = options_in(m, &r);
		o->on_ready = fail_for;
		o->on_ready_ctx = &target;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, o, &g),
			     ADG_EUSER - 2);
		expect_report(&r.report, ADG_EUSER - 2, ADG_FAILED_ON_READY,
			      target, "y", m);
		adg_node_unref(y);
		adg_node_unref(a);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

static int failing_add(void **sum, void *value, void *ctx)
{
	(void)sum;
	scalar_ops.free(value, ctx);
	return ADG_EUSER - 4;
}

/* With an executor an add is the backward's: it names the gradient it
 * folded into. Without one, the add runs in the registering step, which
 * returns its code: the step is named. */
CHECKED_TEST(failure, names_the_add)
{
	static const struct step_plan ok = {0};
	const adg_grad_ops ops = {failing_add, scalar_ops.free, NULL};
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		scalar x = s_leaf(reg, 1);
		adg_node *xx[2] = {x.node, x.node};
		adg_node *y = op_named(xx, 2, &ok, "square");
		adg_grads *g;
		int rc = adg_backward_with(reg, y, scalar_box(1), &ops,
					   options_in(m, &r), &g);
		cr_assert_eq(rc, ADG_EUSER - 4);
		if (m == SEQUENTIAL)
			expect_report(&r.report, rc, ADG_FAILED_STEP, id_of(y),
				      "square", m);
		else
			expect_report(&r.report, rc, ADG_FAILED_ADD, x.id, NULL,
				      m);
		adg_node_unref(y);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* Two branches fail; the one later on the tape fails at once, the earlier
 * one after a nap, so that with workers it often fails later in time. The
 * report names the first in tape order, the one the sequential backward
 * meets, every round. */
CHECKED_TEST(failure, names_the_first_in_tape_order_whatever_the_timing)
{
	static const struct step_plan fast = {.rc = ADG_EUSER - 6},
				      slow = {.rc = ADG_EUSER - 7,
					      .nap_us = 300},
				      ok = {0};
	struct runner r = {0};
	uint64_t first_name_is_slow = 2; /* unknown until the sequential run */
	for (int round = 0; round < 40; round++) {
		enum mode m = round == 0  ? SEQUENTIAL
			      : round % 2 ? POOL2
					  : ALONE;
		scalar x = s_leaf(reg, 1);
		adg_node *a = op_named(&x.node, 1, &slow, "slow");
		adg_node *b = op_named(&x.node, 1, &fast, "fast");
		adg_node *ab[2] = {a, b};
		adg_node *y = op_named(ab, 2, &ok, "y");
		adg_grads *g;
		int rc = adg_backward_with(reg, y, scalar_box(1), &scalar_ops,
					   options_in(m, &r), &g);
		uint64_t slow_first = rc == slow.rc;
		if (round == 0)
			first_name_is_slow = slow_first;
		cr_assert_eq(slow_first, first_name_is_slow, "round %d", round);
		expect_report(&r.report, rc, ADG_FAILED_STEP,
			      id_of(slow_first ? a : b),
			      slow_first ? "slow" : "fast", m);
		adg_node_unref(y);
		adg_node_unref(a);
		adg_node_unref(b);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* What the steps of one pass saw of it: each step's call->pass_id, by
 * slot (3: inner's step, in the nested pass), and, for slot 0, the pass of
 * the backward it runs inside itself (a nested pass, over inner). */
struct pass_log {
	_Atomic uint64_t seen[4];
	_Atomic uint64_t nested_seen;
	adg_node *inner;
};

struct pass_step {
	struct pass_log *log;
	int slot;
};

static int logging_backward(adg_step_call *call, void *user)
{
	const struct pass_step *p = user;
	atomic_store(&p->log->seen[p->slot], call->pass_id);
	if (p->slot == 0 && p->log->inner != NULL) {
		adg_failure f = {.size = sizeof f};
		adg_backward_options o = {
			.size = sizeof o, .failure = &f, .retain = 1};
		adg_grads *g;
		int rc = adg_backward_with(call->registry, p->log->inner,
					   scalar_box(1), &scalar_ops, &o, &g);
		if (rc != 0)
			return rc;
		atomic_store(&p->log->nested_seen, f.pass_id);
		adg_grads_free(g);
	}
	return s_pass_on(call);
}

static adg_node *op_logging(adg_node *const *parents, size_t n,
			    struct pass_step *p)
{
	adg_node *y;
	adg_step step = {.backward = logging_backward, .user = p};
	cr_assert_eq(adg_op(reg, parents, n, &step, &y), 0);
	return y;
}

/* Every step of a pass sees one pass id, on every thread that runs one;
 * the report names it; each pass has its own, and so does a pass nested
 * in a step. */
CHECKED_TEST(failure, every_step_of_a_pass_sees_its_id)
{
	struct runner r = {0};
	uint64_t before[2] = {0, 0};
	for (int round = 0; round < 3 * N_MODES; round++) {
		enum mode m = (enum mode)(round % N_MODES);
		struct pass_log log = {0};
		struct pass_step steps[4] = {
			{&log, 0}, {&log, 1}, {&log, 2}, {&log, 3}};
		scalar z = s_leaf(reg, 1), x = s_leaf(reg, 1);
		adg_node *w = op_logging(&z.node, 1, &steps[3]);
		adg_node *a = op_logging(&x.node, 1, &steps[0]);
		adg_node *b = op_logging(&x.node, 1, &steps[1]);
		adg_node *ab[2] = {a, b};
		adg_node *y = op_logging(ab, 2, &steps[2]);
		log.inner = w;
		adg_grads *g;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, options_in(m, &r),
					       &g),
			     0);
		uint64_t pass = r.report.pass_id;
		cr_assert_neq(pass, 0, "mode %d", m);
		for (int i = 0; i < 3; i++)
			cr_assert_eq(atomic_load(&log.seen[i]), pass,
				     "mode %d, step %d", m, i);
		uint64_t nested = atomic_load(&log.nested_seen);
		cr_assert(nested != 0 && nested != pass, "mode %d", m);
		cr_assert_eq(atomic_load(&log.seen[3]), nested, "mode %d", m);
		cr_assert(pass != before[0] && pass != before[1] &&
				  nested != before[0] && nested != before[1],
			  "mode %d: a pass id seen in the round before", m);
		before[0] = pass;
		before[1] = nested;
		cr_assert_eq(adg_grads_free(g), 0);
		adg_node_unref(y);
		adg_node_unref(a);
		adg_node_unref(b);
		adg_node_unref(w);
		s_drop(x);
		s_drop(z);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* ----------------------------------------------------------- value check */

/* A step that gives `value` to each parent; propagate: it returns what
 * adg_step_give returned, else 0 whatever happened (a careless step). */
struct giving_plan {
	double value;
	bool propagate;
};

static int giving_backward(adg_step_call *call, void *user)
{
	const struct giving_plan *p = user;
	int first = 0;
	for (size_t k = 0; k < call->n_parents; k++) {
		int rc = adg_step_give(call, k, scalar_box(p->value));
		first = first != 0 ? first : rc;
	}
	return p->propagate ? first : 0;
}

static adg_node *op_giving(adg_node *const *parents, size_t n,
			   const struct giving_plan *plan, const char *name)
{
	adg_node *y;
	adg_step step = {.backward = giving_backward,
			 .user = (void *)plan,
			 .name = name};
	cr_assert_eq(adg_op(reg, parents, n, &step, &y), 0);
	return y;
}

static int reject_nan(const void *value, void *ctx)
{
	atomic_fetch_add((atomic_int *)ctx, 1);
	double v = *(const double *)value;
	return v == v ? 0 : ADG_EVALUE;
}

/* A NaN given by one step: the backward fails at that step, which is
 * named, whether the step passes give's code on or not, in every mode,
 * consuming or retained; the value was freed (the fixture counts). */
CHECKED_TEST(failure, the_value_check_names_the_step_that_gave_a_rejected_value)
{
	static const struct giving_plan fine = {1.0, true},
					careless_nan = {NAN, false},
					careful_nan = {NAN, true};
	const struct giving_plan *nans[] = {&careless_nan, &careful_nan};
	struct runner r = {0};
	for (int round = 0; round < 2 * 2 * N_MODES; round++) {
		enum mode m = (enum mode)(round % N_MODES);
		bool retain = round / N_MODES % 2;
		const struct giving_plan *nan_plan = nans[round / N_MODES / 2];
		scalar x = s_leaf(reg, 1);
		adg_node *a = op_giving(&x.node, 1, nan_plan, "sqrt");
		adg_node *y = op_giving(&a, 1, &fine, "top");
		atomic_int checked = 0;
		adg_backward_options *o = options_in(m, &r);
		o->value_check = reject_nan;
		o->value_check_ctx = &checked;
		o->retain = retain;
		adg_grads *g;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, o, &g),
			     ADG_EVALUE, "mode %d", m);
		cr_assert_null(g);
		expect_report(&r.report, ADG_EVALUE, ADG_FAILED_CHECK, id_of(a),
			      "sqrt", m);
		cr_assert_eq(atomic_load(&checked), 2, "mode %d", m);
		if (retain) /* the steps are still there: checked again */
			cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
						       &scalar_ops, o, &g),
				     ADG_EVALUE);
		adg_node_unref(y);
		adg_node_unref(a);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* Accepting every value changes nothing: the same gradients, every give
 * checked once. */
CHECKED_TEST(failure, the_value_check_sees_every_give)
{
	static const struct giving_plan one = {1.0, true}, two = {2.0, true};
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		scalar x = s_leaf(reg, 3);
		adg_node *a = op_giving(&x.node, 1, &two, "a");
		adg_node *ax[2] = {a, x.node};
		adg_node *y = op_giving(ax, 2, &one, "y");
		atomic_int checked = 0;
		adg_backward_options *o = options_in(m, &r);
		o->value_check = reject_nan;
		o->value_check_ctx = &checked;
		adg_grads *g;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, o, &g),
			     0);
		expect_report(&r.report, 0, ADG_FAILED_NOWHERE, 0, NULL, m);
		cr_assert_eq(atomic_load(&checked), 3,
			     "y's two gives, a's one");
		cr_assert_eq(s_grad(g, x), 1.0 + 2.0);
		cr_assert_eq(adg_grads_free(g), 0);
		adg_node_unref(y);
		adg_node_unref(a);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* Two branches give NaNs, the later one on the tape at once, the earlier
 * after a nap: the report names the first in tape order, the sequential
 * backward's, every round. */
static int napping_nan_backward(adg_step_call *call, void *user)
{
	if (user != NULL)
		nanosleep(&(struct timespec){0, 300 * 1000L}, NULL);
	adg_step_give(call, 0, scalar_box(NAN));
	return 0;
}

CHECKED_TEST(failure, the_first_rejected_value_in_tape_order_is_reported)
{
	static const struct giving_plan fine = {1.0, true};
	struct runner r = {0};
	int first_is_slow = -1;
	for (int round = 0; round < 40; round++) {
		enum mode m = round == 0  ? SEQUENTIAL
			      : round % 2 ? POOL2
					  : ALONE;
		scalar x = s_leaf(reg, 1);
		adg_node *a, *b;
		adg_step slow = {.backward = napping_nan_backward,
				 .user = &r,
				 .name = "slow"},
			 fast = {.backward = napping_nan_backward,
				 .name = "fast"};
		cr_assert_eq(adg_op(reg, &x.node, 1, &slow, &a), 0);
		cr_assert_eq(adg_op(reg, &x.node, 1, &fast, &b), 0);
		adg_node *ab[2] = {a, b};
		adg_node *y = op_giving(ab, 2, &fine, "y");
		atomic_int checked = 0;
		adg_backward_options *o = options_in(m, &r);
		o->value_check = reject_nan;
		o->value_check_ctx = &checked;
		adg_grads *g;
		cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
					       &scalar_ops, o, &g),
			     ADG_EVALUE);
		int slow_first = r.report.node_id == id_of(a);
		if (round == 0)
			first_is_slow = slow_first;
		cr_assert_eq(slow_first, first_is_slow, "round %d", round);
		expect_report(&r.report, ADG_EVALUE, ADG_FAILED_CHECK,
			      id_of(slow_first ? a : b),
			      slow_first ? "slow" : "fast", m);
		adg_node_unref(y);
		adg_node_unref(a);
		adg_node_unref(b);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* --------------------------------------------------------- callback sites */

/* What adg_callback_site told one callback: who asked ('s' a step, 'a'
 * an add, 'c' the value check, 'o' on_step, 'r' on_ready), its result,
 * and its answer (junk first, so that an untouched one shows). */
struct site_seen {
	char who;
	int rc;
	adg_failure where;
};

/* The calls of one or more backward passes, in the order they asked.
 * fail: the add and the check fail with it (0: they accept). nested:
 * another log, whose root's backward the step and the add run first. */
struct site_log {
	atomic_int n;
	struct site_seen seen[64];
	int fail;
	adg_node *root;
	const adg_executor *executor;
	struct site_log *nested;
};

/* Records what adg_callback_site tells the calling callback. Asserts
 * nothing: it may run on a worker. */
static void site_note(struct site_log *log, char who)
{
	int i = atomic_fetch_add(&log->n, 1);
	if (i >= 64)
		return; /* the test sees n past the array */
	struct site_seen *s = &log->seen[i];
	memset(&s->where, 0x5a, sizeof s->where);
	s->where.size = sizeof s->where;
	s->who = who;
	s->rc = adg_callback_site(&s->where);
}

static int site_add(void **sum, void *value, void *ctx);
static int site_check(const void *value, void *ctx);

/* The options of a backward whose callbacks note into log. */
static adg_backward_options site_options(struct site_log *log,
					 adg_failure *report)
{
	return (adg_backward_options){.size = sizeof(adg_backward_options),
				      .executor = log->executor,
				      .failure = report,
				      .value_check = site_check,
				      .value_check_ctx = log};
}

/* log's nested backward, if it has one: over log->nested->root, retained
 * (the step and the add run it each time they run), noting into
 * log->nested, on the same executor. */
static void site_nest(struct site_log *log)
{
	struct site_log *in = log->nested;
	if (in == NULL)
		return;
	adg_registry *r;
	adg_grads *g;
	adg_grad_ops ops = {site_add, scalar_ops.free, in};
	adg_backward_options o = site_options(in, NULL);
	o.retain = 1;
	if (adg_node_registry(in->root, &r) != 0 ||
	    adg_backward_with(r, in->root, scalar_box(1), &ops, &o, &g) != 0)
		atomic_fetch_add(&in->n, 1000); /* the test sees n */
	else
		adg_grads_free(g);
}

static int site_add(void **sum, void *value, void *ctx)
{
	struct site_log *log = ctx;
	site_nest(log);
	site_note(log, 'a');
	if (log->fail != 0) {
		scalar_ops.free(value, NULL);
		return log->fail;
	}
	return scalar_ops.add(sum, value, NULL);
}

static int site_check(const void *value, void *ctx)
{
	(void)value;
	struct site_log *log = ctx;
	site_note(log, 'c');
	return log->fail;
}

static int site_on_step(const adg_step_event *event, void *ctx)
{
	(void)event;
	site_note(ctx, 'o');
	return 0;
}

static int site_on_ready(uint64_t id, void **grad, void *ctx)
{
	(void)id;
	(void)grad;
	site_note(ctx, 'r');
	return 0;
}

/* A step that runs log's nested backward, notes, and gives its gradient
 * to every parent slot. */
static int site_backward(adg_step_call *call, void *user)
{
	struct site_log *log = user;
	site_nest(log);
	site_note(log, 's');
	return s_pass_on(call);
}

/* square = x * x, whose step notes into log: its second give folds. */
static adg_node *site_square(scalar x, struct site_log *log)
{
	adg_node *xx[2] = {x.node, x.node}, *y;
	adg_step step = {
		.backward = site_backward, .user = log, .name = "square"};
	cr_assert_eq(adg_op(reg, xx, 2, &step, &y), 0);
	return y;
}

/* The answer a call got is where, with rc 0. */
static void expect_site(const struct site_seen *s, adg_failure_site site,
			uint64_t id, const char *name, uint64_t pass,
			enum mode m)
{
	cr_assert_eq(s->rc, 0, "mode %d, '%c'", m, s->who);
	expect_report(&s->where, 0, site, id, name, m);
	cr_assert_eq(s->where.pass_id, pass, "mode %d, '%c'", m, s->who);
}

/* Where the add of x * x would fail: without an executor in the step
 * (its give returns the code), with one at x's gradient. */
static adg_failure_site add_site(enum mode m)
{
	return m == SEQUENTIAL ? ADG_FAILED_STEP : ADG_FAILED_ADD;
}

/* What a call of the step "square" (of node step_id, over x) was told in
 * pass: the step and its checks name the step, the add the step too
 * without an executor, x's gradient (x_id, no name) with one. */
static void expect_square_site(const struct site_seen *s, uint64_t step_id,
			       uint64_t x_id, uint64_t pass, enum mode m)
{
	if (s->who == 'a')
		expect_site(s, add_site(m), m == SEQUENTIAL ? step_id : x_id,
			    m == SEQUENTIAL ? "square" : NULL, pass, m);
	else
		expect_site(s,
			    s->who == 's' ? ADG_FAILED_STEP : ADG_FAILED_CHECK,
			    step_id, "square", pass, m);
}

/* Inside each callback, adg_callback_site tells what a failure of that
 * call would be named: the step its own node, the check the node whose
 * step gave the value, the add the step (one thread) or the gradient it
 * folds (an executor), on_step its step; on_ready is told ADG_EINVAL and
 * nothing is written. And a failing add or check is named as it was
 * told, pass id included. */
CHECKED_TEST(failure, the_callback_site_names_what_a_failure_would)
{
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		struct site_log log = {0};
		scalar x = s_leaf(reg, 1);
		adg_node *y = site_square(x, &log);
		uint64_t y_id = id_of(y);
		log.executor = options_in(m, &r)->executor;
		adg_grad_ops ops = {site_add, scalar_ops.free, &log};
		adg_backward_options o = site_options(&log, &r.report);
		o.on_step = site_on_step;
		o.on_step_ctx = &log;
		o.on_ready = site_on_ready;
		o.on_ready_ctx = &log;
		o.retain = 1;
		adg_grads *g;
		cr_assert_eq(
			adg_backward_with(reg, y, scalar_box(1), &ops, &o, &g),
			0);
		cr_assert_eq(adg_grads_free(g), 0);
		uint64_t pass = r.report.pass_id;
		/* on_ready (y), on_step, the step, its two checks, the add,
		 * on_step, on_ready (x); with workers the add comes after
		 * the step's last on_step. */
		int n = atomic_load(&log.n), seen[128] = {0};
		cr_assert_eq(n, 8, "mode %d: %d calls", m, n);
		for (int i = 0; i < n; i++) {
			const struct site_seen *s = &log.seen[i];
			seen[(int)s->who]++;
			if (s->who == 's' || s->who == 'c')
				expect_site(s,
					    s->who == 's' ? ADG_FAILED_STEP
							  : ADG_FAILED_CHECK,
					    y_id, "square", pass, m);
			else if (s->who == 'o')
				expect_site(s, ADG_FAILED_ON_STEP, y_id,
					    "square", pass, m);
			else if (s->who == 'a')
				expect_site(s, add_site(m),
					    m == SEQUENTIAL ? y_id : x.id,
					    m == SEQUENTIAL ? "square" : NULL,
					    pass, m);
			else if (s->who == 'r')
				cr_assert(s->rc == ADG_EINVAL &&
						  s->where.pass_id ==
							  0x5a5a5a5a5a5a5a5aull,
					  "mode %d: on_ready told %d", m,
					  s->rc);
		}
		cr_assert(seen['s'] == 1 && seen['c'] == 2 && seen['a'] == 1 &&
				  seen['o'] == 2 && seen['r'] == 2,
			  "mode %d", m);

		/* A failing add, then a rejecting check: named as told. */
		for (int check = 0; check < 2; check++) {
			atomic_store(&log.n, 0);
			log.fail = ADG_EUSER - 8;
			o = site_options(&log, &r.report);
			o.retain = 1;
			if (check == 0)
				o.value_check = NULL;
			cr_assert_eq(adg_backward_with(reg, y, scalar_box(1),
						       &ops, &o, &g),
				     ADG_EUSER - 8);
			char who = check ? 'c' : 'a';
			const struct site_seen *s = NULL;
			for (int i = 0; i < atomic_load(&log.n); i++)
				if (log.seen[i].who == who && s == NULL)
					s = &log.seen[i];
			cr_assert_not_null(s, "mode %d", m);
			expect_site(s, r.report.site, r.report.node_id,
				    r.report.name, r.report.pass_id, m);
			cr_assert_eq(r.report.site,
				     check ? ADG_FAILED_CHECK : add_site(m));
		}
		adg_node_unref(y);
		s_drop(x);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}

/* A backward run inside a step, and one inside an add, answers for its
 * own calls (its pass, its nodes) while it runs, and the outer call's
 * answer is back once it returns; with an executor, on whichever thread
 * runs them. */
CHECKED_TEST(failure, a_nested_backward_has_callback_sites_of_its_own)
{
	struct runner r = {0};
	for (enum mode m = 0; m < N_MODES; m++) {
		struct site_log outer = {0}, inner = {0};
		scalar x = s_leaf(reg, 1), w = s_leaf(reg, 1);
		adg_node *y = site_square(x, &outer);
		adg_node *z = site_square(w, &inner);
		uint64_t y_id = id_of(y), z_id = id_of(z);
		outer.executor = inner.executor = options_in(m, &r)->executor;
		outer.nested = &inner;
		inner.root = z;
		adg_grad_ops ops = {site_add, scalar_ops.free, &outer};
		adg_backward_options o = site_options(&outer, &r.report);
		adg_grads *g;
		cr_assert_eq(
			adg_backward_with(reg, y, scalar_box(1), &ops, &o, &g),
			0);
		cr_assert_eq(adg_grads_free(g), 0);
		uint64_t pass = r.report.pass_id;
		/* Outer: the step, its two checks, the add, each after a
		 * nested backward (the step's and the add's). */
		cr_assert_eq(atomic_load(&outer.n), 4, "mode %d", m);
		for (int i = 0; i < 4; i++)
			expect_square_site(&outer.seen[i], y_id, x.id, pass, m);
		/* Inner: two passes (the step's, the add's) of 4 calls. */
		cr_assert_eq(atomic_load(&inner.n), 8, "mode %d", m);
		uint64_t inner_pass[2] = {0, 0};
		for (int i = 0; i < 8; i++) {
			const struct site_seen *s = &inner.seen[i];
			cr_assert_eq(s->rc, 0, "mode %d", m);
			uint64_t p = s->where.pass_id;
			cr_assert(p != pass && p != 0, "mode %d", m);
			int k = inner_pass[0] == 0 || inner_pass[0] == p ? 0
									 : 1;
			cr_assert(inner_pass[k] == 0 || inner_pass[k] == p,
				  "mode %d: a third pass", m);
			inner_pass[k] = p;
			expect_square_site(s, z_id, w.id, p, m);
		}
		cr_assert(inner_pass[1] != 0, "mode %d: two inner passes", m);
		adg_node_unref(z);
		adg_node_unref(y);
		s_drop(x);
		s_drop(w);
	}
	cr_assert_eq(adg_pool_free(r.pool), 0);
}
