/*
 * Registry lifetime, per-thread shards (node ids and counters), statistics.
 *
 * No counter or id source that every registration touches is shared between
 * threads: each thread that uses a registry gets a shard, where it takes ids
 * from a batch and counts events with plain stores. The registry's shared
 * id counter is touched once per batch. adg_stats sums the shards.
 *
 * RCU thread registration needs nothing here: urcu-bp registers a thread on
 * its first read-side section and unregisters it when the thread exits.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* Ids a thread takes from its registry at once. */
#define ID_BATCH 1024

/* initial-exec: one load from the thread pointer on every call, no
 * __tls_get_addr; the variable is small enough for glibc's static TLS
 * surplus even when libadg is dlopen'ed. */
__thread struct adg_shard *adg_thread_shards
	__attribute__((tls_model("initial-exec")));

/* Its destructor hands a thread's shards back when the thread exits. */
static pthread_key_t thread_exit_key;
static pthread_once_t thread_exit_once = PTHREAD_ONCE_INIT;
static bool thread_exit_key_ok;

static void *default_alloc(size_t size, void *ctx)
{
	(void)ctx;
	return malloc(size);
}

static void default_free(void *ptr, size_t size, void *ctx)
{
	(void)size;
	(void)ctx;
	free(ptr);
}

static size_t cacheline_round(size_t size)
{
	return (size + ADG_CACHELINE - 1) / ADG_CACHELINE * ADG_CACHELINE;
}

/* Shards and registries are cache-line aligned, so they come from
 * aligned_alloc rather than the caller's allocator; a shard may also
 * outlive its registry, and with it the allocator's context. */
static void *aligned_zalloc(size_t size)
{
	void *p = aligned_alloc(ADG_CACHELINE, cacheline_round(size));
	if (p != NULL)
		memset(p, 0, size);
	return p;
}

static void shard_unref(struct adg_shard *s)
{
	/* The registry and the owning thread each hold one reference; the
	 * last to let go frees the shard, after all the other did with it
	 * (acq_rel). */
	if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) {
		adg_tape_free(s->tape_cache);
		free(s);
	}
}

static void thread_exit(void *unused)
{
	(void)unused;
	struct adg_shard *s = adg_thread_shards;

	adg_thread_shards = NULL;
	while (s != NULL) {
		struct adg_shard *next = s->next_in_thread;
		/* Drops the thread's reference: a live registry's shard is
		 * left with refs == 1, which is what adoption looks for. */
		shard_unref(s);
		s = next;
	}
}

static void make_thread_exit_key(void)
{
	thread_exit_key_ok =
		pthread_key_create(&thread_exit_key, thread_exit) == 0;
}

/* Drops this thread's shards of registries that have been freed. */
static void purge_gone_shards(void)
{
	struct adg_shard **link = &adg_thread_shards;

	while (*link != NULL) {
		struct adg_shard *s = *link;
		if (atomic_load_explicit(&s->registry_gone,
					 memory_order_acquire)) {
			*link = s->next_in_thread;
			shard_unref(s);
		} else {
			link = &s->next_in_thread;
		}
	}
}

/* A shard of r for the calling thread: one an exited thread left, or a new
 * one. */
static struct adg_shard *shard_adopt(struct adg_registry *r)
{
	struct adg_shard *s;

	for (s = atomic_load_explicit(&r->shards, memory_order_acquire);
	     s != NULL; s = s->next_in_registry) {
		unsigned int only_registry = 1;
		/* refs == 1: only the registry holds it, its thread has
		 * exited. Acquire: see its counters and id batch as that
		 * thread left them. Two adopters race on the CAS alone. */
		if (atomic_compare_exchange_strong_explicit(
			    &s->refs, &only_registry, 2, memory_order_acquire,
			    memory_order_relaxed))
			return s;
	}
	s = aligned_zalloc(sizeof *s);
	if (s == NULL)
		return NULL;
	s->registry = r;
	atomic_init(&s->refs, 2);
	/* Release: adg_stats and adopters walking the list see the shard
	 * initialised. The list only grows while the registry lives. */
	struct adg_shard *head =
		atomic_load_explicit(&r->shards, memory_order_relaxed);
	do
		s->next_in_registry = head;
	while (!atomic_compare_exchange_weak_explicit(&r->shards, &head, s,
						      memory_order_release,
						      memory_order_relaxed));
	return s;
}

struct adg_shard *adg_shard_get_slow(struct adg_registry *r)
{
	purge_gone_shards();
	struct adg_shard **link = &adg_thread_shards;
	struct adg_shard *s = NULL;

	while (*link != NULL) {
		if ((*link)->registry == r) {
			s = *link;
			*link = s->next_in_thread;
			break;
		}
		link = &(*link)->next_in_thread;
	}
	if (s == NULL) {
		pthread_once(&thread_exit_once, make_thread_exit_key);
		/* Without the key a thread's shards would never go back. */
		if (!thread_exit_key_ok ||
		    pthread_setspecific(thread_exit_key, &thread_exit_key) != 0)
			return NULL;
		s = shard_adopt(r);
		if (s == NULL)
			return NULL;
	}
	/* Most recently used first: the fast path checks only the head. */
	s->next_in_thread = adg_thread_shards;
	adg_thread_shards = s;
	return s;
}

int adg_shard_refill_ids(struct adg_shard *s)
{
	struct adg_registry *r = s->registry;
	uint64_t first =
		atomic_load_explicit(&r->next_free_id, memory_order_relaxed);
	uint64_t n;

	/* Relaxed: ids need only be unique, which read-modify-writes of one
	 * location guarantee; nothing else is published through it. */
	do {
		/* 0: the counter wrapped after handing out UINT64_MAX. */
		if (first == 0 || first > r->max_node_id)
			return ADG_ENOIDS;
		n = r->max_node_id - first + 1;
		if (n > ID_BATCH)
			n = ID_BATCH;
	} while (!atomic_compare_exchange_weak_explicit(
		&r->next_free_id, &first, first + n, memory_order_relaxed,
		memory_order_relaxed));
	s->next_id = first;
	s->ids_left = n;
	return 0;
}

int adg_registry_new(const adg_registry_options *options, adg_registry **out)
{
	if (out != NULL)
		*out = NULL;
	if (out == NULL)
		return ADG_EINVAL;
	adg_allocator allocator = {default_alloc, default_free, NULL};
	uint64_t max_node_id = UINT64_MAX;
	if (options != NULL) {
		const adg_allocator *a = &options->allocator;
		if ((a->alloc == NULL) != (a->free == NULL))
			return ADG_EINVAL;
		if (a->alloc != NULL)
			allocator = *a;
		if (options->max_node_id != 0)
			max_node_id = options->max_node_id;
		if (options->checkpointing != ADG_CHECKPOINT_NONE &&
		    options->checkpointing != ADG_CHECKPOINT_BALANCED)
			return ADG_EINVAL;
	}
	struct adg_registry *r = aligned_zalloc(sizeof *r);
	if (r == NULL)
		return ADG_ENOMEM;
	r->allocator = allocator;
	r->max_node_id = max_node_id;
	r->checkpointing = options ? options->checkpointing : 0;
	atomic_init(&r->uses_checkpoints, false);
	atomic_init(&r->next_free_id, 1);
	atomic_init(&r->shards, NULL);
	r->fallback.shared = true;
	r->fallback.registry = r;
	*out = r;
	return 0;
}

static void sum_counters(struct adg_registry *r, uint64_t sum[ADG_C_COUNT])
{
	/* Retirement counters first, then creation counters. Whatever thread
	 * counts a free, the creation it undoes happened before it; an
	 * acquire load that sees the free therefore lets the later pass see
	 * the creation, and no live count reads negative. */
	static const int passes[][2] = {{0, ADG_C_LEAVES_MADE},
					{ADG_C_LEAVES_MADE, ADG_C_COUNT}};

	memset(sum, 0, ADG_C_COUNT * sizeof *sum);
	for (int p = 0; p < 2; p++) {
		struct adg_shard *s =
			atomic_load_explicit(&r->shards, memory_order_acquire);
		for (; s != NULL; s = s->next_in_registry)
			for (int c = passes[p][0]; c < passes[p][1]; c++)
				sum[c] += atomic_load_explicit(
					&s->counters[c], memory_order_acquire);
		for (int c = passes[p][0]; c < passes[p][1]; c++)
			sum[c] += atomic_load_explicit(&r->fallback.counters[c],
						       memory_order_acquire);
	}
}

int adg_stats(adg_registry *registry, struct adg_stats *out)
{
	if (registry == NULL || out == NULL)
		return ADG_EINVAL;
	uint64_t c[ADG_C_COUNT];

	sum_counters(registry, c);
	out->live_nodes =
		c[ADG_C_LEAVES_MADE] + c[ADG_C_OPS_MADE] - c[ADG_C_NODES_FREED];
	out->live_steps = c[ADG_C_OPS_MADE] - c[ADG_C_STEPS_RELEASED];
	out->live_graphs = c[ADG_C_GRAPHS_MADE] - c[ADG_C_GRAPHS_RETIRED];
	out->merges = c[ADG_C_MERGES];
	out->nodes_freed = c[ADG_C_NODES_FREED];
	return 0;
}

int adg_registry_free(adg_registry *registry)
{
	if (registry == NULL)
		return 0;
	struct adg_stats stats;

	adg_stats(registry, &stats);
	if (stats.live_nodes != 0)
		return ADG_EBUSY;
	/* Graphs on their way back to the allocator wait for call_rcu
	 * callbacks, which use the allocator and rcu_token. The other threads
	 * that used the registry are done with it (the contract), so their
	 * shards' pools may be emptied from here. */
	rcu_barrier();
	adg_tsan_acquire(&registry->rcu_token);
	struct adg_shard *s, *next;
	for (s = atomic_load_explicit(&registry->shards, memory_order_acquire);
	     s != NULL; s = s->next_in_registry) {
		adg_graph_free_pool(s);
		adg_node_free_cache(s);
		atomic_store_explicit(&s->registry_gone, true,
				      memory_order_release);
	}
	/* This thread lets go of its shard now; others do at their next call
	 * or when they exit. */
	purge_gone_shards();
	for (s = atomic_load_explicit(&registry->shards, memory_order_acquire);
	     s != NULL; s = next) {
		next = s->next_in_registry;
		shard_unref(s);
	}
	free(registry);
	return 0;
}
