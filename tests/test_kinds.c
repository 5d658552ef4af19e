/*
 * Step kinds (lib/kind.c): a node keeps a pointer to its step's interned
 * (backward, release, name) and the step's user pointer. White-box: the
 * tests read node->kind through lib/internal.h, as test_ctor.c does, to
 * check that one triple is one kind however many threads register it, that
 * distinct triples stay distinct, that the registry's table grows while
 * other threads look kinds up (a stress test, run under TSan in the TSan
 * build), and that a failed intern changes nothing.
 */
#include "kind.h"
#include "scalar.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* ------------------------------------------------------------- helpers */

static atomic_long releases;

static int backward_a(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static int backward_b(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static void release_count(void *user)
{
	(void)user;
	atomic_fetch_add(&releases, 1);
}

/* Distinct name pointers, one per kind of the growth tests: kinds compare
 * names by address (adg.h: names are static). */
#define N_NAMES 200
static const char names[N_NAMES][2];

_Static_assert(N_NAMES > 4 * ADG_KIND_TABLE_MIN,
	       "the tests grow the kind table several times");

static adg_registry *registry_new(const adg_allocator *allocator)
{
	adg_registry_options o = {.size = sizeof o};
	if (allocator != NULL)
		o.allocator = *allocator;
	adg_registry *r;
	cr_assert_eq(adg_registry_new(&o, &r), 0);
	return r;
}

static adg_node *leaf(adg_registry *r)
{
	adg_node *n;
	cr_assert_eq(adg_leaf(r, &n), 0);
	return n;
}

static adg_node *op(adg_registry *r, adg_node *parent, const adg_step *step)
{
	adg_node *n;
	cr_assert_eq(adg_op(r, &parent, 1, step, &n), 0);
	return n;
}

static const struct adg_step_kind *kind_of(adg_node *n)
{
	return ((struct adg_node *)n)->kind;
}

static void unref(adg_node *n)
{
	cr_assert_eq(adg_node_unref(n), 0);
}

/* ------------------------------------------------------ one triple, one */

#define THREADS	       8
#define OPS_PER_THREAD 2000

struct same_arg {
	adg_registry *r;
	pthread_barrier_t *start;
	const struct adg_step_kind *kinds[OPS_PER_THREAD];
	bool users_kept;
};

static void *same_triple_thread(void *p)
{
	struct same_arg *a = p;
	adg_node *x;
	if (adg_leaf(a->r, &x) != 0)
		return NULL;
	pthread_barrier_wait(a->start);
	a->users_kept = true;
	for (int i = 0; i < OPS_PER_THREAD; i++) {
		adg_step step = {.backward = backward_a,
				 .release = release_count,
				 .user = &a->kinds[i],
				 .name = "same"};
		adg_node *n;
		if (adg_op(a->r, &x, 1, &step, &n) != 0)
			break;
		a->kinds[i] = kind_of(n);
		if (((struct adg_node *)n)->user != &a->kinds[i])
			a->users_kept = false;
		adg_node_unref(n);
	}
	adg_node_unref(x);
	return NULL;
}

Test(kinds, one_triple_from_many_threads_is_one_kind)
{
	adg_registry *r = registry_new(NULL);
	pthread_barrier_t start;
	pthread_barrier_init(&start, NULL, THREADS);
	static struct same_arg args[THREADS];
	pthread_t t[THREADS];
	atomic_store(&releases, 0);
	for (int i = 0; i < THREADS; i++) {
		args[i] = (struct same_arg){.r = r, .start = &start};
		cr_assert_eq(pthread_create(&t[i], NULL, same_triple_thread,
					    &args[i]),
			     0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&start);

	const struct adg_step_kind *k = args[0].kinds[0];
	cr_assert_not_null(k);
	cr_assert_eq(k->registry, r);
	cr_assert_eq(k->backward, backward_a);
	cr_assert_eq(k->release, release_count);
	for (int i = 0; i < THREADS; i++) {
		cr_assert(args[i].users_kept, "thread %d: a node lost its user",
			  i);
		for (int j = 0; j < OPS_PER_THREAD; j++)
			cr_assert_eq(args[i].kinds[j], k,
				     "thread %d, op %d: another kind", i, j);
	}
	cr_assert_eq(atomic_load(&releases), THREADS * OPS_PER_THREAD);
	cr_assert_eq(adg_registry_free(r), 0);
}

/* ------------------------------------------------- distinct stay distinct */

static const char name_x[] = "x", name_y[] = "x"; /* same text, two names */

Test(kinds, distinct_triples_stay_distinct)
{
	adg_registry *r = registry_new(NULL), *r2 = registry_new(NULL);
	adg_node *x = leaf(r), *x2 = leaf(r2);
	const adg_step steps[] = {
		{.backward = backward_a},
		{.backward = backward_b},
		{.backward = backward_a, .release = release_count},
		{.backward = backward_a, .name = name_x},
		{.backward = backward_a, .name = name_y},
		{.backward = backward_b,
		 .release = release_count,
		 .name = name_x},
	};
	enum { N = sizeof steps / sizeof *steps };
	const struct adg_step_kind *kinds[N];
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < N; i++) {
			adg_step s = steps[i];
			s.user = &kinds[i]; /* the user is no part of a kind */
			adg_node *n = op(r, x, &s);
			const struct adg_step_kind *k = kind_of(n);
			cr_assert_eq(((struct adg_node *)n)->user, &kinds[i]);
			cr_assert_eq(k->registry, r);
			cr_assert_eq(k->backward, s.backward);
			cr_assert_eq(k->release, s.release);
			cr_assert_eq(k->name, s.name);
			if (round == 0)
				kinds[i] = k;
			else
				cr_assert_eq(k, kinds[i], "step %d: reinterned",
					     i);
			for (int j = 0; j < i; j++)
				cr_assert_neq(k, kinds[j],
					      "steps %d and %d: one kind", j,
					      i);
			/* Another registry: a kind of its own. */
			adg_node *n2 = op(r2, x2, &s);
			cr_assert_neq(kind_of(n2), k);
			cr_assert_eq(kind_of(n2)->registry, r2);
			unref(n2);
			unref(n);
		}
	}
	/* Leaves share their registry's leaf kind, which has no step. */
	adg_node *y = leaf(r);
	cr_assert_eq(kind_of(y), kind_of(x));
	cr_assert_eq(kind_of(y), &((struct adg_registry *)r)->leaf_kind);
	cr_assert_null(kind_of(y)->backward);
	cr_assert_eq(kind_of(y)->registry, r);
	cr_assert_neq(kind_of(x2), kind_of(x));
	unref(y);
	unref(x);
	unref(x2);
	cr_assert_eq(adg_registry_free(r), 0);
	cr_assert_eq(adg_registry_free(r2), 0);
}

/* A backward runs each node's own step with the node's user, and a
 * failure report names the step. */
static int backward_user(adg_step_call *call, void *user)
{
	for (uint32_t i = 0; i < call->n_parents; i++) {
		int rc = adg_step_give(call, i, scalar_box(1));
		if (rc != 0)
			return rc;
	}
	return *(int *)user == 7 ? 0 : ADG_EINVAL;
}

static int backward_fails(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return ADG_ECALLBACK;
}

Test(kinds, a_backward_runs_the_kinds_step_with_the_nodes_user)
{
	adg_registry *r = registry_new(NULL);
	adg_node *x = leaf(r);
	int seven = 7, other = 8;
	adg_step bad = {.backward = backward_fails, .name = "bad"};
	adg_step ok = {.backward = backward_user, .user = &seven, .name = "ok"};
	adg_node *a = op(r, x, &bad);
	adg_node *b = op(r, a, &ok);
	ok.user = &other; /* same kind, another user */
	adg_node *c = op(r, x, &ok);
	cr_assert_eq(kind_of(b), kind_of(c));
	adg_failure failure = {.size = sizeof failure};
	adg_backward_options o = {.size = sizeof o, .failure = &failure};
	adg_grads *g = NULL;
	int rc = adg_backward_with(r, b, scalar_box(1), &scalar_ops, &o, &g);
	cr_assert_eq(rc, ADG_ECALLBACK, "%s", adg_strerror(rc));
	cr_assert_null(g);
	cr_assert_str_eq(failure.name, "bad");
	cr_assert_eq(failure.site, ADG_FAILED_STEP);
	rc = adg_backward(r, c, scalar_box(1), &scalar_ops, &g);
	cr_assert_eq(rc, ADG_EINVAL, "c's step saw b's user");
	unref(c);
	unref(b);
	unref(a);
	unref(x);
	cr_assert_eq(adg_registry_free(r), 0);
}

/* ------------------------------------ growth while other threads look up */

#define GROW_THREADS 4
#define GROW_ROUNDS  20

struct grow_arg {
	adg_registry *r;
	pthread_barrier_t *start;
	unsigned int seed;
	const struct adg_step_kind *kinds[N_NAMES];
	int bad; /* ops whose kind was not their triple's, or failed */
};

static void *grow_thread(void *p)
{
	struct grow_arg *a = p;
	adg_node *x;
	if (adg_leaf(a->r, &x) != 0) {
		a->bad++;
		return NULL;
	}
	int order[N_NAMES];
	for (int i = 0; i < N_NAMES; i++)
		order[i] = i;
	for (int i = N_NAMES - 1; i > 0; i--) { /* each thread its order */
		int j = (int)(rand_r(&a->seed) % (unsigned int)(i + 1));
		int t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	pthread_barrier_wait(a->start);
	/* Twice over: the second pass finds every kind, in the shard's cache
	 * or in a table another thread may still be growing. */
	for (int pass = 0; pass < 2; pass++) {
		for (int i = 0; i < N_NAMES; i++) {
			int k = order[i];
			adg_step step = {.backward = backward_a,
					 .name = names[k]};
			adg_node *n;
			if (adg_op(a->r, &x, 1, &step, &n) != 0) {
				a->bad++;
				continue;
			}
			const struct adg_step_kind *kind = kind_of(n);
			if (kind->name != names[k] ||
			    kind->backward != backward_a ||
			    kind->release != NULL || kind->registry != a->r ||
			    (pass == 1 && kind != a->kinds[k]))
				a->bad++;
			a->kinds[k] = kind;
			adg_node_unref(n);
		}
	}
	adg_node_unref(x);
	return NULL;
}

Test(kinds_stress, the_table_grows_while_other_threads_look_up)
{
	for (int round = 0; round < GROW_ROUNDS; round++) {
		adg_registry *r = registry_new(NULL);
		pthread_barrier_t start;
		pthread_barrier_init(&start, NULL, GROW_THREADS);
		static struct grow_arg args[GROW_THREADS];
		pthread_t t[GROW_THREADS];
		for (int i = 0; i < GROW_THREADS; i++) {
			args[i] = (struct grow_arg){
				.r = r,
				.start = &start,
				.seed = (unsigned int)(round * GROW_THREADS +
						       i + 1),
			};
			cr_assert_eq(pthread_create(&t[i], NULL, grow_thread,
						    &args[i]),
				     0);
		}
		for (int i = 0; i < GROW_THREADS; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&start);
		for (int i = 0; i < GROW_THREADS; i++) {
			cr_assert_eq(args[i].bad, 0,
				     "round %d, thread %d: %d ops wrong", round,
				     i, args[i].bad);
			for (int k = 0; k < N_NAMES; k++)
				cr_assert_eq(args[i].kinds[k], args[0].kinds[k],
					     "round %d: kind %d interned twice",
					     round, k);
		}
		for (int k = 1; k < N_NAMES; k++)
			cr_assert_neq(args[0].kinds[k], args[0].kinds[k - 1]);
		cr_assert_eq(adg_registry_free(r), 0);
	}
}

/* ------------------------------------------------------ out of memory */

/* An allocator that fails the Nth allocation from when it is armed, and
 * checks that every block goes back with the size it was asked for. */
static struct {
	long fail_at; /* 0: none */
	long seen;
	bool failed;
	long live_bytes;
	long bad_frees;
} oom;

#define HEADER 16

static void *oom_alloc(size_t size, void *ctx)
{
	(void)ctx;
	if (oom.fail_at != 0 && ++oom.seen == oom.fail_at) {
		oom.failed = true;
		oom.fail_at = 0;
		return NULL;
	}
	size_t *p = malloc(size + HEADER);
	if (p == NULL)
		return NULL;
	p[0] = size;
	oom.live_bytes += (long)size;
	return (char *)p + HEADER;
}

static void oom_free(void *ptr, size_t size, void *ctx)
{
	(void)ctx;
	size_t *p = (size_t *)((char *)ptr - HEADER);
	if (p[0] != size)
		oom.bad_frees++;
	oom.live_bytes -= (long)size;
	free(p);
}

static void oom_arm(long n)
{
	oom.fail_at = n;
	oom.seen = 0;
	oom.failed = false;
}

static uint64_t id_of(adg_node *n)
{
	uint64_t id;
	cr_assert_eq(adg_node_id(n, &id), 0);
	return id;
}

/* The registry's table (white-box): how many kinds, and its size. */
static size_t kinds_held(adg_registry *r, size_t *size)
{
	struct adg_kind_table *t =
		atomic_load(&((struct adg_registry *)r)->kinds);
	*size = t != NULL ? t->size : 0;
	return t != NULL ? t->count : 0;
}

Test(kinds, a_failed_intern_changes_nothing)
{
	static const adg_allocator a = {oom_alloc, oom_free, NULL};
	oom = (__typeof__(oom)){0};
	atomic_store(&releases, 0);
	adg_registry *r = registry_new(&a);
	adg_node *x = leaf(r);
	uint64_t last_id = id_of(x);
	long intern_failures = 0, later_failures = 0;
	size_t tables = 0, size = 0;
	adg_node *made[N_NAMES];
	/* Each new kind with each allocation failed in turn: the kind, the
	 * first table or one it grows into, then the node and its graph
	 * (test_oom.c covers those), until a call in which none failed. */
	for (int k = 0; k < N_NAMES; k++) {
		adg_step step = {.backward = backward_a,
				 .release = release_count,
				 .name = names[k]};
		adg_node *out;
		for (long n = 1;; n++) {
			struct adg_stats before = {.size = sizeof before},
					 after = {.size = sizeof after};
			cr_assert_eq(adg_registry_stats(r, &before), 0);
			size_t size_before;
			size_t held = kinds_held(r, &size_before);
			long bytes = oom.live_bytes;
			oom_arm(n);
			out = (adg_node *)&out;
			int rc = adg_op(r, &x, 1, &step, &out);
			bool failed = oom.failed;
			oom_arm(0);
			if (size_before != size) {
				tables++;
				size = size_before;
			}
			if (rc == 0) {
				cr_assert(!failed,
					  "kind %d, N=%ld: an allocation "
					  "failed unseen",
					  k, n);
				break;
			}
			cr_assert_eq(rc, ADG_ENOMEM);
			cr_assert(failed);
			cr_assert_null(out);
			cr_assert_eq(adg_registry_stats(r, &after), 0);
			cr_assert_eq(after.live_nodes, before.live_nodes);
			cr_assert_eq(after.live_steps, before.live_steps);
			cr_assert_eq(after.live_graphs, before.live_graphs);
			cr_assert_eq(atomic_load(&releases), 0);
			size_t size_after;
			size_t held_after = kinds_held(r, &size_after);
			if (held_after == held) {
				/* The intern failed: not a byte kept, the
				 * table as it was. */
				cr_assert_eq(oom.live_bytes, bytes,
					     "kind %d, N=%ld: memory kept", k,
					     n);
				cr_assert_eq(size_after, size_before);
				intern_failures++;
			} else {
				/* Interned, then the node or its graph
				 * failed: the kind stays for the retry. */
				cr_assert_eq(held_after, held + 1);
				later_failures++;
			}
		}
		/* Failed calls took no id. */
		cr_assert_eq(id_of(out), last_id + 1, "kind %d", k);
		last_id = id_of(out);
		made[k] = out;
	}
	size_t final_size;
	cr_assert_eq(kinds_held(r, &final_size), N_NAMES);
	if (final_size != size)
		tables++;
	/* Every kind failed once, and every table made (the first, and one
	 * per growth) once more, in a call that then kept nothing. */
	cr_assert_gt(tables, 2);
	cr_assert_eq(intern_failures, N_NAMES + (long)tables);
	cr_assert_gt(later_failures, 0);
	for (int k = 0; k < N_NAMES; k++)
		unref(made[k]);
	cr_assert_eq(atomic_load(&releases), N_NAMES);
	unref(x);
	cr_assert_eq(adg_registry_free(r), 0);
	cr_assert_eq(oom.live_bytes, 0, "the registry left %ld bytes",
		     oom.live_bytes);
	cr_assert_eq(oom.bad_frees, 0);
}
