/*
 * A sequential reference model of one libadg registry, for the differential
 * fuzzer (tests/fuzz/). Plain arrays indexed by node id, recomputed from the
 * definitions wherever that is simpler than keeping state: slow on purpose,
 * so that it is easy to check by reading.
 *
 * It follows one thread's view: ids are handed out 1, 2, 3, ... and every
 * operation it is given is valid (the caller holds each node it names).
 */
#ifndef ADG_TEST_MODEL_H
#define ADG_TEST_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MODEL_MAX_PARENTS 3
/* Ids 1..MODEL_MAX_NODES; the fuzzer creates at most one node per op. */
#define MODEL_MAX_NODES 1024

/* model_backward's result when a step failed: libadg then returns that
 * step's own code, which the model leaves to the caller to check. */
#define MODEL_STEP_FAILED 1

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
};

struct model {
	struct model_node node[MODEL_MAX_NODES + 1];
	uint64_t next_id;
	uint64_t merges;
	uint64_t nodes_freed;
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
	/* 0, ADG_ECONSUMED, ADG_EUNAVAILABLE or MODEL_STEP_FAILED. */
	int rc;
	/* MODEL_STEP_FAILED: the depth of the deepest failing step. The first
	 * step to fail is one of the failing tape nodes at this depth (which
	 * one depends on the order within a depth, which libadg leaves
	 * open); every tape node deeper ran, none shallower did. */
	uint32_t fail_depth;
	/* The non-leaf nodes the backward takes (0 or EUNAVAILABLE: none). */
	bool on_tape[MODEL_MAX_NODES + 1];
	/* The final gradient of every id that receives one, as if every step
	 * ran: what the hook sees; unless the hook took it, what a tape
	 * node's step is called with and what the container holds for a
	 * leaf. Without has_grad, they get NULL and the container holds
	 * nothing for it. */
	bool has_grad[MODEL_MAX_NODES + 1];
	uint64_t grad[MODEL_MAX_NODES + 1];
	/* With a hook: the ids it is called for (once each, on success), and
	 * those whose gradient it takes. */
	bool fires[MODEL_MAX_NODES + 1];
	bool taken[MODEL_MAX_NODES + 1];
	/* rc 0: how many gradients the container holds (the leaves'). */
	size_t n_leaf_grads;
};

void model_init(struct model *m);

/* Creates a leaf with one handle; returns its id. */
uint64_t model_leaf(struct model *m, uint64_t value);

/* Creates a node from n (1..MODEL_MAX_PARENTS) live parents, with one
 * handle; returns its id. fails: its step will fail when run. */
uint64_t model_op(struct model *m, const uint64_t *parents, size_t n,
		  bool fails);

void model_ref(struct model *m, uint64_t id);
/* Drops one handle, then frees whatever no longer has a reference. */
void model_unref(struct model *m, uint64_t id);

/* What adg_node_graph_id reports for a live node. */
uint64_t model_graph_id(const struct model *m, uint64_t id);

void model_stats(const struct model *m, struct model_stats *out);

/* Whether the node's step has been released (run, or freed unrun). */
bool model_step_released(const struct model *m, uint64_t id);

/* Runs a backward from root (live) with the given seed value, and with a
 * ready hook unless hook is NULL. */
void model_backward(struct model *m, uint64_t root, uint64_t seed,
		    const struct model_hook *hook, struct model_backward *out);

#endif
