/*
 * The gradient table (grads.c): what a backward returns, with the window
 * a backward on one thread fills by id. It knows a registry by pointer and
 * serial only, since it may outlive it, and so stands on util.h alone.
 * Rules: I28 and I29 in docs/concurrency.md.
 */
#ifndef ADG_GRADS_H
#define ADG_GRADS_H

#include "util.h"

#include <stddef.h>
#include <stdint.h>

struct adg_registry;

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
	ADG_ASSERT(id != 0 && value != NULL); /* I28 */
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

#endif /* ADG_GRADS_H */
