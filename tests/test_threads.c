/*
 * The edges of a thread's life, and fork (lib/thread.c): a thread whose
 * first call into libadg comes from a pthread key's destructor in glibc's
 * last round; one that calls libadg again after every exit hook it could
 * have; later threads on the same cached stack, hence the same TLS
 * addresses; and fork while other threads register, allocate and exit.
 * Each case ends with new threads, grace periods and a registry free,
 * which hung on a thread list left with a dead thread's entry (a cycle
 * once the next thread on its stack linked the same entry again).
 *
 * Every test has a timeout: a hang fails it. In the stress tier.
 */
#include "fixture.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int pass_on(adg_step_call *call, void *user)
{
	(void)user;
	return s_pass_on(call);
}

/* A leaf and an op on it through registry r, with the op's gradient checked:
 * a thread's whole use of libadg (a shard, a node slab, a graph, a
 * read-side section, a backward). Returns whether all of it worked. */
static bool use_registry(adg_registry *r, adg_node *shared_leaf)
{
	adg_node *leaf = NULL, *y = NULL;
	adg_grads *g = NULL;
	bool ok = adg_leaf(r, &leaf) == 0;
	if (ok) {
		adg_node *parents[] = {leaf, shared_leaf, leaf};
		adg_step step = {.backward = pass_on};
		ok = adg_op(r, parents, shared_leaf != NULL ? 3 : 1, &step,
			    &y) == 0;
	}
	uint64_t id = 0;
	ok = ok && adg_node_graph_id(y, &id) == 0 && id != 0;
	ok = ok && adg_backward(r, y, scalar_box(1), &scalar_ops, &g) == 0;
	if (ok) {
		uint64_t leaf_id;
		void *grad = NULL;
		ok = adg_node_id(leaf, &leaf_id) == 0 &&
		     adg_grads_get(g, leaf_id, &grad) == 0 && grad != NULL &&
		     *(double *)grad == (shared_leaf != NULL ? 2.0 : 1.0);
	}
	adg_grads_free(g);
	adg_node_unref(y);
	adg_node_unref(leaf);
	return ok;
}

/* Threads after the case: one at a time, so that each reuses the stack
 * (and TLS) of the thread before it, then a few at once. */
static void *later_thread(void *arg)
{
	return use_registry(arg, NULL) ? arg : NULL;
}

static void later_threads(adg_registry *r)
{
	for (int i = 0; i < 8; i++) {
		pthread_t t;
		void *ok;
		cr_assert_eq(pthread_create(&t, NULL, later_thread, r), 0);
		cr_assert_eq(pthread_join(t, &ok), 0);
		cr_assert_eq(ok, r, "later thread %d failed", i);
	}
	pthread_t t[4];
	for (int i = 0; i < 4; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, later_thread, r), 0);
	for (int i = 0; i < 4; i++) {
		void *ok;
		cr_assert_eq(pthread_join(t[i], &ok), 0);
		cr_assert_eq(ok, r, "later thread %d failed", 8 + i);
	}
}

/*
 * A pthread key whose destructor sets it again, round after round: the
 * thread calls libadg from round `from` to the last, glibc's
 * PTHREAD_DESTRUCTOR_ITERATIONS-th, after which a key set is never
 * destroyed. Not in TSan builds: TSan's runtime finalises a thread in a
 * late destructor round of its own, and instrumented code that runs in the
 * third round or later crashes it (SEGV in the runtime); nothing here is
 * concurrent.
 */
#ifndef __SANITIZE_THREAD__
static struct {
	adg_registry *r;
	pthread_key_t key;
	int from;   /* the first round that calls libadg */
	int rounds; /* rounds run */
	bool failed;
} kd;

static void kd_destructor(void *arg)
{
	(void)arg;
	kd.rounds++;
	if (kd.rounds >= kd.from && !use_registry(kd.r, NULL))
		kd.failed = true;
	if (kd.rounds < PTHREAD_DESTRUCTOR_ITERATIONS)
		pthread_setspecific(kd.key, &kd);
}

static void *kd_thread(void *arg)
{
	/* A call before the destructors: its thread is known to libadg
	 * (and any exit hook it sets comes first). */
	if (arg != NULL && !use_registry(kd.r, NULL))
		kd.failed = true;
	pthread_setspecific(kd.key, &kd);
	return NULL;
}

static void destructor_rounds(int from, bool called_before)
{
	cr_assert_eq(adg_registry_new(NULL, &kd.r), 0);
	kd.from = from;
	kd.rounds = 0;
	kd.failed = false;
	/* A first thread, so that libadg's own keys, if any, come before
	 * kd.key: their destructors run first in each round. */
	later_threads(kd.r);
	cr_assert_eq(pthread_key_create(&kd.key, kd_destructor), 0);
	for (int run = 0; run < 3; run++) {
		kd.rounds = 0;
		pthread_t t;
		cr_assert_eq(pthread_create(&t, NULL, kd_thread,
					    called_before ? &kd : NULL),
			     0);
		cr_assert_eq(pthread_join(t, NULL), 0);
		cr_assert_eq(kd.rounds, PTHREAD_DESTRUCTOR_ITERATIONS);
		cr_assert(!kd.failed, "libadg failed in a destructor round");
		later_threads(kd.r);
	}
	pthread_key_delete(kd.key);
	/* Grace periods, in every registry free. */
	cr_assert_eq(adg_registry_free(kd.r), 0);
	adg_registry *r;
	cr_assert_eq(adg_registry_new(NULL, &r), 0);
	later_threads(r);
	cr_assert_eq(adg_registry_free(r), 0);
}

/* The thread's first call comes in the last round. Seen failing (timed
 * out) with an exit hook set in that round and never run: the dead
 * thread's entries stayed listed, the next thread on its stack linked the
 * same ones again, and the next grace period looped for ever. */
Test(threads, first_call_in_the_last_destructor_round, .timeout = 60)
{
	destructor_rounds(PTHREAD_DESTRUCTOR_ITERATIONS, false);
}

/* The thread calls libadg, exits, and calls again from every destructor
 * round, the last included. Seen failing (timed out) with the registry's
 * thread list: its exit hook unlisted the thread, the next round listed it
 * again with a hook that never ran, and the next thread on its stack made
 * a cycle of the list that adg_registry_free walked for ever. */
Test(threads, calls_in_every_destructor_round_after_exit_hooks, .timeout = 60)
{
	destructor_rounds(1, true);
}
#endif

/*
 * fork while other threads register, allocate and exit: the threads lock,
 * and every lock of libadg's a child may need, are held across fork, and
 * the child, whose one thread is the forking one, uses a registry of its
 * own and the one it inherited. Seen failing with the threads lock free of
 * fork hooks: children hung in adg_shard_get_slow on a lock a thread that
 * does not exist there held (killed by their alarm here).
 *
 * Not in the sanitizer builds: their allocators (this toolchain's) leave
 * a child forked while another thread is inside malloc hung in its own
 * malloc. ASan: 2 children in 300 of a program that does nothing but
 * allocate on two threads and fork, without libadg; TSan: 1 child in 100
 * here, in SizeClassAllocator64::GetFromAllocator, on a mutex of TSan's.
 * The deterministic fork tests of tests/test_interleave.c, where no other
 * thread allocates at the fork, run in every build.
 */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CHURNERS 2
#define FORKS	 100

static struct {
	adg_registry *r;
	adg_node *w; /* a parameter every thread uses */
	atomic_bool stop;
} fk;

static void *fk_short_life(void *arg)
{
	(void)arg;
	/* A new step kind now and then, on a registry the child inherits:
	 * its kinds lock is taken too. */
	return use_registry(fk.r, fk.w) ? &fk : NULL;
}

static void *fk_churn(void *arg)
{
	(void)arg;
	while (!atomic_load(&fk.stop)) {
		pthread_t t;
		void *ok = NULL;
		if (pthread_create(&t, NULL, fk_short_life, NULL) != 0 ||
		    pthread_join(t, &ok) != 0 || ok != &fk)
			return NULL;
	}
	return &fk;
}

/* The child: its alarm kills it if libadg hangs. It ends with its
 * inherited registry alive: the other threads' nodes in it (a half-made
 * op, say) are theirs, and they do not exist here. With an exec, not an
 * exit: valgrind would report the parent's heap, copied into the child,
 * as lost. */
static void fk_child(void)
{
	alarm(20);
	adg_registry *own;
	bool ok = adg_registry_new(NULL, &own) == 0;
	ok = ok && use_registry(own, NULL);
	ok = ok && use_registry(fk.r, fk.w);
	ok = ok && use_registry(fk.r, NULL);
	ok = ok && adg_registry_free(own) == 0;
	if (ok)
		execl("/bin/true", "true", (char *)NULL);
	_exit(1);
}

Test(threads, fork_while_threads_register_allocate_and_exit, .timeout = 300)
{
	cr_assert_eq(adg_registry_new(NULL, &fk.r), 0);
	cr_assert_eq(adg_leaf(fk.r, &fk.w), 0);
	atomic_store(&fk.stop, false);
	pthread_t churn[CHURNERS];
	for (int i = 0; i < CHURNERS; i++)
		cr_assert_eq(pthread_create(&churn[i], NULL, fk_churn, NULL),
			     0);
	int hung = 0, failed = 0;
	for (int i = 0; i < FORKS; i++) {
		pid_t pid = fork();
		cr_assert_neq(pid, -1);
		if (pid == 0)
			fk_child();
		int status;
		cr_assert_eq(waitpid(pid, &status, 0), pid);
		if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
			hung++;
		else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed++;
	}
	atomic_store(&fk.stop, true);
	for (int i = 0; i < CHURNERS; i++) {
		void *ok;
		cr_assert_eq(pthread_join(churn[i], &ok), 0);
		cr_expect_eq(ok, &fk, "a churning thread failed");
	}
	cr_expect_eq(hung, 0, "%d children of %d hung", hung, FORKS);
	cr_expect_eq(failed, 0, "%d children of %d failed", failed, FORKS);
	later_threads(fk.r);
	adg_node_unref(fk.w);
	cr_assert_eq(adg_registry_free(fk.r), 0);
}
#endif

/*
 * Threads that register, adopt shards (of threads found gone), allocate,
 * run a backward and end, two at a time, on two starters; while another
 * thread makes registries, uses and frees them (grace periods that scan
 * every record, and the threads lock), and the main thread looks on with
 * statistics. Records are pushed, found gone, released and reused while
 * grace periods read them. In every build, TSan's included.
 */
#define COME_AND_GO 300

static struct {
	adg_registry *r;
	adg_node *w;
	atomic_int wrong;
	atomic_int starters_left;
} cg;

static void *cg_life(void *arg)
{
	(void)arg;
	if (!use_registry(cg.r, cg.w))
		atomic_fetch_add(&cg.wrong, 1);
	return NULL;
}

static void *cg_starter(void *arg)
{
	(void)arg;
	for (int i = 0; i < COME_AND_GO; i++) {
		pthread_t t[2];
		int made = 0;
		for (; made < 2; made++)
			if (pthread_create(&t[made], NULL, cg_life, NULL) != 0)
				break;
		if (made < 2)
			atomic_fetch_add(&cg.wrong, 1);
		while (made > 0)
			pthread_join(t[--made], NULL);
	}
	atomic_fetch_sub(&cg.starters_left, 1);
	return NULL;
}

/* A fixed number, each followed by a yield: looping until the starters
 * are done starved them under valgrind, whose one-thread-at-a-time
 * schedule let this thread take the threads lock back each time before a
 * woken waiter ran. */
#define COME_AND_GO_REGISTRIES 100

static void *cg_registries(void *arg)
{
	(void)arg;
	for (int i = 0; i < COME_AND_GO_REGISTRIES; i++) {
		adg_registry *own;
		if (adg_registry_new(NULL, &own) != 0 ||
		    !use_registry(own, NULL) || adg_registry_free(own) != 0)
			atomic_fetch_add(&cg.wrong, 1);
		sched_yield();
	}
	return NULL;
}

Test(threads, threads_come_and_go_while_grace_periods_run, .timeout = 300)
{
	cr_assert_eq(adg_registry_new(NULL, &cg.r), 0);
	cr_assert_eq(adg_leaf(cg.r, &cg.w), 0);
	atomic_store(&cg.wrong, 0);
	atomic_store(&cg.starters_left, 2);
	pthread_t t[3];
	cr_assert_eq(pthread_create(&t[0], NULL, cg_starter, NULL), 0);
	cr_assert_eq(pthread_create(&t[1], NULL, cg_starter, NULL), 0);
	cr_assert_eq(pthread_create(&t[2], NULL, cg_registries, NULL), 0);
	while (atomic_load(&cg.starters_left) > 0) {
		struct adg_stats st = {.size = sizeof st};
		cr_assert_eq(adg_registry_stats(cg.r, &st), 0);
		sched_yield();
	}
	for (int i = 0; i < 3; i++)
		cr_assert_eq(pthread_join(t[i], NULL), 0);
	cr_expect_eq(atomic_load(&cg.wrong), 0);
	later_threads(cg.r);
	assert_stats(cg.r, 1, 0, 0);
	adg_node_unref(cg.w);
	cr_assert_eq(adg_registry_free(cg.r), 0);
}
