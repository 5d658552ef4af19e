/* The size rule (adg.h, "ABI") at every function that takes a struct the
 * caller allocates: a size of 0 or below the struct's first size is
 * ADG_EINVAL, its exact size works, and a larger one (a newer header's)
 * works when the bytes past libadg's struct are zero, and is ADG_EINVAL
 * when one is not. Then the helper itself (lib/abi.c, compiled in) on a
 * struct that grew, which no public struct has done yet. */
#include "fixture.h"

#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

FIXTURE_SUITE(abi);

/* The helper compiled in (lib/abi.c) writes its reasons here: the
 * library's adg_fail is its own, hidden, and its adg_errmsg reads the
 * library's copy, which the public functions' tests below check. */
static char helper_reason[512];

int adg_fail(int code, const char *func, const char *fmt, ...)
{
	int n = snprintf(helper_reason, sizeof helper_reason, "%s: ", func);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(helper_reason + n, sizeof helper_reason - (size_t)n, fmt, ap);
	va_end(ap);
	return code;
}

/* The sizes each function is tried with: what the caller's struct says,
 * and whether the byte after libadg's struct is set. */
enum size_case { ZERO, TOO_SMALL, EXACT, LARGER, LARGER_DIRTY, N_CASES };

static const char *const case_names[N_CASES] = {
	"0", "too small", "exact", "larger, zero tail", "larger, dirty tail"};

static bool accepted(enum size_case c)
{
	return c == EXACT || c == LARGER;
}

/* A caller's struct of type T as a newer header might have it: T, then
 * fields libadg does not know. */
#define GROWN(T)                                                               \
	struct {                                                               \
		T known;                                                       \
		unsigned char newer[24];                                       \
	}

/* Sets the size of g (a GROWN struct, otherwise as the test set it) for
 * case c. */
#define SIZE_FOR(g, c)                                                         \
	do {                                                                   \
		memset((g).newer, 0, sizeof(g).newer);                         \
		switch (c) {                                                   \
		case ZERO:                                                     \
			(g).known.size = 0;                                    \
			break;                                                 \
		case TOO_SMALL:                                                \
			(g).known.size = sizeof(g).known - 1;                  \
			break;                                                 \
		case EXACT:                                                    \
			(g).known.size = sizeof(g).known;                      \
			break;                                                 \
		case LARGER:                                                   \
			(g).known.size = sizeof(g);                            \
			break;                                                 \
		case LARGER_DIRTY:                                             \
			(g).known.size = sizeof(g);                            \
			(g).newer[5] = 1;                                      \
			break;                                                 \
		default:                                                       \
			break;                                                 \
		}                                                              \
	} while (0)

/* What the reason of a refused size says, after the function's name. */
static const char *const case_reasons[N_CASES] = {
	[ZERO] = "size is 0: set it to sizeof the struct",
	[TOO_SMALL] = "below the struct's",
	[LARGER_DIRTY] = "a field this library does not know",
};

static void expect(int rc, enum size_case c, const char *fn)
{
	if (accepted(c)) {
		cr_assert_eq(rc, 0, "%s, size %s: %d", fn, case_names[c], rc);
		return;
	}
	cr_assert_eq(rc, ADG_EINVAL, "%s, size %s: %d", fn, case_names[c], rc);
	/* The reason names the function (fn's first word) and what was
	 * wrong with the size. */
	const char *why = adg_errmsg();
	cr_assert(strncmp(why, fn, strcspn(fn, "' ")) == 0 &&
			  strstr(why, case_reasons[c]) != NULL,
		  "%s, size %s: reason \"%s\"", fn, case_names[c], why);
}

CHECKED_TEST(abi, registry_options)
{
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_registry_options) g = {0};
		g.known.checkpointing = ADG_CHECKPOINT_BALANCED;
		SIZE_FOR(g, c);
		adg_registry *r = (adg_registry *)&g; /* not NULL after */
		expect(adg_registry_new(&g.known, &r), c, "adg_registry_new");
		if (accepted(c))
			cr_assert_eq(adg_registry_free(r), 0);
		else
			cr_assert_null(r);
	}
}

static int no_step(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

CHECKED_TEST(abi, op_options)
{
	scalar x = s_leaf(reg, 2.0);
	adg_step step = {.backward = no_step};
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_op_options) g = {0};
		SIZE_FOR(g, c);
		adg_node *n = x.node;
		expect(adg_op_with(reg, &x.node, 1, &step, &g.known, &n), c,
		       "adg_op_with");
		if (accepted(c))
			cr_assert_eq(adg_node_unref(n), 0);
		else
			cr_assert_null(n);
	}
	s_drop(x);
}

/* A backward of x * y with options o: 0 or its error. */
static int backward_with(const adg_backward_options *o)
{
	scalar x = s_leaf(reg, 2.0), y = s_leaf(reg, 3.0);
	scalar z = s_mul(reg, x, y);
	adg_grads *g = NULL;
	int rc = adg_backward_with(reg, z.node, scalar_box(1.0), &scalar_ops, o,
				   &g);
	cr_assert_eq(adg_grads_free(g), 0);
	s_drop(z);
	s_drop(y);
	s_drop(x);
	return rc;
}

CHECKED_TEST(abi, backward_options)
{
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_backward_options) g = {0};
		SIZE_FOR(g, c);
		expect(backward_with(&g.known), c, "adg_backward_with");
	}
}

/* adg_failure, reached through the options: checked before anything
 * runs, and written only up to its size, its size kept. */
CHECKED_TEST(abi, failure_in_backward_options)
{
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_failure) f;
		memset(&f, 0x5a, sizeof f);
		SIZE_FOR(f, c);
		size_t size = f.known.size;
		adg_backward_options o = {.size = sizeof o,
					  .failure = &f.known};
		expect(backward_with(&o), c, "adg_backward_with's failure");
		cr_assert_eq(f.known.size, size);
		if (accepted(c)) {
			cr_assert_eq(f.known.code, 0);
			cr_assert_eq(f.known.site, ADG_FAILED_NOWHERE);
			cr_assert_neq(f.known.pass_id, 0);
			for (size_t i = 0; i < sizeof f.newer; i++)
				cr_assert_eq(f.newer[i], 0, "byte %zu", i);
		} else {
			cr_assert_eq(f.known.code, 0x5a5a5a5a, "untouched");
		}
	}
}

/* What a step's adg_callback_site call returned, and the failure. */
struct site_probe {
	adg_failure *where;
	int rc;
};

static int site_step(adg_step_call *call, void *user)
{
	(void)call;
	struct site_probe *p = user;
	p->rc = adg_callback_site(p->where);
	return 0;
}

CHECKED_TEST(abi, failure_of_callback_site)
{
	scalar x = s_leaf(reg, 2.0);
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_failure) f;
		memset(&f, 0x5a, sizeof f);
		SIZE_FOR(f, c);
		struct site_probe p = {.where = &f.known, .rc = 1};
		adg_step step = {.backward = site_step, .user = &p};
		adg_node *n;
		cr_assert_eq(adg_op(reg, &x.node, 1, &step, &n), 0);
		adg_grads *g;
		cr_assert_eq(
			adg_backward(reg, n, scalar_box(1.0), &scalar_ops, &g),
			0);
		cr_assert_eq(adg_grads_free(g), 0);
		cr_assert_eq(adg_node_unref(n), 0);
		expect(p.rc, c, "adg_callback_site");
		if (accepted(c))
			cr_assert_eq(f.known.site, ADG_FAILED_STEP);
		else
			cr_assert_eq(f.known.code, 0x5a5a5a5a, "untouched");
	}
	s_drop(x);
}

static int write_nothing(const char *text, size_t len, void *ctx)
{
	(void)text;
	(void)len;
	(void)ctx;
	return 0;
}

CHECKED_TEST(abi, dot_options)
{
	scalar x = s_leaf(reg, 2.0), y = s_leaf(reg, 3.0);
	scalar z = s_mul(reg, x, y);
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_dot_options) g = {0};
		SIZE_FOR(g, c);
		expect(adg_graph_write_dot_with(z.node, &g.known, write_nothing,
						NULL),
		       c, "adg_graph_write_dot_with");
	}
	s_drop(z);
	s_drop(y);
	s_drop(x);
}

CHECKED_TEST(abi, stats)
{
	scalar x = s_leaf(reg, 2.0);
	for (int c = 0; c < N_CASES; c++) {
		GROWN(struct adg_stats) g;
		memset(&g, 0x5a, sizeof g);
		SIZE_FOR(g, c);
		expect(adg_registry_stats(reg, &g.known), c,
		       "adg_registry_stats");
		if (accepted(c))
			cr_assert_eq(g.known.live_nodes, 1);
		else
			cr_assert_eq(g.known.live_nodes, 0x5a5a5a5a5a5a5a5a);
	}
	s_drop(x);
}

CHECKED_TEST(abi, pool_options)
{
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_pool_options) g = {0};
		g.known.n_threads = 1;
		SIZE_FOR(g, c);
		adg_pool *p = (adg_pool *)&g;
		expect(adg_pool_new_with(&g.known, &p), c, "adg_pool_new_with");
		if (accepted(c))
			cr_assert_eq(adg_pool_free(p), 0);
		else
			cr_assert_null(p);
	}
}

static int r_add(void **sum, const void *value, void *ctx)
{
	(void)sum;
	(void)value;
	(void)ctx;
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
	(void)value;
	(void)participant;
	(void)ctx;
}

CHECKED_TEST(abi, reducer_options_and_hook)
{
	static const uint64_t ids[] = {1};
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_reducer_options) g = {0};
		g.known.n_participants = 1;
		g.known.param_ids = ids;
		g.known.n_params = 1;
		g.known.ops = (adg_reducer_ops){
			.add = r_add, .apply = r_apply, .release = r_release};
		SIZE_FOR(g, c);
		adg_reducer *r = (adg_reducer *)&g;
		expect(adg_reducer_new(&g.known, &r), c, "adg_reducer_new");
		if (!accepted(c)) {
			cr_assert_null(r);
			continue;
		}
		/* adg_reducer_hook reads and writes the caller's backward
		 * options in place. */
		for (int h = 0; h < N_CASES; h++) {
			GROWN(adg_backward_options) o = {0};
			SIZE_FOR(o, h);
			expect(adg_reducer_hook(r, 0, &o.known), h,
			       "adg_reducer_hook");
			cr_assert_eq(o.known.on_ready != NULL, accepted(h));
		}
		cr_assert_eq(adg_reducer_free(r), 0);
	}
}

/* adg_reducer_end_with's failure (read) and round (filled), and
 * adg_reducer_unit_end_with's failure: a refused size ends nothing, so
 * the same participant ends its round with the next case. */
CHECKED_TEST(abi, reducer_failures)
{
	static const uint64_t ids[] = {1};
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = 1,
		.n_units = 1,
		.param_ids = ids,
		.n_params = 1,
		.ops = {.add = r_add, .apply = r_apply, .release = r_release}};
	adg_reducer *r;
	cr_assert_eq(adg_reducer_new(&o, &r), 0);
	size_t unit;
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_failure) f = {0};
		SIZE_FOR(f, c);
		cr_assert_eq(adg_reducer_next_unit(r, 0, &unit), 0);
		expect(adg_reducer_unit_end_with(r, 0, &f.known), c,
		       "adg_reducer_unit_end_with");
		if (!accepted(c))
			cr_assert_eq(adg_reducer_unit_end(r, 0, 0), 0);
		expect(adg_reducer_end_with(r, 0, &f.known, NULL), c,
		       "adg_reducer_end_with's failure");
		if (!accepted(c))
			cr_assert_eq(adg_reducer_end(r, 0, 0), 0);
	}
	for (int c = 0; c < N_CASES; c++) {
		GROWN(adg_reducer_failure) round;
		memset(&round, 0x5a, sizeof round);
		SIZE_FOR(round, c);
		cr_assert_eq(adg_reducer_next_unit(r, 0, &unit), 0);
		cr_assert_eq(adg_reducer_unit_end(r, 0, 0), 0);
		expect(adg_reducer_end_with(r, 0, NULL, &round.known), c,
		       "adg_reducer_end_with's round");
		if (accepted(c)) {
			cr_assert_eq(round.known.code, 0);
			for (size_t i = 0; i < sizeof round.newer; i++)
				cr_assert_eq(round.newer[i], 0, "byte %zu", i);
		} else {
			cr_assert_eq(round.known.code, 0x5a5a5a5a, "untouched");
			cr_assert_eq(adg_reducer_end(r, 0, 0), 0);
		}
	}
	cr_assert_eq(adg_reducer_free(r), 0);
}

/* ------------------------------------------------- the helper, on its own */

/* A struct as 0.2.0 had it, and as a later version has it, one field
 * more: what libadg and a binary see when one of them is older. */
struct old_opts {
	size_t size;
	int a;
};
struct new_opts {
	size_t size;
	int a;
	uint64_t b;
};
#define FIRST offsetof(struct new_opts, b)

Test(abi_helper, an_older_callers_struct_reads_as_zero_past_its_size)
{
	struct {
		struct old_opts old;
		unsigned char junk[16];
	} given;
	memset(&given, 0x5a, sizeof given); /* past its size: not read */
	given.old = (struct old_opts){.size = sizeof given.old, .a = 7};
	struct new_opts local;
	memset(&local, 0x77, sizeof local);
	cr_assert_eq(adg_abi_read("f", "options", &local, sizeof local, FIRST,
				  &given),
		     0);
	cr_assert_eq(local.a, 7);
	cr_assert_eq(local.b, 0);
}

Test(abi_helper, sizes_below_the_first_are_refused)
{
	struct new_opts given = {.size = FIRST - 1, .a = 7}, local;
	cr_assert_eq(adg_abi_read("f", "options", &local, sizeof local, FIRST,
				  &given),
		     ADG_EINVAL);
	given.size = 0;
	cr_assert_eq(adg_abi_check("f", "options", &given, sizeof local, FIRST),
		     ADG_EINVAL);
	cr_assert_str_eq(helper_reason, "f: options->size is 0: set it to "
					"sizeof the struct (adg.h, \"ABI\")");
	given.size = FIRST;
	cr_assert_eq(adg_abi_check("f", "options", &given, sizeof local, FIRST),
		     0);
}

Test(abi_helper, a_newer_callers_fields_must_be_unset)
{
	struct new_opts given = {.size = sizeof given, .a = 7};
	struct old_opts local;
	cr_assert_eq(adg_abi_read("f", "options", &local, sizeof local,
				  sizeof local, &given),
		     0);
	cr_assert_eq(local.a, 7);
	given.b = 1;
	cr_assert_eq(adg_abi_read("f", "options", &local, sizeof local,
				  sizeof local, &given),
		     ADG_EINVAL);
}

Test(abi_helper, an_output_is_written_up_to_the_callers_size)
{
	struct {
		struct old_opts old;
		unsigned char after[16];
	} given;
	memset(&given, 0x5a, sizeof given);
	given.old.size = sizeof given.old;
	struct new_opts local = {.size = 999, .a = 7, .b = 8};
	cr_assert_eq(adg_abi_check("f", "options", &given, sizeof local,
				   sizeof given.old),
		     0);
	adg_abi_write(&given, &local, sizeof local);
	cr_assert_eq(given.old.size, sizeof given.old, "its size kept");
	cr_assert_eq(given.old.a, 7);
	for (size_t i = 0; i < sizeof given.after; i++)
		cr_assert_eq(given.after[i], 0x5a, "byte %zu past its size", i);
}
