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

/* Synchronous data parallelism inside one process, with the same bits at
 * any thread count. A round's gradient is the sum of the contributions of
 * U work units that the trainer defines (a micro-batch of k samples, a
 * graph, a length group): U and what each unit holds are fixed by the
 * data and the trainer's settings, never by the number of threads. T
 * participants (threads) take the round's units one at a time
 * (adg_reducer_next_unit: whichever is free takes the next, so the deal
 * depends on timing), run a backward over each, and hand each
 * parameter's gradient for the unit to the reducer from the ready hook
 * (adg_reducer_hook fills adg_backward_options for that). The reducer
 * folds each parameter's U contributions in a fixed binary tree over unit
 * indices (leaves 0 to U - 1 of the smallest power of two at least U;
 * each inner node adds its right subtree's sum into its left one's with
 * ops.add, a missing or NULL side passing the other through), as they
 * arrive, on the thread that brings the second half of a node, while the
 * other units' backward passes go on.
 *
 * The promise: the sum apply sees depends only on the U contributions,
 * not on T, on which thread computed which unit, nor on timing. So for a
 * given data order, seed, batch, unit definition and BLAS build, a
 * trainer's weights are bitwise the same for every T >= 1, and, where the
 * ranks of a job fold their reducers' partial sums over the same tree
 * (first_unit, total_units), for every rank count R >= 1, whatever the
 * collective's algorithm, bucket or slice size (MPI only moving bytes,
 * as examples/mpi_data_parallel.c does). Within a unit the backward sums in
 * tape order, as always: a unit's contribution must reach the reducer apart
 * from the others' (one backward per unit), as a sum of two units made inside
 * one backward would tie the bits to how units were packed.
 *
 * A trainer that cannot fix its units can make the sum itself
 * order-independent instead: with exact sums (adg/exact.h) as the
 * contributions, each participant adding every piece of work it takes into
 * accumulators of its own, the fold's order no longer matters, and units
 * of zero (below) give the same bits at every T too.
 *
 * Units of zero (n_units 0, the default): one unit per participant,
 * participant p's contributions are unit p's, with no adg_reducer_next_unit
 * (the same tree, so the bits depend on T: for a trainer that deals its
 * batch in T shares).
 *
 * Applies. By default all or nothing: nothing is applied until every
 * participant has ended the round without error, then every parameter
 * (every slice of one in slices) is applied once, the applies shared out
 * among the participants waiting in adg_reducer_end, each parameter's
 * sum complete since its last unit's gradient arrived. A failed round
 * leaves every parameter as it was (but for an apply's own error, which
 * stops the applies not yet started). apply_early applies each parameter
 * as soon as its sum is complete instead, overlapping the backward of
 * earlier layers; then a failed round may have applied some parameters
 * (those complete before the failure was reported) and not others.
 * Either way a step that reads a parameter it names as a parent (a
 * matmul's reads W) has run, in every unit, before that parameter's
 * update, and adg_reducer_end is the round's barrier: it returns once
 * every participant has ended the round and every parameter of the round
 * has been applied (or the round abandoned), so the next forward never
 * reads a parameter before its update. No lock on the contribution path:
 * a lookup in a table fixed at creation and one atomic exchange per tree
 * node a contribution climbs.
 *
 * A round, for each participant: with units, adg_reducer_next_unit, the
 * unit's contributions (one per parameter at most: a backward with the
 * hook, or adg_reducer_give), adg_reducer_unit_end, again until
 * next_unit deals none; without, its contributions. Then one
 * adg_reducer_end. Its next contribution belongs to the next round.
 *
 * Failure abandons the round: a unit or participant that ends with an
 * error, an ops.add or ops.apply error, or a round ended with units not
 * done (ADG_ESTATE). From then on no apply starts (one that has started
 * finishes, and so do the other slices of a parameter in slices), and a
 * parameter is only ever applied with all U contributions, never with
 * part of them. Every participant's adg_reducer_end returns the round's
 * first error, and its thread's reason (adg_errmsg) says which participant
 * failed, with what code, and where (adg_reducer_end_with fills an
 * adg_reducer_failure with the same); contributions that arrive later are
 * held and released as usual, and the next round starts clean.
 *
 * Memory: the reducer holds every contribution of a round until the
 * round's end (U per parameter at most), releasing each to the
 * participant that gave it; a fold keeps its sum in the left side's
 * contribution, so a round needs no buffer beyond them. */

typedef struct adg_reducer adg_reducer;

/* What apply is told about one parameter. */
typedef struct adg_reduction {
	size_t param;	/* its index in adg_reducer_options.param_ids */
	uint64_t id;	/* its leaf's node id */
	uint64_t round; /* rounds completed before this one (0 first) */
	/* The U contributions folded in the unit tree, into the leftmost
	 * non-NULL one; NULL when no unit had a gradient for it. Borrowed:
	 * apply may read and write it, not keep it. */
	void *sum;
	/* A parameter in slices (adg_reducer_options.param_slices): which
	 * slice of sum to apply, 0 to n_slices - 1; apply touches only that
	 * part of the parameter. 0 of 1 otherwise. */
	size_t slice, n_slices;
	/* The units sum covers, first_unit to first_unit + n_units - 1: all
	 * of them (0 to U - 1), or, for a reducer that holds a range of a
	 * job's units (adg_reducer_options.total_units), one of its partial
	 * sums: a subtree of the job's tree within the range. */
	size_t first_unit, n_units;
} adg_reduction;

typedef struct adg_reducer_ops {
	/* Folds value into *sum (both non-NULL; value is the right subtree's
	 * sum, *sum the left one's), on the thread that brought the second
	 * half of a tree node. Borrows value (const: unlike
	 * adg_grad_ops.add, which takes it, so that one function cannot
	 * serve both): the reducer hands each contribution back through
	 * release. It may replace *sum with
	 * another non-NULL value (the one it replaced is then add's to
	 * dispose of); what *sum holds at the end is released to the
	 * participant whose contribution the sum started as. Calls for
	 * different nodes may run at once. Returns 0 or a negative code,
	 * which abandons the round. Required. */
	int (*add)(void **sum, const void *value, void *ctx);
	/* Applies one parameter's reduced gradient (an SGD step), or one
	 * slice of it (param_slices). Runs at most once per parameter (per
	 * slice) per round, once in a round not abandoned, on a participant
	 * waiting in adg_reducer_end (apply_early: on the thread that
	 * completed the sum, or took the slice), with no lock held; calls for
	 * different parameters may run at once. Returns 0 or a negative
	 * code, which abandons the round. Required. */
	int (*apply)(const adg_reduction *reduction, void *ctx);
	/* Hands a contribution (or a sum) back to the participant that gave
	 * it, on that participant's thread inside adg_reducer_end, after the
	 * round's barrier (so a per-thread pool needs no lock). Required. */
	void (*release)(void *value, size_t participant, void *ctx);
	void *ctx;
	/* For parameters in slices: folds slice `slice` of n_slices of value
	 * into the same slice of sum, in place (both non-NULL; value
	 * borrowed), in the same tree as add, which must do the same
	 * arithmetic element by element. Slices of one parameter are folded
	 * and applied at once on several threads: each must touch only its own
	 * part of sum and of the parameter. Returns 0 or a negative code, which
	 * abandons the round. Required when a parameter has more than one
	 * slice. */
	int (*add_slice)(void *sum, const void *value, size_t slice,
			 size_t n_slices, void *ctx);
} adg_reducer_ops;

/* Most slices a parameter may be cut into. */
#define ADG_REDUCER_MAX_SLICES 1024u

/* Most units a round may have. */
#define ADG_REDUCER_MAX_UNITS ((size_t)1 << 20)

/* What adg_reducer_next_unit gives once every unit of the round is
 * dealt. */
#define ADG_REDUCER_NO_UNIT SIZE_MAX

/* Set size (adg.h, "ABI"), zero the rest, then set what you need. */
typedef struct adg_reducer_options {
	size_t size;	       /* sizeof the caller's struct (adg.h, "ABI") */
	size_t n_participants; /* T >= 1 */
	/* U, 1 to ADG_REDUCER_MAX_UNITS: the units of every round, dealt by
	 * adg_reducer_next_unit. 0: one per participant (see above). */
	size_t n_units;
	const uint64_t *param_ids; /* leaf ids, distinct, non-zero (copied) */
	size_t n_params;	   /* >= 1 */
	adg_reducer_ops ops;	   /* copied */
	/* A rank's share of a job: nonzero, the job's units, of which this
	 * reducer holds first_unit to first_unit + n_units - 1 (first_unit +
	 * n_units <= total_units <= ADG_REDUCER_MAX_UNITS; no parameter in
	 * slices). Its trees are the job's, over total_units leaves, cut to
	 * its range: apply is called once per parameter for each largest
	 * subtree whose units are all in the range (its partial sum,
	 * adg_reduction.first_unit and n_units), in the order of their units;
	 * at most 2 log2(total_units) of them. Fold the ranks' partial sums
	 * over the rest of the job's tree, in its order (a node adds its
	 * right subtree's sum into its left one's), and every rank count
	 * gives the bits of one reducer of all the units.
	 * adg_reducer_next_unit deals units of the range (job indices).
	 * 0: the reducer holds the whole round (first_unit must be 0). */
	size_t first_unit, total_units;
	/* 0 (all or nothing): apply nothing until every participant has
	 * ended the round without error, then every parameter, shared out
	 * among the participants at the barrier. Nonzero: apply each
	 * parameter as soon as its sum is complete; a failed round may then
	 * have applied some. The folds run as contributions arrive either
	 * way. */
	int apply_early;
	/* Both callbacks or neither (malloc and free); called by
	 * adg_reducer_new and adg_reducer_free only. */
	adg_allocator allocator;
	/* NULL: every parameter whole. Else, per parameter, into how many
	 * slices (1 to ADG_REDUCER_MAX_SLICES) its sum and update are cut
	 * (reduce-scatter): when its last contribution arrives, the slices
	 * are folded (ops.add_slice, the whole unit tree for each slice) and
	 * applied (one apply per slice) by that thread and by the
	 * participants waiting in adg_reducer_end, each slice by one of them,
	 * so that no single thread sums and updates a large parameter alone.
	 * The arithmetic is the same whichever thread takes a slice. Give T
	 * slices, say, to parameters of many elements, 1 to small ones. Once a
	 * parameter's slices are offered every one is folded and applied,
	 * whatever another participant reports meanwhile; an add_slice or apply
	 * error stops only the slice it happens in. (copied) */
	const size_t *param_slices;
} adg_reducer_options;

/* Creates a reducer. Errors: ADG_EINVAL (NULL argument, T or n_params 0,
 * n_units above ADG_REDUCER_MAX_UNITS, a range of units that does not fit
 * in total_units or without units, a required op missing, an id 0 or
 * repeated, one allocator callback, a slice count 0 or above
 * ADG_REDUCER_MAX_SLICES, slices without add_slice or with a range of
 * units), ADG_ENOMEM. */
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
 * gradients go to participant's unit at the time of each give (with
 * units, the one it was dealt last), so one hooked options serves every
 * unit. The hook returns give's code: ADG_ESTATE for a parameter the
 * unit already has (a second backward for one unit), or add's or apply's.
 * Errors: ADG_EINVAL (NULL argument, participant >= T). */
ADG_API int adg_reducer_hook(adg_reducer *reducer, size_t participant,
			     adg_backward_options *options);

/* Hands the gradient for parameter id (non-NULL) of participant's unit
 * (with units, the one it was dealt last and has not ended) to the
 * reducer; what the hook does, for callers that hand gradients
 * themselves. Thread-safe: with an executor, the calls of one participant
 * come from several threads at once. The reducer holds value until the
 * participant's adg_reducer_end, which releases it. Errors: ADG_EINVAL
 * (NULL argument, participant >= T, an id that is not a parameter: value
 * not taken), ADG_ESTATE (the unit already has id, participant has no
 * unit, or is ending its round: value not taken), or, when this
 * contribution completes a tree node, ops.add's code, or apply's with
 * apply_early (ADG_ECALLBACK for a positive one; value taken). */
ADG_API int adg_reducer_give(adg_reducer *reducer, size_t participant,
			     uint64_t id, void *value);

/* Deals participant the round's next unit, the lowest not yet dealt:
 * *unit is its index (among the job's units, with total_units), to which
 * participant's gives and hook go until adg_reducer_unit_end, or
 * ADG_REDUCER_NO_UNIT once every unit of the round is dealt (or the round has
 * failed: no use computing more). Any thread deals to any participant; which
 * participant gets which unit changes nothing in the sums. Errors: ADG_EINVAL
 * (NULL argument, participant >= T), ADG_ESTATE (a reducer without units,
 * participant's unit not ended, or participant ending its round: *unit is then
 * ADG_REDUCER_NO_UNIT). */
ADG_API int adg_reducer_next_unit(adg_reducer *reducer, size_t participant,
				  size_t *unit);

/* Ends participant's unit: result is its backward's result (0, or the
 * error that abandons the round; a positive one is ADG_ECALLBACK).
 * Parameters the unit gave nothing for count as NULL contributions
 * (which may complete tree nodes and fold them here). Returns 0, or the
 * code of an add (or, with apply_early, an apply) it ran. Errors:
 * ADG_EINVAL (NULL, participant >= T), ADG_ESTATE (a reducer without
 * units, or participant has no unit). */
ADG_API int adg_reducer_unit_end(adg_reducer *reducer, size_t participant,
				 int result);

/* Ends participant's round: result is 0 or the error that abandons the
 * round (a positive one is ADG_ECALLBACK). A unit participant has not
 * ended is ended with result; without units, the parameters it gave
 * nothing for count as NULL contributions. Waits until every participant
 * has ended the round and every parameter is applied (or the round is
 * abandoned), folding and applying slices of parameters in slices and
 * (all or nothing) applying parameters meanwhile, looking (yielding the
 * core; for up to 200 us when there are no more participants than
 * cores) and then sleeping; then releases the contributions this
 * participant gave and returns: 0 when the round was applied whole, else
 * the round's first error (the same code for every participant;
 * ADG_ESTATE when the round ended with units not done), with the same
 * reason on every participant's thread: "adg_reducer_end: round 4
 * abandoned: participant 2 failed with ADG_EVALUE (-12)"
 * (adg_reducer_end_with adds the step). The next round starts clean.
 * Errors:
 * ADG_EINVAL (NULL, participant >= T), ADG_ESTATE (participant is already
 * ending this round: nothing changed), or the round's error. */

ADG_API int adg_reducer_end(adg_reducer *reducer, size_t participant,
			    int result);

/* What failed a round first (adg_reducer_end_with). */
typedef enum adg_reducer_failure_site {
	/* The round was applied whole: no failure. */
	ADG_REDUCER_FAILED_NOWHERE = 0,
	/* participant ended its unit or round with an error: its
	 * backward's, where step says (when it handed its adg_failure
	 * over: adg_reducer_unit_end_with, adg_reducer_end_with). */
	ADG_REDUCER_FAILED_RESULT,
	/* ops.add (or add_slice) folding param_id's sum; participant is
	 * the one whose contribution completed the tree node (SIZE_MAX for
	 * a slice folded at the barrier). */
	ADG_REDUCER_FAILED_ADD,
	/* ops.apply for param_id (participant SIZE_MAX). */
	ADG_REDUCER_FAILED_APPLY,
	/* The round ended with units not done (ADG_ESTATE; participant
	 * SIZE_MAX). */
	ADG_REDUCER_FAILED_UNITS,
} adg_reducer_failure_site;

/* The first failure of a round, the same for every participant: which
 * participant failed, with what code, and where. */
typedef struct adg_reducer_failure {
	size_t size; /* sizeof the caller's struct (adg.h, "ABI") */
	int code;    /* the round's result: 0, or its first error */
	adg_reducer_failure_site site;
	uint64_t round;	    /* rounds completed before this one */
	size_t participant; /* SIZE_MAX where none is to blame (above) */
	/* ADD and APPLY: the parameter's leaf id; else 0. */
	uint64_t param_id;
	/* RESULT: the unit the participant was ending (job index, as
	 * adg_reducer_next_unit gives it), or ADG_REDUCER_NO_UNIT; else
	 * ADG_REDUCER_NO_UNIT. */
	size_t unit;
	/* RESULT with a failure handed over: the participant's backward's
	 * adg_failure (its site, node_id, step name, pass_id; code as
	 * given); else all zero. name is the step's static string. */
	adg_failure step;
} adg_reducer_failure;

/* adg_reducer_unit_end with the unit's backward's adg_failure (its
 * adg_backward_options.failure) instead of a bare result: failure->code
 * is the result, and a round that this unit fails first reports the step
 * (node, step name) to every participant (adg_reducer_failure.step).
 * NULL is a result of 0. Errors: those of adg_reducer_unit_end. */
ADG_API int adg_reducer_unit_end_with(adg_reducer *reducer, size_t participant,
				      const adg_failure *failure);

/* adg_reducer_end with participant's backward's adg_failure instead of
 * a bare result (failure->code is the result; NULL is 0), and, unless
 * round is NULL, the round's first failure filled in on return, on every
 * participant: code 0 and ADG_REDUCER_FAILED_NOWHERE for a round applied
 * whole (and on ADG_EINVAL or ADG_ESTATE for the call itself, which ends
 * no round). A failed round's reason (adg_errmsg) says the same on every
 * participant's thread: "adg_reducer_end_with: round 4 abandoned:
 * participant 2 failed with ADG_EVALUE (-12) at step 'mul' of node 17".
 * What the round records costs only on a failure. Errors: those of
 * adg_reducer_end. */
ADG_API int adg_reducer_end_with(adg_reducer *reducer, size_t participant,
				 const adg_failure *failure,
				 adg_reducer_failure *round);

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
