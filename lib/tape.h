/*
 * What backward.c (taking a tape, running it on one thread) and parallel.c
 * (running it on several) share: the tape's scratch arrays, reused by a
 * thread's backward passes, and the ready hook.
 */
#ifndef ADG_TAPE_H
#define ADG_TAPE_H

#include "internal.h"

#include <time.h>

struct adg_par_ticket;
struct adg_ready_queue;

/* A leaf's contributions still to come, for the ready hook; with an
 * executor, also the leaf's index in the scheduler's arrays. A retained
 * backward keys its tape's nodes here too (their counts, or with an
 * executor their positions), since it may not write them (I14). */
struct leaf_pending {
	uint64_t id; /* 0: empty slot */
	uint32_t pending;
	uint32_t index;
};

/* The scheduler's arrays (parallel.c), one allocation carved in parts:
 * per tape position, per edge (a tape node's parent slot, numbered in
 * tape order) and per target (a tape position, or a leaf after them). */
struct adg_par_arrays {
	uint32_t *edge_base;   /* position -> its first edge; len + 1 */
	void **edge_value;     /* what the step registered for the slot */
	uint32_t *edge_target; /* edge -> target */
	uint32_t *in_next;     /* next edge of the same target, in order */
	uint32_t *in_head;     /* target -> its first edge */
	uint32_t *last;	       /* target -> its last contributor's position */
	_Atomic uint32_t *pending; /* target -> edges still to deliver */
	void **grad;		   /* target -> its gradient, as folded */
	uint8_t *state;	      /* target -> WAITING, FOLDED, POISONED, RAN */
	uint32_t *next_ready; /* position -> next in its ready queue */
	uint64_t *leaf_id;    /* leaf index -> id */
	struct adg_ready_queue *queues; /* one per worker slot */
};

/* Scratch arrays, reused by a thread's backward passes (kept on its shard).
 * All from the registry's allocator. */
struct adg_tape {
	struct adg_node **walked; /* in walk order */
	struct adg_node **sorted; /* deepest first, walk order within a depth */
	size_t *per_depth;	  /* counting-sort buckets */
	size_t nodes_cap;
	size_t depth_cap;
	/* With a ready hook or an executor: open addressing by leaf id, a
	 * power of two. */
	struct leaf_pending *leaves;
	size_t leaves_cap;
	/* With checkpointing: a recompute's parent outputs, as many as the
	 * most parents a tape node has (outputs_stride), once per worker slot
	 * with an executor's workers: a worker fills its own while no lock
	 * is held. */
	void **outputs;
	size_t outputs_cap;
	size_t outputs_stride;
	/* With an executor that offers no worker: one step's parent slots,
	 * as many as the most parents a tape node has. */
	void **slots;
	size_t slots_cap;
	/* With an executor's workers: the block behind par, in bytes, and
	 * the edges it was carved for. */
	void *par_block;
	size_t par_cap;
	size_t par_edges;
	struct adg_par_arrays par;
};

/* What a step's view of the gradients knows (struct adg_grads.sink): its
 * node and its parent slots, one registration each. With workers the
 * slots are the step's edges; alone, scratch that marks the slots used,
 * while the values go to the container at once. */
struct adg_step_sink {
	const struct adg_node *node;
	void **slots;
	const adg_grad_ops *ops;
	/* Alone: where registrations go at once, and the first error. */
	struct adg_alone *alone;
	/* Every slot below this one holds a registration: the next one for
	 * a parent goes to the first empty slot naming it, at or after. */
	uint32_t filled;
	/* Alone: the slots from filled on were cleared for marks, once a
	 * registration came out of slot order. Until then none is read. */
	bool marked;
};

/* A backward on an executor that offers no worker (backward.c): its
 * container, and its first error by key (see parallel.c). */
struct adg_alone {
	adg_grads *grads;
	const struct adg_tape *tape;
	size_t len;
	uint64_t err_key;
	int rc;
};

/* backward.c: adding a registration into id's gradient failed with rc, in
 * a backward running alone. */
void adg_alone_add_failed(struct adg_alone *alone, uint64_t id, int rc);

/* The slot a step's registration for id goes to: the first empty one
 * naming id, so that a parent's slots fill in the order of its
 * registrations; UINT32_MAX when id is not a parent or its slots are all
 * taken. Every slot below sink->filled is taken. */
static inline uint32_t adg_sink_claim(struct adg_step_sink *sink, uint64_t id,
				      void *value)
{
	const struct adg_node *n = sink->node;
	const uint64_t *ids = adg_node_parent_ids(n);
	void **slot = sink->slots;
	uint32_t k = sink->filled, end = n->n_parents;

	/* Most steps register in slot order: slot k is then the one. */
	if (adg_likely(k < end && ids[k] == id)) {
		uint32_t claimed = k;
		slot[k] = value;
		do
			k++;
		while (k < end && slot[k] != NULL);
		sink->filled = k;
		return claimed;
	}
	while (k < end && (ids[k] != id || slot[k] != NULL))
		k++;
	if (k == end)
		return UINT32_MAX;
	slot[k] = value;
	return k;
}

/* on_step (adg_backward_options): fn NULL when none. */
struct step_hook {
	adg_step_hook_fn fn;
	void *ctx;
};

static inline uint64_t adg_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Runs n's step, between the two on_step calls when there is a hook.
 * Returns the step's result, or the hook's code: a refusal before the
 * step means the step does not run, and stops the backward as the
 * step's failure would. */
static inline int adg_step_run(const struct step_hook *h, struct adg_node *n,
			       adg_step_call *call)
{
	if (adg_likely(h->fn == NULL))
		return adg_callback_result(
			n->step.backward(call, n->step.user));
	adg_step_event event = {.node_id = n->id, .name = n->step.name};
	int rc = adg_callback_result(h->fn(&event, h->ctx));
	if (rc != 0)
		return rc;
	uint64_t start = adg_now_ns();
	int step_rc = adg_callback_result(n->step.backward(call, n->step.user));
	event.after = 1;
	event.duration_ns = adg_now_ns() - start;
	event.result = step_rc;
	rc = adg_callback_result(h->fn(&event, h->ctx));
	return step_rc != 0 ? step_rc : rc;
}

/* The hook of one backward, if any. */
struct ready {
	adg_ready_fn fn;
	void *ctx;
	bool leaves_only;
};

static inline struct leaf_pending *leaf_slot(struct adg_tape *t, uint64_t id)
{
	size_t mask = t->leaves_cap - 1;
	size_t i = (size_t)((id * UINT64_C(0x9e3779b97f4a7c15)) >> 20) & mask;
	while (t->leaves[i].id != 0 && t->leaves[i].id != id)
		i = (i + 1) & mask;
	return &t->leaves[i];
}

/* parallel.c: reserves the scheduler's arrays for a tape of len nodes,
 * edges parent slots (leaf_slots of them naming leaves) and n_slots
 * workers. All or nothing; false on failure or when an index would not
 * fit in 32 bits. */
bool adg_par_reserve(struct adg_registry *r, struct adg_tape *t, size_t len,
		     size_t edges, size_t leaf_slots, uint32_t n_slots);

/* parallel.c: runs a taken tape (sorted, checkpoints planned) on the
 * calling thread and the executor's workers (at least one); as run() in
 * backward.c, but leaf gradients land in grads at the end. The run lets
 * go of ticket (from adg_par_ticket_new). */
int adg_par_run(struct adg_shard *shard, struct adg_tape *t, size_t len,
		void *seed, const adg_grad_ops *ops, const struct ready *ready,
		const struct step_hook *step_hook, adg_grads *grads,
		const adg_executor *executor, bool retained,
		struct adg_par_ticket *ticket);

/* A backward's handle for the jobs it submits, which may outlive it and
 * its registry: allocated before the tape is taken, so that running never
 * allocates. */
struct adg_par_ticket *adg_par_ticket_new(void);
void adg_par_ticket_put(struct adg_par_ticket *ticket);

/* How many worker slots an executor needs: the caller's and its workers'. */
static inline uint32_t adg_par_slots(const adg_executor *e)
{
	return 1 + e->n_workers;
}

#endif /* ADG_TAPE_H */
