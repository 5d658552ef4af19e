/*
 * The per-backward gradient container: node id -> the caller's value.
 * Open addressing with linear probing; ids are never 0, so 0 marks an empty
 * slot. Owned by one thread at a time, so nothing here is atomic.
 */
#include "internal.h"

#include <string.h>

struct grad_slot {
	uint64_t id;
	void *value;
};

struct adg_grads {
	adg_grad_ops ops;
	adg_allocator allocator; /* a copy: the container may outlive the
				    registry */
	struct grad_slot *slots;
	size_t cap;	    /* a power of two */
	unsigned int shift; /* 64 - log2(cap) */
	size_t count;
};

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
	if (grads == NULL || value == NULL || id == 0)
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
	if (grads == NULL || value == NULL || id == 0)
		return ADG_EINVAL;
	size_t i = find(grads, id);
	if (grads->slots[i].id == 0)
		return ADG_ENOTFOUND;
	*value = grads->slots[i].value;
	remove_at(grads, i);
	return 0;
}

int adg_grads_register(adg_grads *grads, uint64_t id, void *value)
{
	if (grads == NULL)
		return ADG_EINVAL;
	const adg_grad_ops *ops = &grads->ops;
	if (value == NULL)
		return ADG_EINVAL;
	if (id == 0) {
		ops->free(value, ops->ctx);
		return ADG_EINVAL;
	}
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

int adg_grads_count(const adg_grads *grads, size_t *count)
{
	if (grads == NULL || count == NULL)
		return ADG_EINVAL;
	*count = grads->count;
	return 0;
}

int adg_grads_free(adg_grads *grads)
{
	if (grads == NULL)
		return 0;
	for (size_t i = 0; i < grads->cap; i++)
		if (grads->slots[i].id != 0)
			grads->ops.free(grads->slots[i].value, grads->ops.ctx);
	adg_allocator a = grads->allocator;
	a.free(grads->slots, grads->cap * sizeof *grads->slots, a.ctx);
	a.free(grads, sizeof *grads, a.ctx);
	return 0;
}
