/*
 * libadg's gradient reducer: synchronous data parallelism inside one
 * process, on the backward's ready hook. An annex (lib/reducer.c): built on
 * the public API alone. Part of <adg.h>, which includes it where its
 * section stands; including this header alone includes <adg.h>.
 */
#ifndef ADG_REDUCER_H
#define ADG_REDUCER_H

#include "../adg.h" /* beside this one, whatever the include path */

#ifdef __cplusplus
extern "C" {
#endif

/* Synchronous data parallelism inside one process. T participants (threads)
 * each run a backward of their own graph over their own share of a batch
 * and hand each parameter's gradient to the reducer from the ready hook
 * (adg_reducer_hook fills adg_backward_options for that). When the T-th
 * contribution of a parameter arrives, the thread that brought it folds
 * the T contributions in participant order (0, 1, ..., T-1, whatever the
 * timing: bitwise reproducible for a given T) with ops.add and calls
 * ops.apply once with the sum (the SGD step), while the other
 * participants' backward passes go on with earlier layers: a step that
 * reads a parameter it names as a parent (a matmul's reads W) has run, in
 * every participant, before that parameter's update. With T = 1 apply
 * gets the participant's gradient itself, as a hook that applies it
 * would. adg_reducer_end is the round's barrier: it returns once every
 * participant has ended the round and every parameter of the round has
 * been applied (or the round abandoned), so the next forward never reads a
 * parameter before its update. No lock on the contribution path: a lookup
 * in a table fixed at creation and one atomic count per parameter.
 *
 * A round, for each participant: its contributions (one per parameter at
 * most: a backward with the hook, or adg_reducer_give), then one
 * adg_reducer_end. Its next contribution belongs to the next round.
 *
 * Failure abandons the round: a participant that ends it with an error, or
 * an ops.add or ops.apply error. From then on no apply starts (one that
 * has started finishes, and so do the other slices of a parameter in
 * slices), and a parameter is only ever applied with all T contributions,
 * never with part of them. Every participant's
 * adg_reducer_end returns the round's first error; contributions that
 * arrive later are held and released as usual, and the next round starts
 * clean. */

typedef struct adg_reducer adg_reducer;

/* What apply is told about one parameter. */
typedef struct adg_reduction {
	size_t param;	/* its index in adg_reducer_options.param_ids */
	uint64_t id;	/* its leaf's node id */
	uint64_t round; /* rounds completed before this one (0 first) */
	/* The T contributions folded in participant order, into the first
	 * non-NULL one; NULL when no participant had a gradient for it.
	 * Borrowed: apply may read and write it, not keep it. */
	void *sum;
	/* A parameter in slices (adg_reducer_options.param_slices): which
	 * slice of sum to apply, 0 to n_slices - 1; apply touches only that
	 * part of the parameter. 0 of 1 otherwise. */
	size_t slice, n_slices;
} adg_reduction;

typedef struct adg_reducer_ops {
	/* Folds value into *sum (both non-NULL), on the thread that brought
	 * the parameter's last contribution. Borrows value (const: unlike
	 * adg_grad_ops.add, which takes it, so that one function cannot
	 * serve both): the reducer hands each contribution back through
	 * release. It may replace *sum with
	 * another non-NULL value (the one it replaced is then add's to
	 * dispose of); what *sum holds at the end is released to the
	 * participant whose contribution the sum started as. Returns 0 or a
	 * negative code, which abandons the round. Required. */
	int (*add)(void **sum, const void *value, void *ctx);
	/* Applies one parameter's reduced gradient (an SGD step), or one
	 * slice of it (param_slices). Runs at most once per parameter (per
	 * slice) per round, once in a round not abandoned,
	 * on the thread that brought its last contribution (apply_at_end: on
	 * the last participant to end), with no lock held; calls for
	 * different parameters may run at once. Returns 0 or a negative
	 * code, which abandons the round. Required. */
	int (*apply)(const adg_reduction *reduction, void *ctx);
	/* Hands a contribution (or a sum) back to its participant, on that
	 * participant's thread inside adg_reducer_end, after the round's
	 * barrier (so a per-thread pool needs no lock). Required. */
	void (*release)(void *value, size_t participant, void *ctx);
	void *ctx;
	/* For parameters in slices: folds slice `slice` of n_slices of value
	 * into the same slice of sum, in place (both non-NULL; value
	 * borrowed). Slices of one parameter are folded and applied at once
	 * on several threads: each must touch only its own part of sum and
	 * of the parameter. Returns 0 or a negative code, which abandons the
	 * round. Required when a parameter has more than one slice. */
	int (*add_slice)(void *sum, const void *value, size_t slice,
			 size_t n_slices, void *ctx);
} adg_reducer_ops;

/* Most slices a parameter may be cut into. */
#define ADG_REDUCER_MAX_SLICES 1024u

/* Zero-initialise, then set what you need. */
typedef struct adg_reducer_options {
	size_t n_participants;	   /* T >= 1 */
	const uint64_t *param_ids; /* leaf ids, distinct, non-zero (copied) */
	size_t n_params;	   /* >= 1 */
	adg_reducer_ops ops;	   /* copied */
	/* Nonzero: apply nothing until every participant has ended the
	 * round without error, then apply every parameter in index order on
	 * the last participant to end: all or nothing (an apply error stops
	 * there, the applies before it stay), no overlap. 0: apply each
	 * parameter as soon as its last contribution arrives. The folds run
	 * as contributions arrive either way. */
	int apply_at_end;
	/* Both callbacks or neither (malloc and free); called by
	 * adg_reducer_new and adg_reducer_free only. */
	adg_allocator allocator;
	/* NULL: every parameter whole. Else, per parameter, into how many
	 * slices (1 to ADG_REDUCER_MAX_SLICES) its sum and update are cut
	 * (reduce-scatter): when its last contribution arrives, the slices
	 * are folded (ops.add_slice) and applied (one apply per slice) by
	 * that thread and by the participants waiting in adg_reducer_end,
	 * each slice by one of them, so that no single thread sums and
	 * updates a large parameter alone. The arithmetic is the same
	 * whichever thread takes a slice. Give T slices, say, to parameters
	 * of many elements, 1 to small ones. Once a parameter's slices are
	 * offered every one is folded and applied, whatever another
	 * participant reports meanwhile; an add_slice or apply error stops
	 * only the slice it happens in. (copied) */
	const size_t *param_slices;
} adg_reducer_options;

/* Creates a reducer. Errors: ADG_EINVAL (NULL argument, T or n_params 0, a
 * required op missing, an id 0 or repeated, one allocator callback, a
 * slice count 0 or above ADG_REDUCER_MAX_SLICES, slices without
 * add_slice), ADG_ENOMEM. */
ADG_API int adg_reducer_new(const adg_reducer_options *options,
			    adg_reducer **out);

/* Sets options->on_ready and options->on_ready_ctx so that a backward run
 * by participant hands each parameter's gradient to the reducer
 * (adg_reducer_give), taking it out of the backward's container; the
 * gradients of leaves that are not parameters (inputs) stay there, and a
 * parameter the backward gives no gradient counts as NULL. Hooks compose:
 * an on_ready already in options (the trainer's own: clipping, logging)
 * is kept, per participant, and called first, with its ctx, for every node
 * it would have seen, so it sees a parameter's gradient before the reducer
 * takes it; its error stops the backward as usual. With no hook of its
 * own, leaves_only is set to 1; with one, leaves_only is left as it is.
 * Calling it again on options it already hooked for participant keeps the
 * kept hook. Other fields are left as they are (executor, retain...). The
 * hook returns give's code: ADG_ESTATE for a parameter this participant
 * already gave this round (a second backward in one round), or add's or
 * apply's. Errors: ADG_EINVAL (NULL argument, participant >= T). */
ADG_API int adg_reducer_hook(adg_reducer *reducer, size_t participant,
			     adg_backward_options *options);

/* Hands participant's gradient for parameter id (non-NULL) to the reducer
 * for this round; what the hook does, for callers that hand gradients
 * themselves. Thread-safe: with an executor, the calls of one participant
 * come from several threads at once. The reducer holds value until the
 * participant's adg_reducer_end, which releases it.
 * Errors: ADG_EINVAL (NULL argument, participant >= T, an id that is not
 * a parameter: value not taken), ADG_ESTATE (this participant already gave
 * id this round, or is ending it: value not taken), or, when this
 * contribution completes the parameter, ops.add's or ops.apply's code
 * (ADG_ECALLBACK for a positive one; value taken). */
ADG_API int adg_reducer_give(adg_reducer *reducer, size_t participant,
			     uint64_t id, void *value);

/* Ends participant's round: result is its backward's result (0, or the
 * error that abandons the round; a positive one is ADG_ECALLBACK).
 * Parameters it gave nothing for count as NULL contributions (which may
 * complete them, and apply them, here). Waits until every participant
 * has ended the round and every parameter is applied (or the round is
 * abandoned), taking slices of parameters in slices meanwhile, looking a
 * few times and then sleeping; then releases this participant's contributions
 * and returns: 0 when the round was applied whole, else the round's first error
 * (the same code for every participant). The next round starts clean. Errors:
 * ADG_EINVAL (NULL, participant >= T), ADG_ESTATE (participant is already
 * ending this round: nothing changed), or the round's error. */
ADG_API int adg_reducer_end(adg_reducer *reducer, size_t participant,
			    int result);

/* Fills *rounds with the number of rounds completed (applied or
 * abandoned). Errors: ADG_EINVAL. */
ADG_API int adg_reducer_rounds(const adg_reducer *reducer, uint64_t *rounds);

/* Frees the reducer. No participant may be inside a round, nor call it
 * concurrently. NULL is a no-op that returns 0.
 * Errors: ADG_EBUSY (a round has begun and not ended: nothing freed). */
ADG_API int adg_reducer_free(adg_reducer *reducer);

#ifdef __cplusplus
}
#endif

#endif /* ADG_REDUCER_H */
