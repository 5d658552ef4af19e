/*
 * The wait of libadg's spinlocks (spinlock.h): the graph
 * locks and the scheduler's ready queues.
 */
#include "spinlock.h"

#include <sched.h>

/* Spins this many times on a held lock before yielding the CPU: a holder
 * keeps these locks for a few dozen instructions, unless it was
 * preempted, and then only yielding lets it run. */
#define SPINS_BEFORE_YIELD 64

void adg_spin_wait(ck_spinlock_fas_t *lock)
{
	unsigned int spins = 0;

	do {
		/* Read-only while held: no exchange bounces the line. */
		while (ck_spinlock_fas_locked(lock)) {
			if (++spins < SPINS_BEFORE_YIELD) {
				ck_pr_stall();
			} else {
				sched_yield();
				spins = 0;
			}
		}
	} while (!ck_spinlock_fas_trylock(lock));
}
