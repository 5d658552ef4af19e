/*
 * Step kinds (kind.c): a registry's table of interned (backward, release,
 * name) triples, and the inline lookup in the thread's shard cache that
 * adg_op runs. The record itself, struct adg_step_kind, is in internal.h:
 * every node points at one and a registry holds its leaf kind. Rules: I25
 * to I27 in docs/concurrency.md.
 */
#ifndef ADG_KIND_H
#define ADG_KIND_H

#include "internal.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
		if (adg_likely(k != NULL && adg_kind_is(k, step))) {
			ADG_ASSERT(k->registry == s->registry); /* I27 */
			return k;
		}
	}
	return adg_kind_intern_slow(s, step, h);
}

/* Registry setup and teardown: the leaf kind, and freeing every kind and
 * table (after the shards, whose caches point at kinds, are done). */
void adg_kind_init(struct adg_registry *r);
void adg_kind_free_all(struct adg_registry *r);

#endif /* ADG_KIND_H */
