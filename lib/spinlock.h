/*
 * The spinlock that guards the graphs (internal.h) and the scheduler's ready
 * queues (parallel.c), with its slow half in spinlock.c. Below internal.h:
 * it knows nothing of what it guards.
 */
#ifndef ADG_SPINLOCK_H
#define ADG_SPINLOCK_H

#include "util.h"

#include <ck_spinlock.h>

/*
 * Concurrency Kit's fetch-and-store spinlock guards the graphs (graph.c)
 * and the scheduler's ready queues (parallel.c): locks that are nearly
 * always free, where taking one is one exchange and releasing it a plain
 * store, where a mutex pays a second locked instruction to look for
 * sleepers. When one is held, a waiter spins briefly and then yields, so
 * that on a machine with more threads than cores a preempted holder gets
 * to run. ck_pr is inline assembly that ThreadSanitizer cannot see: in
 * TSan builds the annotations tell it what the lock orders.
 */
void adg_spin_wait(ck_spinlock_fas_t *lock);

static inline void adg_spin_lock(ck_spinlock_fas_t *lock)
{
	if (adg_unlikely(!ck_spinlock_fas_trylock(lock)))
		adg_spin_wait(lock);
	adg_tsan_acquire(lock);
}

static inline void adg_spin_unlock(ck_spinlock_fas_t *lock)
{
	adg_tsan_release(lock);
	ck_spinlock_fas_unlock(lock);
}

#endif /* ADG_SPINLOCK_H */
