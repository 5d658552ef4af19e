/*
 * Nodes: creation (adg_leaf, adg_op), counted references, and freeing.
 *
 * A node holds one reference on each non-leaf parent slot while its step is
 * unconsumed, so "some backward could still run this step" is exactly "the
 * node's count is above zero": the caller's handles keep it, and so does
 * every unconsumed descendant. Once a backward has taken a node's step, the
 * node lets go of its parents. Freeing is therefore driven by references
 * alone and costs work in proportion to what is freed; nothing sweeps.
 * Leaves have no step to keep, so children do not count them.
 */
#include "internal.h"

#include <string.h>

static struct adg_node *node_new(struct adg_shard *shard,
				 struct adg_registry *r, uint32_t n_parents,
				 int *rc)
{
	struct adg_node *n = adg_alloc(r, adg_node_size(n_parents));
	if (n == NULL) {
		*rc = ADG_ENOMEM;
		return NULL;
	}
	*rc = adg_next_id(shard, &n->id);
	if (*rc != 0) {
		adg_free(r, n, adg_node_size(n_parents));
		return NULL;
	}
	n->registry = r;
	atomic_init(&n->refs, 1); /* the handle returned to the caller */
	n->graph = NULL;
	n->depth = 0;
	n->n_parents = n_parents;
	n->state = ADG_NODE_LEAF;
	n->tape_links = 0;
	n->step = (adg_step){0};
	return n;
}

int adg_leaf(adg_registry *registry, adg_node **out)
{
	if (out != NULL)
		*out = NULL;
	if (registry == NULL || out == NULL)
		return ADG_EINVAL;
	struct adg_shard *shard = adg_shard_get(registry);
	if (shard == NULL)
		return ADG_ENOMEM;
	int rc;
	struct adg_node *n = node_new(shard, registry, 0, &rc);
	if (n == NULL)
		return rc;
	adg_count(shard, ADG_C_NODES_MADE, 1);
	*out = n;
	return 0;
}

int adg_op(adg_registry *registry, adg_node *const *parents, size_t n_parents,
	   const adg_step *step, adg_node **out)
{
	if (out != NULL)
		*out = NULL;
	if (registry == NULL || parents == NULL || n_parents == 0 ||
	    n_parents > UINT32_MAX || step == NULL || step->backward == NULL ||
	    out == NULL)
		return ADG_EINVAL;
	/* Depth fits 32 bits: a deeper chain would need 2^32 nodes alive. */
	uint32_t depth = 0;
	for (size_t i = 0; i < n_parents; i++) {
		if (parents[i] == NULL)
			return ADG_EINVAL;
	}
	for (size_t i = 0; i < n_parents; i++) {
		if (parents[i]->registry != registry)
			return ADG_EFOREIGN;
		if (parents[i]->depth > depth)
			depth = parents[i]->depth;
	}
	struct adg_shard *shard = adg_shard_get(registry);
	if (shard == NULL)
		return ADG_ENOMEM;
	int rc;
	struct adg_node *n =
		node_new(shard, registry, (uint32_t)n_parents, &rc);
	if (n == NULL)
		return rc;
	n->depth = depth + 1;
	n->state = ADG_NODE_LIVE;
	n->step = *step;
	uint64_t *ids = (uint64_t *)(n->parents + n_parents);
	for (size_t i = 0; i < n_parents; i++) {
		bool leaf = adg_node_is_leaf(parents[i]);
		n->parents[i] = leaf ? NULL : parents[i];
		ids[i] = parents[i]->id;
	}

	rc = adg_graph_place(shard, n);
	if (rc != 0) {
		adg_free(registry, n, adg_node_size(n_parents));
		return rc;
	}
	/* Nothing can reach the new node yet, so its parent references may
	 * follow its placement. Relaxed: the caller holds each parent, so no
	 * count can reach zero meanwhile. */
	for (size_t i = 0; i < n_parents; i++)
		if (n->parents[i] != NULL)
			atomic_fetch_add_explicit(&n->parents[i]->refs, 1,
						  memory_order_relaxed);
	adg_count(shard, ADG_C_NODES_MADE, 1);
	adg_count(shard, ADG_C_STEPS_MADE, 1);
	*out = n;
	return 0;
}

int adg_node_ref(adg_node *node)
{
	if (node == NULL)
		return ADG_EINVAL;
	/* Relaxed: the caller holds a reference, so the count is above zero
	 * and nothing is published by this increment. */
	atomic_fetch_add_explicit(&node->refs, 1, memory_order_relaxed);
	return 0;
}

int adg_node_unref(adg_node *node)
{
	if (node == NULL)
		return ADG_EINVAL;
	adg_node_release(adg_shard_get_or_shared(node->registry), node);
	return 0;
}

int adg_node_id(const adg_node *node, uint64_t *id)
{
	if (node == NULL || id == NULL)
		return ADG_EINVAL;
	*id = node->id;
	return 0;
}

void adg_node_release_step(struct adg_shard *shard, struct adg_node *node)
{
	if (node->step.release != NULL)
		node->step.release(node->step.user);
	adg_count(shard, ADG_C_STEPS_RELEASED, 1);
}

/* Drops n references; a node whose count reaches zero goes on doomed,
 * taken out of its graph first if its step is unconsumed. NULL (a leaf
 * parent) holds nothing. */
static void drop_refs(struct adg_shard *shard, struct adg_node *node,
		      uint64_t n, struct adg_node **doomed)
{
	if (node == NULL || n == 0)
		return;
	/* Release: what this thread did with the node happens before its
	 * free, whichever thread drops the last reference. Acquire: the last
	 * dropper sees what every earlier one did. (acq_rel costs the same
	 * locked instruction as release alone, and TSan understands it, which
	 * it does not a fence.) */
	if (atomic_fetch_sub_explicit(&node->refs, n, memory_order_acq_rel) !=
	    n)
		return;
	if (node->state == ADG_NODE_LIVE) {
		/* Unreachable now, but still a member of its graph, which a
		 * concurrent merge may be moving. */
		struct adg_graph *g = adg_graph_lock_of(node);
		adg_graph_detach_locked(g, node);
		adg_graph_unlock(shard, g);
	}
	node->next_doomed = *doomed;
	*doomed = node;
}

/* Frees one unreachable node; parents it lets go of join doomed. */
static void node_free(struct adg_shard *shard, struct adg_node *node,
		      struct adg_node **doomed)
{
	/* A LIVE node still holds its step and its parents; a CONSUMED one
	 * gave both up to the backward that took it. */
	if (node->state == ADG_NODE_LIVE) {
		adg_node_release_step(shard, node);
		for (uint32_t i = 0; i < node->n_parents; i++)
			drop_refs(shard, node->parents[i], 1, doomed);
	}
	adg_count(shard, ADG_C_NODES_FREED, 1);
	adg_free(node->registry, node, adg_node_size(node->n_parents));
}

static void free_doomed(struct adg_shard *shard, struct adg_node *doomed)
{
	/* A work list rather than recursion: a chain of a million nodes
	 * freed at once must not overflow the stack. */
	while (doomed != NULL) {
		struct adg_node *n = doomed;
		doomed = n->next_doomed;
		node_free(shard, n, &doomed);
	}
}

void adg_node_release_many(struct adg_shard *shard, struct adg_node *node,
			   uint64_t n)
{
	struct adg_node *doomed = NULL;

	drop_refs(shard, node, n, &doomed);
	free_doomed(shard, doomed);
}

void adg_node_release(struct adg_shard *shard, struct adg_node *node)
{
	adg_node_release_many(shard, node, 1);
}
