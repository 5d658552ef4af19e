/*
 * libadg's own read side: what keeps a graph object's memory from going
 * back to the allocator while a lock-free reader may still touch it.
 *
 * liburcu-bp's read-side calls cost 88 instructions a registration in a
 * shared library: its reader state is global-dynamic TLS, two
 * __tls_get_addr calls a section end. libadg's reader state is its own, in
 * initial-exec TLS (one load from the thread pointer): a section is a load
 * of the global epoch and two stores to the thread's reader word.
 *
 * The protocol (urcu-memb's, with a 64-bit epoch that never wraps, so one
 * counter step per grace period suffices):
 * - A reader stores the epoch it read into its reader word, then (with
 *   sys_membarrier) a compiler barrier or (without) a full fence, then
 *   reads; it ends the section with a release store of 0.
 * - adg_rcu_synchronize, after the caller unlinked what it will free:
 *   a full barrier on every running thread (membarrier) or a fence, then
 *   the epoch steps to e, then it waits until every reader word reads 0 or
 *   at least e. A reader that holds a word below e read the epoch before
 *   the step; the barrier orders its word's store before any of its reads
 *   that could miss the unlink, so the scan sees the word and waits. A
 *   reader whose word reads e or more read the step (acquire), which comes
 *   after the unlink (release): it cannot reach what was unlinked.
 * Sections never nest, never run user code and never wait for a grace
 * period; a grace period is waited for with no graph lock held, so a
 * reader spinning on a graph lock always gets it.
 *
 * Readers register lazily, on their first section, without allocating:
 * the word is static TLS. A pthread key's destructor unregisters a thread
 * when it exits. A thread whose exit hook cannot be set up (no key), or
 * that calls libadg again after it ran, reads through a shared counter
 * instead, which grace periods wait to see at 0.
 */
#include "internal.h"

#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

__thread struct adg_reader adg_this_reader
	__attribute__((tls_model("initial-exec")));

/* The grace-period epoch: stepped by each grace period, under the readers
 * lock; 1 at first, so that a reader word of 0 means "in no section". */
atomic_uint_fast64_t adg_rcu_epoch = 1;
/* Written once, under readside_once, before any reader's first section
 * reads it (registration runs readside_once first), and never again. */
bool adg_rcu_membarrier;

/* Registered readers, and the writers' mutual exclusion: the readers lock
 * is held for a whole grace period, so that a reader word is never read
 * after its thread unregistered. */
static pthread_mutex_t readside_lock = PTHREAD_MUTEX_INITIALIZER;
static CDS_LIST_HEAD(readside_readers);
/* Sections open on threads with no reader word of their own. */
atomic_uint_fast64_t adg_rcu_unregistered_readers;

static pthread_once_t readside_once = PTHREAD_ONCE_INIT;
static pthread_key_t readside_exit_key;
static bool readside_exit_key_ok;

static long readside_membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

/* A thread's word leaves the list as its thread exits. The thread may still
 * call libadg afterwards, from a later pthread key's destructor: it reads
 * through the shared counter from then on, rather than registering again,
 * since a key set in glibc's last destructor round is never destroyed and
 * its word, freed with the thread, would stay on the list. */
static void readside_thread_exit(void *arg)
{
	struct adg_reader *me = arg;

	pthread_mutex_lock(&readside_lock);
	cds_list_del(&me->link);
	me->state = ADG_READER_SHARED;
	pthread_mutex_unlock(&readside_lock);
}

/* fork: the readers lock is held across it, so that the child inherits a
 * whole list. Only the forking thread lives on in the child, and it is in
 * no section (fork is user code); the other threads' reader words, copied
 * with the address space, may read "in a section" forever, and would hold
 * up the child's every grace period: they leave the list. */
static void readside_before_fork(void)
{
	pthread_mutex_lock(&readside_lock);
}

static void readside_after_fork_parent(void)
{
	pthread_mutex_unlock(&readside_lock);
}

static void readside_after_fork_child(void)
{
	struct adg_reader *r, *next;

	cds_list_for_each_entry_safe (r, next, &readside_readers, link)
		if (r != &adg_this_reader)
			cds_list_del(&r->link);
	/* Relaxed: the child has one thread. */
	atomic_store_explicit(&adg_rcu_unregistered_readers, 0,
			      memory_order_relaxed);
	pthread_mutex_unlock(&readside_lock);
}

static void readside_init(void)
{
	readside_exit_key_ok = pthread_key_create(&readside_exit_key,
						  readside_thread_exit) == 0;
	/* Can fail only for want of memory; a fork then leaves the other
	 * threads' words on the child's list, as before this hook. */
	(void)pthread_atfork(readside_before_fork, readside_after_fork_parent,
			     readside_after_fork_child);
	/* Private expedited membarrier (Linux 4.14), registered once for the
	 * process; otherwise, readers fence. ThreadSanitizer does not know
	 * membarrier: its builds fence. */
#ifndef ADG_TSAN
	long cmds = readside_membarrier(MEMBARRIER_CMD_QUERY);
	if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
	    readside_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0)
		adg_rcu_membarrier = true;
#endif
}

#ifdef ADG_TEST_HOOKS
size_t adg_rcu_registered_readers(void)
{
	size_t n = 0;
	struct adg_reader *r;

	pthread_mutex_lock(&readside_lock);
	cds_list_for_each_entry (r, &readside_readers, link)
		n++;
	pthread_mutex_unlock(&readside_lock);
	return n;
}
#endif

void adg_rcu_register(void)
{
	struct adg_reader *me = &adg_this_reader;

	/* readside_once also orders adg_rcu_membarrier's one write before this
	 * thread's sections read it. */
	pthread_once(&readside_once, readside_init);
	if (!readside_exit_key_ok ||
	    pthread_setspecific(readside_exit_key, me) != 0) {
		/* The word could not be unlinked at exit: read through the
		 * shared counter. */
		me->state = ADG_READER_SHARED;
		return;
	}
	pthread_mutex_lock(&readside_lock);
	cds_list_add(&me->link, &readside_readers);
	me->state = ADG_READER_OWN;
	pthread_mutex_unlock(&readside_lock);
}

/* A full barrier on every thread of the process that is running now, or,
 * without membarrier, on this one (the readers fence). */
static void readside_barrier_all(void)
{
	/* Registered, the command cannot fail (its errors are for a kernel
	 * without it and a process that did not register). */
	if (adg_rcu_membarrier &&
	    readside_membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
		return;
#ifdef ADG_TSAN
		/* TSan rejects fences; the epoch's seq_cst step that follows is
		 * a locked instruction, a full barrier on x86. */
#else
	atomic_thread_fence(memory_order_seq_cst);
#endif
}

void adg_rcu_synchronize(void)
{
	pthread_once(&readside_once, readside_init);
	pthread_mutex_lock(&readside_lock);
	/* Orders the caller's unlinks before any running reader's later
	 * reads (see the protocol above). */
	readside_barrier_all();
	/* seq_cst: a release for the readers' acquire load of the epoch, and
	 * ordered before the scan's loads below. */
	uint64_t e = atomic_fetch_add(&adg_rcu_epoch, 1) + 1;
	struct adg_reader *r;
	cds_list_for_each_entry (r, &readside_readers, link) {
		/* Acquire: pairs with the reader's release store of 0, so
		 * that what its section did happens before what the caller
		 * frees. */
		for (;;) {
			uint64_t w = atomic_load_explicit(&r->word,
							  memory_order_acquire);
			if (w == 0 || w >= e)
				break;
			sched_yield();
		}
	}
	/* seq_cst: against the readers' seq_cst increments, after this
	 * thread's barrier above; and an acquire, as above. May wait longer
	 * than it needs to: these threads are the few whose exit hook
	 * failed. */
	while (atomic_load(&adg_rcu_unregistered_readers) != 0)
		sched_yield();
	pthread_mutex_unlock(&readside_lock);
}
