/*
 * A stand-in for the part of Criterion's API that libadg's tests use, for
 * the ThreadSanitizer build only. Criterion 2.4 cannot start under TSan: its
 * BoxFort arena is mapped at random fixed addresses that fall in TSan's
 * reserved ranges ("Could not initialize inheritable arena", Criterion issue
 * 274). The test sources stay the same; this runner gives each test its own
 * forked child, as Criterion does, and prints "tsan: N passed, N failed".
 * Of Criterion's options it takes --filter, with which tests/meson.build
 * splits a binary's tests across test tiers, and --list, with which
 * tests/check-ids.sh checks that every id it splits off names a test.
 *
 * Stricter than Criterion in one respect: a failed check in .fini counts.
 */
#ifndef ADG_TSAN_RUNNER_CRITERION_H
#define ADG_TSAN_RUNNER_CRITERION_H

#include <stdbool.h>
#include <string.h>

struct runner_suite {
	const char *name;
	void (*init)(void);
	void (*fini)(void);
	double timeout;
	struct runner_suite *next;
};

struct runner_test {
	const char *suite, *name;
	void (*fn)(void);
	void (*init)(void);
	void (*fini)(void);
	double timeout;
	struct runner_test *next;
};

void runner_add_suite(struct runner_suite *s);
void runner_add_test(struct runner_test *t);
/* Reports a failed check; a fatal one ends the test's process at once. */
void runner_fail(bool fatal, const char *file, int line, const char *expr,
		 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define TestSuite(suite_, ...)                                                 \
	static struct runner_suite runner_suite_##suite_ = {.name = #suite_,   \
							    ##__VA_ARGS__};    \
	__attribute__((constructor)) static void runner_reg_suite_##suite_(    \
		void)                                                          \
	{                                                                      \
		runner_add_suite(&runner_suite_##suite_);                      \
	}

#define Test(suite_, name_, ...)                                               \
	static void suite_##_##name_##_impl(void);                             \
	static struct runner_test runner_test_##suite_##_##name_ = {           \
		.suite = #suite_,                                              \
		.name = #name_,                                                \
		.fn = suite_##_##name_##_impl,                                 \
		##__VA_ARGS__};                                                \
	__attribute__((                                                        \
		constructor)) static void runner_reg_##suite_##_##name_(void)  \
	{                                                                      \
		runner_add_test(&runner_test_##suite_##_##name_);              \
	}                                                                      \
	static void suite_##_##name_##_impl(void)

#define RUNNER_CHECK(fatal, cond, expr, ...)                                   \
	do {                                                                   \
		if (!(cond))                                                   \
			runner_fail(fatal, __FILE__, __LINE__, expr,           \
				    " " __VA_ARGS__);                          \
	} while (0)

#define cr_assert(c, ...) RUNNER_CHECK(true, (c), #c, __VA_ARGS__)
#define cr_expect(c, ...) RUNNER_CHECK(false, (c), #c, __VA_ARGS__)
#define cr_assert_eq(a, b, ...)                                                \
	RUNNER_CHECK(true, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...)                                                \
	RUNNER_CHECK(false, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...)                                               \
	RUNNER_CHECK(true, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...)                                               \
	RUNNER_CHECK(false, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...)                                                \
	RUNNER_CHECK(true, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...)                                                \
	RUNNER_CHECK(false, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...)                                                \
	RUNNER_CHECK(true, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...)                                                \
	RUNNER_CHECK(false, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...)                                               \
	RUNNER_CHECK(true, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...)                                               \
	RUNNER_CHECK(false, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...)                                               \
	RUNNER_CHECK(true, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...)                                               \
	RUNNER_CHECK(false, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_assert_null(p, ...)                                                 \
	RUNNER_CHECK(true, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_null(p, ...)                                                 \
	RUNNER_CHECK(false, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...)                                             \
	RUNNER_CHECK(true, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...)                                             \
	RUNNER_CHECK(false, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...)                                            \
	RUNNER_CHECK(true, strcmp((a), (b)) == 0, #a " eq " #b, __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...)                                            \
	RUNNER_CHECK(false, strcmp((a), (b)) == 0, #a " eq " #b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...)                                           \
	RUNNER_CHECK(true, strcmp((a), (b)) != 0, #a " neq " #b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...)                                           \
	RUNNER_CHECK(false, strcmp((a), (b)) != 0, #a " neq " #b, __VA_ARGS__)

#endif
