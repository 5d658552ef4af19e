/*
 * The gradient table: node id -> the caller's value, the container a
 * backward returns. Open addressing with linear probing; ids are never 0,
 * so 0 marks an empty entry. Owned by one thread at a time, so nothing
 * here is atomic.
 *
 * adg_grads is what adg_grads_register sends a gradient to: this table, or
 * a step's output, a runner's type that routes the gradient to the step's
 * parent slot (lib/run.c). This file knows only that the latter is not a
 * table, by its accept function, and refuses it where a table is needed.
 */
#include "grads.h"
#include "internal.h"

#include <string.h>

static int grad_table_accept(struct adg_grads *to, uint64_t id, void *value);

struct adg_grad_table *adg_grad_table_of(const adg_grads *grads)
{
	if (grads == NULL || grads->accept != grad_table_accept)
		return NULL;
	return caa_container_of(grads, struct adg_grad_table, as_grads);
}

/* id's slot in the attached window, or NULL when id is not in one. */
static inline void **grad_table_window_slot(const struct adg_grad_table *g,
					    uint64_t id)
{
	/* Unsigned: an id below window_lo wraps above window_len. */
	uint64_t i = id - g->window_lo;
	return adg_likely(i < g->window_len) ? &g->window[i] : NULL;
}

static size_t grad_table_home(const struct adg_grad_table *g, uint64_t id)
{
	return (size_t)adg_id_hash(id, g->shift);
}

/* The entry holding id, or the empty entry where it would go. */
static size_t grad_table_find(const struct adg_grad_table *g, uint64_t id)
{
	size_t mask = g->cap - 1, i = grad_table_home(g, id);

	while (g->entries[i].id != 0 && g->entries[i].id != id)
		i = (i + 1) & mask;
	return i;
}

static int grad_table_resize(struct adg_grad_table *g, size_t cap)
{
	struct adg_grad_entry *entries =
		g->allocator.alloc(cap * sizeof *entries, g->allocator.ctx);
	if (entries == NULL)
		return ADG_ENOMEM;
	memset(entries, 0, cap * sizeof *entries);
	struct adg_grad_entry *old = g->entries;
	size_t old_cap = g->cap;
	unsigned int log2 = 0;
	while (((size_t)1 << log2) < cap)
		log2++;
	g->entries = entries;
	g->cap = cap;
	g->shift = 64 - log2;
	for (size_t i = 0; i < old_cap; i++)
		if (old[i].id != 0)
			g->entries[grad_table_find(g, old[i].id)] = old[i];
	if (old != NULL)
		g->allocator.free(old, old_cap * sizeof *old, g->allocator.ctx);
	return 0;
}

int adg_grad_table_new(struct adg_registry *registry, const adg_grad_ops *ops,
		       size_t expected, struct adg_grad_table **out)
{
	*out = NULL;
	struct adg_grad_table *g = adg_alloc(registry, sizeof *g);
	if (g == NULL)
		return ADG_ENOMEM;
	*g = (struct adg_grad_table){
		.as_grads = {.accept = grad_table_accept},
		.ops = *ops,
		.allocator = registry->allocator,
		.registry_serial = registry->serial,
	};
	/* Keep the load at or under 3/4 without growing mid-backward. */
	size_t cap = 16;
	while (cap / 4 * 3 < expected &&
	       cap < SIZE_MAX / 2 / sizeof(struct adg_grad_entry))
		cap *= 2;
	if (grad_table_resize(g, cap) != 0) {
		adg_free(registry, g, sizeof *g);
		return ADG_ENOMEM;
	}
	*out = g;
	return 0;
}

int adg_grad_failed(int rc, const char *func, uint64_t id)
{
	if (rc == ADG_ENOMEM)
		return adg_fail(
			rc, func,
			"the allocator gave no memory to hold id %" PRIu64
			"'s gradient",
			id);
	return adg_fail(
		rc, func,
		"ops->add returned %s folding a gradient into id %" PRIu64,
		adg_code_text(rc, (char[32]){0}), id);
}

/* An insert into the table failed with rc for id. Its reason names
 * adg_step_give, whose common path returns the insert's code as it is
 * (a tail call, which a check of the code there would cost a frame); the
 * other callers, adg_grads_register and the backward, write their own
 * over it. */
static __attribute__((cold, noinline)) int grad_table_failed(int rc,
							     uint64_t id)
{
	return adg_grad_failed(rc, "adg_step_give", id);
}

/* The reason grads is refused by func: NULL, or a step's view. */
static __attribute__((cold, noinline)) int grads_refused(const char *func,
							 const adg_grads *grads)
{
	return adg_fail(ADG_EINVAL, func, "%s",
			grads == NULL ? "grads is NULL"
				      : "grads is a step's view (call->grads "
					"with an executor), not a container");
}

/* The checks of adg_grads_get and adg_grads_take, with their reasons. */
static int grads_lookup_check(const char *func, const adg_grads *grads,
			      const struct adg_grad_table *g, uint64_t id,
			      void **value)
{
	if (adg_likely(g != NULL && value != NULL && id != 0))
		return 0;
	if (g == NULL)
		return grads_refused(func, grads);
	return adg_fail(ADG_EINVAL, func, "%s",
			value == NULL ? "value is NULL" : "id is 0");
}

/* The reason no gradient was found. */
static __attribute__((cold, noinline)) int grads_not_found(const char *func,
							   uint64_t id)
{
	return adg_fail(ADG_ENOTFOUND, func,
			"no gradient is held for id %" PRIu64, id);
}

int adg_grads_get(const adg_grads *grads, uint64_t id, void **value)
{
	if (value != NULL)
		*value = NULL;
	const struct adg_grad_table *g = adg_grad_table_of(grads);
	int rc = grads_lookup_check(__func__, grads, g, id, value);
	if (rc != 0)
		return rc;
	void **slot = grad_table_window_slot(g, id);
	if (slot != NULL) {
		*value = *slot;
		return *value != NULL ? 0 : grads_not_found(__func__, id);
	}
	size_t i = grad_table_find(g, id);
	if (g->entries[i].id == 0)
		return grads_not_found(__func__, id);
	*value = g->entries[i].value;
	return 0;
}

/* Empties entry i, moving later entries of its probe run back into the
 * hole so that lookups never stop early (no tombstones). */
static void grad_table_remove_at(struct adg_grad_table *g, size_t i)
{
	size_t mask = g->cap - 1, j = i;

	for (;;) {
		j = (j + 1) & mask;
		if (g->entries[j].id == 0)
			break;
		size_t home = grad_table_home(g, g->entries[j].id);
		/* Move j back into i unless its home lies cyclically in
		 * (i, j]: then a lookup for it never passes i. */
		bool stays = i <= j ? (i < home && home <= j)
				    : (i < home || home <= j);
		if (!stays) {
			g->entries[i] = g->entries[j];
			i = j;
		}
	}
	g->entries[i] = (struct adg_grad_entry){0};
	g->count--;
}

int adg_grads_take(adg_grads *grads, uint64_t id, void **value)
{
	if (value != NULL)
		*value = NULL;
	struct adg_grad_table *g = adg_grad_table_of(grads);
	int rc = grads_lookup_check(__func__, grads, g, id, value);
	if (rc != 0)
		return rc;
	*value = adg_grad_table_take(g, id);
	return *value != NULL ? 0 : grads_not_found(__func__, id);
}

void *adg_grad_table_take(struct adg_grad_table *g, uint64_t id)
{
	void **slot = grad_table_window_slot(g, id);
	if (slot != NULL) {
		void *value = *slot;
		*slot = NULL;
		g->count -= value != NULL;
		return value;
	}
	size_t i = grad_table_find(g, id);
	if (g->entries[i].id == 0)
		return NULL;
	void *value = g->entries[i].value;
	grad_table_remove_at(g, i);
	return value;
}

int adg_grad_table_window_insert(struct adg_grad_table *g, void **slot,
				 void *value)
{
	if (*slot == NULL) {
		*slot = value;
		g->count++;
		return 0;
	}
	/* add owns value from here on, whatever it returns. */
	int rc = g->ops.add(slot, value, g->ops.ctx);
	g->count -= *slot == NULL; /* nothing is held any more */
	if (adg_unlikely(rc != 0))
		return grad_table_failed(adg_callback_result(rc),
					 g->window_lo +
						 (uint64_t)(slot - g->window));
	return 0;
}

int adg_grad_table_insert(struct adg_grad_table *g, uint64_t id, void *value)
{
	const adg_grad_ops *ops = &g->ops;
	void **slot = grad_table_window_slot(g, id);
	if (slot != NULL)
		return adg_grad_table_window_insert(g, slot, value);
	size_t i = grad_table_find(g, id);
	if (g->entries[i].id != 0) {
		/* add owns value from here on, whatever it returns. */
		int rc = ops->add(&g->entries[i].value, value, ops->ctx);
		if (g->entries[i].value == NULL)
			grad_table_remove_at(g,
					     i); /* nothing is held any more */
		return rc == 0 ? 0
			       : grad_table_failed(adg_callback_result(rc), id);
	}
	if ((g->count + 1) > g->cap / 4 * 3) {
		if (grad_table_resize(g, g->cap * 2) != 0) {
			ops->free(value, ops->ctx);
			return grad_table_failed(ADG_ENOMEM, id);
		}
		i = grad_table_find(g, id);
	}
	g->entries[i] = (struct adg_grad_entry){id, value};
	g->count++;
	return 0;
}

/* adg_grads_register on a table. */
static int grad_table_accept(struct adg_grads *to, uint64_t id, void *value)
{
	struct adg_grad_table *g =
		caa_container_of(to, struct adg_grad_table, as_grads);
	if (id == 0) {
		g->ops.free(value, g->ops.ctx);
		return adg_fail(ADG_EINVAL, "adg_grads_register",
				"id is 0 (value freed)");
	}
	int rc = adg_grad_table_insert(g, id, value);
	return rc == 0 ? 0 : adg_grad_failed(rc, "adg_grads_register", id);
}

int adg_grads_register(adg_grads *grads, uint64_t id, void *value)
{
	if (grads == NULL || value == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				grads == NULL ? "grads" : "value");
	/* A tail call through the receiver's own function: the table's, or
	 * a step output's (run.c). */
	return grads->accept(grads, id, value);
}

/* The id under which grads holds node's gradient, after the checks of
 * adg_grads_get_node: ADG_EINVAL for NULL or a container that is not a
 * table, ADG_EFOREIGN for a node of another registry (its id may name
 * another node here). The caller holds node, and so its registry: both
 * are read without a lock. */
static int grad_table_node_id(const char *func, const adg_grads *grads,
			      const adg_node *node, void **value, uint64_t *id)
{
	if (value != NULL)
		*value = NULL;
	const struct adg_grad_table *g = adg_grad_table_of(grads);
	if (g == NULL)
		return grads_refused(func, grads);
	if (node == NULL || value == NULL)
		return adg_fail(ADG_EINVAL, func, "%s is NULL",
				node == NULL ? "node" : "value");
	if (adg_node_registry_of(node)->serial != g->registry_serial)
		return adg_fail(ADG_EFOREIGN, func,
				"node %" PRIu64 " belongs to another registry "
				"than the backward that made grads",
				node->id);
	*id = node->id;
	return 0;
}

int adg_grads_get_node(const adg_grads *grads, const adg_node *node,
		       void **value)
{
	uint64_t id = 0; /* set when rc is 0; -O3 cannot see it */
	int rc = grad_table_node_id(__func__, grads, node, value, &id);
	if (rc != 0)
		return rc;
	rc = adg_grads_get(grads, id, value);
	return rc == 0 ? 0 : grads_not_found(__func__, id);
}

int adg_grads_take_node(adg_grads *grads, const adg_node *node, void **value)
{
	uint64_t id = 0; /* set when rc is 0; -O3 cannot see it */
	int rc = grad_table_node_id(__func__, grads, node, value, &id);
	if (rc != 0)
		return rc;
	rc = adg_grads_take(grads, id, value);
	return rc == 0 ? 0 : grads_not_found(__func__, id);
}

int adg_grads_count(const adg_grads *grads, size_t *count)
{
	const struct adg_grad_table *g = adg_grad_table_of(grads);
	if (g == NULL)
		return grads_refused(__func__, grads);
	if (count == NULL)
		return ADG_FAIL(ADG_EINVAL, "count is NULL");
	*count = g->count;
	return 0;
}

int adg_grads_free(adg_grads *grads)
{
	if (grads == NULL)
		return 0;
	struct adg_grad_table *g = adg_grad_table_of(grads);
	if (g == NULL) /* a step's output: the backward owns it */
		return grads_refused(__func__, grads);
	adg_grad_table_free(g);
	return 0;
}

void adg_grad_table_attach_window(struct adg_grad_table *g, void **window,
				  uint64_t lo, size_t len)
{
	g->window = window;
	g->window_lo = lo;
	g->window_len = len;
}

int adg_grad_table_detach_window(struct adg_grad_table *g)
{
	void **window = g->window;
	size_t len = g->window_len;
	int rc = 0;
	/* The entries route by id again before anything moves. */
	g->window_len = 0;
	g->window = NULL;
	for (size_t i = 0; i < len; i++) {
		if (window[i] == NULL)
			continue;
		void *value = window[i];
		window[i] = NULL;
		g->count--;
		/* A new id for the entries: no add, only growth can fail,
		 * and then value was freed. */
		int moved = adg_grad_table_insert(g, g->window_lo + i, value);
		rc = rc != 0 ? rc : moved;
	}
	return rc;
}

void adg_grad_table_free(struct adg_grad_table *g)
{
	for (size_t i = 0; i < g->window_len; i++) {
		if (g->window[i] != NULL)
			g->ops.free(g->window[i], g->ops.ctx);
		g->window[i] = NULL;
	}
	for (size_t i = 0; i < g->cap; i++)
		if (g->entries[i].id != 0)
			g->ops.free(g->entries[i].value, g->ops.ctx);
	adg_allocator a = g->allocator;
	a.free(g->entries, g->cap * sizeof *g->entries, a.ctx);
	a.free(g, sizeof *g, a.ctx);
}
