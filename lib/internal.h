/*
 * The structs that the files of lib/ share, and the few inline helpers on their
 * hot paths, in sections by subject. A node's life runs through the files in
 * this order: node.c creates it, graph.c places it in a graph, a backward
 * takes and runs its step, node.c frees it. A backward is the runner's
 * (run.h): backward.c is its entry point and the sequential loop, tape.c
 * takes the tape, run.c is the step protocol every mode shares, and
 * parallel.c runs a tape on an executor's workers. thread.c keeps a record
 * of each thread (its reader word, its shards' slots) and handles fork;
 * readside.c is the read side and its grace periods; registry.c owns the
 * per-thread shards that carry ids and counters, kind.c the step kinds
 * nodes point at; grads.c the gradient table a backward returns. The annexes
 * (pool.c, reducer.c) need none of this: they stand on adg.h and util.h alone.
 */
#ifndef ADG_INTERNAL_H
#define ADG_INTERNAL_H

#include "adg.h"
#include "util.h"

#include <ck_pr.h>
#include <ck_spinlock.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ADG_SLAB_ASAN 1
#endif
#if defined(ADG_ASSERTIONS) && __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#define ADG_SLAB_MEMCHECK 1
#endif

/*
 * liburcu supplies the pointer primitives (rcu_dereference,
 * rcu_assign_pointer) and the list macros; the read side and grace periods
 * are libadg's own (readside.c, the RCU section below). liburcu-bp's read-side
 * calls cost 88 instructions a registration from a shared library, whose
 * global-dynamic TLS takes two __tls_get_addr calls a section end.
 *
 * _LGPL_SOURCE is not defined: libadg is MIT-licensed. The pointer
 * primitives are inlined (URCU_INLINE_SMALL_FUNCTIONS, which liburcu offers
 * non-LGPL code) except in ThreadSanitizer builds, where they stay calls
 * into liburcu so that TSan sees neither side of an RCU publish; the
 * annotations below rely on that.
 */
#include <urcu-bp.h>
#include <urcu/list.h>

/*
 * ThreadSanitizer sees neither liburcu's publish and dereference nor its
 * grace periods. In a TSan build these tell it what RCU guarantees: what was
 * written to an object before rcu_assign_pointer happens before what a
 * reader does after rcu_dereference. (libadg's own read side and grace
 * periods, readside.c, are C11 atomics that TSan sees, and need none.)
 * Elsewhere they compile to nothing.
 */
#if defined(__SANITIZE_THREAD__)
#define ADG_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ADG_TSAN 1
#endif
#endif
#ifdef ADG_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define adg_tsan_acquire(p) __tsan_acquire((void *)(p))
#define adg_tsan_release(p) __tsan_release((void *)(p))
#else
#define adg_tsan_acquire(p) ((void)(p))
#define adg_tsan_release(p) ((void)(p))
#endif

/*
 * Interleaving points. A white-box test compiles lib/ with ADG_TEST_HOOKS
 * and sets adg_test_point, which each point then calls: the test runs
 * another thread's work at the exact instant where a thread could stall,
 * and so checks an interleaving that a stress test would rarely hit. In
 * the library they compile to nothing.
 */
enum adg_test_point {
	ADG_TP_GRAPH_ID_LOADED,	     /* adg_node_graph_id has read the graph */
	ADG_TP_GRAPH_ID_ORIGIN_READ, /* ... and then its origin */
	ADG_TP_THREADS_LOCKED,	     /* the threads lock was taken */
	ADG_TP_KINDS_LOCKED,	     /* a registry's kinds lock was taken */
};
#ifdef ADG_TEST_HOOKS
extern void (*adg_test_point)(enum adg_test_point where);
#define ADG_TEST_POINT(where)                                                  \
	do {                                                                   \
		if (adg_test_point != NULL)                                    \
			adg_test_point(where);                                 \
	} while (0)
#else
#define ADG_TEST_POINT(where) ((void)0)
#endif

struct adg_shard;
struct adg_graph;
struct adg_kind_table; /* a registry's interned step kinds (kind.c) */
struct adg_tape;       /* a backward's scratch, reused by its thread (tape.h) */

/* -------------------------------------------------------------- spinlocks */

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

/* ------------------------------------------------------------------ nodes */

/*
 * What a step does, apart from its user pointer: the (backward, release,
 * name) of an adg_step, interned per registry (kind.c), so that every node
 * of one kind points at one record instead of carrying the three pointers
 * and its registry's (24 bytes a node less). Immutable once published, and
 * freed with its registry. A registry's leaves share its leaf_kind, whose
 * backward is NULL.
 */
struct adg_step_kind {
	struct adg_registry *registry;
	adg_backward_fn backward;
	adg_release_fn release;
	const char *name;
};

enum adg_node_state {
	ADG_NODE_LEAF,	   /* never changes */
	ADG_NODE_LIVE,	   /* step registered, in a graph */
	ADG_NODE_VISITING, /* on a tape being taken; its graph is locked */
	ADG_NODE_CONSUMED, /* step taken by a backward; in no graph */
};

struct adg_node {
	/* What the step does, interned per registry (kind.c), and so the
	 * node's registry (adg_node_registry_of); a leaf's is its registry's
	 * leaf_kind. Set before the node is published and never changed. */
	const struct adg_step_kind *kind;
	uint64_t id;
	/* The caller's handles, plus one per parent slot of an unconsumed
	 * child. Leaves are not counted by their children (see parents). */
	atomic_uint_fast64_t refs;
	/* The graph the node is in, NULL for leaves and consumed nodes. Read
	 * with rcu_dereference. Set by placement before any other thread can
	 * reach the node; after that, written with rcu_assign_pointer while
	 * holding the lock of the graph it pointed to. */
	struct adg_graph *graph;
	union {
		/* In graph->members, under the graph's lock. */
		struct cds_list_head link;
		/* Once out of its graph and unreachable: the free path's
		 * work list. */
		struct adg_node *next_doomed;
	};
	uint32_t depth;
	uint32_t n_parents;
	/* enum adg_node_state. LEAF never changes. The others are written
	 * only under the lock of the graph the node is in, and read only
	 * under it (backward.c) or by the thread that freed the node. */
	uint8_t state;
	/* ADG_NODE_F_*: set before the node is published and never changed
	 * after, so any holder may read them. */
	uint8_t flags;
	/* While on a tape being taken or run: how many of the tape's parent
	 * slots name this node. The backward drops them in one go. */
	uint32_t tape_links;
	union {
		/* While a tape is taken, under the lock: those of tape_links
		 * not yet placed in the tape's order (tape.c tape_order).
		 * While it runs on one thread with a ready hook: those whose
		 * steps have not run yet. */
		uint32_t tape_pending;
		/* While on a tape run with an executor: the node's position
		 * (the scheduler keeps the counts). */
		uint32_t tape_pos;
	};
	/* How many retained backward passes are running over the node
	 * (I14). Under the lock of the graph the node is in, as state: a
	 * consuming walk that meets a node with one is refused. The fields
	 * above are a consuming tape's, or a walk's under the lock: several
	 * retained passes may be running over the node, so theirs read none
	 * of them once the lock is released. */
	uint32_t retained_runs;
	/* The step's user pointer (adg_step.user), NULL for a leaf; the rest
	 * of the adg_step is in kind. */
	void *user;
	/* One word per parent slot, in adg_op's order (repeats kept): an op
	 * parent's pointer (nodes are 8-aligned, so its low bit is 0) or a
	 * leaf's (id << 1) | 1 (adg_parent_node, adg_parent_id). A leaf is
	 * kept by id alone: children never touch a leaf after creating it, so
	 * a parameter shared by every thread is a cache line nobody writes,
	 * and its handle may go while children still use its id. Hence ids
	 * stop at ADG_ID_MAX. */
	uint64_t parents[];
};

/* 80 bytes on LP64, plus 8 per parent slot: a product of two parents is
 * a 96-byte node in its slab, one parent 88 (docs/concurrency.md, "Cost
 * as a graph grows"). */
_Static_assert(sizeof(void *) != 8 || sizeof(struct adg_node) == 80,
	       "struct adg_node's size is stated above and in the docs");

/* The node offers a forward output (adg_op_with). Any holder may test
 * it, while the checkpointing record belongs to the node's owner and goes
 * when a backward has run the step. */
#define ADG_NODE_F_OFFERS_OUTPUT 0x1
/* The node was made with options: a slot for its checkpointing record
 * follows its parents (adg_node_ckpt_slot). Nodes without one, nearly all,
 * spare its 8 bytes. */
#define ADG_NODE_F_CKPT_SLOT 0x2

/* The graph node n is in, read without following it: for comparing with a
 * graph the caller has locked (see adg_graph_lock_of), which needs no
 * read-side section. */
static inline struct adg_graph *adg_node_graph(const struct adg_node *n)
{
	return rcu_dereference(n->graph);
}

/* The node's registry: its kind's, set before the node is published and
 * never changed, so any holder may read it. */
static inline struct adg_registry *
adg_node_registry_of(const struct adg_node *n)
{
	return n->kind->registry;
}

/* Leaves are the only nodes without parents: adg_op requires one. */
static inline bool adg_node_is_leaf(const struct adg_node *n)
{
	return n->n_parents == 0;
}

/* A parent slot's word for parent p (see parents). */
static inline uint64_t adg_parent_word(const struct adg_node *p)
{
	ADG_ASSERT(p->id <= ADG_ID_MAX);
	if (adg_node_is_leaf(p))
		return (p->id << 1) | 1;
	ADG_ASSERT(((uintptr_t)p & 1) == 0);
	return (uint64_t)(uintptr_t)p;
}

/* The op parent a slot's word names, NULL for a leaf. */
static inline struct adg_node *adg_parent_node(uint64_t word)
{
	return (word & 1) ? NULL : (struct adg_node *)(uintptr_t)word;
}

/* The id of the parent a slot's word names: the leaf's, or the op's. */
static inline uint64_t adg_parent_id(uint64_t word)
{
	return (word & 1) ? word >> 1
			  : ((const struct adg_node *)(uintptr_t)word)->id;
}

/* Slot k's op parent, NULL for a leaf. */
static inline struct adg_node *adg_node_parent(const struct adg_node *n,
					       uint32_t k)
{
	return adg_parent_node(n->parents[k]);
}

/* Slot k's parent id. */
static inline uint64_t adg_node_parent_id(const struct adg_node *n, uint32_t k)
{
	return adg_parent_id(n->parents[k]);
}

/* Writes n's parent ids, in slot order, to ids (room for n_parents): the
 * contiguous array a step call, a visitor or a failure report hands
 * out. */
static inline void adg_node_fill_parent_ids(const struct adg_node *n,
					    uint64_t *ids)
{
	for (uint32_t k = 0; k < n->n_parents; k++)
		ids[k] = adg_parent_id(n->parents[k]);
}

/* Drops one reference; frees the node and whatever becomes unreachable. */
void adg_node_release(struct adg_shard *shard, struct adg_node *node);

/* Drops n references at once; frees as adg_node_release does. */
void adg_node_release_many(struct adg_shard *shard, struct adg_node *node,
			   uint64_t n);

/* Calls the step's release callback, once. */
void adg_node_release_step(struct adg_shard *shard, struct adg_node *node);

/* ----------------------------------------------------------------- graphs */

/*
 * A graph object is type-stable: once allocated it stays a graph, with an
 * initialised lock, until its registry is freed or a grace period after it
 * left its shard's pool has passed (graph.c graph_defer). Retired graphs are
 * reused at once by the thread that retired them, so a thread holding a stale
 * pointer may lock a graph that has since become another one. Every path
 * therefore locks, then checks that the node still points there
 * (adg_graph_lock_of); the lock-free reader checks the generation instead
 * (adg_node_graph_id).
 */
struct adg_graph {
	/* Bumped, under the lock, each time the object retires: a lock-free
	 * reader that sees it unchanged read one graph's fields. */
	atomic_uint_fast64_t gen;
	/* See adg_graph_lock. Not the first member: the TSan annotations of
	 * the lock (on &lock) and of the graph's publication (on the graph's
	 * address) must not share an address, or one would order what only
	 * the other should. */
	ck_spinlock_fas_t lock;
#ifdef ADG_ASSERTIONS
	/* Who holds lock (adg_graph_held), for the assertions only. Relaxed
	 * atomic: others write it while the reader checks for itself. */
	_Atomic(const void *) owner;
#endif
	/* The smallest origin among the graphs merged into this one. Written
	 * under the lock, read lock-free by adg_node_graph_id. */
	atomic_uint_fast64_t origin;
	/* Lock order: fixed when the object is first allocated and never
	 * changed, so every thread orders the same two objects the same way
	 * however merges and reuse interleave. Unique: it is the id of the
	 * node the object was first allocated for. */
	uint64_t rank;
	struct cds_list_head members; /* nodes whose step is unconsumed */
	size_t n_members;
	bool retire_pending; /* emptied or merged away while locked */
	struct adg_registry *registry;
	/* In a shard's pool or limbo, once retired. */
	struct adg_graph *next_free;
};

_Static_assert(
	offsetof(struct adg_graph, lock) != 0,
	"the lock's TSan annotations must not share the graph's address");

/* The per-graph lock, a spinlock (see above): graphs of unrelated work are
 * locked by one thread only. */

#ifdef ADG_ASSERTIONS
/* A distinct address per live thread: the identity a lock owner holds. */
extern __thread char adg_thread_identity;
#define ADG_ME ((const void *)&adg_thread_identity)
#define adg_graph_set_owner(g, who)                                            \
	atomic_store_explicit(&(g)->owner, (who), memory_order_relaxed)
/* Whether this thread holds g's lock. */
#define adg_graph_held(g)                                                      \
	(atomic_load_explicit(&(g)->owner, memory_order_relaxed) == ADG_ME)
#else
#define adg_graph_set_owner(g, who) ((void)0)
#define adg_graph_held(g)	    true
#endif

static inline void adg_graph_lock(struct adg_graph *g)
{
	adg_spin_lock(&g->lock);
	adg_graph_set_owner(g, ADG_ME);
}

static inline void adg_graph_unlock_plain(struct adg_graph *g)
{
	ADG_ASSERT(adg_graph_held(g));
	adg_graph_set_owner(g, NULL);
	adg_spin_unlock(&g->lock);
}

/* The one way a placed node's state changes: under the lock of its graph
 * (I2), and only LIVE -> VISITING (a walk reaches it), VISITING -> LIVE
 * (the walk is undone, or was a retained pass's) or VISITING -> CONSUMED
 * (the tape is taken) (I1). */
static inline void adg_node_set_state(struct adg_node *n,
				      enum adg_node_state to)
{
	ADG_ASSERT(adg_node_graph(n) != NULL &&
		   adg_graph_held(adg_node_graph(n)));
	ADG_ASSERT(n->state == ADG_NODE_LIVE ? to == ADG_NODE_VISITING
		   : n->state == ADG_NODE_VISITING
			   ? to == ADG_NODE_LIVE || to == ADG_NODE_CONSUMED
			   : false);
	n->state = to;
}

/* A shard keeps at most ADG_GRAPH_POOL_MAX retired graphs for reuse; past
 * that, they wait in its limbo, and ADG_GRAPH_LIMBO_MAX of them go back to
 * the allocator together after one grace period (graph.c graph_defer). */
#define ADG_GRAPH_POOL_MAX  1024
#define ADG_GRAPH_LIMBO_MAX 64

/* Places a new LIVE node in its parents' graph, creating a graph when no
 * parent is in one and merging when they are in several, and publishes
 * node->graph. Returns 0 or ADG_ENOMEM (then nothing changed). */
int adg_graph_place(struct adg_shard *shard, struct adg_node *node);

/* Locks the graph node is in and returns it, or returns NULL if the node is
 * in none. While the lock is held the node stays in that graph. */
struct adg_graph *adg_graph_lock_of(struct adg_node *node);

/* Takes node out of graph g (locked); node->graph becomes NULL. */
void adg_graph_detach_locked(struct adg_graph *g, struct adg_node *node);

/* Unlocks g; if g was retired while locked, puts it in this thread's pool
 * for reuse (or, past the pool's size, frees it after a grace period). */
void adg_graph_unlock(struct adg_shard *shard, struct adg_graph *g);

/* Registry teardown, after adg_rcu_synchronize: frees the graphs a shard
 * keeps, in its pool and its limbo. */
void adg_graph_free_pool(struct adg_shard *shard);

/* ------------------------------------------------------- per-thread shard */

enum adg_counter {
	ADG_C_NODES_FREED,
	ADG_C_STEPS_RELEASED,
	ADG_C_GRAPHS_RETIRED,
	ADG_C_MERGES,
	ADG_C_SLAB_BYTES_FREED, /* node slabs given back */
	ADG_C_HUGE_BYTES_FREED, /* of them, mapped for huge pages */
	/* Creation counters come after the retirement counters:
	 * adg_registry_stats reads all of the latter first (see registry.c). */
	ADG_C_LEAVES_MADE,
	ADG_C_OPS_MADE, /* nodes with a step */
	ADG_C_GRAPHS_MADE,
	ADG_C_SLAB_BYTES_TAKEN, /* node slabs taken */
	ADG_C_HUGE_BYTES_TAKEN, /* of them, mapped for huge pages */
	ADG_C_COUNT,
};

/* Nodes with fewer parents than this come from slabs (slab.c), one size
 * class per parent count; the others are blocks of the allocator's. */
#define ADG_SLAB_CLASSES 8

struct adg_slab;

/* A shard's cache of step kinds (struct adg_shard kind_cache): entries, a
 * power of two, indexed by the top ADG_KIND_CACHE_BITS of adg_kind_hash. */
#define ADG_KIND_CACHE_BITS 5
#define ADG_KIND_CACHE_SIZE (1u << ADG_KIND_CACHE_BITS)

/*
 * One thread's slice of a registry: its batch of node ids and its counters,
 * on cache lines no other thread writes. The registry keeps every shard on
 * an append-only list (adg_registry_stats sums them) and frees them all, with
 * its allocator, in adg_registry_free; a thread finds its shards through the
 * slots of its record, struct adg_thread (or, past ADG_THREAD_SLOTS
 * registries, its overflow list). A shard whose thread has ended is
 * adopted by the next thread that needs one and finds it so.
 */
struct adg_shard {
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t counters[ADG_C_COUNT];
	/* The registry's fallback shard, shared by threads that could not
	 * allocate their own: counted with atomic adds, never given ids. */
	bool shared;
	uint64_t next_id;  /* next id of this thread's batch */
	uint64_t ids_left; /* ids left in the batch */
	/* The output this thread offered last and the balanced strategy let
	 * go of, taken out of its node's record: freed by the owner's next
	 * op or backward on the registry that succeeds, or with the registry
	 * (adg_ckpt_free_deferred), so that the forward that made it may go
	 * on reading it. value NULL: none. Owner-only: no other thread can
	 * reach it, whatever becomes of the node. Beside the ids, which
	 * every op reads: no cache line more for the op's check. */
	struct adg_deferred_output {
		void *value;
		void (*free)(void *value, void *ctx);
		void *ctx;
	} deferred;
	uint64_t next_pass;	     /* next pass id of this thread's batch */
	uint64_t passes_left;	     /* pass ids left in the batch */
	struct adg_tape *tape_cache; /* NULL while a backward uses it */

	/* The owner's node slabs, per class (slab.c): the one nodes are
	 * taken from, the others with free room, and all of them. */
	struct adg_slab *slab_current[ADG_SLAB_CLASSES];
	struct adg_slab *slabs_with_room[ADG_SLAB_CLASSES];
	struct adg_slab *slabs;
	uint32_t slabs_held[ADG_SLAB_CLASSES];
	uint32_t slabs_held_huge[ADG_SLAB_CLASSES]; /* of them, mapped */
	/* Empty huge slabs, of any class, linked through next (slab.c). */
	struct adg_slab *huge_spares;
	/* Retired graphs, ready for reuse by this thread (see struct
	 * adg_graph). */
	struct adg_graph *graph_pool;
	uint32_t graphs_pooled;
	/* Retired graphs past the pool's size, freed together after a grace
	 * period (graph.c graph_defer). */
	struct adg_graph *graph_limbo;
	uint32_t graphs_in_limbo;
	/* Step kinds this thread interned or found, direct-mapped by
	 * adg_kind_hash (adg_kind_intern); NULL entries are empty. Never used
	 * on the fallback shard, which threads share. */
	const struct adg_step_kind *kind_cache[ADG_KIND_CACHE_SIZE];

	/* Slabs of this shard's that other threads freed nodes of, pushed by
	 * them, taken all at once by the owner (slab.c): a line of its own,
	 * the only one of a shard's that other threads write. */
	_Alignas(ADG_CACHELINE) struct adg_slab *_Atomic slabs_freed_remotely;

	/* Read-mostly: written at creation and adoption. */
	_Alignas(ADG_CACHELINE) struct adg_registry *registry;
	/* The thread record that holds it, NULL while none does: under the
	 * threads lock (thread.c). */
	struct adg_thread *owner;
	void *alloc_base; /* what the allocator returned (see
			     registry_zalloc_aligned) */
	struct adg_shard *next_in_registry;
	/* In its thread's overflow list (struct adg_thread), under the
	 * threads lock. */
	struct adg_shard *next_overflow;
};

_Static_assert(_Alignof(struct adg_shard) == ADG_CACHELINE &&
		       offsetof(struct adg_shard, registry) % ADG_CACHELINE ==
			       0,
	       "a shard's owner-written fields and its read-mostly fields "
	       "start cache lines of their own");

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

struct adg_registry {
	/* Unique in the process, never reused: what a gradient table, which
	 * may outlive its registry, compares a node's registry with (a new
	 * registry may get a freed one's address). */
	uint64_t serial;
	adg_allocator allocator;
	void *alloc_base; /* what the allocator returned for this struct */
	uint64_t max_node_id;
	int checkpointing; /* enum adg_checkpointing */
	/* A backward's ops when it is passed none (adg_registry_options). */
	adg_grad_ops grad_ops;
	bool has_grad_ops;
	/* No allocator was given: big node slabs may be libadg's own
	 * mappings, advised for huge pages (slab.c). */
	bool maps_huge_slabs;
	/* Set when the first node gets a checkpointing record; until then a
	 * backward skips the checkpointing passes. Written once. */
	atomic_bool uses_checkpoints;
	/* Step kinds (kind.c): the one every leaf points at, and the table
	 * the others are interned in, NULL until the first op. The table
	 * pointer is read lock-free (acquire) on a shard cache miss and
	 * written, as the table's slots are, under kinds_lock, taken only to
	 * intern a kind not seen before: rare, so the lock shares the
	 * read-mostly line. */
	struct adg_step_kind leaf_kind;
	struct adg_kind_table *_Atomic kinds;
	ck_spinlock_fas_t kinds_lock;
	/* Written once per id batch of any thread, and once per pass id
	 * batch (adg_next_pass_id): both rare, so they share a line. */
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t next_free_id;
	atomic_uint_fast64_t next_free_pass;
	/* Written once per shard created (under the threads lock). */
	_Alignas(ADG_CACHELINE) struct adg_shard *_Atomic shards;
	/* Counts the frees of threads that have no shard (see shared). */
	struct adg_shard fallback;
	/* In thread.c's list of registries, under the threads lock. */
	struct adg_registry *next_registry;
};

_Static_assert(offsetof(struct adg_registry, next_free_id) % ADG_CACHELINE ==
			       0 &&
		       offsetof(struct adg_registry, shards) % ADG_CACHELINE ==
			       0 &&
		       offsetof(struct adg_registry, shards) >
			       offsetof(struct adg_registry, next_free_id),
	       "the id counter and the shard list are on lines of their own");

/* The calling thread's shard of registry when it is not in the first slot;
 * NULL on allocation failure. */
struct adg_shard *adg_shard_get_slow(struct adg_registry *registry);

static inline struct adg_shard *adg_shard_get(struct adg_registry *registry)
{
	struct adg_thread *self = adg_self;
	if (adg_unlikely(self == NULL))
		return adg_shard_get_slow(registry);
	struct adg_thread_slot *first = &self->slots[0];

	/* Relaxed: only this thread writes a slot's registry to a registry,
	 * and adg_registry_free clears only the slots of one that no call may
	 * use any more; so reading `registry` here means the slot and its
	 * shard are this thread's. Most threads use one registry: it is in
	 * the first slot. */
	if (adg_likely(atomic_load_explicit(&first->registry,
					    memory_order_relaxed) ==
		       registry)) {
		ADG_ASSERT(first->shard->registry == registry); /* I9 */
		return first->shard;
	}
	return adg_shard_get_slow(registry);
}

/* The calling thread's shard, or the registry's fallback shard when it
 * cannot have one: for paths that free and must not fail. */
static inline struct adg_shard *
adg_shard_get_or_shared(struct adg_registry *registry)
{
	struct adg_shard *s = adg_shard_get(registry);
	return s != NULL ? s : &registry->fallback;
}

/* Counts n events of kind c on this thread's shard. Only the owning thread
 * writes a shard, so a load and a store do, with no locked instruction; the
 * release store lets adg_registry_stats see what led up to the event. */
static inline void adg_count(struct adg_shard *s, enum adg_counter c,
			     uint64_t n)
{
	if (adg_unlikely(s->shared)) {
		atomic_fetch_add_explicit(&s->counters[c], n,
					  memory_order_release);
		return;
	}
	uint64_t v =
		atomic_load_explicit(&s->counters[c], memory_order_relaxed);
	atomic_store_explicit(&s->counters[c], v + n, memory_order_release);
}

/* Hands out the next node id of this thread's batch. Returns 0 or
 * ADG_ENOIDS. */
int adg_shard_refill_ids(struct adg_shard *s);

static inline int adg_next_id(struct adg_shard *s, uint64_t *id)
{
	if (adg_unlikely(s->ids_left == 0)) {
		int rc = adg_shard_refill_ids(s);
		if (rc != 0)
			return rc;
	}
	s->ids_left--;
	*id = s->next_id++;
	return 0;
}

/* Gives back the id adg_next_id just handed out, for a node no one saw: a
 * refused call changes nothing, ids included. Nothing in between took
 * another: the caller made no other node on this thread. */
static inline void adg_put_id(struct adg_shard *s, uint64_t id)
{
	ADG_ASSERT(id + 1 == s->next_id);
	s->next_id = id;
	s->ids_left++;
}

/* A new backward pass's id (adg_step_call.pass_id): unique in the
 * registry, never 0. From this thread's batch, so that a backward writes
 * no shared line for it; the fallback shard, shared, takes one at a time. */
uint64_t adg_next_pass_id(struct adg_shard *s);

/* ------------------------------------------------------------- step kinds */

/* The first size of a registry's kind table (kind.c); a power of two. */
#define ADG_KIND_TABLE_MIN 16

/* A registry's table of kinds (kind.c): linear probing, at most half full,
 * so that a probe always meets an empty slot; its size a power of two. In
 * this header for the white-box tests (tests/test_kinds.c). */
struct adg_kind_table {
	/* The table this one replaced, kept for its readers until the
	 * registry goes; NULL for the first. */
	struct adg_kind_table *older;
	unsigned int shift; /* 64 - log2(size): the top bits of the hash */
	size_t size;
	size_t count; /* under the kinds lock */
	/* Each NULL until a kind is stored there, under the lock, with a
	 * release store; never changed after. */
	const struct adg_step_kind *_Atomic slots[];
};

/* The hash of a kind's triple: a product per pointer, combined, whose top
 * bits (as adg_id_hash's) pick a shard cache entry and a table slot. */
static inline uint64_t adg_kind_hash(adg_backward_fn backward,
				     adg_release_fn release, const char *name)
{
	uint64_t h =
		(uint64_t)(uintptr_t)backward * UINT64_C(0x9e3779b97f4a7c15);
	h ^= (uint64_t)(uintptr_t)release * UINT64_C(0xc2b2ae3d27d4eb4f);
	h ^= (uint64_t)(uintptr_t)name * UINT64_C(0x165667b19e3779f9);
	return h;
}

static inline bool adg_kind_is(const struct adg_step_kind *k,
			       const adg_step *step)
{
	return k->backward == step->backward && k->release == step->release &&
	       k->name == step->name;
}

/* adg_kind_intern past the shard's cache: the registry's table, lock-free,
 * then an insert under its lock (kind.c). */
const struct adg_step_kind *
adg_kind_intern_slow(struct adg_shard *s, const adg_step *step, uint64_t hash);

/* The kind of step's (backward, release, name) in s's registry, interned
 * on first sight; NULL on allocation failure, when nothing changed. On
 * adg_op's path: a hit in the thread's cache is a hash, a load and three
 * compares. The record is this thread's to read: it was published before
 * it went into the cache (kind.c). */
static inline const struct adg_step_kind *adg_kind_intern(struct adg_shard *s,
							  const adg_step *step)
{
	uint64_t h = adg_kind_hash(step->backward, step->release, step->name);
	if (adg_likely(!s->shared)) {
		const struct adg_step_kind *k =
			s->kind_cache[h >> (64 - ADG_KIND_CACHE_BITS)];
		if (adg_likely(k != NULL && adg_kind_is(k, step)))
			return k;
	}
	return adg_kind_intern_slow(s, step, h);
}

/* Registry setup and teardown: the leaf kind, and freeing every kind and
 * table (after the shards, whose caches point at kinds, are done). */
void adg_kind_init(struct adg_registry *r);
void adg_kind_free_all(struct adg_registry *r);

/* ------------------------------------------------------------------- RCU */

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

/* ------------------------------------------------------------- allocation */

static inline void *adg_alloc(struct adg_registry *r, size_t size)
{
	return r->allocator.alloc(size, r->allocator.ctx);
}

static inline void adg_free(struct adg_registry *r, void *p, size_t size)
{
	r->allocator.free(p, size, r->allocator.ctx);
}

static inline size_t adg_node_size(size_t n_parents)
{
	return sizeof(struct adg_node) + n_parents * sizeof(uint64_t);
}

/* ------------------------------------------------------------ node slabs */

/*
 * Node memory of libadg's own (slab.c). A slab is one block of the
 * registry's allocator, owned by one shard and holding nodes of one size
 * class, bumped in the order they are made, so that a graph one thread
 * made lies in memory in the order its backward walks it. Each slab page
 * (ADG_SLAB_PAGE) that holds nodes starts with the slab's address, which
 * is how a node finds its slab. The owner reuses freed room (its free
 * list) before bumping; other threads' frees go on a lock-free list the
 * owner takes when it runs out of room. A slab goes back to the allocator
 * once all its nodes are free.
 */
/* 8 KiB, two of the system's pages: a node never straddles a slab page,
 * so each page loses the slab's address and the room short of a node at
 * its end, 24 bytes in 8 KiB for 96-byte nodes where 4 KiB pages lost 64
 * in 4 KiB (1.6 % of a graph's memory). */
#define ADG_SLAB_PAGE 8192

/* A free node's first word, linking it into a slab's free list. */
struct adg_slab_free {
	struct adg_slab_free *next;
};

struct adg_slab {
	/* Other threads' frees: a stack of free nodes, pushed with a compare
	 * and swap, its low bit set once the slab is on its owner's
	 * slabs_freed_remotely (the pusher that set it put it there), and
	 * cleared when the owner takes the stack. */
	_Atomic uintptr_t freed_remotely;
	struct adg_slab *next_freed_remotely;
	/* Set at creation, never changed: any thread may read it. */
	struct adg_shard *owner;
	uint32_t cls;
	uint32_t node_size;
	size_t bytes; /* asked of the allocator, or mapped */
	bool mapped;  /* a mapping of libadg's own, for huge pages */
	char *first_page;
	char *end; /* of the last whole page */

	/* The owner's, a line away from freed_remotely (a slab is a block
	 * of the allocator's, aligned as malloc's are, so not _Alignas). */
	char apart[ADG_CACHELINE];
	struct adg_slab_free *free_list;
	char *bump;	/* where the next node is cut */
	char *page_end; /* of bump's page */
	uint32_t used;	/* nodes cut or reused, less the frees taken */
	/* Current, or in the shard's slabs_with_room: a free needs not list
	 * it for the owner to find its room. */
	bool findable;
	struct adg_slab *prev_with_room, *next_with_room;
	struct adg_slab *prev, *next; /* in the shard's slabs */
};

/* The slab node p lies in. */
static inline struct adg_slab *adg_slab_of(const void *p)
{
	return *(struct adg_slab *const *)((uintptr_t)p &
					   ~(uintptr_t)(ADG_SLAB_PAGE - 1));
}

void *adg_slab_alloc_slow(struct adg_shard *shard, uint32_t cls);
void adg_slab_free_slow(struct adg_shard *shard, struct adg_slab *slab);
void adg_slab_free_remote(struct adg_slab *slab, void *p);
/* A freed node's first word links it into a free list: it stays readable,
 * the rest is poisoned, so that a use after free is caught by ASan (and by
 * memcheck in builds with assertions) as it was with one block a node.
 * Nothing in other builds. */
static inline void adg_slab_poison(void *p, size_t size)
{
	char *rest = (char *)p + sizeof(struct adg_slab_free);
	size_t len = size - sizeof(struct adg_slab_free);
	(void)rest;
	(void)len;
#ifdef ADG_SLAB_ASAN
	ASAN_POISON_MEMORY_REGION(rest, len);
#endif
#ifdef ADG_SLAB_MEMCHECK
	VALGRIND_MAKE_MEM_NOACCESS(rest, len);
#endif
}

static inline void adg_slab_unpoison(void *p, size_t size)
{
	(void)p;
	(void)size;
#ifdef ADG_SLAB_ASAN
	ASAN_UNPOISON_MEMORY_REGION(p, size);
#endif
#ifdef ADG_SLAB_MEMCHECK
	VALGRIND_MAKE_MEM_UNDEFINED(p, size);
#endif
}

/* A node of class cls (its parent count) for the calling thread, which
 * owns shard; NULL when the allocator fails. */
static inline void *adg_slab_alloc(struct adg_shard *shard, uint32_t cls)
{
	struct adg_slab *s = shard->slab_current[cls];
	if (adg_likely(s != NULL)) {
		void *p = s->free_list;
		if (p != NULL) {
			s->free_list = s->free_list->next;
		} else if (s->bump + s->node_size <= s->page_end) {
			p = s->bump;
			s->bump += s->node_size;
		} else {
			return adg_slab_alloc_slow(shard, cls);
		}
		s->used++;
		adg_slab_unpoison(p, s->node_size);
		return p;
	}
	return adg_slab_alloc_slow(shard, cls);
}

/* Frees node memory p of a slab's; shard is the calling thread's (or the
 * registry's fallback shard). */
static inline void adg_slab_free(struct adg_shard *shard, void *p)
{
	struct adg_slab *s = adg_slab_of(p);
	if (adg_unlikely(s->owner != shard)) {
		adg_slab_free_remote(s, p);
		return;
	}
	struct adg_slab_free *f = p;
	f->next = s->free_list;
	s->free_list = f;
	adg_slab_poison(p, s->node_size);
	/* The slab goes back, or gets listed as having room. */
	if (adg_unlikely(--s->used == 0 || !s->findable))
		adg_slab_free_slow(shard, s);
}

/* What a node takes: with a checkpointing slot, 8 bytes more. */
static inline size_t adg_node_alloc_size(size_t n_parents, bool ckpt_slot)
{
	return adg_node_size(n_parents) +
	       (ckpt_slot ? sizeof(struct adg_ckpt *) : 0);
}

/* The slot of a node made with options (ADG_NODE_F_CKPT_SLOT). */
static inline struct adg_ckpt **adg_node_ckpt_slot(const struct adg_node *n)
{
	ADG_ASSERT((n->flags & ADG_NODE_F_CKPT_SLOT) != 0);
	return (struct adg_ckpt **)((uintptr_t)n + adg_node_size(n->n_parents));
}

/* The node's checkpointing record, or NULL. */
static inline struct adg_ckpt *adg_node_ckpt(const struct adg_node *n)
{
	if ((n->flags & ADG_NODE_F_CKPT_SLOT) == 0)
		return NULL;
	return *adg_node_ckpt_slot(n);
}

/* ---------------------------------------------------------- checkpointing */

/* A node's part in checkpointing: the output it offers, and the outputs its
 * step will ask for. Touched only by whoever owns the node: its creator,
 * the backward that took it, or the thread that frees it. */
struct adg_ckpt {
	bool memory_bound;
	/* The output, while held. Retained passes, which may share the
	 * record, read it with acquire loads and publish one with a compare
	 * and swap; the record's owner uses it as it likes. */
	void *value;
	void (*free)(void *value, void *ctx);
	void *free_ctx;
	adg_recompute_fn recompute;
	/* During a backward: requests still to serve. 64 bits: one per
	 * want slot of every tape child, and a slot count is 32 bits. */
	uint64_t pending;
	/* During a backward: the take planned to rebuild the output, and it
	 * has not been rebuilt yet; see ckpt_serve. */
	bool rebuild_planned;
	/* With an executor's workers: the run (its output lock's address)
	 * rebuilding the output now, or NULL; atomic, since retained passes
	 * share the record. Others of that run that need the output sleep
	 * until it is there (see checkpoint.c). */
	const void *builder;
	/* A value let go of under the run's output lock, to free once it is
	 * released, and the next such record (struct adg_drops). */
	void *dropped;
	struct adg_node *drop_next;
	struct adg_node *unbuilt_next; /* ckpt_serve's work list */
	bool want_self;
	uint32_t n_want_parents;
	uint32_t want_parents[]; /* parent slots */
};

/* Outputs let go of while a run's output lock is held, to free once it is
 * released (an output's free is the caller's code): a list through their
 * records. */
struct adg_drops {
	struct adg_node *head;
};

/* Frees every output on drops, with no lock held. */
void adg_ckpt_free_drops(struct adg_drops *drops);

/* What adg_output_get needs of the backward that runs the step. */
struct adg_backward_context {
	struct adg_node *node;	 /* whose step runs */
	struct adg_node **stack; /* recompute's work list, tape-sized */
	/* A recompute's parent outputs: room for the most parents a tape
	 * node has, reserved when the tape was taken, so that adg_output_get
	 * never allocates. */
	void **outputs;
	/* And their ids, the recompute call's parent_ids: as many. */
	uint64_t *ids;
	/* With an executor's workers: held around every use of the records
	 * and of stack, which the backward's workers share, and never across
	 * a recompute (outputs is the worker's own); rebuilt is signalled
	 * when a rebuild ends. NULL on one thread. */
	pthread_mutex_t *serialize;
	pthread_cond_t *rebuilt;
	/* A retained backward: no request is counted or served, and an
	 * output it rebuilds is published for the passes after it (and
	 * those running beside it: see checkpoint.c). */
	bool retained;
};

/* adg_op_with: checks options against the parents and attaches a record
 * to node (not yet placed). Returns 0, ADG_EINVAL or ADG_ENOMEM, with its
 * reason naming func (the public function called); on error nothing was
 * taken. */
int adg_ckpt_attach(struct adg_node *node, adg_node *const *parents,
		    const adg_op_options *options, const char *func);

/* Once an op with a record is placed: applies the registry's strategy to
 * its output. An output the strategy drops leaves the record at once but
 * is freed later: it becomes shard's deferred output (shard is the
 * caller's own, and has none: the caller freed it). */
void adg_ckpt_commit(struct adg_shard *shard, struct adg_node *node);

/* Frees shard's deferred output, if any: when the owner's next op or
 * backward succeeds, and when the registry goes. */
void adg_ckpt_free_deferred_slow(struct adg_shard *shard);

static inline void adg_ckpt_free_deferred(struct adg_shard *shard)
{
	if (adg_unlikely(shard->deferred.value != NULL))
		adg_ckpt_free_deferred_slow(shard);
}

/* After a tape is taken: counts its requests and frees what none needs. */
void adg_ckpt_plan(struct adg_node **tape, size_t len);

/* After the step of a tape node with a record returned: its requests are
 * served. With drops, under the run's output lock: the outputs let go of
 * are freed by adg_ckpt_free_drops after it. */
void adg_ckpt_served(struct adg_node *node, struct adg_drops *drops);

/* At the end of a backward, or when a node with a record goes: frees the
 * record and what is left of its output. */
void adg_ckpt_drop(struct adg_node *node);

/* ----------------------------------------------------------------- grads */

/* What adg_grads_register sends a gradient to: a gradient table (below),
 * or a step's output in a backward with an executor (struct adg_step_out,
 * run.h), which routes it to the step's parent slot. Each embeds this;
 * accept takes value whatever it returns. */
struct adg_grads {
	int (*accept)(struct adg_grads *to, uint64_t id, void *value);
};

/* One entry of a gradient table: node id -> the caller's value. */
struct adg_grad_entry {
	uint64_t id;
	void *value;
};

/* The container a backward returns (grads.c). */
struct adg_grad_table {
	struct adg_grads as_grads;
	adg_grad_ops ops;
	/* Copies: the table may outlive the registry. The serial is what a
	 * node's registry is compared with (adg_grads_get_node). */
	adg_allocator allocator;
	uint64_t registry_serial;
	struct adg_grad_entry *entries;
	size_t cap;	    /* a power of two */
	unsigned int shift; /* 64 - log2(cap) */
	size_t count;	    /* held, in entries and window */
	/* While a backward on one thread runs: the gradients of ids window_lo
	 * to window_lo + window_len - 1 live here instead, indexed by id, so
	 * that a tape whose ids are dense (a graph recorded by one thread)
	 * reads and writes them in memory order, with no hashing. The memory
	 * is the tape's scratch; NULL: none. */
	void **window;
	uint64_t window_lo;
	size_t window_len;
};

/* A table sized for about `expected` gradients, allocated with registry's
 * allocator (copied: it may outlive the registry). */
int adg_grad_table_new(struct adg_registry *registry, const adg_grad_ops *ops,
		       size_t expected, struct adg_grad_table **out);

/* The table behind grads, or NULL when grads is none (NULL, or a step's
 * output). */
struct adg_grad_table *adg_grad_table_of(const adg_grads *grads);

/* The reason of adg_grad_table_insert's failure rc (ADG_ENOMEM, or
 * ops->add's code) for id, in func; returns rc. */
__attribute__((cold)) int adg_grad_failed(int rc, const char *func,
					  uint64_t id);

/* Adds value to id's gradient (ops->add), or holds it; id non-zero. Takes
 * value whatever it returns: 0, ADG_ENOMEM or add's code. */
int adg_grad_table_insert(struct adg_grad_table *g, uint64_t id, void *value);

/* Adds value into *slot, one of the window's: held as it is, or folded
 * with ops->add into what the slot holds. */
int adg_grad_table_window_insert(struct adg_grad_table *g, void **slot,
				 void *value);

/* adg_grad_table_insert with the window's common case inline, where a
 * step on one thread sends its gradients: id's first gradient is a
 * store, a later one a call to the add. */
static inline int adg_grad_table_insert_fast(struct adg_grad_table *g,
					     uint64_t id, void *value)
{
	/* Unsigned: an id below window_lo wraps above window_len. */
	uint64_t i = id - g->window_lo;
	if (adg_unlikely(i >= g->window_len))
		return adg_grad_table_insert(g, id, value);
	void **slot = &g->window[i];
	if (*slot != NULL)
		return adg_grad_table_window_insert(g, slot, value);
	*slot = value;
	g->count++;
	return 0;
}

/* Removes and returns id's value, or NULL when none is held (a held value
 * is never NULL). */
void *adg_grad_table_take(struct adg_grad_table *g, uint64_t id);

/* Frees every value held (ops->free) and the table; an attached window's
 * values too, leaving its slots NULL. */
void adg_grad_table_free(struct adg_grad_table *g);

/* Routes ids lo to lo + len - 1 to window (len slots, all NULL) until
 * adg_grad_table_detach_window. */
void adg_grad_table_attach_window(struct adg_grad_table *g, void **window,
				  uint64_t lo, size_t len);

/* Moves what the window holds into the table's own entries, leaving the
 * window's slots NULL for its next use. Returns 0, or ADG_ENOMEM when the
 * entries could not grow for them: then what could not move was freed. */
int adg_grad_table_detach_window(struct adg_grad_table *g);

/* --------------------------------------------------------------- teardown */

/* Releases tape scratch (a shard's, or a nested backward's own). */
void adg_tape_free(struct adg_registry *registry, struct adg_tape *tape);

/* Registry teardown: gives a shard's node slabs back to the allocator. */
void adg_slab_free_all(struct adg_shard *shard);

#endif /* ADG_INTERNAL_H */
