/*
 * The fixture the tests share: each test works on a fresh registry, reg,
 * and ends by checking that it gave everything back: reg frees (no node is
 * left alive), and no gradient, step closure, forward output, byte of
 * fixture_alloc or, in AddressSanitizer builds, heap block is left.
 *
 * A suite whose tests start on a default registry:
 *
 *	FIXTURE_SUITE(graph);
 *	CHECKED_TEST(graph, leaf_reused_across_graphs) { ... reg ... }
 *
 * Another .init may call fixture_open with options of its own; a test that
 * opens registries one after another calls fixture_open and fixture_close
 * itself, in a plain Test.
 */
#ifndef ADG_TEST_FIXTURE_H
#define ADG_TEST_FIXTURE_H

#include "scalar.h"

#include <criterion/criterion.h>

/* The registry the test works on. */
extern adg_registry *reg;
/* An allocator for reg that counts its bytes (failing_allocator); one that
 * still holds some at the end fails the test. */
extern failing_alloc fixture_alloc;

/* Zeroes the scalar backend's counters and fixture_alloc, then opens reg
 * with o (NULL: adg_registry_new's defaults). */
void fixture_open(const adg_registry_options *o);
/* fixture_open(NULL), as a suite's .init. */
void fixture_open_default(void);
/* Frees reg, which must have no live node, and asserts that nothing
 * leaked. */
void fixture_close(void);

/* What each thread of a concurrent scenario gets: the scenario's state
 * (a struct of the test's, never file-scope globals) and its number. */
struct thread {
	void *s;
	int i;
};

/* Runs fn on n threads, numbered from 0, each with &(struct thread){s, i},
 * and joins them. */
void run_threads(int n, void *(*fn)(void *), void *s);

#define FIXTURE_SUITE(suite, ...)                                              \
	TestSuite(suite, .init = fixture_open_default, ##__VA_ARGS__)

/* Criterion 2.4 ignores assertion failures in a suite's .fini, so a
 * fixture's end checks would not count there: CHECKED_TEST runs them at
 * the end of the test's own body. */
#define CHECKED_TEST(suite, name, ...)                                         \
	static void suite##_##name##_body(void);                               \
	Test(suite, name, ##__VA_ARGS__)                                       \
	{                                                                      \
		suite##_##name##_body();                                       \
		fixture_close();                                               \
	}                                                                      \
	static void suite##_##name##_body(void)

#endif
