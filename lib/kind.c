/*
 * Step kinds: the (backward, release, name) of a step, interned once per
 * registry, so that a node keeps one pointer to its kind and its step's
 * user pointer instead of an adg_step and a registry pointer.
 *
 * Memory is bounded by the program, not by its graphs: a registry holds one
 * kind per distinct (backward, release, name) triple registered on it, and
 * those are pointers to functions and (static, adg.h) names that the
 * program has in its code; a training loop that records a billion nodes of
 * a dozen ops interns a dozen kinds. Kinds are never freed before their
 * registry, so a node, a shard's cache or a reader that has a kind may use
 * it without counting.
 *
 * The lookup has two levels. adg_kind_intern (kind.h), inline on
 * adg_op's path, looks in the calling thread's shard: a direct-mapped
 * cache that only its thread touches. On a miss, kind_find probes the
 * registry's open-addressing table without a lock: slots go from NULL to
 * a kind once and never change again, and a table is never freed while
 * the registry lives, so a reader needs only acquire loads. A kind not
 * there is inserted under the registry's kinds lock, which also makes the
 * table grow: the kinds move to a table twice the size, published with a
 * release store, and the old one goes on a list that adg_kind_free_all
 * frees, since a reader may still be probing it (and finding no new kind
 * there, takes the lock and looks again).
 */
#include "kind.h"

_Static_assert((ADG_KIND_TABLE_MIN & (ADG_KIND_TABLE_MIN - 1)) == 0 &&
		       ADG_KIND_TABLE_MIN >= 2,
	       "a kind table's size is a power of two (kind_find masks)");

static size_t kind_table_bytes(size_t size)
{
	return offsetof(struct adg_kind_table, slots) +
	       size * sizeof(const struct adg_step_kind *);
}

/* A new, empty table of size slots (a power of two, 2^bits), or NULL. */
static struct adg_kind_table *kind_table_new(struct adg_registry *r,
					     unsigned int bits)
{
	size_t size = (size_t)1 << bits;
	struct adg_kind_table *t = adg_alloc(r, kind_table_bytes(size));
	if (t == NULL)
		return NULL;
	t->older = NULL;
	t->shift = 64 - bits;
	t->size = size;
	t->count = 0;
	/* Plain initialisation: no reader can reach t before the release
	 * store that publishes it (kind_insert_locked). */
	for (size_t i = 0; i < size; i++)
		atomic_init(&t->slots[i], NULL);
	return t;
}

/* step's kind in t, or NULL if t has none. Lock-free: safe beside an
 * insert into t, and on a table that has been replaced. */
static const struct adg_step_kind *
kind_find(const struct adg_kind_table *t, const adg_step *step, uint64_t hash)
{
	size_t mask = t->size - 1;
	for (size_t i = hash >> t->shift;; i = (i + 1) & mask) {
		/* Acquire: pairs with the release store that put the kind
		 * there (kind_place_locked), so its fields are read as they
		 * were written. */
		const struct adg_step_kind *k = atomic_load_explicit(
			&t->slots[i], memory_order_acquire);
		if (k == NULL)
			return NULL; /* at most half full: always met */
		if (adg_kind_is(k, step))
			return k;
	}
}

/* Under the kinds lock: stores k in t's first free slot from its hash. */
static void kind_place_locked(struct adg_kind_table *t,
			      const struct adg_step_kind *k)
{
	size_t mask = t->size - 1;
	size_t i = adg_kind_hash(k->backward, k->release, k->name) >> t->shift;
	/* Relaxed loads: slots are written under the lock, which is held. */
	while (atomic_load_explicit(&t->slots[i], memory_order_relaxed) != NULL)
		i = (i + 1) & mask;
	/* Release: a lock-free reader that finds k (kind_find's acquire)
	 * reads its fields as they were initialised. */
	atomic_store_explicit(&t->slots[i], k, memory_order_release);
	t->count++;
}

/* Under the kinds lock: moves every kind of t into a table twice its
 * size and publishes it. Returns it, or NULL (then t is unchanged and
 * still the registry's). */
static struct adg_kind_table *kind_grow_locked(struct adg_registry *r,
					       struct adg_kind_table *t)
{
	struct adg_kind_table *bigger = kind_table_new(r, 64 - t->shift + 1);
	if (bigger == NULL)
		return NULL;
	for (size_t i = 0; i < t->size; i++) {
		/* Relaxed: written under the lock, which is held. */
		const struct adg_step_kind *k = atomic_load_explicit(
			&t->slots[i], memory_order_relaxed);
		if (k != NULL)
			kind_place_locked(bigger, k);
	}
	bigger->older = t;
	/* Release: pairs with the acquire load of r->kinds in
	 * adg_kind_intern_slow; a reader that sees the bigger table sees it
	 * filled. The old table stays readable (adg_kind_free_all). */
	atomic_store_explicit(&r->kinds, bigger, memory_order_release);
	return bigger;
}

/* Under the kinds lock: step's kind, found in the current table or made
 * and inserted, growing the table first when it would be over half full.
 * NULL on allocation failure, when nothing changed. */
static const struct adg_step_kind *
kind_insert_locked(struct adg_registry *r, const adg_step *step, uint64_t hash)
{
	/* Relaxed: only writers, who hold the lock, store r->kinds. */
	struct adg_kind_table *t =
		atomic_load_explicit(&r->kinds, memory_order_relaxed);
	if (t != NULL) {
		const struct adg_step_kind *found = kind_find(t, step, hash);
		if (found != NULL)
			return found; /* another thread inserted it meanwhile */
	}
	struct adg_step_kind *k = adg_alloc(r, sizeof *k);
	if (k == NULL)
		return NULL;
	*k = (struct adg_step_kind){
		.registry = r,
		.backward = step->backward,
		.release = step->release,
		.name = step->name,
	};
	if (t == NULL) {
		unsigned int bits = (unsigned int)__builtin_ctzll(
			(unsigned long long)ADG_KIND_TABLE_MIN);
		t = kind_table_new(r, bits);
		if (t == NULL)
			goto out_free_kind;
		/* Release: as kind_grow_locked's. */
		atomic_store_explicit(&r->kinds, t, memory_order_release);
	} else if (2 * (t->count + 1) > t->size) {
		t = kind_grow_locked(r, t);
		if (t == NULL)
			goto out_free_kind;
	}
	kind_place_locked(t, k);
	return k;

out_free_kind:
	adg_free(r, k, sizeof *k);
	return NULL;
}

const struct adg_step_kind *
adg_kind_intern_slow(struct adg_shard *s, const adg_step *step, uint64_t hash)
{
	struct adg_registry *r = s->registry;
	/* Acquire: pairs with the release store that published the table
	 * (kind_insert_locked, kind_grow_locked): its slots read as
	 * initialised. */
	struct adg_kind_table *t =
		atomic_load_explicit(&r->kinds, memory_order_acquire);
	const struct adg_step_kind *k =
		t != NULL ? kind_find(t, step, hash) : NULL;
	if (k == NULL) {
		/* The allocator runs under this spinlock, as under a graph
		 * lock in tape_walk: it may not call libadg (adg.h). */
		adg_spin_lock(&r->kinds_lock);
		ADG_TEST_POINT(ADG_TP_KINDS_LOCKED);
		k = kind_insert_locked(r, step, hash);
		adg_spin_unlock(&r->kinds_lock);
		if (k == NULL)
			return NULL;
	}
	/* The fallback shard is shared: its cache is never used. */
	if (!s->shared)
		s->kind_cache[hash >> (64 - ADG_KIND_CACHE_BITS)] = k;
	return k;
}

void adg_kind_init(struct adg_registry *r)
{
	r->leaf_kind = (struct adg_step_kind){.registry = r};
	atomic_init(&r->kinds, NULL);
	ck_spinlock_fas_init(&r->kinds_lock);
}

void adg_kind_free_all(struct adg_registry *r)
{
	/* Relaxed: adg_registry_free runs when no other call may use r. */
	struct adg_kind_table *t =
		atomic_load_explicit(&r->kinds, memory_order_relaxed);
	if (t == NULL)
		return;
	/* The current table holds every kind once; the older ones hold
	 * some of the same, and are freed without their kinds. */
	for (size_t i = 0; i < t->size; i++) {
		const struct adg_step_kind *k = atomic_load_explicit(
			&t->slots[i], memory_order_relaxed);
		if (k != NULL)
			adg_free(r, (void *)k, sizeof *k);
	}
	while (t != NULL) {
		struct adg_kind_table *older = t->older;
		adg_free(r, t, kind_table_bytes(t->size));
		t = older;
	}
	atomic_store_explicit(&r->kinds, NULL, memory_order_relaxed);
}
