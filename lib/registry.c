/*
 * Registry lifetime, per-thread shards (node ids and counters), statistics.
 *
 * No counter or id source that every registration touches is shared between
 * threads: each thread that uses a registry gets a shard, where it takes ids
 * from a batch and counts events with plain stores. The registry's shared
 * id counter is touched once per batch. adg_registry_stats sums the shards.
 *
 * A thread's slots, where it finds its shards, are in its record (thread.c),
 * as is the threads lock that guards them.
 */
#include "checkpoint.h"
#include "grads.h"
#include "internal.h"
#include "kind.h"
#include "readside.h"
#include "slab.h"
#include "tape.h"

#include <string.h>

/* Ids a thread takes from its registry at once. */
#define ID_BATCH 1024

/* Registries and shards are cache-line aligned, and the caller's allocator
 * promises only malloc's alignment: ask for a line more and round up.
 * *base is what to give back to registry_free_aligned. */
static void *registry_zalloc_aligned(const adg_allocator *a, size_t size,
				     void **base)
{
	void *p = a->alloc(size + ADG_CACHELINE, a->ctx);
	if (p == NULL)
		return NULL;
	uintptr_t q = adg_round_up((uintptr_t)p, ADG_CACHELINE);
	memset((void *)q, 0, size);
	*base = p;
	return (void *)q;
}

static void registry_free_aligned(const adg_allocator *a, void *base,
				  size_t size)
{
	a->free(base, size + ADG_CACHELINE, a->ctx);
}

/* Under the threads lock: a shard of r for the calling thread, one that a
 * thread now gone left or a new one. */
static struct adg_shard *registry_shard_adopt(struct adg_registry *r)
{
	struct adg_shard *s;

	struct adg_shard *first =
		atomic_load_explicit(&r->shards, memory_order_relaxed);
	/* One free; else one whose thread is found gone (a system call
	 * each, thread.c). */
	for (s = first; s != NULL; s = s->next_in_registry)
		if (s->owner == NULL)
			return s;
	for (s = first; s != NULL; s = s->next_in_registry)
		if (adg_thread_gone_locked(s->owner))
			return s;
	void *base;
	s = registry_zalloc_aligned(&r->allocator, sizeof *s, &base);
	if (s == NULL)
		return NULL;
	s->alloc_base = base;
	s->registry = r;
	s->next_in_registry =
		atomic_load_explicit(&r->shards, memory_order_relaxed);
	/* Release: adg_registry_stats, which walks the list without the lock,
	 * sees the shard initialised. */
	atomic_store_explicit(&r->shards, s, memory_order_release);
	return s;
}

/* Under the threads lock: r's shard in t's overflow list, taken out of
 * it, or NULL. */
static struct adg_shard *registry_overflow_take(struct adg_thread *t,
						struct adg_registry *r)
{
	for (struct adg_shard **link = &t->overflow; *link != NULL;
	     link = &(*link)->next_overflow) {
		struct adg_shard *s = *link;
		if (s->registry == r) {
			*link = s->next_overflow;
			return s;
		}
	}
	return NULL;
}

/* Under the threads lock: a free slot of t, or one whose shard moves to
 * t's overflow list (still t's). */
static struct adg_thread_slot *registry_slot_for_new(struct adg_thread *t)
{
	for (int i = 0; i < ADG_THREAD_SLOTS; i++)
		if (atomic_load_explicit(&t->slots[i].registry,
					 memory_order_relaxed) == NULL)
			return &t->slots[i];
	struct adg_thread_slot *slot =
		&t->slots[t->evict_next++ % ADG_THREAD_SLOTS];
	slot->shard->next_overflow = t->overflow;
	t->overflow = slot->shard;
	atomic_store_explicit(&slot->registry, NULL, memory_order_relaxed);
	return slot;
}

struct adg_shard *adg_shard_get_slow(struct adg_registry *r)
{
	struct adg_thread *t = adg_self;
	if (t == NULL && (t = adg_thread_register()) == NULL)
		return NULL;

	/* In another slot: lock-free, as adg_shard_get. */
	for (int i = 0; i < ADG_THREAD_SLOTS; i++)
		if (atomic_load_explicit(&t->slots[i].registry,
					 memory_order_relaxed) == r)
			return t->slots[i].shard;

	adg_threads_lock();
	ADG_TEST_POINT(ADG_TP_THREADS_LOCKED);
	struct adg_shard *s = registry_overflow_take(t, r);
	if (s == NULL)
		s = registry_shard_adopt(r);
	if (s != NULL) {
		s->owner = t;
		struct adg_thread_slot *slot = registry_slot_for_new(t);
		slot->shard = s;
		atomic_store_explicit(&slot->registry, r, memory_order_relaxed);
	}
	adg_threads_unlock();
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
		/* max_node_id <= ADG_ID_MAX, so the counter cannot wrap. */
		ADG_ASSERT(r->max_node_id <= ADG_ID_MAX);
		if (first > r->max_node_id)
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

uint64_t adg_next_pass_id(struct adg_shard *s)
{
	struct adg_registry *r = s->registry;

	/* Relaxed, as the ids above: pass ids need only be unique. 2^64
	 * passes do not run out. */
	if (adg_unlikely(s->shared))
		return atomic_fetch_add_explicit(&r->next_free_pass, 1,
						 memory_order_relaxed);
	if (adg_unlikely(s->passes_left == 0)) {
		s->next_pass = atomic_fetch_add_explicit(
			&r->next_free_pass, ID_BATCH, memory_order_relaxed);
		s->passes_left = ID_BATCH;
	}
	s->passes_left--;
	return s->next_pass++;
}

/* Registries made in this process: the source of their serials. Written
 * once per registry made. */
static atomic_uint_fast64_t registries_made;

/* The caller's options (options, as read by the size rule), checked: 0 or
 * ADG_EINVAL, with adg_registry_new's reason. */
static int registry_options_check(const adg_registry_options *options)
{
	const char *func = "adg_registry_new";
	int rc = adg_allocator_check(func, &options->allocator);
	if (rc != 0)
		return rc;
	if (options->checkpointing != ADG_CHECKPOINT_NONE &&
	    options->checkpointing != ADG_CHECKPOINT_BALANCED)
		return adg_fail(ADG_EINVAL, func,
				"options->checkpointing %d is no strategy "
				"(ADG_CHECKPOINT_NONE or "
				"ADG_CHECKPOINT_BALANCED)",
				options->checkpointing);
	const adg_grad_ops *ops = options->grad_ops;
	if (ops != NULL && (ops->add == NULL || ops->free == NULL))
		return adg_fail(ADG_EINVAL, func, "options->grad_ops has no %s",
				ops->add == NULL ? "add" : "free");
	return 0;
}

int adg_registry_new(const adg_registry_options *options, adg_registry **out)
{
	if (out != NULL)
		*out = NULL;
	if (out == NULL)
		return ADG_FAIL(ADG_EINVAL, "out is NULL");
	adg_allocator allocator = adg_default_allocator;
	/* A leaf parent's slot holds (id << 1) | 1 (internal.h): no id
	 * beyond ADG_ID_MAX. */
	uint64_t max_node_id = ADG_ID_MAX;
	adg_registry_options opts;
	if (options != NULL) {
		int rc = ADG_ABI_READ(__func__, "options", &opts, options,
				      ADG_ABI_FIRST_REGISTRY_OPTIONS);
		if (rc == 0)
			rc = registry_options_check(&opts);
		if (rc != 0)
			return rc;
		options = &opts;
		if (options->allocator.alloc != NULL)
			allocator = options->allocator;
		if (options->max_node_id != 0 &&
		    options->max_node_id < ADG_ID_MAX)
			max_node_id = options->max_node_id;
	}
	/* The read side's set-up, once in the process: here, not at the
	 * first read-side section, so that its membarrier registration
	 * (milliseconds: readside.c) is paid where the docs say, not inside
	 * the first graph op, which needs a registry. A thread's first
	 * section and each grace period still run it (a pthread_once, nearly
	 * free once done), so no order of calls meets a read side not set
	 * up. */
	adg_rcu_init();
	void *base;
	struct adg_registry *r =
		registry_zalloc_aligned(&allocator, sizeof *r, &base);
	if (r == NULL)
		return ADG_FAIL(ADG_ENOMEM,
				"the allocator gave no memory for the registry "
				"(%zu bytes)",
				sizeof *r);
	r->alloc_base = base;
	/* Relaxed: a serial need only be unique. */
	r->serial = atomic_fetch_add_explicit(&registries_made, 1,
					      memory_order_relaxed) +
		    1;
	r->allocator = allocator;
	r->maps_huge_slabs =
		options == NULL || options->allocator.alloc == NULL;
	r->max_node_id = max_node_id;
	r->checkpointing = options ? options->checkpointing : 0;
	if (options != NULL && options->grad_ops != NULL) {
		r->grad_ops = *options->grad_ops;
		r->has_grad_ops = true;
	}
	atomic_init(&r->uses_checkpoints, false);
	atomic_init(&r->next_free_id, 1);
	atomic_init(&r->next_free_pass, 1);
	atomic_init(&r->shards, NULL);
	r->fallback.shared = true;
	r->fallback.registry = r;
	adg_kind_init(r);
	adg_threads_lock();
	adg_threads_add_registry_locked(r);
	adg_threads_unlock();
	*out = r;
	return 0;
}

int adg_registry_allocator(const adg_registry *registry, adg_allocator *out)
{
	if (registry == NULL || out == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				registry == NULL ? "registry" : "out");
	*out = registry->allocator;
	return 0;
}

static void registry_sum_counters(struct adg_registry *r,
				  uint64_t sum[ADG_C_COUNT])
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

static void registry_stats(struct adg_registry *r, struct adg_stats *out)
{
	uint64_t c[ADG_C_COUNT];

	registry_sum_counters(r, c);
	out->live_nodes =
		c[ADG_C_LEAVES_MADE] + c[ADG_C_OPS_MADE] - c[ADG_C_NODES_FREED];
	out->live_steps = c[ADG_C_OPS_MADE] - c[ADG_C_STEPS_RELEASED];
	out->live_graphs = c[ADG_C_GRAPHS_MADE] - c[ADG_C_GRAPHS_RETIRED];
	out->merges = c[ADG_C_MERGES];
	out->nodes_freed = c[ADG_C_NODES_FREED];
	out->slab_bytes = c[ADG_C_SLAB_BYTES_TAKEN] - c[ADG_C_SLAB_BYTES_FREED];
	out->slab_bytes_huge =
		c[ADG_C_HUGE_BYTES_TAKEN] - c[ADG_C_HUGE_BYTES_FREED];
}

int adg_registry_stats(adg_registry *registry, struct adg_stats *out)
{
	if (registry == NULL || out == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				registry == NULL ? "registry" : "out");
	int rc = adg_abi_check(__func__, "out", out, sizeof *out,
			       ADG_ABI_FIRST_STATS);
	if (rc != 0)
		return rc;
	struct adg_stats st;
	registry_stats(registry, &st);
	adg_abi_write(out, &st, sizeof st);
	return 0;
}

int adg_registry_free(adg_registry *registry)
{
	if (registry == NULL)
		return 0;
	struct adg_stats stats;

	registry_stats(registry, &stats);
	if (stats.live_nodes != 0)
		return ADG_FAIL(ADG_EBUSY,
				"%" PRIu64 " nodes still live (drop every "
				"handle first)",
				stats.live_nodes);
	/* A grace period: no read-side section still touches a graph in a
	 * shard's pool or limbo, freed below. */
	adg_rcu_synchronize();
	/* No thread may find a shard of this registry from now on; the other
	 * threads that used it are done with it (the contract), so what their
	 * shards keep may be freed from here. Every record, live or not: one
	 * whose thread is gone may still name the registry. */
	adg_threads_lock();
	adg_threads_remove_registry_locked(registry);
	for (struct adg_thread *t = adg_threads_first(); t != NULL;
	     t = t->next_all) {
		for (int i = 0; i < ADG_THREAD_SLOTS; i++)
			if (atomic_load_explicit(&t->slots[i].registry,
						 memory_order_relaxed) ==
			    registry)
				atomic_store_explicit(&t->slots[i].registry,
						      NULL,
						      memory_order_relaxed);
		/* At most one: a thread holds one shard per registry. */
		registry_overflow_take(t, registry);
	}
	adg_threads_unlock();

	adg_allocator a = registry->allocator;
	struct adg_shard *s =
		atomic_load_explicit(&registry->shards, memory_order_acquire);
	while (s != NULL) {
		struct adg_shard *next = s->next_in_registry;
		/* Its thread's last dropped output, still the forward's:
		 * that thread is done with the registry (the contract). */
		adg_ckpt_free_deferred(s);
		adg_graph_free_pool(s);
		adg_slab_free_all(s);
		adg_tape_free(registry, s->tape_cache);
		registry_free_aligned(&a, s->alloc_base, sizeof *s);
		s = next;
	}
	/* After the shards: their node caches' nodes point at kinds. */
	adg_kind_free_all(registry);
	registry_free_aligned(&a, registry->alloc_base, sizeof *registry);
	return 0;
}
