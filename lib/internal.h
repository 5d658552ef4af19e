/*
 * The structs that the files of lib/ share, and the few inline helpers on their
 * hot paths. A node's life runs through the files in this order: node.c creates
 * it, graph.c places it in a graph, backward.c takes and runs its step,
 * node.c frees it. registry.c owns the per-thread shards that carry ids and
 * counters; grads.c the gradient container.
 */
#ifndef ADG_INTERNAL_H
#define ADG_INTERNAL_H

#include "adg.h"

#include <ck_cc.h>
#include <ck_md.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * RCU flavour: bulletproof (urcu-bp). A library cannot ask its users to call
 * rcu_register_thread() (urcu-memb, urcu-mb, urcu-signal) or to report
 * quiescent states (urcu-qsbr): urcu-bp registers a thread on its first
 * read-side section and forgets it when the thread exits. Its read side
 * costs about what urcu-memb's does where sys_membarrier exists.
 *
 * _LGPL_SOURCE is not defined: libadg is MIT-licensed, so it calls liburcu's
 * read-lock and pointer functions rather than inlining them. That also keeps
 * both sides of every RCU publish out of ThreadSanitizer's sight, which the
 * annotations below rely on.
 */
#include <urcu-bp.h>
#include <urcu-call-rcu.h>
#include <urcu/list.h>

#define ADG_CACHELINE	CK_MD_CACHELINE
#define adg_likely(x)	CK_CC_LIKELY(x)
#define adg_unlikely(x) CK_CC_UNLIKELY(x)

/*
 * ThreadSanitizer sees neither liburcu's publish and dereference nor its
 * grace periods. In a TSan build these tell it what RCU guarantees: what was
 * written to an object before rcu_assign_pointer happens before what a
 * reader does after rcu_dereference; what a reader did before
 * rcu_read_unlock happens before a call_rcu callback that frees it.
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

struct adg_shard;
struct adg_graph;

/* ------------------------------------------------------------------ nodes */

enum adg_node_state {
	ADG_NODE_LEAF,	   /* never changes */
	ADG_NODE_LIVE,	   /* step registered, in a graph */
	ADG_NODE_VISITING, /* on a tape being taken; its graph is locked */
	ADG_NODE_CONSUMED, /* step taken by a backward; in no graph */
};

struct adg_node {
	struct adg_registry *registry;
	uint64_t id;
	/* The caller's handles, plus one per parent slot of an unconsumed
	 * child. Leaves are not counted by their children (see parents). */
	atomic_uint_fast64_t refs;
	/* The graph the node is in, NULL for leaves and consumed nodes. Read
	 * with rcu_dereference; written with rcu_assign_pointer while holding
	 * the lock of the graph it pointed to. */
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
	/* enum adg_node_state. LEAF never changes; the others change only
	 * under the lock of the graph the node is (or was last) in. */
	uint8_t state;
	/* While on a tape being taken or run: how many of the tape's parent
	 * slots name this node. The backward drops them in one go. */
	uint32_t tape_links;
	adg_step step;
	/* n_parents pointers, then n_parents ids (see adg_node_parent_ids).
	 * A leaf parent's pointer is NULL: children never touch a leaf after
	 * creating it, so a parameter shared by every thread is a cache line
	 * nobody writes, and its handle may go while children still use its
	 * id. */
	struct adg_node *parents[];
};

/* Leaves are the only nodes without parents: adg_op requires one. */
static inline bool adg_node_is_leaf(const struct adg_node *n)
{
	return n->n_parents == 0;
}

static inline const uint64_t *adg_node_parent_ids(const struct adg_node *n)
{
	return (const uint64_t *)(n->parents + n->n_parents);
}

/* Drops one reference; frees the node and whatever becomes unreachable. */
void adg_node_release(struct adg_shard *shard, struct adg_node *node);

/* Drops n references at once; frees as adg_node_release does. */
void adg_node_release_many(struct adg_shard *shard, struct adg_node *node,
			   uint64_t n);

/* Calls the step's release callback, once. */
void adg_node_release_step(struct adg_shard *shard, struct adg_node *node);

/* ----------------------------------------------------------------- graphs */

struct adg_graph {
	pthread_mutex_t lock;
	/* The smallest origin among the graphs merged into this one. Written
	 * under the lock, read lock-free by adg_node_graph_id. */
	atomic_uint_fast64_t origin;
	/* Lock order: the origin the container was created with. Unlike
	 * origin it never changes, so every thread sorts graphs the same way
	 * however merges interleave. */
	uint64_t rank;
	/* Set once, when a merge retires this graph: the survivor. */
	struct adg_graph *merged_into;
	struct cds_list_head members; /* nodes whose step is unconsumed */
	size_t n_members;
	bool dead;	     /* retired: empty or merged away; under lock */
	bool retire_pending; /* dead, and call_rcu still to be called */
	struct adg_registry *registry;
	struct rcu_head rcu;
};

/* Places a new LIVE node in its parents' graph, creating a graph when no
 * parent is in one and merging when they are in several, and publishes
 * node->graph. Returns 0 or ADG_ENOMEM (then nothing changed). */
int adg_graph_place(struct adg_shard *shard, struct adg_node *node);

/* Locks the graph node is in and returns it, or returns NULL if the node is
 * in none. While the lock is held the node stays in that graph. */
struct adg_graph *adg_graph_lock_of(struct adg_node *node);

/* Takes node out of graph g (locked); node->graph becomes NULL. */
void adg_graph_detach_locked(struct adg_graph *g, struct adg_node *node);

/* Unlocks g; if g was retired while locked, frees it after a grace period. */
void adg_graph_unlock(struct adg_shard *shard, struct adg_graph *g);

/* ------------------------------------------------------- per-thread shard */

enum adg_counter {
	ADG_C_NODES_FREED,
	ADG_C_STEPS_RELEASED,
	ADG_C_GRAPHS_RETIRED,
	ADG_C_MERGES,
	/* Creation counters come after the retirement counters: adg_stats
	 * reads all of the latter first (see registry.c). */
	ADG_C_NODES_MADE,
	ADG_C_STEPS_MADE,
	ADG_C_GRAPHS_MADE,
	ADG_C_COUNT,
};

struct adg_tape; /* backward.c's reusable scratch */

/*
 * One thread's slice of a registry: its batch of node ids and its counters,
 * on cache lines no other thread writes. The registry keeps every shard on
 * an append-only list (adg_stats sums them); a thread keeps the shards it
 * owns on its own list. A shard is freed when both have let go (refs); a
 * shard whose thread has exited is adopted by the next new thread.
 */
struct adg_shard {
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t counters[ADG_C_COUNT];
	/* The registry's fallback shard, shared by threads that could not
	 * allocate their own: counted with atomic adds, never given ids. */
	bool shared;
	uint64_t next_id;	     /* next id of this thread's batch */
	uint64_t ids_left;	     /* ids left in the batch */
	struct adg_tape *tape_cache; /* NULL while a backward uses it */

	/* Read-mostly, written at adoption and registry teardown. */
	_Alignas(ADG_CACHELINE) struct adg_registry *registry;
	atomic_bool registry_gone;
	atomic_uint refs; /* 1 for the registry, 1 for an owning thread */
	struct adg_shard *next_in_registry;
	struct adg_shard *next_in_thread;
};

struct adg_registry {
	adg_allocator allocator;
	uint64_t max_node_id;
	/* Written once per id batch of any thread. */
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t next_free_id;
	/* Written once per thread that starts using the registry. */
	_Alignas(ADG_CACHELINE) struct adg_shard *_Atomic shards;
	/* Counts the frees of threads that have no shard (see shared). */
	struct adg_shard fallback;
	/* TSan only: read-side sections release it, call_rcu callbacks
	 * acquire it (see adg_tsan_release). */
	char rcu_token;
};

/* The calling thread's shard of registry, NULL on allocation failure. */
struct adg_shard *adg_shard_get_slow(struct adg_registry *registry);

/* The calling thread's shard, or the registry's fallback shard when it
 * cannot have one: for paths that free and must not fail. */
struct adg_shard *adg_shard_get_or_shared(struct adg_registry *registry);

extern __thread struct adg_shard *adg_thread_shards
	__attribute__((tls_model("initial-exec")));

static inline struct adg_shard *adg_shard_get(struct adg_registry *registry)
{
	struct adg_shard *s = adg_thread_shards;
	/* The thread's most recent shard is first on its list. registry_gone
	 * tells a freed registry from a new one at the same address. */
	if (adg_likely(s != NULL && s->registry == registry &&
		       !atomic_load_explicit(&s->registry_gone,
					     memory_order_acquire)))
		return s;
	return adg_shard_get_slow(registry);
}

/* Counts n events of kind c on this thread's shard. Only the owning thread
 * writes a shard, so a load and a store do, with no locked instruction; the
 * release store lets adg_stats see what led up to the event. */
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

/* ------------------------------------------------------------------- RCU */

/* Ends a read-side section; in TSan builds, first orders what the section
 * did before any call_rcu callback that runs after it. */
static inline void adg_rcu_read_unlock(struct adg_registry *r)
{
	adg_tsan_release(&r->rcu_token);
	rcu_read_unlock();
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
	return sizeof(struct adg_node) +
	       n_parents * (sizeof(struct adg_node *) + sizeof(uint64_t));
}

/* ----------------------------------------------------------------- grads */

/* A container sized for about `expected` gradients, allocated with
 * registry's allocator (copied: it may outlive the registry). */
int adg_grads_new(struct adg_registry *registry, const adg_grad_ops *ops,
		  size_t expected, adg_grads **out);

/* Maps a callback's result to the library's convention. */
static inline int adg_callback_result(int rc)
{
	return rc > 0 ? ADG_ECALLBACK : rc;
}

/* Releases the tape scratch of a shard being freed. */
void adg_tape_free(struct adg_tape *tape);

#endif /* ADG_INTERNAL_H */
