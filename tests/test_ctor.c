/*
 * libadg used before main: from a constructor, and from a thread that the
 * constructor created before libadg's first use. liburcu reverted its
 * initial-exec TLS over lazy-initialisation deadlocks with library
 * constructors; libadg's reader word and shard slots are initial-exec TLS
 * too, zero-initialised in every thread's static TLS, and a thread's first
 * read-side section registers it with no allocation (lib/readside.c). The
 * constructor places nodes (read-side sections), merges graphs, retires
 * enough of them to free a limbo after a grace period, runs a backward and
 * frees its registry; the early thread does the same once the constructor
 * is done, and main does it again on a registry made after the others
 * were freed. A plain main, in every build: it prints Criterion's
 * synthesis line, which scripts/test.sh and scripts/valgrind.sh read.
 */
#include "adg.h"
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int tests, failures;

static void check(bool ok, const char *what)
{
	tests++;
	if (!ok) {
		failures++;
		fprintf(stderr, "test_ctor: FAIL: %s\n", what);
	}
}

static int ctor_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static int ctor_add(void **sum, void *value, void *ctx)
{
	(void)sum;
	(void)value;
	(void)ctx;
	return 0;
}

static void ctor_free(void *value, void *ctx)
{
	(void)value;
	(void)ctx;
}

static const adg_grad_ops ctor_ops = {ctor_add, ctor_free, NULL};
static char ctor_seed;

static adg_node *ctor_op(adg_registry *r, adg_node *a, adg_node *b)
{
	adg_node *parents[] = {a, b}, *out = NULL;
	adg_step step = {.backward = ctor_backward};
	if (adg_op(r, parents, b != NULL ? 2 : 1, &step, &out) != 0)
		return NULL;
	return out;
}

/* One graph per node of many, then all merged into one: each merge
 * retires a graph on this thread, past its pool into its limbo, which a
 * grace period frees. Returns whether every call did what it should. */
static bool ctor_work(void)
{
	enum { N = ADG_GRAPH_POOL_MAX + 2 * ADG_GRAPH_LIMBO_MAX };
	adg_registry *r;
	adg_node *leaf, *tip = NULL;
	bool ok = adg_registry_new(NULL, &r) == 0 && adg_leaf(r, &leaf) == 0;
	if (!ok)
		return false;
	for (int i = 0; i < N && ok; i++) {
		adg_node *n = ctor_op(r, leaf, NULL); /* a graph of its own */
		adg_node *m = n == NULL	    ? NULL
			      : tip == NULL ? n
					    : ctor_op(r, tip, n); /* merged */
		ok = n != NULL && m != NULL;
		if (tip != NULL && m != NULL) {
			adg_node_unref(tip);
			adg_node_unref(n);
		}
		tip = m;
	}
	uint64_t id = 0;
	ok = ok && adg_node_graph_id(tip, &id) == 0 && id != 0;
	adg_grads *g = NULL;
	ok = ok && adg_backward(r, tip, &ctor_seed, &ctor_ops, &g) == 0;
	adg_grads_free(g);
	if (tip != NULL)
		adg_node_unref(tip);
	adg_node_unref(leaf);
	struct adg_stats st = {.size = sizeof st};
	ok = ok && adg_registry_stats(r, &st) == 0 && st.live_graphs == 0;
	return adg_registry_free(r) == 0 && ok;
}

static pthread_t early_thread;
static pthread_barrier_t ctor_done;
static bool ctor_ok, early_ok, early_started;

static void *ctor_early(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&ctor_done);
	early_ok = ctor_work();
	return NULL;
}

__attribute__((constructor)) static void ctor_first_use(void)
{
	pthread_barrier_init(&ctor_done, NULL, 2);
	/* Created before this process's first call into libadg. */
	early_started =
		pthread_create(&early_thread, NULL, ctor_early, NULL) == 0;
	ctor_ok = ctor_work();
	if (early_started)
		pthread_barrier_wait(&ctor_done);
}

int main(void)
{
	check(ctor_ok, "libadg used from a constructor");
	check(early_started, "a thread created before libadg's first use");
	if (early_started)
		pthread_join(early_thread, NULL);
	check(early_ok, "libadg used from that thread");
	check(ctor_work(), "a registry made after the others were freed");
	printf("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | "
	       "Crashing: 0\n",
	       tests, tests - failures, failures);
	return failures != 0;
}
