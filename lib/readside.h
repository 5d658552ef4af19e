/*
 * libadg's read side and its grace periods (readside.c): what keeps a
 * graph object a reader may reach from going back to the allocator. It
 * needs a thread's record (thread.h) and nothing of a node, a graph or a
 * registry; its rules are I19 to I21 in docs/concurrency.md.
 */
#ifndef ADG_READSIDE_H
#define ADG_READSIDE_H

#include "thread.h"
#include "util.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * libadg's own read side (readside.c): a read-side section keeps every graph
 * object the reader may reach from going back to the allocator, as
 * liburcu's would, at the cost of an initial-exec TLS access instead of
 * liburcu-bp's global-dynamic ones. Sections never nest and never run user
 * code. adg_rcu_synchronize waits for every section open when it began.
 */
extern atomic_uint_fast64_t adg_rcu_epoch;
extern bool adg_rcu_membarrier;
extern atomic_uint_fast64_t adg_rcu_unregistered_readers;

/* Sets the read side up, once in the process; before a thread's first
 * section (adg_thread_register runs it), and at adg_registry_new, which
 * normally comes first and takes its cost. */
void adg_rcu_init(void);

/* Returns once every read-side section open when it was called has ended.
 * Call with no graph lock held, outside a section, and without the threads
 * lock. */
void adg_rcu_synchronize(void);

static inline void adg_rcu_read_lock(void)
{
	struct adg_thread *self = adg_self;
	if (adg_unlikely(self == NULL) &&
	    (self = adg_thread_register()) == NULL) {
		/* seq_cst: the writer's fence and its seq_cst load of the
		 * count order this against its unlinks. */
		atomic_fetch_add(&adg_rcu_unregistered_readers, 1);
		return;
	}
#ifdef ADG_TEST_HOOKS
	if (self->nest++ != 0)
		return;
#endif
	ADG_ASSERT(atomic_load_explicit(&self->reader, memory_order_relaxed) ==
		   0); /* sections never nest */
	/* Acquire: pairs with adg_rcu_synchronize's step of the epoch, made
	 * after its caller's unlinks: a section that reads the new epoch
	 * sees them. */
	uint64_t e = atomic_load_explicit(&adg_rcu_epoch, memory_order_acquire);
#ifdef ADG_TSAN
	/* TSan rejects fences: a seq_cst exchange, a full barrier on the
	 * x86 it runs on, orders the store before the section's reads. */
	atomic_exchange(&self->reader, e);
#else
	/* Relaxed store, ordered before the section's reads by what
	 * follows. With membarrier the writer's sys_membarrier is the other
	 * half, and a compiler barrier is enough here (as urcu-memb's
	 * reader); without, a full fence. */
	atomic_store_explicit(&self->reader, e, memory_order_relaxed);
	if (adg_likely(adg_rcu_membarrier))
		atomic_signal_fence(memory_order_seq_cst);
	else
		atomic_thread_fence(memory_order_seq_cst);
#endif
}

static inline void adg_rcu_read_unlock(void)
{
	/* Release, both: what the section read happens before what a
	 * writer that sees it ended frees (its acquire loads). A thread
	 * registers in adg_rcu_read_lock or adg_shard_get_slow, neither of
	 * which runs inside a section, so adg_self is what the section began
	 * with. */
	struct adg_thread *self = adg_self;
	if (adg_likely(self != NULL)) {
#ifdef ADG_TEST_HOOKS
		if (--self->nest != 0)
			return;
#endif
		atomic_store_explicit(&self->reader, 0, memory_order_release);
	} else {
		atomic_fetch_sub_explicit(&adg_rcu_unregistered_readers, 1,
					  memory_order_release);
	}
}

#endif /* ADG_READSIDE_H */
