/*
 * A sequential reference model of one libadg registry, for the differential
 * fuzzer (tests/fuzz/). Plain arrays indexed by node id, recomputed from the
 * definitions wherever that is simpler than keeping state: slow on purpose,
 * so that it is easy to check by reading.
 *
 * It follows one thread's view: ids are handed out 1, 2, 3, ... and every
 * operation it is given is valid (the caller holds each node it names).
 *
 * Checkpointing (adg_op_with) is modelled by what exists when: whether each
 * node's output is held, and how many times its free and its recompute have
 * run. A backward is followed step by step, in the order libadg runs them
 * (model_step_begin and the calls after it), since which outputs are held
 * at a given moment depends on that order.
 *
 * A backward with an executor runs its steps in an order that depends on
 * timing, and several at once: the fuzzer then cannot report them to the
 * model one by one. It checks each step against what does not depend on
 * the order (model_get_fails), and afterwards has the model run the tape
 * as the sequential backward would (model_run_tape): what a successful
 * backward leaves does not depend on the order, and of a failed one the
 * first failure in tape order and what came before it do not either.
 *
 * A retained backward (adg_backward_options.retain) is the same backward
 * with two things left out: nothing is consumed (no node leaves its graph,
 * no step is released, nothing is collected), and no output is freed, not
 * at the take, not as steps return, not at the end, failed or not. What it
 * rebuilds stays held for the passes after it, and each output is rebuilt
 * at most once in it, since nothing it holds goes before it ends. The
 * tape, its order, the gradients and the failures are those of a
 * consuming backward from the same root at the same moment.
 */
#ifndef ADG_TEST_MODEL_H
#define ADG_TEST_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MODEL_MAX_PARENTS 3
/* Parent slots a step asks for; repeats allowed. */
#define MODEL_MAX_WANTS 3
/* Ids 1..MODEL_MAX_NODES; the fuzzer creates at most one node per op. */
#define MODEL_MAX_NODES 1024

/* What an op made with adg_op_with offers and asks for. All false and
 * empty: a plain op (adg_op). */
struct model_output {
	bool value;	      /* offers the value its forward computed */
	bool recompute;	      /* offers a recompute callback */
	bool memory_bound;    /* the balanced strategy may drop the value */
	bool recompute_fails; /* its recompute callback fails when it runs */
	/* ... having set an output first, which libadg then frees */
	bool recompute_sets_output;
	bool want_self; /* its step asks for its own output */
	size_t n_want;
	uint32_t want[MODEL_MAX_WANTS]; /* parent slots its step asks for */
	/* Its step calls adg_output_get for each of them; false: it asks in
	 * adg_op_with, and then never gets any. */
	bool gets;
};

struct model_node {
	bool exists;   /* created (ids below next_id) */
	bool alive;    /* not freed */
	bool leaf;     /* no parents, no step */
	bool consumed; /* its step was taken by a backward */
	bool fails;    /* its step fails when it runs */
	uint64_t value;
	uint32_t depth;
	size_t n_parents;
	uint64_t parents[MODEL_MAX_PARENTS]; /* ids, repeats kept */
	uint64_t graph;	  /* origin of its graph; 0 for leaves, consumed */
	uint64_t handles; /* the caller's references */
	struct model_output out;
	uint64_t runs;	     /* times its step began, over every backward */
	bool held;	     /* an output value of this node exists */
	uint64_t frees;	     /* output values freed so far */
	uint64_t recomputes; /* recompute callbacks run so far */
};

struct model {
	struct model_node node[MODEL_MAX_NODES + 1];
	int checkpointing; /* enum adg_checkpointing */
	uint64_t next_id;
	uint64_t merges;
	uint64_t nodes_freed;
	/* The node whose output the balanced strategy dropped at its op but
	 * that is still its forward's, alive outside the node, until the next
	 * op or backward that succeeds; 0: none. */
	uint64_t deferred;
};

/* The fields of struct adg_stats, as the model sees them. */
struct model_stats {
	uint64_t live_nodes;
	uint64_t live_steps;
	uint64_t live_graphs;
	uint64_t merges;
	uint64_t nodes_freed;
};

/* A gradient-ready hook (adg_backward_with): it is called for each node
 * whose gradient is final, and may take that gradient. */
struct model_hook {
	bool leaves_only; /* called for leaves only */
	/* takes[id]: the hook takes id's gradient when it has one. */
	const bool *takes;
};

struct model_backward {
	/* A retained backward: it consumes nothing and frees no output. */
	bool retained;
	/* 0 (the tape is taken and its steps run: see failed_step for the
	 * outcome), ADG_ECONSUMED or ADG_EUNAVAILABLE. */
	int rc;
	/* The non-leaf nodes the backward takes (with a nonzero rc: none). */
	bool on_tape[MODEL_MAX_NODES + 1];
	/* The tape in the order the sequential backward runs it: each node
	 * after its children, placed once its last child is, the placed
	 * taken last in, first out, parents pushed in slot order (model.c),
	 * so that it depends on the graph's shape alone. An executor's
	 * backward reports the failure that comes first in this order. pos:
	 * each tape node's index in tape. */
	uint64_t tape[MODEL_MAX_NODES];
	size_t n_tape;
	size_t pos[MODEL_MAX_NODES + 1];
	/* The final gradient of every id that receives one, as if every step
	 * ran: what the hook sees; unless the hook took it, what a tape
	 * node's step is called with and what the container holds for a
	 * leaf. Without has_grad, they get NULL and the container holds
	 * nothing for it. A step that gets outputs adds their values to each
	 * gradient it gives (model_fold). */
	bool has_grad[MODEL_MAX_NODES + 1];
	uint64_t grad[MODEL_MAX_NODES + 1];
	/* With a hook: the ids it is called for (once each, on success), and
	 * those whose gradient it takes. */
	bool fires[MODEL_MAX_NODES + 1];
	bool taken[MODEL_MAX_NODES + 1];
	/* rc 0: how many gradients the container holds (the leaves'). */
	size_t n_leaf_grads;

	/* Checkpointing, fixed when the tape is taken. A node is needed when
	 * a step of the tape asks for its output, or a needed node that has
	 * none held must be rebuilt from it; that rebuild is planned. */
	bool needed[MODEL_MAX_NODES + 1];
	bool planned[MODEL_MAX_NODES + 1];
	uint64_t freed_at_take; /* held outputs no one needed (retained: 0) */
	/* Which outputs of the tape were held once the take was done. */
	bool held_at_take[MODEL_MAX_NODES + 1];

	/* As the steps run. A step has begun (ran) and returned (done); a
	 * node's output was rebuilt (built). */
	bool ran[MODEL_MAX_NODES + 1];
	bool done[MODEL_MAX_NODES + 1];
	bool built[MODEL_MAX_NODES + 1];
	/* The first step to fail, 0 while none has; and the node whose
	 * recompute made it fail, 0 when the step failed on its own. Then
	 * libadg runs no further step and returns that failure's code. */
	uint64_t failed_step;
	uint64_t failed_recompute;
	/* model_backward_end: outputs still held at the end, freed there
	 * (retained: none is). */
	uint64_t freed_at_end;
};

/* A fresh registry with this checkpointing strategy. */
void model_init(struct model *m, int checkpointing);

/* Creates a leaf with one handle; returns its id. */
uint64_t model_leaf(struct model *m, uint64_t value);

/* Creates a node from n (1..MODEL_MAX_PARENTS) live parents, with one
 * handle; returns its id. fails: its step will fail when run. */
uint64_t model_op(struct model *m, const uint64_t *parents, size_t n,
		  bool fails);

/* The same with adg_op_with: sets *rc to 0, or to ADG_EINVAL when libadg
 * must refuse the options (then nothing changes: no node is made and no
 * id used up). Returns the id, 0 when refused. */
uint64_t model_op_with(struct model *m, const uint64_t *parents, size_t n,
		       bool fails, const struct model_output *out, int *rc);

/* Whether the step of node step asked for the output of node target (so
 * adg_output_get serves it; otherwise it returns ADG_EINVAL). */
bool model_asks(const struct model *m, uint64_t step, uint64_t target);

/* How many outputs of id are alive: the one its node holds, and one the
 * balanced strategy dropped and its forward still has (model.deferred). */
unsigned model_outputs_alive(const struct model *m, uint64_t id);
/* A backward succeeded: the dropped output its forward still had goes. */
void model_free_deferred(struct model *m);

void model_ref(struct model *m, uint64_t id);
/* Drops one handle, then frees whatever no longer has a reference. */
void model_unref(struct model *m, uint64_t id);

/* What adg_node_graph_id reports for a live node. */
uint64_t model_graph_id(const struct model *m, uint64_t id);

void model_stats(const struct model *m, struct model_stats *out);

/* Whether the node's step has been released (run, or freed unrun). */
bool model_step_released(const struct model *m, uint64_t id);

/* Runs a backward from root (live) with the given seed value, and with a
 * ready hook unless hook is NULL: takes the tape (consuming its nodes and
 * freeing the outputs no step needs, unless retain) and fills *out. With
 * out->rc 0 the steps then run, reported one by one with the calls below,
 * and model_backward_end closes it. retain: a retained backward (above). */
void model_backward(struct model *m, uint64_t root, uint64_t seed,
		    const struct model_hook *hook, bool retain,
		    struct model_backward *out);

/* The step of id (on the tape, not yet run) begins. */
void model_step_begin(struct model *m, struct model_backward *b, uint64_t id);

/* The step running calls adg_output_get for target, which it asked for.
 * Returns 0 when libadg must hand out the output (rebuilding what it has
 * to), or the node whose recompute fails on the way: the get then fails
 * with that callback's code. */
uint64_t model_output_get(struct model *m, struct model_backward *b,
			  uint64_t step, uint64_t target);

/* The step of id returned. */
void model_step_end(struct model *m, struct model_backward *b, uint64_t id);

/* What model_output_get would return for target, in any order of the
 * steps and with any of them running at once, read from the tape as taken
 * and changing nothing: a get rebuilds what was not held at the take, its
 * parents first in slot order, and a rebuild that succeeded leaves
 * nothing below it that fails. So the node whose recompute fails first on
 * that walk is the one, whichever step got there first. */
uint64_t model_get_fails(const struct model *m, const struct model_backward *b,
			 uint64_t target);

/* Runs the steps of backward b (rc 0, none run yet) as the sequential
 * backward does: in tape order, each getting the outputs it asks for (its
 * own, then its slots in order, up to the first get that fails), up to
 * and including the first step that fails. For a backward whose steps
 * could not be reported one by one (an executor's): afterwards b holds
 * what ran and failed, and the outputs are where the sequential backward
 * leaves them. */
void model_run_tape(struct model *m, struct model_backward *b);

/* After a failed backward with an executor and model_backward_end: steps
 * after the first failure in tape order that had already started ran too
 * (runs more begins of the step of node id of b's tape), and their
 * rebuilds (of outputs of node id) added frees and recomputes that the
 * sequential run does not have. The model takes them as reported: those
 * counts depend on timing. held: whether id's output is held now; a
 * consuming backward has freed them all (false), a retained one keeps
 * what the late rebuilds made. */
void model_backward_late(struct model *m, const struct model_backward *b,
			 uint64_t id, uint64_t runs, uint64_t frees,
			 uint64_t recomputes, bool held);

/* The backward returned: the outputs its tape still held are freed
 * (retained: kept). */
void model_backward_end(struct model *m, struct model_backward *b);

/* What the step of id adds to each gradient it gives: the sum of the
 * outputs it gets (none unless it gets them), at their true values. */
uint64_t model_fold(const struct model *m, uint64_t id);

#endif
