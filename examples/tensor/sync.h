/* The glue between a data-parallel trainer and libadg's gradient reducer
 * (adg_reducer), whatever its gradients are: the reducer of a model's
 * parameters, what each participant (a thread) holds, the round it runs,
 * and the backward it runs for each unit. The trainers of examples/digits
 * and examples/fashion use it through runner.c, with tensors as
 * gradients; examples/mpi_data_parallel.c directly, with boxed doubles.
 * It needs neither BLAS nor the tensor layer.
 *
 * A round, on each participant's thread (sync_round):
 *
 *	while (adg_reducer_next_unit(p->reducer, p->index, &u) == 0 &&
 *	       u != ADG_REDUCER_NO_UNIT) {
 *		rc = record the graph of unit u;
 *		if (rc == 0)
 *			rc = backward_hooked(registry, loss, seed, &grad_ops,
 *					     &p->backward);
 *		adg_reducer_unit_end(p->reducer, p->index, rc);
 *	}
 *	rc = adg_reducer_end(p->reducer, p->index, 0);
 *
 * adg_reducer_end returns once every parameter is updated, or the round's
 * first error on every participant. The units are the trainer's: fixed by
 * the batch and its settings, never by the number of threads, so that the
 * sums, folded in a tree over unit indices, are the same bits at any T. */
#ifndef EXAMPLES_SYNC_H
#define EXAMPLES_SYNC_H

#include <adg.h>
#include <stddef.h>
#include <stdint.h>

/* Makes *out, the reducer of o (o->param_slices NULL) with slices added:
 * a parameter of at least slice_from elements (elements[i], parameter i
 * being o->param_ids[i]) is summed and updated in one slice per
 * participant, by all of them, so that no one thread sums and updates a
 * large layer while the others wait (o->ops.add_slice folds a slice);
 * with slice_from 0, or elements NULL, every parameter is whole. Slices
 * change no bit of a sum. Returns 0 or an ADG_E* code. */
int sync_reducer_new(const adg_reducer_options *o, const size_t *elements,
		     size_t slice_from, adg_reducer **out);

/* A participant's thread: its place in the reducer, and the options of its
 * backward passes, whose ready hook hands each parameter's gradient to the
 * reducer as soon as it is final (an executor may be added there). */
struct sync_participant {
	adg_reducer *reducer;
	size_t index; /* 0 to T - 1 */
	int units;    /* whether the reducer deals units (n_units > 0) */
	adg_backward_options backward;
};

/* Makes p participant index of reducer; units: whether the reducer was
 * made with n_units > 0. Returns 0 or ADG_EINVAL. */
int sync_participant_init(struct sync_participant *p, adg_reducer *reducer,
			  size_t index, int units);

/* One round of participant p. With units, for each unit the reducer deals
 * p: train(unit, ctx), which records the unit's graph and runs its
 * backward with p->backward, then ends the unit with train's result.
 * Without units, train(p->index, ctx) once: p's share of the batch. Then
 * adg_reducer_end. Returns 0 when the round was applied whole, else the
 * round's first error (the same on every participant). */
int sync_round(struct sync_participant *p, int (*train)(size_t unit, void *ctx),
	       void *ctx);

/* Runs the backward from loss with seed (d loss / d loss, taken) whose
 * options' ready hook takes every parameter's gradient (a reducer's, or
 * one that applies it), then frees the container, which holds what the
 * hook left: the gradients of leaves that are not parameters. Returns 0 or
 * an ADG_E* code. */
int backward_hooked(adg_registry *registry, adg_node *loss, void *seed,
		    const adg_grad_ops *ops,
		    const adg_backward_options *options);

#endif /* EXAMPLES_SYNC_H */
