/*
 * The per-backward gradient container: node id -> the caller's value.
 * Open addressing with linear probing; ids are never 0, so 0 marks an empty
 * slot. Owned by one thread at a time, so nothing here is atomic. A step of
 * a backward run with an executor sees a view instead (struct adg_grads).
 */
#include "tape.h"

#include <string.h>

static size_t slot_of(const struct adg_grads *g, uint64_t id)
{
	/* Fibonacci hashing: consecutive ids spread over the table. */
	return (size_t)((id * UINT64_C(0x9e3779b97f4a7c15)) >> g->shift);
}

/* The slot holding id, or the empty slot where it would go. */
static size_t find(const struct adg_grads *g, uint64_t id)
{
	size_t mask = g->cap - 1, i = slot_of(g, id);

	while (g->slots[i].id != 0 && g->slots[i].id != id)
		i = (i + 1) & mask;
	return i;
}

static int set_capacity(struct adg_grads *g, size_t cap)
{
	struct grad_slot *slots =
		g->allocator.alloc(cap * sizeof *slots, g->allocator.ctx);
	if (slots == NULL)
		return ADG_ENOMEM;
	memset(slots, 0, cap * sizeof *slots);
	struct grad_slot *old = g->slots;
	size_t old_cap = g->cap;
	unsigned int log2 = 0;
	while (((size_t)1 << log2) < cap)
		log2++;
	g->slots = slots;
	g->cap = cap;
	g->shift = 64 - log2;
	for (size_t i = 0; i < old_cap; i++)
		if (old[i].id != 0)
			g->slots[find(g, old[i].id)] = old[i];
	if (old != NULL)
		g->allocator.free(old, old_cap * sizeof *old, g->allocator.ctx);
	return 0;
}

int adg_grads_new(struct adg_registry *registry, const adg_grad_ops *ops,
		  size_t expected, adg_grads **out)
{
	*out = NULL;
	struct adg_grads *g = adg_alloc(registry, sizeof *g);
	if (g == NULL)
		return ADG_ENOMEM;
	*g = (struct adg_grads){.ops = *ops, .allocator = registry->allocator};
	/* Keep the load at or under 3/4 without growing mid-backward. */
	size_t cap = 16;
	while (cap / 4 * 3 < expected &&
	       cap < SIZE_MAX / 2 / sizeof(struct grad_slot))
		cap *= 2;
	if (set_capacity(g, cap) != 0) {
		adg_free(registry, g, sizeof *g);
		return ADG_ENOMEM;
	}
	*out = g;
	return 0;
}

int adg_grads_get(const adg_grads *grads, uint64_t id, void **value)
{
	if (value != NULL)
		*value = NULL;
	if (grads == NULL || grads->sink != NULL || value == NULL || id == 0)
		return ADG_EINVAL;
	size_t i = find(grads, id);
	if (grads->slots[i].id == 0)
		return ADG_ENOTFOUND;
	*value = grads->slots[i].value;
	return 0;
}

/* Empties slot i, moving later entries of its probe run back into the
 * hole so that lookups never stop early (no tombstones). */
static void remove_at(struct adg_grads *g, size_t i)
{
	size_t mask = g->cap - 1, j = i;

	for (;;) {
		j = (j + 1) & mask;
		if (g->slots[j].id == 0)
			break;
		size_t home = slot_of(g, g->slots[j].id);
		/* Move j back into i unless its home lies cyclically in
		 * (i, j]: then a lookup for it never passes i. */
		bool stays = i <= j ? (i < home && home <= j)
				    : (i < home || home <= j);
		if (!stays) {
			g->slots[i] = g->slots[j];
			i = j;
		}
	}
	g->slots[i] = (struct grad_slot){0};
	g->count--;
}

int adg_grads_take(adg_grads *grads, uint64_t id, void **value)
{
	if (value != NULL)
		*value = NULL;
	if (grads == NULL || grads->sink != NULL || value == NULL || id == 0)
		return ADG_EINVAL;
	*value = adg_grads_take_held(grads, id);
	return *value != NULL ? 0 : ADG_ENOTFOUND;
}

void *adg_grads_take_held(adg_grads *grads, uint64_t id)
{
	size_t i = find(grads, id);
	if (grads->slots[i].id == 0)
		return NULL;
	void *value = grads->slots[i].value;
	remove_at(grads, i);
	return value;
}

/* Adds value to id's gradient, or holds it: id and value checked. */
static inline int insert(adg_grads *grads, uint64_t id, void *value)
{
	const adg_grad_ops *ops = &grads->ops;
	size_t i = find(grads, id);
	if (grads->slots[i].id != 0) {
		/* add owns value from here on, whatever it returns. */
		int rc = ops->add(&grads->slots[i].value, value, ops->ctx);
		if (grads->slots[i].value == NULL)
			remove_at(grads, i); /* nothing is held any more */
		return adg_callback_result(rc);
	}
	if ((grads->count + 1) > grads->cap / 4 * 3) {
		if (set_capacity(grads, grads->cap * 2) != 0) {
			ops->free(value, ops->ctx);
			return ADG_ENOMEM;
		}
		i = find(grads, id);
	}
	grads->slots[i] = (struct grad_slot){id, value};
	grads->count++;
	return 0;
}

/* adg_grads_register on a step's view. With workers, the value waits in
 * its slot, an edge of the tape (parallel.c). Alone, the registrations
 * reach the container in the order a fold with workers takes them (by
 * position, then slot), so they go at once; an add error is the
 * backward's, not the step's, as with workers it happens in a later fold.
 * The container was sized for every tape node and leaf: it does not
 * grow. */
static inline int alone_insert(struct adg_alone *alone, uint64_t id,
			       void *value)
{
	int rc = insert(alone->grads, id, value);
	if (adg_unlikely(rc != 0))
		adg_alone_add_failed(alone, id, rc);
	return 0;
}

__attribute__((noinline)) static int
register_in_view(struct adg_step_sink *sink, uint64_t id, void *value)
{
	struct adg_alone *alone = sink->alone;
	if (alone != NULL && !sink->marked) {
		const struct adg_node *n = sink->node;
		uint32_t k = sink->filled;
		if (adg_likely(k < n->n_parents &&
			       adg_node_parent_ids(n)[k] == id)) {
			/* In slot order: the slot needs no mark. */
			sink->filled = k + 1;
			return alone_insert(alone, id, value);
		}
		/* Out of order: the slots from here on get marks. */
		for (uint32_t j = k; j < n->n_parents; j++)
			sink->slots[j] = NULL;
		sink->marked = true;
	}
	if (adg_sink_claim(sink, id, value) == UINT32_MAX) {
		/* Not a parent, or its slots are all taken: adding here
		 * would fold in another order than the sequential backward. */
		sink->ops->free(value, sink->ops->ctx);
		return ADG_EINVAL;
	}
	return alone != NULL ? alone_insert(alone, id, value) : 0;
}

__attribute__((noinline)) static int
register_in_container(adg_grads *grads, uint64_t id, void *value)
{
	if (id == 0) {
		grads->ops.free(value, grads->ops.ctx);
		return ADG_EINVAL;
	}
	return insert(grads, id, value);
}

int adg_grads_register(adg_grads *grads, uint64_t id, void *value)
{
	if (grads == NULL || value == NULL)
		return ADG_EINVAL;
	/* Both tail calls, so that neither path saves the registers the
	 * other needs. */
	if (grads->sink != NULL)
		return register_in_view(grads->sink, id, value);
	return register_in_container(grads, id, value);
}

int adg_grads_count(const adg_grads *grads, size_t *count)
{
	if (grads == NULL || grads->sink != NULL || count == NULL)
		return ADG_EINVAL;
	*count = grads->count;
	return 0;
}

int adg_grads_free(adg_grads *grads)
{
	if (grads == NULL)
		return 0;
	if (grads->sink != NULL)
		return ADG_EINVAL; /* a step's view: the backward owns it */
	for (size_t i = 0; i < grads->cap; i++)
		if (grads->slots[i].id != 0)
			grads->ops.free(grads->slots[i].value, grads->ops.ctx);
	adg_allocator a = grads->allocator;
	a.free(grads->slots, grads->cap * sizeof *grads->slots, a.ctx);
	a.free(grads, sizeof *grads, a.ctx);
	return 0;
}
