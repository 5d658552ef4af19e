/*
 * Taking a tape: the walk from a backward's root under its graph's lock,
 * the order its steps run in, and the scratch every run of it uses.
 *
 * Taking is all or nothing. The walk marks what it reaches VISITING; if it
 * meets a consumed step, or runs out of memory, it puts every mark back and
 * the registry is as it was. Otherwise every node on the tape becomes
 * CONSUMED and leaves its graph before the lock is released, so a
 * concurrent backward that needs one of them fails cleanly instead of
 * silently skipping part of the graph; a retained run marks them as run
 * over instead (I14).
 *
 * Every unconsumed parent of an unconsumed node is in the node's graph
 * (placement merges them, and only consuming or freeing takes a node out),
 * so one lock covers the whole walk.
 */
#include "run.h"

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
	if (t->keys_cap != 0)
		adg_free(r, t->keys, t->keys_cap * sizeof *t->keys);
	if (t->outputs_cap != 0)
		adg_free(r, t->outputs, t->outputs_cap * sizeof *t->outputs);
	if (t->marks_cap != 0)
		adg_free(r, t->marks, t->marks_cap * sizeof *t->marks);
	if (t->ids_cap != 0)
		adg_free(r, t->ids, t->ids_cap * sizeof *t->ids);
	if (t->recompute_ids_cap != 0)
		adg_free(r, t->recompute_ids,
			 t->recompute_ids_cap * sizeof *t->recompute_ids);
	if (t->par_cap != 0)
		adg_free(r, t->par_block, t->par_cap);
	if (t->window_cap != 0)
		adg_free(r, t->window, t->window_cap * sizeof *t->window);
	adg_free(r, t, sizeof *t);
}

/* The allocator has no realloc: a new array of new_bytes, the old one
 * (old_bytes, nothing kept) freed. NULL on failure, old then untouched. */
static void *tape_regrow(struct adg_registry *r, void *old, size_t old_bytes,
			 size_t new_bytes)
{
	void *fresh = adg_alloc(r, new_bytes);
	if (fresh != NULL && old != NULL)
		adg_free(r, old, old_bytes);
	return fresh;
}

/* Grows the node arrays to hold n; the first `kept` of each stay (the
 * walk's nodes, and its stack in sorted). All or nothing. Out of line:
 * the walk checks the capacity once per node. */
__attribute__((noinline)) static bool tape_grow_nodes(struct adg_registry *r,
						      struct adg_tape *t,
						      size_t n, size_t kept)
{
	size_t cap = t->nodes_cap ? t->nodes_cap : 64;
	while (cap < n)
		cap *= 2;
	/* Both allocated before either old one goes: all or nothing. */
	struct adg_node **walked = adg_alloc(r, cap * sizeof *walked);
	struct adg_node **sorted = adg_alloc(r, cap * sizeof *sorted);
	if (walked == NULL || sorted == NULL) {
		if (walked != NULL)
			adg_free(r, walked, cap * sizeof *walked);
		if (sorted != NULL)
			adg_free(r, sorted, cap * sizeof *sorted);
		return false;
	}
	if (t->nodes_cap != 0) {
		memcpy(walked, t->walked, kept * sizeof *walked);
		memcpy(sorted, t->sorted, kept * sizeof *sorted);
		adg_free(r, t->walked, t->nodes_cap * sizeof *walked);
		adg_free(r, t->sorted, t->nodes_cap * sizeof *sorted);
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

/* Grows a scratch array of pointers (the recompute outputs, a step's
 * marks) to hold n; nothing in it is kept. */
static bool tape_reserve_pointers(struct adg_registry *r, void ***array,
				  size_t *cap, size_t n)
{
	if (n <= *cap)
		return true;
	void **grown =
		tape_regrow(r, *array, *cap * sizeof *grown, n * sizeof *grown);
	if (grown == NULL)
		return false;
	*array = grown;
	*cap = n;
	return true;
}

/* Grows a scratch array of ids (a step's or a recompute's parent ids) to
 * hold n; nothing in it is kept. */
static bool tape_reserve_ids(struct adg_registry *r, uint64_t **array,
			     size_t *cap, size_t n)
{
	if (n <= *cap)
		return true;
	uint64_t *grown =
		tape_regrow(r, *array, *cap * sizeof *grown, n * sizeof *grown);
	if (grown == NULL)
		return false;
	*array = grown;
	*cap = n;
	return true;
}

/* On one thread, a tape whose ids are dense (at most twice as many ids in
 * its span as nodes, as a graph recorded by one thread has) gets a window
 * for its gradients (struct adg_grad_table), read and written by id in
 * memory order where a hash table scatters them. Kept with its slots all
 * NULL between runs: only a larger window is allocated and cleared.
 * window_len 0: none. */
static bool tape_reserve_window(struct adg_registry *r, struct adg_tape *t,
				uint64_t lo, uint64_t hi, size_t n)
{
	t->window_len = 0;
	if (hi - lo >= 2 * (uint64_t)n + 64)
		return true; /* sparse: the table hashes them */
	size_t len = (size_t)(hi - lo) + 1;
	if (len > t->window_cap) {
		void **w = tape_regrow(r, t->window,
				       t->window_cap * sizeof *t->window,
				       len * sizeof *t->window);
		if (w == NULL)
			return false;
		memset(w, 0, len * sizeof *w);
		t->window = w;
		t->window_cap = len;
	}
	t->window_lo = lo;
	t->window_len = len;
	return true;
}

/* Room for n keys in the id table, at load 1/2 or less. */
static bool tape_reserve_keys(struct adg_registry *r, struct adg_tape *t,
			      size_t n)
{
	size_t cap = 16;
	while (cap < 2 * n)
		cap *= 2;
	if (cap <= t->keys_cap)
		return true;
	struct adg_tape_key *l = tape_regrow(
		r, t->keys, t->keys_cap * sizeof *l, cap * sizeof *l);
	if (l == NULL)
		return false;
	t->keys = l;
	t->keys_cap = cap;
	return true;
}

/* Counts, for the ready hook, the contributions each node and leaf of the
 * tape will receive: one per tape parent slot that names it. A leaf's go in
 * the tape's table, and so do a node's in a retained backward, which must
 * not write the node (I14); a consuming one's start from tape_links. */
static void tape_count_pending(struct adg_tape *t, size_t len, bool retained)
{
	memset(t->keys, 0, t->keys_cap * sizeof *t->keys);
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = t->sorted[i]; /* any order: counts */
		if (!retained)
			n->tape_pending = n->tape_links;
		for (uint32_t k = 0; k < n->n_parents; k++) {
			if (adg_node_parent(n, k) != NULL && !retained)
				continue;
			uint64_t id = adg_node_parent_id(n, k);
			struct adg_tape_key *l = adg_tape_key(t, id);
			l->id = id;
			l->pending++;
		}
	}
}

/* What a walk asks of the tape's scratch besides the nodes. */
struct tape_needs {
	bool counting;	  /* a ready hook: leaf counts */
	bool checkpoints; /* the registry uses checkpointing: recompute */
	bool marks;	  /* on one thread: a step's marks */
	uint32_t workers; /* an executor's worker slots; 0: none */
	/* A retained backward: its table keys the tape's nodes too. */
	bool retained;
};

/* With an executor: the table and the scheduler's arrays. */
static bool tape_reserve_parallel(struct adg_registry *r, struct adg_tape *t,
				  size_t len, size_t leaves, size_t keys,
				  uint32_t workers)
{
	size_t edges = 0;
	for (size_t i = 0; i < len; i++)
		edges += t->walked[i]->n_parents;
	return tape_reserve_keys(r, t, keys) &&
	       adg_par_reserve(r, t, len, edges, leaves, workers);
}

/* Leaf ids the walk saw last, for counting the tape's leaves: a leaf is
 * counted again only when another took its entry, so the count bounds the
 * distinct leaves from above, as a reservation must, while a parameter
 * that every node of a graph multiplies by counts once, not once per node
 * (a table sized per slot would be cleared, and paged in, for nothing). */
struct tape_leaf_filter {
	uint64_t recent[64];
	size_t count;
};

static inline void tape_count_leaf(struct tape_leaf_filter *f, uint64_t id)
{
	size_t i = (size_t)adg_id_hash(id, 64 - 6); /* 64 entries */
	if (f->recent[i] != id) {
		f->recent[i] = id;
		f->count++;
	}
}

/* What a walk met: what sizes the scratch a run of its tape uses. */
struct tape_walked {
	size_t n;	       /* nodes */
	size_t leaves;	       /* at least the distinct leaves they name */
	uint32_t most_parents; /* of one node */
	uint64_t lo, hi;       /* the span of the nodes' ids */
};

/* Reserves, as needs says, every scratch array a run of the walked tape
 * will use besides the nodes, so that running it never allocates. false
 * when one could not grow (those before it stay grown, for the next). */
static bool tape_reserve_run(struct adg_registry *r, struct adg_tape *t,
			     struct tape_needs needs, struct tape_walked w)
{
	/* A retained backward's table keys the tape's nodes too. */
	size_t keys = w.leaves + (needs.retained ? w.n : 0);
	size_t slots = needs.workers ? needs.workers : 1;
	size_t outputs = (size_t)w.most_parents * slots;
	/* A node of more parents than the inline array holds: the step's
	 * ids go here (run.h adg_run_step_ids). */
	t->ids_stride =
		w.most_parents > ADG_RUN_INLINE_IDS ? w.most_parents : 0;
	return (!needs.counting || tape_reserve_keys(r, t, keys)) &&
	       (t->ids_stride == 0 ||
		tape_reserve_ids(r, &t->ids, &t->ids_cap,
				 t->ids_stride * slots)) &&
	       (!needs.checkpoints ||
		(tape_reserve_pointers(r, &t->outputs, &t->outputs_cap,
				       outputs) &&
		 tape_reserve_ids(r, &t->recompute_ids, &t->recompute_ids_cap,
				  outputs))) &&
	       (!needs.marks ||
		(tape_reserve_pointers(r, &t->marks, &t->marks_cap,
				       w.most_parents) &&
		 tape_reserve_window(r, t, w.lo, w.hi, w.n))) &&
	       (needs.workers == 0 ||
		tape_reserve_parallel(r, t, w.n, w.leaves, keys,
				      needs.workers));
}

/* Where the walk stands in t: the nodes walked (t->walked) and those
 * waiting on its stack (t->sorted). */
struct tape_cursor {
	size_t n;
	size_t waiting;
};

/* The walk meets p, an op (not a leaf) named by a parent slot of a node
 * on the tape: the first time, marks it VISITING, appends it to
 * t->walked and pushes it on the walk's stack in t->sorted (at says where
 * both end); after that, counts the slot. Returns 0, ADG_EUNAVAILABLE or
 * ADG_ENOMEM. Inline: the walk's loop runs it once per slot. */
static inline int tape_walk_parent(struct adg_registry *r, struct adg_tape *t,
				   struct adg_graph *g, struct adg_node *p,
				   uint32_t refused_runs,
				   struct tape_cursor *at)
{
	/* An unconsumed parent is in its child's graph, g. One that is not
	 * was consumed by another backward, whose writes to it were made
	 * under a lock we do not hold: decide by the pointer alone
	 * (compared, never followed) and leave its other fields alone. A
	 * visited parent was checked when first met. */
	if (adg_unlikely(adg_node_graph(p) != g ||
			 (p->retained_runs & refused_runs)))
		return ADG_EUNAVAILABLE;
	if (p->state == ADG_NODE_VISITING) {
		p->tape_links++;
		p->tape_pending++;
		return 0;
	}
	if (!tape_reserve_nodes(r, t, at->n + 1, at->n))
		return ADG_ENOMEM;
	adg_node_set_state(p, ADG_NODE_VISITING);
	p->tape_links = 1;
	p->tape_pending = 1;
	t->walked[at->n++] = p;
	t->sorted[at->waiting++] = p;
	return 0;
}

/* Walks from root, in graph g (locked), through unconsumed steps, marking
 * each VISITING once and counting in tape_links the tape's slots that name
 * it (and in tape_pending, for tape_order). Fills t->walked, *len, and
 * *leaves (at least the distinct leaves its slots name: a bound on the
 * leaf gradients to come), and reserves every scratch array the backward
 * will use, so that running it never allocates. A consuming walk is
 * refused where a retained pass runs (I14). On error every mark is
 * undone. */
static int tape_walk(struct adg_tape *t, struct adg_graph *g,
		     struct adg_node *root, struct tape_needs needs,
		     size_t *len, size_t *leaves)
{
	struct adg_registry *r = adg_node_registry_of(root);
	struct tape_cursor at = {0};
	struct tape_leaf_filter leaf_ids = {0};
	uint32_t most_parents = 0;
	/* The tape's ids span, for the gradient window. */
	uint64_t lo = UINT64_MAX, hi = 0;
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
	root->tape_pending = 0;
	t->walked[at.n++] = root;
	/* Depth first, the nodes met waiting in sorted (free until
	 * tape_order fills it; each is pushed once, so it holds at most at.n):
	 * a branch is walked to its end before the next, in memory order
	 * where a graph made by one thread lies, where breadth first would
	 * step through k chains joined at a root all at once. */
	t->sorted[at.waiting++] = root;
	while (at.waiting > 0 && rc == 0) {
		struct adg_node *node = t->sorted[--at.waiting];
		if (node->n_parents > most_parents)
			most_parents = node->n_parents;
		lo = node->id < lo ? node->id : lo;
		hi = node->id > hi ? node->id : hi;
		for (uint32_t k = 0; k < node->n_parents; k++) {
			uint64_t word = node->parents[k];
			struct adg_node *p = adg_parent_node(word);
			if (p == NULL) {
				/* A leaf: nothing to take. */
				tape_count_leaf(&leaf_ids, adg_parent_id(word));
				continue;
			}
			rc = tape_walk_parent(r, t, g, p, refused_runs, &at);
			if (rc != 0)
				break;
		}
	}
	if (rc == 0 &&
	    !tape_reserve_run(r, t, needs,
			      (struct tape_walked){at.n, leaf_ids.count,
						   most_parents, lo, hi}))
		rc = ADG_ENOMEM;
	if (rc != 0) {
		for (size_t i = 0; i < at.n; i++)
			adg_node_set_state(t->walked[i], ADG_NODE_LIVE);
		return rc;
	}
	t->outputs_stride = most_parents;
	*len = at.n;
	*leaves = leaf_ids.count;
	return 0;
}

/*
 * The tape's order, into t->sorted, and each node taken (consumed, out of
 * g) or, in a retained run, marked as run over: under g's lock, in one pass
 * over the nodes, which the walk left with tape_pending counting the
 * tape's slots that name each.
 *
 * A node comes after every tape node that names it as a parent (its
 * children), so its gradient is complete when its step runs: a node is
 * placed once its last child is, and the placed nodes wait on a stack.
 * Last in, first out, the order follows one branch down to where it meets
 * another before it turns to the next: k chains joined at a root run chain
 * after chain, each in the order its nodes were made, in reverse (memory
 * order, where a graph made by one thread lies), where an order by depth
 * would step through all k at once. Stable: the order depends on the
 * graph's shape and its parent slots' order alone, never on timing or
 * addresses, so gradients sum in the same order on every run.
 *
 * The walk's array is the stack (each node is pushed once, when placed,
 * and the walk's order is not read again).
 */
static void tape_order(struct adg_tape *t, struct adg_graph *g, size_t len,
		       bool retained)
{
	struct adg_node **stack = t->walked;
	size_t top = 0, placed = 0;

	stack[top++] = t->walked[0]; /* the root: named by no tape node */
	while (top > 0) {
		struct adg_node *n = stack[--top];
		t->sorted[placed++] = n;
		if (retained) {
			/* Run over, not taken: the node stays in the graph,
			 * held by its children as before, and no consuming
			 * walk takes it until adg_tape_release_retained. */
			n->retained_runs++;
			adg_node_set_state(n, ADG_NODE_LIVE);
		} else {
			/* Consumed: it holds its parents' references until
			 * the run lets go of it (adg_run_let_go). */
			adg_node_set_state(n, ADG_NODE_CONSUMED);
			adg_graph_detach_locked(g, n);
		}
		for (uint32_t k = 0; k < n->n_parents; k++) {
			struct adg_node *p = adg_node_parent(n, k);
			if (p != NULL && --p->tape_pending == 0)
				stack[top++] = p;
		}
	}
	/* I7: the counts add up, so every walked node was placed once. */
	ADG_ASSERT(placed == len);
}

/* I7: each tape node's tape_links counts the tape's parent slots that name
 * it. For the assertions only: it costs a pass over the tape. */
static inline bool tape_links_add_up(struct adg_tape *t, size_t len)
{
	uint64_t links = 0, slots = 0;
	for (size_t i = 0; i < len; i++) {
		links += t->walked[i]->tape_links;
		for (uint32_t k = 0; k < t->walked[i]->n_parents; k++)
			slots += adg_node_parent(t->walked[i], k) != NULL;
	}
	return links == slots && t->walked[0]->tape_links == 0;
}

int adg_tape_take(struct adg_run *run, struct adg_node *root)
{
	struct adg_registry *r = adg_node_registry_of(root);
	struct adg_tape *t = run->tape;
	uint32_t workers = run->mode == ADG_RUN_PARALLEL
				   ? adg_par_slots(run->executor)
				   : 0;
	/* Relaxed: set once, before any node with a record is published. */
	struct tape_needs needs = {
		.counting = run->on_ready != NULL && workers == 0,
		.checkpoints = atomic_load_explicit(&r->uses_checkpoints,
						    memory_order_relaxed),
		.marks = workers == 0,
		.workers = workers,
		.retained = run->retained,
	};
	struct adg_graph *g = adg_graph_lock_of(root);
	if (g == NULL)
		return ADG_ECONSUMED;
	size_t leaves, len = 0;
	int rc = tape_walk(t, g, root, needs, &len, &leaves);
	if (rc != 0)
		goto out_unlock; /* the walk undid its marks */
	ADG_ASSERT(tape_links_add_up(t, len));
	/* With workers, or with a window for the tape's nodes, only the
	 * leaves' gradients land in the table's entries. */
	rc = adg_grad_table_new(r, run->ops,
				workers || t->window_len != 0 ? leaves
							      : len + leaves,
				&run->grads);
	if (rc != 0)
		goto out_unmark;
	tape_order(t, g, len, run->retained);
	adg_graph_unlock(run->shard, g);
	if (needs.counting)
		tape_count_pending(t, len, run->retained);
	/* A retained backward counts no request: it frees no output. */
	if (needs.checkpoints && !run->retained)
		adg_ckpt_plan(t->sorted, len);
	run->len = len;
	return 0;

out_unmark:
	for (size_t i = 0; i < len; i++)
		adg_node_set_state(t->walked[i], ADG_NODE_LIVE);
out_unlock:
	adg_graph_unlock(run->shard, g);
	return rc;
}

/* Its nodes are all in the root's graph still: they were together in one
 * when the tape was taken, merges move a graph's members together, and
 * none can have left (nothing consumes them meanwhile, and this backward
 * holds them). */
void adg_tape_release_retained(struct adg_run *run)
{
	struct adg_tape *t = run->tape;
	struct adg_graph *g = adg_graph_lock_of(t->sorted[0]);
	ADG_ASSERT(g != NULL);
	for (size_t i = 0; i < run->len; i++) {
		struct adg_node *n = t->sorted[i];
		ADG_ASSERT(adg_node_graph(n) == g && n->retained_runs > 0);
		n->retained_runs--;
	}
	adg_graph_unlock(run->shard, g);
}
