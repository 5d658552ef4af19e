/* The glue between a trainer and the gradient reducer (see sync.h). */
#include "sync.h"

#include <stdlib.h>

int sync_reducer_new(const adg_reducer_ops *ops, size_t n_participants,
		     const uint64_t *ids, const size_t *elements,
		     size_t n_params, size_t slice_from, adg_reducer **out)
{
	size_t *slices = NULL;
	if (elements != NULL && slice_from > 0) {
		slices = malloc(n_params * sizeof *slices);
		if (slices == NULL)
			return ADG_ENOMEM;
		for (size_t i = 0; i < n_params; i++)
			slices[i] =
				elements[i] >= slice_from ? n_participants : 1;
	}
	adg_reducer_options o = {
		.n_participants = n_participants,
		.param_ids = ids,
		.n_params = n_params,
		.ops = *ops,
		.param_slices = slices,
	};
	int rc = adg_reducer_new(&o, out);
	free(slices); /* the reducer keeps a copy */
	return rc;
}

int sync_participant_init(struct sync_participant *p, adg_reducer *reducer,
			  size_t index)
{
	*p = (struct sync_participant){.reducer = reducer, .index = index};
	return adg_reducer_hook(reducer, index, &p->backward);
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
