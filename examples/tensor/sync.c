/* The glue between a trainer and the gradient reducer (see sync.h). */
#include "sync.h"

#include "../jitter.h"

#include <stdlib.h>

int sync_reducer_new(const adg_reducer_options *o, const size_t *elements,
		     size_t slice_from, adg_reducer **out)
{
	size_t *slices = NULL;
	if (elements != NULL && slice_from > 0) {
		slices = malloc(o->n_params * sizeof *slices);
		if (slices == NULL)
			return ADG_ENOMEM;
		for (size_t i = 0; i < o->n_params; i++)
			slices[i] = elements[i] >= slice_from
					    ? o->n_participants
					    : 1;
	}
	adg_reducer_options sliced = *o;
	sliced.param_slices = slices;
	int rc = adg_reducer_new(&sliced, out);
	free(slices); /* the reducer keeps a copy */
	return rc;
}

int sync_participant_init(struct sync_participant *p, adg_reducer *reducer,
			  size_t index, int units)
{
	*p = (struct sync_participant){
		.reducer = reducer,
		.index = index,
		.units = units,
		.backward = {.size = sizeof p->backward},
	};
	return adg_reducer_hook(reducer, index, &p->backward);
}

int sync_round(struct sync_participant *p, int (*train)(size_t unit, void *ctx),
	       void *ctx)
{
	int rc = 0;
	if (!p->units) {
		rc = train(p->index, ctx);
		return adg_reducer_end(p->reducer, p->index, rc);
	}
	/* Every unit must be dealt and ended, an empty one too, or the round
	 * ends with units not done: next_unit deals none once the round has
	 * failed, so an error here only ends the loop sooner. */
	for (;;) {
		size_t unit;
		rc = adg_reducer_next_unit(p->reducer, p->index, &unit);
		if (rc != 0 || unit == ADG_REDUCER_NO_UNIT)
			break;
		jitter_pause(); /* the tests' other interleavings */
		rc = adg_reducer_unit_end(p->reducer, p->index,
					  train(unit, ctx));
		if (rc != 0)
			break;
	}
	return adg_reducer_end(p->reducer, p->index, rc);
}

int backward_hooked(adg_registry *registry, adg_node *loss, void *seed,
		    const adg_grad_ops *ops,
		    const adg_backward_options *options)
{
	adg_grads *grads = NULL;
	int rc = adg_backward_with(registry, loss, seed, ops, options, &grads);
	int freed = adg_grads_free(grads); /* NULL after a failure */
	return rc != 0 ? rc : freed;
}
