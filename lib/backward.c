/*
 * Backward: take the tape under the root's graph lock, then run its steps
 * deepest first with no lock held.
 *
 * Taking is all or nothing. The walk marks what it reaches VISITING; if it
 * meets a consumed step, or runs out of memory, it puts every mark back and
 * the registry is as it was. Otherwise every node on the tape becomes
 * CONSUMED and leaves its graph before the lock is released, so a
 * concurrent backward that needs one of them fails cleanly instead of
 * silently skipping part of the graph.
 *
 * Every unconsumed parent of an unconsumed node is in the node's graph
 * (placement merges them, and only consuming or freeing takes a node out),
 * so one lock covers the whole walk.
 */
#include "tape.h"

#include <string.h>

void adg_tape_free(struct adg_registry *r, struct adg_tape *t)
{
	if (t == NULL)
		return;
	/* A capacity is 0 exactly when its array was never allocated. */
	if (t->nodes_cap != 0) {
		adg_free(r, t->walked, t->nodes_cap * sizeof *t->walked);
		adg_free(r, t->sorted, t->nodes_cap * sizeof *t->sorted);
	}
	if (t->depth_cap != 0)
		adg_free(r, t->per_depth, t->depth_cap * sizeof *t->per_depth);
	if (t->leaves_cap != 0)
		adg_free(r, t->leaves, t->leaves_cap * sizeof *t->leaves);
	if (t->outputs_cap != 0)
		adg_free(r, t->outputs, t->outputs_cap * sizeof *t->outputs);
	if (t->slots_cap != 0)
		adg_free(r, t->slots, t->slots_cap * sizeof *t->slots);
	if (t->par_cap != 0)
		adg_free(r, t->par_block, t->par_cap);
	adg_free(r, t, sizeof *t);
}

/* The allocator has no realloc: a new array of new_bytes, the old one
 * (old_bytes, nothing kept) freed. NULL on failure, old then untouched. */
static void *regrow(struct adg_registry *r, void *old, size_t old_bytes,
		    size_t new_bytes)
{
	void *fresh = adg_alloc(r, new_bytes);
	if (fresh != NULL && old != NULL)
		adg_free(r, old, old_bytes);
	return fresh;
}

/* Grows the node arrays to hold n; the first `kept` walked ones stay. All
 * or nothing. Out of line: the walk checks the capacity once per node. */
__attribute__((noinline)) static bool tape_grow_nodes(struct adg_registry *r,
						      struct adg_tape *t,
						      size_t n, size_t kept)
{
	size_t cap = t->nodes_cap ? t->nodes_cap : 64;
	while (cap < n)
		cap *= 2;
	struct adg_node **walked = adg_alloc(r, cap * sizeof *walked);
	if (walked == NULL)
		return false;
	struct adg_node **sorted =
		regrow(r, t->sorted, t->nodes_cap * sizeof *sorted,
		       cap * sizeof *sorted);
	if (sorted == NULL) {
		adg_free(r, walked, cap * sizeof *walked);
		return false;
	}
	if (t->walked != NULL) {
		memcpy(walked, t->walked, kept * sizeof *walked);
		adg_free(r, t->walked, t->nodes_cap * sizeof *walked);
	}
	t->walked = walked;
	t->sorted = sorted;
	t->nodes_cap = cap;
	return true;
}

static inline bool tape_reserve_nodes(struct adg_registry *r,
				      struct adg_tape *t, size_t n, size_t kept)
{
	return adg_likely(n <= t->nodes_cap) || tape_grow_nodes(r, t, n, kept);
}

static bool tape_reserve_depths(struct adg_registry *r, struct adg_tape *t,
				size_t n)
{
	if (n <= t->depth_cap)
		return true;
	size_t *d = regrow(r, t->per_depth, t->depth_cap * sizeof *d,
			   n * sizeof *d);
	if (d == NULL)
		return false;
	t->per_depth = d;
	t->depth_cap = n;
	return true;
}

/* Grows a scratch array of pointers (the recompute outputs, a step's
 * slots) to hold n; nothing in it is kept. */
static bool reserve_pointers(struct adg_registry *r, void ***array, size_t *cap,
			     size_t n)
{
	if (n <= *cap)
		return true;
	void **grown =
		regrow(r, *array, *cap * sizeof *grown, n * sizeof *grown);
	if (grown == NULL)
		return false;
	*array = grown;
	*cap = n;
	return true;
}

/* Room for the leaf counts of up to n leaf slots, at load 1/2 or less. */
static bool tape_reserve_leaves(struct adg_registry *r, struct adg_tape *t,
				size_t n)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	if (cap <= t->leaves_cap)
		return true;
	struct leaf_pending *l = regrow(r, t->leaves, t->leaves_cap * sizeof *l,
					cap * sizeof *l);
	if (l == NULL)
		return false;
	t->leaves = l;
	t->leaves_cap = cap;
	return true;
}

/* Counts, for the ready hook, the contributions each node and leaf of the
 * tape will receive: one per tape parent slot that names it. A leaf's go in
 * the tape's table, and so do a node's in a retained backward, which must
 * not write the node (I14); a consuming one's start from tape_links. */
static void count_pending(struct adg_tape *t, size_t len, bool retained)
{
	memset(t->leaves, 0, t->leaves_cap * sizeof *t->leaves);
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = t->walked[i];
		const uint64_t *ids = adg_node_parent_ids(n);
		if (!retained)
			n->tape_pending = n->tape_links;
		for (uint32_t k = 0; k < n->n_parents; k++) {
			if (n->parents[k] != NULL && !retained)
				continue;
			struct leaf_pending *l = leaf_slot(t, ids[k]);
			l->id = ids[k];
			l->pending++;
		}
	}
}

/* Hands node id's final gradient to the hook, which may take it. */
static int fire(const struct ready *r, adg_grads *grads, uint64_t id)
{
	void *grad = NULL;
	adg_grads_take(grads, id, &grad);
	int rc = adg_callback_result(r->fn(id, &grad, r->ctx));
	/* Left to us: back where it was. Its slot was just freed, so this
	 * never allocates and cannot fail. */
	if (grad != NULL)
		adg_grads_register(grads, id, grad);
	return rc;
}

/* After node n's step ran: its parents each lost one pending
 * contribution; those with none left are final. Where count_pending put
 * each count: the table, or a consuming tape node. */
static int fire_parents(const struct ready *r, struct adg_tape *t,
			adg_grads *grads, struct adg_node *n, bool retained)
{
	const uint64_t *ids = adg_node_parent_ids(n);
	for (uint32_t k = 0; k < n->n_parents; k++) {
		struct adg_node *p = n->parents[k];
		uint32_t *pending = p == NULL || retained
					    ? &leaf_slot(t, ids[k])->pending
					    : &p->tape_pending;
		if (--*pending == 0 && (p == NULL || !r->leaves_only)) {
			int rc = fire(r, grads, ids[k]);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

/* What a walk asks of the tape's scratch besides the nodes. */
struct walk_needs {
	bool counting;	  /* a ready hook: leaf counts */
	bool checkpoints; /* the registry uses checkpointing: recompute */
	bool slots;	  /* an executor without workers: a step's slots */
	uint32_t workers; /* an executor's worker slots; 0: none */
	/* A retained backward: its table keys the tape's nodes too. */
	bool retained;
};

/* With an executor: the table and the scheduler's arrays. */
static bool reserve_parallel(struct adg_registry *r, struct adg_tape *t,
			     size_t len, size_t leaf_slots, size_t keys,
			     uint32_t workers)
{
	size_t edges = 0;
	for (size_t i = 0; i < len; i++)
		edges += t->walked[i]->n_parents;
	return tape_reserve_leaves(r, t, keys) &&
	       adg_par_reserve(r, t, len, edges, leaf_slots, workers);
}

/* Walks from root, in graph g (locked), through unconsumed steps, marking
 * each VISITING once and counting in tape_links the tape's slots that name
 * it. Fills t->walked, *len, and *leaf_slots (parent slots that name
 * leaves: a bound on the leaf gradients to come), and reserves every
 * scratch array the backward will use, so that running it never
 * allocates. A consuming walk is refused where a retained pass runs
 * (I14). On error every mark is undone. */
static int walk(struct adg_tape *t, struct adg_graph *g, struct adg_node *root,
		struct walk_needs needs, size_t *len, size_t *leaf_slots)
{
	struct adg_registry *r = root->registry;
	size_t n = 0, leaves = 0;
	uint32_t most_parents = 0;
	int rc = 0;
	/* A consuming walk refuses a node that a retained pass runs over
	 * (I14): a mask, so that the check costs no branch of its own. */
	const uint32_t refused_runs = needs.retained ? 0 : UINT32_MAX;

	if (root->retained_runs & refused_runs)
		return ADG_EUNAVAILABLE;
	if (!tape_reserve_nodes(r, t, 1, 0))
		return ADG_ENOMEM;
	adg_node_set_state(root, ADG_NODE_VISITING);
	root->tape_links = 0;
	t->walked[n++] = root;
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct adg_node *node = t->walked[i];
		if (node->n_parents > most_parents)
			most_parents = node->n_parents;
		for (uint32_t k = 0; k < node->n_parents; k++) {
			struct adg_node *p = node->parents[k];
			if (p == NULL) {
				leaves++; /* a leaf: nothing to take */
				continue;
			}
			/* An unconsumed parent is in its child's graph, g. One
			 * that is not was consumed by another backward, whose
			 * writes to it were made under a lock we do not hold:
			 * decide by the pointer alone (compared, never
			 * followed) and leave its other fields alone. A
			 * visited parent was checked when first met. */
			if (adg_unlikely(adg_node_graph(p) != g ||
					 (p->retained_runs & refused_runs))) {
				rc = ADG_EUNAVAILABLE;
				break;
			}
			if (p->state == ADG_NODE_VISITING) {
				p->tape_links++;
				continue;
			}
			if (!tape_reserve_nodes(r, t, n + 1, n)) {
				rc = ADG_ENOMEM;
				break;
			}
			adg_node_set_state(p, ADG_NODE_VISITING);
			p->tape_links = 1;
			t->walked[n++] = p;
		}
	}
	/* A retained backward's table keys the tape's nodes too. */
	size_t keys = leaves + (needs.retained ? n : 0);
	if (rc == 0 &&
	    (!tape_reserve_depths(r, t, (size_t)root->depth + 1) ||
	     (needs.counting && !tape_reserve_leaves(r, t, keys)) ||
	     (needs.checkpoints &&
	      !reserve_pointers(r, &t->outputs, &t->outputs_cap,
				(size_t)most_parents *
					(needs.workers ? needs.workers : 1))) ||
	     (needs.slots &&
	      !reserve_pointers(r, &t->slots, &t->slots_cap, most_parents)) ||
	     (needs.workers != 0 &&
	      !reserve_parallel(r, t, n, leaves, keys, needs.workers))))
		rc = ADG_ENOMEM;
	if (rc != 0) {
		for (size_t i = 0; i < n; i++)
			adg_node_set_state(t->walked[i], ADG_NODE_LIVE);
		return rc;
	}
	t->outputs_stride = most_parents;
	*len = n;
	*leaf_slots = leaves;
	return 0;
}

/* Orders the walked nodes deepest first: a counting sort on depth, stable,
 * so the order depends only on the graph's shape, never on timing or
 * addresses, and gradients sum in the same order on every run. A child is
 * deeper than each of its parents, so every step runs after all of its
 * node's children have added to its gradient. */
static void sort_by_depth(struct adg_tape *t, size_t n, uint32_t max_depth)
{
	size_t *bucket = t->per_depth;

	for (size_t d = 0; d <= max_depth; d++)
		bucket[d] = 0;
	for (size_t i = 0; i < n; i++)
		bucket[max_depth - t->walked[i]->depth]++;
	size_t start = 0;
	for (size_t d = 0; d <= max_depth; d++) {
		size_t count = bucket[d];
		bucket[d] = start;
		start += count;
	}
	for (size_t i = 0; i < n; i++)
		t->sorted[bucket[max_depth - t->walked[i]->depth]++] =
			t->walked[i];
}

/* I7: each tape node's tape_links counts the tape's parent slots that name
 * it. For the assertions only: it costs a pass over the tape. */
static inline bool tape_links_add_up(struct adg_tape *t, size_t len)
{
	uint64_t links = 0, slots = 0;
	for (size_t i = 0; i < len; i++) {
		links += t->walked[i]->tape_links;
		for (uint32_t k = 0; k < t->walked[i]->n_parents; k++)
			slots += t->walked[i]->parents[k] != NULL;
	}
	return links == slots && t->walked[0]->tape_links == 0;
}

/* Takes the tape from root's graph and creates the container sized for it;
 * a retained backward marks it as run over instead (I14). On error nothing
 * is taken. Out of line: inlined, it costs run()'s loop registers
 * (callgrind: 7 instructions per node more). */
__attribute__((noinline)) static int
take(struct adg_shard *shard, struct adg_tape *t, struct adg_node *root,
     const adg_grad_ops *ops, bool counting, const adg_executor *executor,
     bool retained, size_t *len, adg_grads **grads)
{
	struct adg_registry *r = root->registry;
	uint32_t workers = executor && executor->n_workers != 0
				   ? adg_par_slots(executor)
				   : 0;
	/* Relaxed: set once, before any node with a record is published. */
	struct walk_needs needs = {
		.counting = counting && workers == 0,
		.checkpoints = atomic_load_explicit(&r->uses_checkpoints,
						    memory_order_relaxed),
		.slots = executor != NULL && workers == 0,
		.workers = workers,
		.retained = retained,
	};
	struct adg_graph *g = adg_graph_lock_of(root);
	if (g == NULL)
		return ADG_ECONSUMED;
	size_t leaf_slots;
	int rc = walk(t, g, root, needs, len, &leaf_slots);
	if (rc != 0)
		goto out_unlock; /* the walk undid its marks */
	ADG_ASSERT(tape_links_add_up(t, *len));
	/* With an executor only the leaves' gradients land in the
	 * container. */
	rc = adg_grads_new(r, ops, workers ? leaf_slots : *len + leaf_slots,
			   grads);
	if (rc != 0)
		goto out_unmark;
	if (retained) {
		/* Run over, not taken: the nodes stay in the graph, held by
		 * their children as before, and no consuming walk takes them
		 * until release_retained. */
		for (size_t i = 0; i < *len; i++) {
			struct adg_node *n = t->walked[i];
			n->retained_runs++;
			adg_node_set_state(n, ADG_NODE_LIVE);
		}
	} else {
		/* Consumed: the tape's nodes hold their parents' references
		 * until the backward drops them all at the end
		 * (drop_tape_links). */
		for (size_t i = 0; i < *len; i++) {
			struct adg_node *n = t->walked[i];
			adg_node_set_state(n, ADG_NODE_CONSUMED);
			adg_graph_detach_locked(g, n);
		}
	}
	adg_graph_unlock(shard, g);
	sort_by_depth(t, *len, root->depth);
	if (needs.counting)
		count_pending(t, *len, retained);
	/* A retained backward counts no request: it frees no output. */
	if (needs.checkpoints && !retained)
		adg_ckpt_plan(t->sorted, *len);
	return 0;

out_unmark:
	for (size_t i = 0; i < *len; i++)
		adg_node_set_state(t->walked[i], ADG_NODE_LIVE);
out_unlock:
	adg_graph_unlock(shard, g);
	return rc;
}

/* After a retained backward: its nodes may be consumed again. They are all
 * in root's graph still: they were together in one when the tape was
 * taken, merges move a graph's members together, and none can have left
 * (nothing consumes them meanwhile, and this backward holds them). */
static void release_retained(struct adg_shard *shard, struct adg_tape *t,
			     size_t len)
{
	struct adg_graph *g = adg_graph_lock_of(t->sorted[0]);
	ADG_ASSERT(g != NULL);
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = t->sorted[i];
		ADG_ASSERT(adg_node_graph(n) == g && n->retained_runs > 0);
		n->retained_runs--;
	}
	adg_graph_unlock(shard, g);
}

/* Drops, in one atomic subtraction per node, every reference that the
 * tape's nodes held on each other; frees what nothing else holds. Every
 * parent slot of a taken node names a leaf (uncounted) or another taken
 * node, so this lets go of all the references the tape held. */
static void drop_tape_links(struct adg_shard *shard, struct adg_tape *t,
			    size_t len)
{
	for (size_t i = 0; i < len; i++)
		adg_node_release_many(shard, t->sorted[i],
				      t->sorted[i]->tape_links);
}

static void alone_fail(struct adg_alone *alone, uint64_t key, int rc)
{
	if (key < alone->err_key) {
		alone->err_key = key;
		alone->rc = rc;
	}
}

/* With an executor that offers no worker: where a failing add into id's
 * gradient stands among errors, as parallel.c keys it (just after id's
 * last contributor on the tape), so that the first error is the same
 * with workers or without. Only on failure: a scan of the tape's end. */
void adg_alone_add_failed(struct adg_alone *alone, uint64_t id, int rc)
{
	const struct adg_tape *t = alone->tape;
	for (size_t p = alone->len; p-- > 0;) {
		const struct adg_node *n = t->sorted[p];
		const uint64_t *ids = adg_node_parent_ids(n);
		for (uint32_t k = 0; k < n->n_parents; k++) {
			if (ids[k] == id) {
				alone_fail(alone, (uint64_t)p * 2 + 1, rc);
				return;
			}
		}
	}
}

/*
 * Runs the taken tape. What it touches after calling out to user code (a
 * step, a release, a recompute, the hook, ops) stays alive whatever that
 * code does: each non-root tape node is held by its tape children's
 * references until drop_tape_links, the root by the backward's own
 * reference (adg_backward_with), the records by the tape (only this
 * backward owns a consumed node's record), the scratch by this call (a
 * nested backward finds the shard's tape taken and uses its own), and
 * grads by this thread (no step sees the container outside its call).
 *
 * alone: an executor that offers no worker. The steps run as without one,
 * but see a view of the gradients, as with workers (parallel.c): a
 * registration claims its parent slot and goes to the container at once
 * (grads.c, register_in_view), which in tape order is the order a fold
 * with workers adds them in, so the gradients are the same either way; an
 * add error is the backward's, keyed as parallel.c keys errors, and steps
 * before the first error in tape order still run. Inlined into two
 * copies, so that the sequential backward pays nothing for it.
 *
 * retained: the steps stay registered (nothing is released, no request
 * served, no link dropped), and an output a step's request rebuilds is
 * published for the passes after it (checkpoint.c).
 */
static inline __attribute__((always_inline)) int
run_tape(struct adg_shard *shard, struct adg_tape *t, size_t len, void *seed,
	 const adg_grad_ops *ops, const struct ready *ready,
	 const struct step_hook *step_hook, adg_grads *grads, const bool alone,
	 bool retained)
{
	/* The root is deepest, so it runs first, with the seed, which is
	 * final from the start. */
	void *grad = seed;
	/* The first error. Steps at keys (2 * position) at or past err_key
	 * do not run. Without an executor every error stops all that
	 * follows: its key is 0. */
	struct adg_alone first = {
		.grads = grads, .tape = t, .len = len, .err_key = UINT64_MAX};
	/* Recomputing outputs needs a work list as long as the tape; the walk
	 * order is no longer needed, so its array serves. */
	struct adg_backward_context ctx = {
		.stack = t->walked,
		.outputs = t->outputs,
		.retained = retained,
	};
	/* Alone: each step's view; only a view's sink is ever read. */
	struct adg_step_sink sink = {
		.slots = t->slots, .ops = ops, .alone = &first};
	adg_grads view;
	view.sink = &sink;

	if (ready != NULL && !ready->leaves_only) {
		int rc = adg_callback_result(
			ready->fn(t->sorted[0]->id, &grad, ready->ctx));
		if (rc != 0) {
			alone_fail(&first, 0, rc);
			if (grad != NULL)
				ops->free(grad, ops->ctx);
		}
	}
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = t->sorted[i];
		if ((uint64_t)i * 2 < first.err_key) {
			if (i > 0)
				grad = adg_grads_take_held(grads, n->id);
			ctx.node = n;
			if (alone) {
				sink.node = n;
				sink.filled = 0;
				sink.marked = false;
			}
			adg_step_call call = {
				.registry = n->registry,
				.grads = alone ? &view : grads,
				.node_id = n->id,
				.grad = grad,
				.parent_ids = adg_node_parent_ids(n),
				.n_parents = n->n_parents,
				.context = &ctx,
				.retained = retained,
			};
			int rc = adg_step_run(step_hook, n, &call);
			if (n->ckpt != NULL && !retained)
				adg_ckpt_served(n, NULL);
			if (call.grad != NULL)
				ops->free(call.grad, ops->ctx);
			if (rc != 0)
				alone_fail(&first, alone ? (uint64_t)i * 2 : 0,
					   rc);
			else if (ready != NULL &&
				 (rc = fire_parents(ready, t, grads, n,
						    retained)) != 0)
				alone_fail(&first,
					   alone ? (uint64_t)i * 2 + 1 : 0, rc);
		}
		/* After a failure the rest are released unrun. */
		if (!retained)
			adg_node_release_step(shard, n);
	}
	int rc = first.rc;
	if (retained)
		return rc; /* the graph is as it was: nothing to let go */
	/* What a failure left of the outputs goes now, exactly once; after a
	 * success the counts have freed it all, and only records remain. */
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = t->sorted[i];
		/* I7, I8: a successful backward served every request and,
		 * with a hook, delivered every contribution. */
		ADG_ASSERT(rc != 0 || ready == NULL || n->tape_pending == 0);
		if (n->ckpt == NULL)
			continue;
		ADG_ASSERT(rc != 0 ||
			   (n->ckpt->pending == 0 && n->ckpt->value == NULL));
		adg_ckpt_drop(n);
	}
	drop_tape_links(shard, t, len);
	return rc;
}

static int run(struct adg_shard *shard, struct adg_tape *t, size_t len,
	       void *seed, const adg_grad_ops *ops, const struct ready *ready,
	       const struct step_hook *step_hook, adg_grads *grads, bool alone,
	       bool retained)
{
	if (alone)
		return run_tape(shard, t, len, seed, ops, ready, step_hook,
				grads, true, retained);
	return run_tape(shard, t, len, seed, ops, ready, step_hook, grads,
			false, retained);
}

/* A root that is a leaf: the container holds just the seed. Takes *seed
 * (and sets it to NULL) once the container has it. */
static int backward_of_leaf(struct adg_registry *registry, uint64_t id,
			    void **seed, const adg_grad_ops *ops,
			    const struct ready *ready, adg_grads **out)
{
	adg_grads *grads;
	int rc = adg_grads_new(registry, ops, 1, &grads);
	if (rc != 0)
		return rc;
	/* The container owns seed from here, failing or not. */
	rc = adg_grads_register(grads, id, *seed);
	*seed = NULL;
	if (rc == 0 && ready != NULL)
		rc = fire(ready, grads, id);
	if (rc != 0) {
		adg_grads_free(grads);
		return rc;
	}
	*out = grads;
	return 0;
}

int adg_backward(adg_registry *registry, adg_node *root, void *seed,
		 const adg_grad_ops *ops, adg_grads **out)
{
	return adg_backward_with(registry, root, seed, ops, NULL, out);
}

int adg_backward_with(adg_registry *registry, adg_node *root, void *seed,
		      const adg_grad_ops *ops,
		      const adg_backward_options *options, adg_grads **out)
{
	if (out != NULL)
		*out = NULL;
	if (ops == NULL || ops->add == NULL || ops->free == NULL)
		return ADG_EINVAL; /* no way to free seed */
	int rc = ADG_EINVAL;
	struct adg_shard *shard;
	struct adg_tape *t;
	adg_grads *grads = NULL;
	struct adg_par_ticket *ticket = NULL;
	size_t len = 0;
	if (registry == NULL || root == NULL || seed == NULL || out == NULL)
		goto out_free_seed;
	const adg_executor *executor = options ? options->executor : NULL;
	if (executor != NULL &&
	    (executor->submit == NULL ||
	     executor->n_workers > ADG_EXECUTOR_MAX_WORKERS))
		goto out_free_seed;
	rc = ADG_EFOREIGN;
	if (root->registry != registry)
		goto out_free_seed;
	rc = ADG_ENOMEM;
	shard = adg_shard_get(registry);
	if (shard == NULL)
		goto out_free_seed;

	struct step_hook step_hook = {0};
	if (options != NULL)
		step_hook =
			(struct step_hook){options->on_step, options->step_ctx};
	struct ready hook = {0};
	const struct ready *ready = NULL;
	if (options != NULL && options->on_ready != NULL) {
		hook = (struct ready){options->on_ready, options->ctx,
				      options->leaves_only != 0};
		ready = &hook;
	}
	if (adg_node_is_leaf(root)) {
		rc = backward_of_leaf(registry, root->id, &seed, ops, ready,
				      out);
		goto out_free_seed;
	}
	/* Jobs submitted to the executor may outlive this call: their
	 * handle is allocated now, so that nothing is taken if it cannot
	 * be. */
	if (executor != NULL && executor->n_workers != 0) {
		ticket = adg_par_ticket_new();
		if (ticket == NULL)
			goto out_free_seed;
	}

	/* A nested backward (a step calling adg_backward) finds the cache
	 * taken and uses a tape of its own. */
	t = shard->tape_cache;
	shard->tape_cache = NULL;
	if (t == NULL) {
		t = adg_alloc(registry, sizeof *t);
		if (t == NULL)
			goto out_put_ticket;
		*t = (struct adg_tape){0};
	}
	/* The backward's own reference to root, for as long as it runs: a
	 * step may drop the caller's last one. Relaxed: the caller holds a
	 * reference during the call, so the count is above zero. */
	atomic_fetch_add_explicit(&root->refs, 1, memory_order_relaxed);
	bool retained = options != NULL && options->retain != 0;
	rc = take(shard, t, root, ops, ready != NULL, executor, retained, &len,
		  &grads);
	if (rc != 0)
		goto out_put_tape;
	if (ticket != NULL) {
		rc = adg_par_run(shard, t, len, seed, ops, ready, &step_hook,
				 grads, executor, retained, ticket);
		ticket = NULL; /* the run let go of it */
	} else {
		rc = run(shard, t, len, seed, ops, ready, &step_hook, grads,
			 executor != NULL, retained);
	}
	seed = NULL; /* the run took it */
	if (retained)
		release_retained(shard, t, len);
	if (rc != 0) {
		adg_grads_free(grads);
		grads = NULL;
	}

out_put_tape:
	adg_node_release(shard, root);
	if (shard->tape_cache == NULL)
		shard->tape_cache = t;
	else
		adg_tape_free(registry, t);
	*out = grads;
out_put_ticket:
	if (ticket != NULL)
		adg_par_ticket_put(ticket);
out_free_seed:
	if (seed != NULL)
		ops->free(seed, ops->ctx);
	return rc;
}
