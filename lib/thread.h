/*
 * A thread's record (thread.c): its reader word, which the read side
 * (readside.h) reads, and its slots, through which it finds its shard of a
 * registry (internal.h adg_shard_get). Below internal.h: it knows a shard
 * and a registry by pointer only.
 */
#ifndef ADG_THREAD_H
#define ADG_THREAD_H

#include "util.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct adg_registry;
struct adg_shard;

/* How many registries a thread finds its shard of without a lock; past
 * that, one slot's shard (round robin) moves to the thread's overflow
 * list for the next. */
#define ADG_THREAD_SLOTS 4

/*
 * A thread's record (thread.c): its reader word and its shards, one slot per
 * registry it uses. In memory of libadg's own, never freed, so that grace
 * periods and adg_registry_free may read and clear it whether its thread
 * lives or not; the thread finds it through adg_self. The owner reads the
 * slots lock-free; every write to a slot, by the owner, by
 * adg_registry_free clearing the slots of its registry in every record, or
 * by the thread that finds the owner gone, holds the threads lock, which
 * also orders a shard's hand-over between threads.
 */
struct adg_thread_slot {
	/* The slot's registry, NULL when free. Atomic: adg_registry_free
	 * clears it from another thread while the owner may be comparing it
	 * with another registry. */
	struct adg_registry *_Atomic registry;
	struct adg_shard *shard; /* written under the lock, read by the owner */
};

struct adg_thread {
	/* 0 outside a read-side section; inside, the epoch read when it
	 * began. Written by the owner, read by adg_rcu_synchronize. */
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t reader;
	struct adg_thread_slot slots[ADG_THREAD_SLOTS];
#ifdef ADG_TEST_HOOKS
	/* Sections open on the thread. In the library sections never nest;
	 * an interleaving test's hook runs another thread's work inside
	 * one. */
	uint32_t nest;
#endif
	/* Under the threads lock. The thread's other shards: a thread keeps
	 * every shard it took until it is gone (or the registry goes): a
	 * call up its stack (a backward whose step works on other
	 * registries) may still be using one that lost its slot. */
	struct adg_shard *overflow;
	uint32_t evict_next;
	bool live;		      /* a thread holds it */
	struct adg_thread *next_free; /* on the free list, when not live */
	struct adg_thread *next_all;  /* set before it is listed; constant */
	/* The owner's thread id (gettid), while live: how others learn that
	 * it has ended (adg_thread_gone_locked). */
	pid_t tid;
};

/* The calling thread's record; NULL until its first call that needs one
 * (or while it cannot have one: no memory). */
extern __thread struct adg_thread *adg_self
	__attribute__((tls_model("initial-exec")));

/* Gives the calling thread a record and returns it (adg_self from then
 * on); NULL for want of memory. Takes the threads lock. */
struct adg_thread *adg_thread_register(void);

void adg_threads_lock(void);
void adg_threads_unlock(void);

/* Under the threads lock: whether t's thread has ended. If so, t is
 * released: its shards go back for adoption, its slots are cleared, and
 * it may be a new thread's record. The calling thread's own record, and
 * the owner of shards a fork left behind, are never gone. */
bool adg_thread_gone_locked(struct adg_thread *t);

/* The first of every record there is (linked through next_all), live or
 * not; lock-free. */
struct adg_thread *adg_threads_first(void);

/* Under the threads lock: the registries that fork must find whole
 * (thread.c locks their kinds locks across it). */
void adg_threads_add_registry_locked(struct adg_registry *r);
void adg_threads_remove_registry_locked(struct adg_registry *r);

#ifdef ADG_TEST_HOOKS
/* How many records have a thread that is still alive; how many records
 * there are. */
size_t adg_threads_live(void);
size_t adg_threads_records(void);
#endif

#endif /* ADG_THREAD_H */
