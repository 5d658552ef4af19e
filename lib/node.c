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
#include "checkpoint.h"
#include "internal.h"
#include "kind.h"
#include "slab.h"

#include <string.h>

/* Node memory: a slab of the shard's for nodes of up to
 * ADG_SLAB_CLASSES - 1 parents, a block of the allocator's for the rest
 * and for nodes with a checkpointing slot (made with options: few). */
static inline struct adg_node *node_alloc(struct adg_shard *shard,
					  struct adg_registry *r,
					  uint32_t n_parents, bool ckpt_slot)
{
	if (adg_likely(n_parents < ADG_SLAB_CLASSES && !ckpt_slot))
		return adg_slab_alloc(shard, n_parents);
	return adg_alloc(r, adg_node_alloc_size(n_parents, ckpt_slot));
}

static void node_dealloc(struct adg_shard *shard, struct adg_node *n)
{
	uint32_t k = n->n_parents;
	bool ckpt_slot = (n->flags & ADG_NODE_F_CKPT_SLOT) != 0;
#ifdef ADG_ASSERTIONS
	/* The last drop may skip the subtraction (node_put_refs): zero the
	 * count, so that a drop of a freed node trips I5 (where the free
	 * list's link or the poison leave it readable). */
	atomic_store_explicit(&n->refs, 0, memory_order_relaxed);
#endif
	if (adg_likely(k < ADG_SLAB_CLASSES && !ckpt_slot))
		adg_slab_free(shard, n);
	else
		adg_free(adg_node_registry_of(n), n,
			 adg_node_alloc_size(k, ckpt_slot));
}

/* Inlined: on adg_op's path, the stores that node_op_new overwrites go. */
static inline __attribute__((always_inline)) struct adg_node *
node_new(struct adg_shard *shard, const struct adg_step_kind *kind,
	 uint32_t n_parents, bool ckpt_slot, int *rc)
{
	struct adg_node *n =
		node_alloc(shard, kind->registry, n_parents, ckpt_slot);
	if (n == NULL) {
		*rc = ADG_ENOMEM; /* the caller says so */
		return NULL;
	}
	n->kind = kind;
	n->n_parents = n_parents;
	n->flags = ckpt_slot ? ADG_NODE_F_CKPT_SLOT : 0;
	if (ckpt_slot)
		*adg_node_ckpt_slot(n) = NULL;
	*rc = adg_next_id(shard, &n->id);
	if (*rc != 0) {
		node_dealloc(shard, n);
		return NULL;
	}
	atomic_init(&n->refs, 1); /* the handle returned to the caller */
	n->graph = NULL;
	n->depth = 0;
	n->state = ADG_NODE_LEAF;
	n->tape_links = 0;
	n->retained_runs = 0;
	return n;
}

/* The reason of an allocation that failed for func: what it was for. */
static __attribute__((cold, noinline)) int node_no_memory(const char *func,
							  const char *what)
{
	return adg_fail(ADG_ENOMEM, func, "the allocator gave no memory for %s",
			what);
}

/* The reason of node_new's failure: no memory, or no id left. */
static __attribute__((cold, noinline)) int node_new_failed(const char *func,
							   int rc)
{
	if (rc == ADG_ENOIDS)
		return adg_fail(rc, func,
				"no node id left to hand out (max_node_id "
				"reached)");
	return node_no_memory(func, "the node");
}

int adg_leaf(adg_registry *registry, adg_node **out)
{
	if (out != NULL)
		*out = NULL;
	if (registry == NULL || out == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				registry == NULL ? "registry" : "out");
	struct adg_shard *shard = adg_shard_get(registry);
	if (shard == NULL)
		return node_no_memory(__func__, "the thread's slice");
	int rc;
	struct adg_node *n =
		node_new(shard, &registry->leaf_kind, 0, false, &rc);
	if (n == NULL)
		return node_new_failed(__func__, rc);
	n->user = NULL;
	adg_count(shard, ADG_C_LEAVES_MADE, 1);
	*out = n;
	return 0;
}

/* What an entry point of adg_op's was called with, options aside. */
struct node_op_call {
	adg_registry *registry;
	adg_node *const *parents;
	size_t n_parents;
	const adg_step *step;
	uint64_t moved;	  /* the slots whose references the caller hands over */
	const char *func; /* the entry point, for reasons */
};

/* The reasons of node_op_new's bad input: which argument, and why. c by
 * value: the caller's stays in registers, its address taken nowhere on
 * adg_op's path. */
static __attribute__((cold, noinline)) int
node_op_invalid(struct node_op_call call, adg_node **out)
{
	const struct node_op_call *c = &call;
	const char *func = c->func;
	if (c->registry == NULL || c->parents == NULL || c->step == NULL ||
	    out == NULL)
		return adg_fail(ADG_EINVAL, func, "%s is NULL",
				c->registry == NULL  ? "registry"
				: c->parents == NULL ? "parents"
				: c->step == NULL    ? "step"
						     : "out");
	if (c->n_parents == 0 || c->n_parents > UINT32_MAX)
		return adg_fail(ADG_EINVAL, func,
				"n_parents is %zu (1 to UINT32_MAX)",
				c->n_parents);
	if (c->step->backward == NULL)
		return adg_fail(ADG_EINVAL, func, "step->backward is NULL");
	if (c->n_parents < 64 && c->moved >> c->n_parents != 0)
		return adg_fail(ADG_EINVAL, func,
				"moved has bit %d set, at or past n_parents "
				"(%zu)",
				63 - __builtin_clzll(c->moved), c->n_parents);
	return adg_fail(ADG_EINVAL, func, "bad argument");
}

/* Whether slot i's reference is the caller's, moved in (adg_op_moving,
 * options->moved). */
static inline bool node_slot_moved(uint64_t moved, size_t i)
{
	return i < 64 && (moved >> i & 1) != 0;
}

/* Checks c's parents: none NULL, all of c's registry. Returns 0 and their
 * greatest depth in *depth, or the failure's code, with its reason. */
static inline __attribute__((always_inline)) int
node_op_parents_check(const struct node_op_call *c, uint32_t *depth)
{
	/* Depth fits 32 bits: a deeper chain would need 2^32 nodes alive. */
	*depth = 0;
	for (size_t i = 0; i < c->n_parents; i++) {
		const struct adg_node *p = c->parents[i];
		if (p == NULL)
			return adg_fail(ADG_EINVAL, c->func,
					"parents[%zu] is NULL", i);
		if (adg_node_registry_of(p) != c->registry)
			return adg_fail(ADG_EFOREIGN, c->func,
					"parents[%zu] (node %" PRIu64
					") belongs to another registry",
					i, p->id);
		if (p->depth > *depth)
			*depth = p->depth;
	}
	return 0;
}

/* Fills n's parent slots from c's parents and takes a reference on each
 * op among them that the caller does not move in. Returns the moved
 * slots that name a leaf: their references are dropped once n is in. */
static inline __attribute__((always_inline)) uint64_t
node_op_take_parents(struct adg_node *n, const struct node_op_call *c)
{
	uint64_t moved_leaves = 0;
	for (size_t i = 0; i < c->n_parents; i++) {
		struct adg_node *p = c->parents[i];
		n->parents[i] = adg_parent_word(p);
		if (adg_node_is_leaf(p)) {
			if (node_slot_moved(c->moved, i))
				moved_leaves |= (uint64_t)1 << i;
			continue;
		}
		/* A moved slot's reference is the caller's, taken over: no
		 * add now, and no drop by the caller later. */
		if (node_slot_moved(c->moved, i))
			continue;
		/* Relaxed: the caller holds p, so its count cannot reach
		 * zero meanwhile, and nothing is published by it. */
		atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
	}
	return moved_leaves;
}

/* Undoes node_op_take_parents and the checkpoint record of n, which no
 * one saw: takes back the references added (not the last ones: the
 * caller holds each parent); moved ones stay the caller's. */
static void node_op_put_parents(struct adg_node *n, uint64_t moved)
{
	for (size_t i = 0; i < n->n_parents; i++) {
		struct adg_node *p = adg_node_parent(n, (uint32_t)i);
		if (p != NULL && !node_slot_moved(moved, i))
			atomic_fetch_sub_explicit(&p->refs, 1,
						  memory_order_relaxed);
	}
	if (adg_node_ckpt(n) != NULL) {
		/* the caller keeps what it offered */
		adg_node_ckpt(n)->value = NULL;
		adg_ckpt_drop(n);
	}
}

/* Inlined into each entry point, so that adg_op and a call with no options
 * pay for neither options nor moves. */
static inline __attribute__((always_inline)) int
node_op_new(const struct node_op_call *c, const adg_op_options *options,
	    adg_node **out)
{
	const char *func = c->func;
	if (out != NULL)
		*out = NULL;
	if (c->registry == NULL || c->parents == NULL || c->n_parents == 0 ||
	    c->n_parents > UINT32_MAX || c->step == NULL ||
	    c->step->backward == NULL || out == NULL ||
	    (c->n_parents < 64 && c->moved >> c->n_parents != 0))
		return node_op_invalid(*c, out);
	uint32_t depth;
	int rc = node_op_parents_check(c, &depth);
	if (rc != 0)
		return rc;
	struct adg_shard *shard = adg_shard_get(c->registry);
	if (shard == NULL)
		return node_no_memory(func, "the thread's slice");
	/* Before anything is taken: a failed intern changes nothing. */
	const struct adg_step_kind *kind = adg_kind_intern(shard, c->step);
	if (kind == NULL)
		return node_no_memory(func, "the step's kind");
	struct adg_node *n = node_new(shard, kind, (uint32_t)c->n_parents,
				      options != NULL, &rc);
	if (n == NULL)
		return node_new_failed(func, rc);
	n->depth = depth + 1;
	n->state = ADG_NODE_LIVE; /* I1: before it is published */
	n->user = c->step->user;
	if (options != NULL) {
		rc = adg_ckpt_attach(n, c->parents, options, func);
		if (rc != 0)
			goto out_dealloc;
	}
	/* Their references are dropped once the node is in. */
	uint64_t moved_leaves = node_op_take_parents(n, c);
	rc = adg_graph_place(shard, n);
	if (rc != 0) {
		node_no_memory(func, "the node's graph");
		goto out_put_parents;
	}
	/* The output this thread's last op offered and the balanced
	 * strategy dropped was its forward's until now. Only once the op
	 * is in: a failed call changes nothing. */
	adg_ckpt_free_deferred(shard);
	if (adg_node_ckpt(n) != NULL)
		adg_ckpt_commit(shard, n);
	adg_count(shard, ADG_C_OPS_MADE, 1);
	*out = n;
	/* A moved leaf's reference has no slot to go to (children keep a
	 * leaf's id only): dropped, as the caller would have. */
	while (adg_unlikely(moved_leaves != 0)) {
		adg_node_unref(c->parents[__builtin_ctzll(moved_leaves)]);
		moved_leaves &= moved_leaves - 1;
	}
	return 0;

out_put_parents:
	node_op_put_parents(n, c->moved); /* nothing saw the node */
out_dealloc:
	adg_put_id(shard, n->id);
	node_dealloc(shard, n);
	return rc;
}

int adg_op(adg_registry *registry, adg_node *const *parents, size_t n_parents,
	   const adg_step *step, adg_node **out)
{
	struct node_op_call c = {.registry = registry,
				 .parents = parents,
				 .n_parents = n_parents,
				 .step = step,
				 .func = __func__};
	return node_op_new(&c, NULL, out);
}

/* node_op_new with the caller's options (non-NULL), read by the size
 * rule, and the moves they name. */
static int node_op_with(const struct node_op_call *c,
			const adg_op_options *options, adg_node **out)
{
	adg_op_options o;
	int rc = ADG_ABI_READ(c->func, "options", &o, options,
			      ADG_ABI_FIRST_OP_OPTIONS);
	if (rc != 0) {
		if (out != NULL)
			*out = NULL;
		return rc;
	}
	struct node_op_call moving = *c;
	moving.moved = o.moved;
	return node_op_new(&moving, &o, out);
}

int adg_op_with(adg_registry *registry, adg_node *const *parents,
		size_t n_parents, const adg_step *step,
		const adg_op_options *options, adg_node **out)
{
	struct node_op_call c = {.registry = registry,
				 .parents = parents,
				 .n_parents = n_parents,
				 .step = step,
				 .func = __func__};
	if (options == NULL)
		return node_op_new(&c, NULL, out);
	return node_op_with(&c, options, out);
}

int adg_op_moving(adg_registry *registry, adg_node *const *parents,
		  size_t n_parents, uint64_t moved, const adg_step *step,
		  adg_node **out)
{
	struct node_op_call c = {.registry = registry,
				 .parents = parents,
				 .n_parents = n_parents,
				 .step = step,
				 .moved = moved,
				 .func = __func__};
	return node_op_new(&c, NULL, out);
}

int adg_node_ref(adg_node *node)
{
	if (node == NULL)
		return ADG_FAIL(ADG_EINVAL, "node is NULL");
	/* Relaxed: the caller holds a reference, so the count is above zero
	 * and nothing is published by this increment. */
	uint64_t old =
		atomic_fetch_add_explicit(&node->refs, 1, memory_order_relaxed);
	ADG_ASSERT(old > 0); /* I5: the caller's reference */
	(void)old;
	return 0;
}

int adg_node_id(const adg_node *node, uint64_t *id)
{
	if (node == NULL || id == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				node == NULL ? "node" : "id");
	*id = node->id;
	return 0;
}

int adg_node_registry(const adg_node *node, adg_registry **registry)
{
	if (node == NULL || registry == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				node == NULL ? "node" : "registry");
	/* Set before the node is published and never changed. */
	*registry = adg_node_registry_of(node);
	return 0;
}

void adg_node_release_step(struct adg_shard *shard, struct adg_node *node)
{
	if (node->kind->release != NULL)
		node->kind->release(node->user);
	adg_count(shard, ADG_C_STEPS_RELEASED, 1);
}

/* Drops n references; returns whether they were the last. */
static bool node_put_refs(struct adg_node *node, uint64_t n)
{
	/* A count that reads n is all ours: no one else holds the node, so
	 * no one can change the count (a new reference needs an old one), and
	 * the locked subtraction can be skipped. Acquire: pairs with the
	 * release of the dropper that brought it down to n. Otherwise the
	 * subtraction is acq_rel: release, so that what this thread did with
	 * the node happens before its free, whichever thread drops the last
	 * reference; acquire, so that the last dropper sees what every
	 * earlier one did. (acq_rel costs the same locked instruction as
	 * release alone, and TSan understands it, which it does not a
	 * fence.) */
	uint64_t old = atomic_load_explicit(&node->refs, memory_order_acquire);
	if (old == n)
		return true;
	old = atomic_fetch_sub_explicit(&node->refs, n, memory_order_acq_rel);
	/* I5: this thread holds the n it drops, so the count was at least
	 * n, whatever other holders did meanwhile. */
	ADG_ASSERT(old >= n);
	return old == n;
}

/*
 * One free: what a drop made unreachable, found in a first pass and freed
 * in a second. The first takes each unconsumed node out of its graph and
 * drops its parents' references, calling no user code, so that it may
 * keep a graph's lock from one node to the next: a graph of a thousand
 * unconsumed nodes (never run, or run only by retained passes) is taken
 * apart in one lock hold, not a thousand. The second runs the release
 * callbacks and frees, with no lock held. Nodes are freed in the order
 * they were found, as one pass that did both would.
 */
struct reaper {
	struct adg_shard *shard;
	struct adg_graph *held; /* locked by this free; NULL: none */
	uint32_t held_for;	/* nodes taken out under it */
	struct adg_node *todo;	/* LIFO: found, parents not yet dropped */
	struct adg_node *found, **found_end; /* FIFO: to free, in order */
};

/* Nodes taken out under one hold, at most: other threads that use the
 * graph's live nodes wait for it no longer than that. */
#define REAPER_HOLD_MAX 256

static void node_reaper_unlock(struct reaper *rp)
{
	if (rp->held != NULL) {
		adg_graph_unlock(rp->shard, rp->held);
		rp->held = NULL;
	}
}

/* Puts a node nothing references on the work list, taken out of its graph
 * first if its step is unconsumed. */
static void node_doom(struct reaper *rp, struct adg_node *node)
{
	if (node->state == ADG_NODE_LIVE) {
		/* Unreachable now, but still a member of its graph, which a
		 * concurrent merge may be moving: under the lock held, a
		 * member of that graph stays there. Any other graph is locked
		 * after letting go of the one held, never both at once, so
		 * that no lock order is needed. */
		if (rp->held == NULL || adg_node_graph(node) != rp->held ||
		    rp->held_for == REAPER_HOLD_MAX) {
			node_reaper_unlock(rp);
			rp->held = adg_graph_lock_of(node);
			rp->held_for = 0;
		}
		ADG_ASSERT(rp->held != NULL); /* I1: a LIVE node is in one */
		/* I14: a retained pass holds what it runs over. */
		ADG_ASSERT(node->retained_runs == 0);
		adg_graph_detach_locked(rp->held, node);
		rp->held_for++;
	}
	node->next_doomed = rp->todo;
	rp->todo = node;
}

/* Drops n references; a node whose count reaches zero is doomed. NULL (a
 * leaf parent) holds nothing. */
static void node_drop_refs(struct reaper *rp, struct adg_node *node, uint64_t n)
{
	if (node != NULL && n != 0 && node_put_refs(node, n))
		node_doom(rp, node);
}

/* Frees one unreachable node, with no lock held. */
static void node_free(struct adg_shard *shard, struct adg_node *node)
{
	/* A LIVE node still holds its step; a CONSUMED one gave it up to
	 * the backward that took it. */
	if (node->state == ADG_NODE_LIVE)
		adg_node_release_step(shard, node);
	if (adg_node_ckpt(node) != NULL)
		adg_ckpt_drop(node); /* a LIVE node's kept output goes */
	adg_count(shard, ADG_C_NODES_FREED, 1);
	node_dealloc(shard, node);
}

/* The two passes over what the drops so far doomed. */
static void node_reap(struct reaper *rp)
{
	/* Most frees are of one consumed node (a backward letting go of its
	 * tape): it holds nothing, so there is nothing more to find. */
	struct adg_node *only = rp->todo;
	if (only->next_doomed == NULL && only->state != ADG_NODE_LIVE) {
		node_free(rp->shard, only);
		return;
	}
	/* A work list rather than recursion: a chain of a million nodes
	 * freed at once must not overflow the stack. */
	rp->found_end = &rp->found;
	while (rp->todo != NULL) {
		struct adg_node *n = rp->todo;
		rp->todo = n->next_doomed;
		n->next_doomed = NULL;
		*rp->found_end = n;
		rp->found_end = &n->next_doomed;
		/* A LIVE node still holds its parents; a CONSUMED one gave
		 * them up to the backward that took it. */
		if (n->state == ADG_NODE_LIVE)
			for (uint32_t i = 0; i < n->n_parents; i++)
				node_drop_refs(rp, adg_node_parent(n, i), 1);
	}
	node_reaper_unlock(rp);
	for (struct adg_node *n = rp->found; n != NULL;) {
		struct adg_node *next = n->next_doomed;
		node_free(rp->shard, n);
		n = next;
	}
}

void adg_node_release_many(struct adg_shard *shard, struct adg_node *node,
			   uint64_t n)
{
	struct reaper rp = {.shard = shard};

	node_drop_refs(&rp, node, n);
	if (rp.todo != NULL)
		node_reap(&rp);
}

void adg_node_release(struct adg_shard *shard, struct adg_node *node)
{
	adg_node_release_many(shard, node, 1);
}

int adg_node_unref(adg_node *node)
{
	if (node == NULL)
		return ADG_FAIL(ADG_EINVAL, "node is NULL");
	/* Most drops are not the last one and need nothing else. */
	if (!node_put_refs(node, 1))
		return 0;
	struct reaper rp = {
		.shard = adg_shard_get_or_shared(adg_node_registry_of(node))};
	node_doom(&rp, node);
	node_reap(&rp);
	return 0;
}
