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
 * A reader's word is in its thread's record (thread.c), which libadg's own
 * memory holds and which outlives the thread: grace periods read every
 * record's word, lock-free, and a record whose thread is gone reads 0 until
 * a new thread takes it. A thread that could not get a record (no memory)
 * reads through a shared counter instead, which grace periods wait to see
 * at 0.
 */
#include "readside.h"

#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The grace-period epoch: stepped by each grace period; 1 at first, so
 * that a reader word of 0 means "in no section". */
atomic_uint_fast64_t adg_rcu_epoch = 1;
/* Written once, under readside_once, before any reader's first section
 * reads it (registration runs adg_rcu_init first), and never again. */
bool adg_rcu_membarrier;

/* Sections open on threads with no record of their own. */
atomic_uint_fast64_t adg_rcu_unregistered_readers;

static pthread_once_t readside_once = PTHREAD_ONCE_INIT;

static long readside_membarrier(int cmd)
{
	return syscall(__NR_membarrier, cmd, 0, 0);
}

static void readside_init(void)
{
	/* Private expedited membarrier (Linux 4.14), registered once for the
	 * process; otherwise, readers fence. ThreadSanitizer does not know
	 * membarrier: its builds fence. The registration waits until every
	 * CPU sees it (on most kernels an RCU grace period of the kernel's),
	 * 8 to 30 ms measured, so adg_registry_new runs
	 * this, where adg.h says so, rather than the first graph op; a
	 * thread's first section (adg_thread_register) and each grace period
	 * run it too, should either ever come first. */
#ifndef ADG_TSAN
	long cmds = readside_membarrier(MEMBARRIER_CMD_QUERY);
	if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
	    readside_membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0)
		adg_rcu_membarrier = true;
#endif
}

void adg_rcu_init(void)
{
	pthread_once(&readside_once, readside_init);
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
	adg_rcu_init();
	/* Orders the caller's unlinks before any running reader's later
	 * reads (see the protocol above), and before the load of the list
	 * of records below: a record pushed after that load belongs to a
	 * thread whose sections, from the barrier on, see the unlinks. */
	readside_barrier_all();
	/* seq_cst: a release for the readers' acquire load of the epoch, and
	 * ordered before the scan's loads below. */
	uint64_t e = atomic_fetch_add(&adg_rcu_epoch, 1) + 1;
	for (struct adg_thread *t = adg_threads_first(); t != NULL;
	     t = t->next_all) {
		/* Acquire: pairs with the reader's release store of 0, so
		 * that what its section did happens before what the caller
		 * frees. */
		for (;;) {
			uint64_t w = atomic_load_explicit(&t->reader,
							  memory_order_acquire);
			if (w == 0 || w >= e)
				break;
			sched_yield();
		}
	}
	/* seq_cst: against the readers' seq_cst increments, after this
	 * thread's barrier above; and an acquire, as above. May wait longer
	 * than it needs to: these threads are the few that could not get a
	 * record. */
	while (atomic_load(&adg_rcu_unregistered_readers) != 0)
		sched_yield();
}
