/*
 * The checkpointing record (checkpoint.c): what a node offers and what its
 * step will ask for, and the calls that plan, serve and drop them around a
 * backward. The deferred output's inline check reads the shard
 * (internal.h). Rules: I30 to I32 in docs/concurrency.md.
 */
#ifndef ADG_CHECKPOINT_H
#define ADG_CHECKPOINT_H

#include "internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* The slot of a node made with options (ADG_NODE_F_CKPT_SLOT). */
static inline struct adg_ckpt **adg_node_ckpt_slot(const struct adg_node *n)
{
	ADG_ASSERT((n->flags & ADG_NODE_F_CKPT_SLOT) != 0);
	return (struct adg_ckpt **)((uintptr_t)n + adg_node_size(n->n_parents));
}

/* The node's checkpointing record, or NULL. */
static inline struct adg_ckpt *adg_node_ckpt(const struct adg_node *n)
{
	if ((n->flags & ADG_NODE_F_CKPT_SLOT) == 0)
		return NULL;
	return *adg_node_ckpt_slot(n);
}

/* A node's part in checkpointing: the output it offers, and the outputs its
 * step will ask for. Touched only by whoever owns the node: its creator,
 * the backward that took it, or the thread that frees it. */
struct adg_ckpt {
	bool memory_bound;
	/* The output, while held. Retained passes, which may share the
	 * record, read it with acquire loads and publish one with a compare
	 * and swap; the record's owner uses it as it likes. */
	void *value;
	void (*free)(void *value, void *ctx);
	void *free_ctx;
	adg_recompute_fn recompute;
	/* During a backward: requests still to serve. 64 bits: one per
	 * want slot of every tape child, and a slot count is 32 bits. */
	uint64_t pending;
	/* During a backward: the take planned to rebuild the output, and it
	 * has not been rebuilt yet; see ckpt_serve. */
	bool rebuild_planned;
	/* With an executor's workers: the run (its output lock's address)
	 * rebuilding the output now, or NULL; atomic, since retained passes
	 * share the record. Others of that run that need the output sleep
	 * until it is there (see checkpoint.c). */
	const void *builder;
	/* A value let go of under the run's output lock, to free once it is
	 * released, and the next such record (struct adg_drops). */
	void *dropped;
	struct adg_node *drop_next;
	struct adg_node *unbuilt_next; /* ckpt_serve's work list */
	bool want_self;
	uint32_t n_want_parents;
	uint32_t want_parents[]; /* parent slots */
};

/* Outputs let go of while a run's output lock is held, to free once it is
 * released (an output's free is the caller's code): a list through their
 * records. */
struct adg_drops {
	struct adg_node *head;
};

/* Frees every output on drops, with no lock held. */
void adg_ckpt_free_drops(struct adg_drops *drops);

/* What adg_output_get needs of the backward that runs the step. */
struct adg_backward_context {
	struct adg_node *node;	 /* whose step runs */
	struct adg_node **stack; /* recompute's work list, tape-sized */
	/* A recompute's parent outputs: room for the most parents a tape
	 * node has, reserved when the tape was taken, so that adg_output_get
	 * never allocates. */
	void **outputs;
	/* And their ids, the recompute call's parent_ids: as many. */
	uint64_t *ids;
	/* With an executor's workers: held around every use of the records
	 * and of stack, which the backward's workers share, and never across
	 * a recompute (outputs is the worker's own); rebuilt is signalled
	 * when a rebuild ends. NULL on one thread. */
	pthread_mutex_t *serialize;
	pthread_cond_t *rebuilt;
	/* A retained backward: no request is counted or served, and an
	 * output it rebuilds is published for the passes after it (and
	 * those running beside it: see checkpoint.c). */
	bool retained;
};

/* adg_op_with: checks options against the parents and attaches a record
 * to node (not yet placed). Returns 0, ADG_EINVAL or ADG_ENOMEM, with its
 * reason naming func (the public function called); on error nothing was
 * taken. */
int adg_ckpt_attach(struct adg_node *node, adg_node *const *parents,
		    const adg_op_options *options, const char *func);

/* Once an op with a record is placed: applies the registry's strategy to
 * its output. An output the strategy drops leaves the record at once but
 * is freed later: it becomes shard's deferred output (shard is the
 * caller's own, and has none: the caller freed it). */
void adg_ckpt_commit(struct adg_shard *shard, struct adg_node *node);

/* Frees shard's deferred output, if any: when the owner's next op or
 * backward succeeds, and when the registry goes. */
void adg_ckpt_free_deferred_slow(struct adg_shard *shard);

static inline void adg_ckpt_free_deferred(struct adg_shard *shard)
{
	if (adg_unlikely(shard->deferred.value != NULL))
		adg_ckpt_free_deferred_slow(shard);
}

/* After a tape is taken: counts its requests and frees what none needs. */
void adg_ckpt_plan(struct adg_node **tape, size_t len);

/* After the step of a tape node with a record returned: its requests are
 * served. With drops, under the run's output lock: the outputs let go of
 * are freed by adg_ckpt_free_drops after it. */
void adg_ckpt_served(struct adg_node *node, struct adg_drops *drops);

/* At the end of a backward, or when a node with a record goes: frees the
 * record and what is left of its output. */
void adg_ckpt_drop(struct adg_node *node);

#endif /* ADG_CHECKPOINT_H */
