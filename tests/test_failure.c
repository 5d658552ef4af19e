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
	r->o = (adg_backward_options){.failure = &r->report};
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
		adg_failure f;
		adg_backward_options o = {.failure = &f, .retain = 1};
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
