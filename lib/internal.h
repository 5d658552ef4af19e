/*
 * What every core file of lib/ needs: nodes, graphs and their locks, the
 * per-thread shards and the registry, with the few inline helpers on their
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
 *
 * Each primitive keeps its own struct and inline fast paths in a header
 * beside its .c. The headers of lib/ form layers, and a header includes
 * only headers of the layers below its own (CONTRIBUTING.md draws the
 * graph):
 *
 *   1. util.h          what any file of lib/ may use, annexes included
 *   2. thread.h        a thread's record; spinlock.h, the spinlock;
 *      grads.h         the gradient table
 *   3. readside.h      the read side, on thread.h
 *   4. internal.h      this header, on spinlock.h and thread.h
 *   5. slab.h, kind.h, checkpoint.h: primitives whose inline fast paths
 *      read a thread's shard (its slabs, its kind cache, its deferred
 *      output), and so stand on internal.h
 *   6. tape.h          a backward's tape, on internal.h
 *   7. run.h           the runner, on tape.h, checkpoint.h and grads.h
 *
 * A fast path that reads the shard stays in its primitive's header, above
 * this one, rather than taking the shard's field as an argument: its
 * callers keep their calls as they are, and the shard's layout, which
 * keeps the fields each thread writes on lines of their own, stays in one
 * struct in one place.
 */
#ifndef ADG_INTERNAL_H
#define ADG_INTERNAL_H

#include "adg.h"
#include "spinlock.h"
#include "thread.h"
#include "util.h"

#include <ck_pr.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * liburcu supplies the pointer primitives (rcu_dereference,
 * rcu_assign_pointer) and the list macros; the read side and grace periods
 * are libadg's own (readside.h). liburcu-bp's read-side
 * calls cost 88 instructions a registration from a shared library, whose
 * global-dynamic TLS takes two __tls_get_addr calls a section end.
 *
 * _LGPL_SOURCE is not defined: libadg is MIT-licensed. The pointer
 * primitives are inlined (URCU_INLINE_SMALL_FUNCTIONS, which liburcu offers
 * non-LGPL code) except in ThreadSanitizer builds, where they stay calls
 * into liburcu so that TSan sees neither side of an RCU publish; the
 * annotations (adg_tsan_acquire, util.h) rely on that.
 */
#include <urcu-bp.h>
#include <urcu/list.h>

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
struct adg_kind_table; /* a registry's interned step kinds (kind.h) */
struct adg_ckpt;       /* a node's checkpointing record (checkpoint.h) */
struct adg_tape;       /* a backward's scratch, reused by its thread (tape.h) */

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

/* What a node takes: with a checkpointing slot, 8 bytes more. */
static inline size_t adg_node_alloc_size(size_t n_parents, bool ckpt_slot)
{
	return adg_node_size(n_parents) +
	       (ckpt_slot ? sizeof(struct adg_ckpt *) : 0);
}

#endif /* ADG_INTERNAL_H */
