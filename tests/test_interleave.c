/*
 * White-box interleavings: this test compiles lib/ itself with
 * ADG_TEST_HOOKS, so that the library calls adg_test_point at its
 * interleaving points (lib/internal.h). The hook runs, on the reader's own
 * thread, the work another thread could do while the reader is stalled
 * there; an interleaving that a stress test hits once in a blue moon runs
 * here every time.
 */
#include "internal.h"
#include "readside.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define TEST_MEMCHECK 1
#endif

void (*adg_test_point)(enum adg_test_point where);

static int no_backward(adg_step_call *call, void *user)
{
	(void)call;
	(void)user;
	return 0;
}

static adg_node *op(adg_registry *r, adg_node *a, adg_node *b)
{
	adg_node *parents[] = {a, b}, *out;
	adg_step step = {.backward = no_backward};
	cr_assert_eq(adg_op(r, parents, b != NULL ? 2 : 1, &step, &out), 0);
	return out;
}

static uint64_t id_of(adg_node *n)
{
	uint64_t id;
	cr_assert_eq(adg_node_id(n, &id), 0);
	return id;
}

/* The scenario: n alone in graph a; b a bigger graph with an older origin.
 * While a reader of n's graph id is stalled, n is merged into b (a
 * retires), a is reused at once by a new graph p that outgrows b, and b is
 * merged into p's graph: n is back in the object a, whose origin is p's
 * until the second merge lowers it. */
static struct {
	adg_registry *r;
	adg_node *leaf, *n, *b_tip, *m, *p_tip, *q;
	adg_node *made[8];
	int n_made;
	struct adg_graph *a;
	int stage; /* hooks run so far */
} sc;

static void stalled_reader_hook(enum adg_test_point where)
{
	if (where == ADG_TP_GRAPH_ID_LOADED && sc.stage == 0) {
		sc.stage = 1;
		adg_test_point = NULL; /* the hook's own calls read no ids */
		sc.m = op(sc.r, sc.n, sc.b_tip); /* a retires into b */
		adg_node *p = op(sc.r, sc.leaf, NULL);
		cr_assert_eq(p->graph, sc.a, "the retired graph is reused");
		sc.made[sc.n_made++] = p;
		for (int i = 0; i < 5; i++) {
			p = op(sc.r, p, NULL);
			sc.made[sc.n_made++] = p;
		}
		sc.p_tip = p;
		adg_test_point = stalled_reader_hook;
	} else if (where == ADG_TP_GRAPH_ID_ORIGIN_READ && sc.stage == 1) {
		sc.stage = 2;
		adg_test_point = NULL;
		sc.q = op(sc.r, sc.m, sc.p_tip); /* b (5) into a (6) */
		cr_assert_eq(sc.n->graph, sc.a, "n is back in the object a");
	}
}

Test(interleave, graph_id_reader_stalled_across_retire_reuse_and_merge)
{
	cr_assert_eq(adg_registry_new(NULL, &sc.r), 0);
	cr_assert_eq(adg_leaf(sc.r, &sc.leaf), 0);
	adg_node *b1 = op(sc.r, sc.leaf, NULL);
	adg_node *b2 = op(sc.r, b1, NULL);
	sc.b_tip = op(sc.r, b2, NULL);
	sc.n = op(sc.r, sc.leaf, NULL);
	sc.a = sc.n->graph;
	uint64_t n_id = id_of(sc.n), b_origin = id_of(b1);
	cr_assert_lt(b_origin, n_id);

	adg_test_point = stalled_reader_hook;
	uint64_t got;
	cr_assert_eq(adg_node_graph_id(sc.n, &got), 0);
	adg_test_point = NULL;
	cr_assert_eq(sc.stage, 2, "both stalls happened");

	/* The ids n's graph had during the call: its own, then b's. */
	cr_expect(got == n_id || got == b_origin,
		  "graph id %llu: n's graph had only %llu and %llu",
		  (unsigned long long)got, (unsigned long long)n_id,
		  (unsigned long long)b_origin);
	cr_assert_eq(adg_node_graph_id(sc.n, &got), 0);
	cr_expect_eq(got, b_origin);

	adg_node *all[] = {b1, b2, sc.b_tip, sc.n, sc.m, sc.q, sc.leaf};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		adg_node_unref(all[i]);
	for (int i = 0; i < sc.n_made; i++)
		adg_node_unref(sc.made[i]);
	cr_assert_eq(adg_registry_free(sc.r), 0);
}

/* A grace period must wait for a reader stalled inside its section. The
 * reader of n's graph id has loaded n's graph g and stalls there; another
 * thread, whose pool is full and whose limbo is one short of a flush,
 * merges n away (g retires into the limbo, which fills) and frees the
 * limbo after a grace period. That grace period cannot end before the
 * reader's section does: were it to, g would be freed under the reader,
 * which reads g's generation next. Seen failing with adg_rcu_synchronize
 * returning at once: "the grace period ended inside the section" (and a
 * heap-use-after-free under ASan). */
static struct {
	adg_registry *r;
	adg_node *leaf, *n, *o_tip;
	atomic_int stage; /* 1: merger ready; 2: go; 3: merged and freed */
	bool ended_early;
} gp;

static void *gp_merger(void *arg)
{
	(void)arg;
	enum { K = ADG_GRAPH_POOL_MAX + ADG_GRAPH_LIMBO_MAX - 1 };
	adg_node **made = malloc(K * sizeof *made);
	cr_assert_not_null(made);
	for (int i = 0; i < K; i++)
		made[i] = op(gp.r, gp.leaf, NULL); /* a graph each */
	for (int i = 0; i < K; i++)
		adg_node_unref(made[i]); /* each graph retires here */
	free(made);
	struct adg_shard *me = adg_shard_get(gp.r);
	cr_assert_eq(me->graphs_pooled, ADG_GRAPH_POOL_MAX);
	cr_assert_eq(me->graphs_in_limbo, ADG_GRAPH_LIMBO_MAX - 1);
	atomic_store(&gp.stage, 1);
	while (atomic_load(&gp.stage) != 2)
		sched_yield();
	/* n's graph (one member) retires into the bigger one: the limbo is
	 * full, and freed after a grace period. */
	adg_node *m = op(gp.r, gp.n, gp.o_tip);
	cr_assert_eq(me->graphs_in_limbo, 0);
	atomic_store(&gp.stage, 3);
	adg_node_unref(m);
	return NULL;
}

static void gp_hook(enum adg_test_point where)
{
	if (where != ADG_TP_GRAPH_ID_LOADED)
		return;
	adg_test_point = NULL;
	atomic_store(&gp.stage, 2);
	/* Long enough for the merger to merge, fill its limbo and, were
	 * the grace period not to wait for this section, free g. */
	for (int i = 0; i < 200 && atomic_load(&gp.stage) != 3; i++)
		usleep(1000);
	gp.ended_early = atomic_load(&gp.stage) == 3;
}

Test(interleave, grace_period_waits_for_a_stalled_reader)
{
	cr_assert_eq(adg_registry_new(NULL, &gp.r), 0);
	cr_assert_eq(adg_leaf(gp.r, &gp.leaf), 0);
	gp.n = op(gp.r, gp.leaf, NULL);
	adg_node *o1 = op(gp.r, gp.leaf, NULL);
	gp.o_tip = op(gp.r, o1, NULL); /* two members: it survives */
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, gp_merger, NULL), 0);
	while (atomic_load(&gp.stage) != 1)
		sched_yield();
	adg_test_point = gp_hook;
	uint64_t id;
	cr_assert_eq(adg_node_graph_id(gp.n, &id), 0);
	adg_test_point = NULL;
	pthread_join(t, NULL);
	cr_expect(!gp.ended_early, "the grace period ended inside the section");
	cr_expect_eq(atomic_load(&gp.stage), 3);
	cr_expect_eq(id, id_of(gp.n), "the merged graph keeps n's origin");
	adg_node *all[] = {gp.n, o1, gp.o_tip, gp.leaf};
	for (size_t i = 0; i < sizeof all / sizeof *all; i++)
		adg_node_unref(all[i]);
	cr_assert_eq(adg_registry_free(gp.r), 0);
}

/* fork while another thread is inside a section: only the forking thread
 * lives on in the child, and the other's reader word, copied as it was,
 * must not hold up the child's grace periods. Seen failing without the
 * fork hooks of lib/readside.c: the child's grace period waits forever
 * (here: killed by its alarm). */
static struct {
	adg_registry *r;
	adg_node *n;
	atomic_int stage; /* 1: the reader is in its section; 2: let it go */
} fk;

static void fk_hook(enum adg_test_point where)
{
	if (where != ADG_TP_GRAPH_ID_LOADED)
		return;
	atomic_store(&fk.stage, 1);
	while (atomic_load(&fk.stage) != 2)
		sched_yield();
}

static void *fk_reader(void *arg)
{
	(void)arg;
	uint64_t id;
	cr_assert_eq(adg_node_graph_id(fk.n, &id), 0);
	return NULL;
}

Test(interleave, fork_while_another_thread_is_in_a_section)
{
	cr_assert_eq(adg_registry_new(NULL, &fk.r), 0);
	adg_node *leaf;
	cr_assert_eq(adg_leaf(fk.r, &leaf), 0);
	fk.n = op(fk.r, leaf, NULL);
	adg_rcu_synchronize(); /* this thread's read side is set up */
	adg_test_point = fk_hook;
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, fk_reader, NULL), 0);
	while (atomic_load(&fk.stage) != 1)
		sched_yield();
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		/* SIGALRM if the grace period hangs. Done, an exec of true:
		 * an exit would have valgrind report the parent's heap,
		 * copied into the child, as lost. */
		alarm(10);
		adg_rcu_synchronize();
		execl("/bin/true", "true", (char *)NULL);
		_exit(1);
	}
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	adg_test_point = NULL;
	atomic_store(&fk.stage, 2);
	pthread_join(t, NULL);
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "the child's grace period waited for a thread it does not "
		  "have");
	adg_node_unref(fk.n);
	adg_node_unref(leaf);
	cr_assert_eq(adg_registry_free(fk.r), 0);
}

/*
 * fork while another thread holds one of libadg's process-wide locks: the
 * threads lock (registering a thread, adopting a shard) or a registry's
 * kinds lock (interning a step kind). The holder stalls in the lock until
 * the fork has begun, then lets go a little later: with the lock held
 * across fork (pthread_atfork), fork waits for it; without, the child
 * inherits it taken by a thread it does not have, and its first call that
 * needs it hangs (killed by its alarm here). Seen failing so for the
 * threads lock, 3 of 3, before it had fork hooks, and for the kinds lock
 * with the fork hooks leaving it out.
 */
static struct {
	adg_registry *r;
	enum adg_test_point point; /* where the holder stalls */
	atomic_int stage;	   /* 1: it holds the lock; 2: fork begins */
} fh;

static __thread bool fh_is_holder;

static void fh_hook(enum adg_test_point where)
{
	if (!fh_is_holder || where != fh.point)
		return;
	fh_is_holder = false; /* once */
	atomic_store(&fh.stage, 1);
	while (atomic_load(&fh.stage) != 2)
		sched_yield();
	usleep(100 * 1000); /* the fork has begun: it must wait for this */
}

static void *fh_holder(void *arg)
{
	(void)arg;
	fh_is_holder = true;
	/* Its first call: it registers (threads lock), takes a shard
	 * (threads lock) and interns the step kind "held" (kinds lock). */
	adg_node *leaf, *y, *parents[1];
	adg_step step = {.backward = no_backward, .name = "held"};
	cr_assert_eq(adg_leaf(fh.r, &leaf), 0);
	parents[0] = leaf;
	cr_assert_eq(adg_op(fh.r, parents, 1, &step, &y), 0);
	adg_node_unref(y);
	adg_node_unref(leaf);
	return NULL;
}

/* The child's use of the lock: a registry of its own (threads lock) and a
 * step kind new to the inherited registry (its kinds lock). */
static void fh_child(void)
{
	alarm(10);
	adg_registry *own;
	adg_node *leaf, *y, *parents[1];
	adg_step step = {.backward = no_backward, .name = "child"};
	bool ok =
		adg_registry_new(NULL, &own) == 0 && adg_leaf(own, &leaf) == 0;
	if (ok) {
		adg_node_unref(leaf);
		ok = adg_registry_free(own) == 0 && adg_leaf(fh.r, &leaf) == 0;
	}
	if (ok) {
		parents[0] = leaf;
		ok = adg_op(fh.r, parents, 1, &step, &y) == 0;
	}
	/* An exec, not an exit: valgrind would report the parent's heap,
	 * copied into the child, as lost. */
	if (ok)
		execl("/bin/true", "true", (char *)NULL);
	_exit(1);
}

static void fork_while_held(enum adg_test_point point)
{
	cr_assert_eq(adg_registry_new(NULL, &fh.r), 0);
	fh.point = point;
	atomic_store(&fh.stage, 0);
	adg_test_point = fh_hook;
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, fh_holder, NULL), 0);
	while (atomic_load(&fh.stage) != 1)
		sched_yield();
	atomic_store(&fh.stage, 2);
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0)
		fh_child();
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	pthread_join(t, NULL);
	adg_test_point = NULL;
	cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "the child %s %d",
		  WIFSIGNALED(status) ? "died of signal" : "exited with",
		  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	cr_assert_eq(adg_registry_free(fh.r), 0);
}

Test(interleave, fork_while_another_thread_holds_the_threads_lock)
{
	fork_while_held(ADG_TP_THREADS_LOCKED);
}

Test(interleave, fork_while_another_thread_holds_a_kinds_lock)
{
	fork_while_held(ADG_TP_KINDS_LOCKED);
}

/* Threads that use libadg and end, one after another or some at once:
 * each takes the record of one found gone, so records number what lives
 * at once (here one more, at most two: a thread just joined may still
 * answer the kernel's probe while it finishes ending). */
static adg_node *reuse_leaf;

static void *reuse_thread(void *arg)
{
	adg_node *y = op(arg, reuse_leaf, NULL);
	adg_node_unref(y);
	return NULL;
}

Test(interleave, thread_records_are_reused_once_their_threads_are_gone)
{
	adg_registry *r;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	cr_assert_eq(adg_leaf(r, &reuse_leaf), 0);
	size_t before = adg_threads_records();
	for (int i = 0; i < 200; i++) {
		pthread_t t;
		cr_assert_eq(pthread_create(&t, NULL, reuse_thread, r), 0);
		cr_assert_eq(pthread_join(t, NULL), 0);
	}
	cr_expect_leq(adg_threads_records(), before + 3,
		      "%zu records after %zu", adg_threads_records(), before);
	for (int wave = 0; wave < 20; wave++) {
		pthread_t t[8];
		for (int i = 0; i < 8; i++)
			cr_assert_eq(
				pthread_create(&t[i], NULL, reuse_thread, r),
				0);
		for (int i = 0; i < 8; i++)
			cr_assert_eq(pthread_join(t[i], NULL), 0);
	}
	cr_expect_leq(adg_threads_records(), before + 8 + 3,
		      "%zu records after %zu", adg_threads_records(), before);
	adg_node_unref(reuse_leaf);
	cr_assert_eq(adg_registry_free(r), 0);
}

/* A thread that calls libadg from its own pthread key's destructor, in
 * every round glibc runs, the last included. Its record must be found gone
 * once the thread is: were it kept by an exit hook set in the last round,
 * never run, a later thread on the same stack would list the same TLS
 * again (tests/test_threads.c has those cases). Seen failing, when the
 * record was the thread's TLS, with the exit hook leaving the thread free
 * to register again: "a reader word outlived its thread". Not in TSan
 * builds: TSan's runtime
 * finalises a thread in a late destructor round of its own, and
 * instrumented code that runs in the third round or later crashes it
 * (SEGV in the runtime); nothing here is concurrent. */
#ifndef __SANITIZE_THREAD__
static struct {
	adg_registry *r;
	adg_node *leaf;
	pthread_key_t key;
	int rounds;
	bool failed;
} ex;

static void ex_destructor(void *arg)
{
	(void)arg;
	adg_node *n = op(ex.r, ex.leaf, NULL); /* a read-side section */
	adg_node *m = n != NULL ? op(ex.r, n, NULL) : NULL;
	uint64_t id;
	if (m == NULL || adg_node_graph_id(m, &id) != 0 || id != id_of(n))
		ex.failed = true;
	adg_node_unref(m);
	adg_node_unref(n);
	/* Again in the next round, up to the last. */
	if (++ex.rounds < PTHREAD_DESTRUCTOR_ITERATIONS)
		pthread_setspecific(ex.key, &ex);
}

static void *ex_thread(void *arg)
{
	(void)arg;
	adg_node *n = op(ex.r, ex.leaf, NULL); /* registers this thread */
	adg_node_unref(n);
	pthread_setspecific(ex.key, &ex);
	return NULL;
}

Test(interleave, a_thread_that_calls_libadg_from_its_key_destructors)
{
	cr_assert_eq(adg_registry_new(NULL, &ex.r), 0);
	cr_assert_eq(adg_leaf(ex.r, &ex.leaf), 0);
	adg_rcu_synchronize();
	cr_assert_eq(pthread_key_create(&ex.key, ex_destructor), 0);
	size_t before = adg_threads_live();
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, ex_thread, NULL), 0);
	cr_assert_eq(pthread_join(t, NULL), 0);
	cr_expect_eq(ex.rounds, PTHREAD_DESTRUCTOR_ITERATIONS);
	cr_expect(!ex.failed, "libadg failed inside a key destructor");
	/* Joined, the thread may still answer the kernel's probe for a
	 * moment while it finishes ending: a second at most. */
	size_t live = adg_threads_live();
	for (int i = 0; i < 1000 && live != before; i++) {
		usleep(1000);
		live = adg_threads_live();
	}
	cr_expect_eq(live, before, "a thread record outlived its thread");
	adg_rcu_synchronize();
	pthread_key_delete(ex.key);
	adg_node_unref(ex.leaf);
	cr_assert_eq(adg_registry_free(ex.r), 0);
}
#endif

/* The child's memory: a static arena, so that a child that dies with its
 * registry alive leaves no heap block behind. */
static _Alignas(64) char arena[1 << 16];
static size_t arena_used;

static void *arena_alloc(size_t size, void *ctx)
{
	(void)ctx;
	size = (size + 15) & ~(size_t)15; /* malloc's alignment */
	if (size > sizeof arena - arena_used)
		return NULL;
	arena_used += size;
	return arena + arena_used - size;
}

static void arena_free(void *ptr, size_t size, void *ctx)
{
	(void)ptr;
	(void)size;
	(void)ctx;
}

/* Run in a process that this binary execs with ADG_BREAK_AN_INVARIANT set,
 * before Criterion starts (so that it holds nothing of Criterion's, and a
 * death leaves nothing for valgrind to call lost): breaks I5, a count
 * never drops below zero, by dropping a reference it does not hold. */
__attribute__((constructor)) static void break_an_invariant(void)
{
	if (getenv("ADG_BREAK_AN_INVARIANT") == NULL)
		return;
	adg_registry_options o = {.size = sizeof o,
				  .allocator = {arena_alloc, arena_free, NULL}};
	adg_registry *r;
	adg_node *leaf;
	if (adg_registry_new(&o, &r) != 0 || adg_leaf(r, &leaf) != 0)
		_exit(2);
	adg_node_ref(leaf);
	adg_node_unref(leaf);
	adg_node_unref(leaf); /* the last: back to its slab, count 0 */
#ifdef TEST_MEMCHECK
	/* The drop reads the freed node on purpose: I5 is to catch it. */
	VALGRIND_DISABLE_ERROR_REPORTING;
#endif
	adg_node_unref(leaf); /* one too many */
	_exit(0);
}

/* The tests, the stress tests and the fuzzer are meant to run with the
 * invariants checked (ADG_ASSERTIONS, every build but release): a process
 * that breaks one must die of the failed assertion. */
Test(interleave, invariants_are_checked_in_test_builds)
{
#ifndef ADG_ASSERTIONS
	cr_assert_fail("built without ADG_ASSERTIONS: the tests would not "
		       "check the invariants");
#endif
	/* This binary's path: read, not exec'd as /proc/self/exe, which
	 * under valgrind is valgrind itself. */
	char self[4096];
	ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
	cr_assert_gt(len, 0);
	self[len] = 0;
	pid_t pid = fork();
	cr_assert_neq(pid, -1);
	if (pid == 0) {
		/* Keep the child's report out of the test log. */
		int null = open("/dev/null", O_WRONLY);
		if (null >= 0)
			dup2(null, STDERR_FILENO);
		char *argv[] = {"test_interleave", NULL};
		setenv("ADG_BREAK_AN_INVARIANT", "1", 1);
		/* Under ASan the freed leaf is poisoned, so ASan catches the
		 * drop before I5 does: make it abort too. */
		setenv("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1", 1);
		execv(self, argv);
		_exit(127);
	}
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
		  "the child %s %d instead of aborting",
		  WIFSIGNALED(status) ? "died of signal" : "exited with",
		  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}
