/*
 * A backward's tape (tape.c): the steps reachable from its root, taken
 * from the root's graph under its lock and ordered each after its
 * children, and the scratch arrays a thread's backward passes reuse (kept
 * on its shard). The runners (run.h) read it.
 */
#ifndef ADG_TAPE_H
#define ADG_TAPE_H

#include "internal.h"

struct adg_ready_queue;
struct adg_run;

/* An entry of the tape's id table: a leaf's contributions still to come,
 * for the ready hook; with an executor, also the leaf's index in the
 * scheduler's arrays. A retained backward keys its tape's nodes here too
 * (their counts, or with an executor their positions), since it may not
 * write them (I14). */
struct adg_tape_key {
	uint64_t id; /* 0: empty */
	uint32_t pending;
	uint32_t index;
};

/* The scheduler's arrays (parallel.c), one allocation carved in parts:
 * per tape position, per edge (a tape node's parent slot, numbered in
 * tape order) and per target (a tape position, or a leaf after them). */
struct adg_par_arrays {
	uint32_t *edge_base;   /* position -> its first edge; len + 1 */
	void **edge_value;     /* what the step gave for the slot */
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

/* How many parent ids a step's call finds in its thread's inline array
 * (struct adg_run_thread); a node of more takes the tape's ids. */
#define ADG_RUN_INLINE_IDS 8

/* Scratch arrays, reused by a thread's backward passes. All from the
 * registry's allocator. */
struct adg_tape {
	/* In walk order; then tape_order's stack; then free for a run. */
	struct adg_node **walked;
	/* The walk's stack; then the tape, each node after its children. */
	struct adg_node **sorted;
	size_t nodes_cap;
	/* With a ready hook or an executor: open addressing by id, a power
	 * of two. */
	struct adg_tape_key *keys;
	size_t keys_cap;
	/* With checkpointing: a recompute's parent outputs, as many as the
	 * most parents a tape node has (outputs_stride), once per worker slot
	 * with an executor's workers: a worker fills its own while no lock
	 * is held. */
	void **outputs;
	size_t outputs_cap;
	size_t outputs_stride;
	/* A step's parent ids (adg_step_call.parent_ids) for a node of more
	 * parents than the inline array of struct adg_run_thread holds: as
	 * many as the most parents a tape node has (ids_stride), once per
	 * worker slot; ids_stride 0 when no tape node needs it. */
	uint64_t *ids;
	size_t ids_cap;
	size_t ids_stride;
	/* With checkpointing: a recompute's parent ids, outputs_stride per
	 * worker slot, as outputs (a recompute runs inside a step, whose
	 * ids must stay as they are). */
	uint64_t *recompute_ids;
	size_t recompute_ids_cap;
	/* On one thread: one step's marks of the parent slots it gave (struct
	 * adg_step_out), as many as the most parents a tape node has. */
	void **marks;
	size_t marks_cap;
	/* On one thread: the gradient window (tape_reserve_window), slots
	 * all NULL between runs, and the span this tape uses of it. */
	void **window;
	size_t window_cap;
	uint64_t window_lo;
	size_t window_len;
	/* With an executor's workers: the block behind par, in bytes, and
	 * the edges it was carved for. */
	void *par_block;
	size_t par_cap;
	size_t par_edges;
	struct adg_par_arrays par;
};

static inline struct adg_tape_key *adg_tape_key(struct adg_tape *t, uint64_t id)
{
	size_t mask = t->keys_cap - 1;
	/* The hash's bits from 20 up, masked to the table: a capacity that
	 * grows needs no shift kept beside it. */
	size_t i = (size_t)adg_id_hash(id, 20) & mask;
	while (t->keys[i].id != 0 && t->keys[i].id != id)
		i = (i + 1) & mask;
	return &t->keys[i];
}

/* Takes run's tape from root's graph (root not a leaf) into run->tape,
 * sets run->len and creates run->grads sized for it; a retained run marks
 * it as run over instead (I14). Reserves every scratch array the run will
 * use, so that running never allocates. On error nothing is taken:
 * ADG_ECONSUMED, ADG_EUNAVAILABLE or ADG_ENOMEM. */
int adg_tape_take(struct adg_run *run, struct adg_node *root);

/* After a retained run: its nodes may be consumed again. */
void adg_tape_release_retained(struct adg_run *run);

/* parallel.c: reserves the scheduler's arrays for a tape of len nodes,
 * edges parent slots (naming at most `leaves` distinct leaves) and n_slots
 * workers. All or nothing; false on failure or when an index would not
 * fit in 32 bits. */
bool adg_par_reserve(struct adg_registry *r, struct adg_tape *t, size_t len,
		     size_t edges, size_t leaves, uint32_t n_slots);

/* Releases tape scratch (a shard's, or a nested backward's own). */
void adg_tape_free(struct adg_registry *registry, struct adg_tape *tape);

#endif /* ADG_TAPE_H */
