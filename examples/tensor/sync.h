/* The glue between a data-parallel trainer and libadg's gradient reducer
 * (adg_reducer), whatever its gradients are: the reducer of a model's
 * parameters, what each participant (a thread with its share of every
 * batch) holds, and the backward it runs in a round. The trainers of
 * examples/digits and examples/fashion use it through runner.c, with
 * tensors as gradients; examples/mpi_data_parallel.c directly, with boxed
 * doubles. It needs neither BLAS nor the tensor layer.
 *
 * A round, on each participant's thread:
 *
 *	rc = record the graph of this thread's share of the batch;
 *	if (rc == 0)
 *		rc = backward_hooked(registry, loss, seed, &grad_ops,
 *				     &p->backward);
 *	rc = adg_reducer_end(p->reducer, p->index, rc);
 *
 * adg_reducer_end returns once every parameter is updated, or the round's
 * first error on every participant. */
#ifndef EXAMPLES_SYNC_H
#define EXAMPLES_SYNC_H

#include <adg.h>
#include <stddef.h>
#include <stdint.h>

/* Makes *out, the reducer of n_params parameters for n_participants
 * threads: ids[i] is parameter i's leaf, the one ops->apply's r->param
 * names i. A parameter of at least slice_from elements (elements[i]) is
 * summed and updated in one slice per participant, by all of them, so
 * that no one thread sums and updates a large layer while the others wait
 * (ops->add_slice folds a slice); with slice_from 0, or elements NULL,
 * every parameter is whole. Returns 0 or an ADG_E* code. */
int sync_reducer_new(const adg_reducer_ops *ops, size_t n_participants,
		     const uint64_t *ids, const size_t *elements,
		     size_t n_params, size_t slice_from, adg_reducer **out);

/* A participant's thread: its place in the reducer, and the options of its
 * backward passes, whose ready hook hands each parameter's gradient to the
 * reducer as soon as it is final (an executor may be added there). */
struct sync_participant {
	adg_reducer *reducer;
	size_t index; /* 0 to T - 1: its place in the sums' order */
	adg_backward_options backward;
};

/* Makes p participant index of reducer. Returns 0 or ADG_EINVAL. */
int sync_participant_init(struct sync_participant *p, adg_reducer *reducer,
			  size_t index);

/* Runs the backward from loss with seed (d loss / d loss, taken) whose
 * options' ready hook takes every parameter's gradient (a reducer's, or
 * one that applies it), then frees the container, which holds what the
 * hook left: the gradients of leaves that are not parameters. Returns 0 or
 * an ADG_E* code. */
int backward_hooked(adg_registry *registry, adg_node *loss, void *seed,
		    const adg_grad_ops *ops,
		    const adg_backward_options *options);

#endif /* EXAMPLES_SYNC_H */
