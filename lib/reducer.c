/*
 * The gradient reducer: synchronous data parallelism inside one process
 * (include/adg/reducer.h; docs/concurrency.md, I15 to I18).
 *
 * Units and the tree. A round's contributions come from U units: with
 * n_units 0 one per participant, else dealt to participants by a counter
 * (adg_reducer_next_unit). Each unit has a block of slots, one per
 * parameter, on cache lines of its own: a contribution is a plain store
 * into the unit's slot and an atomic exchange of the slot's given flag
 * (which refuses a second one); then it climbs the parameter's tree, a
 * binary tree over unit indices padded to a power of two (width): at
 * each inner node whose other side holds a unit, it writes which unit's
 * slot holds its side's sum (anchor) and exchanges the node's mark with
 * the round's number. The first to arrive stops there; the second (the
 * exchange returns the same round) folds right into left with ops.add,
 * in place in the left side's slot, and climbs on. So every node adds
 * the same two sums whatever the timing and whichever thread computed
 * which unit: the arithmetic depends on U alone (I15). Marks are never
 * reset: a round's number differs from every earlier one's, an
 * abandoned round's half-met nodes included. The one that completes the
 * root has the parameter's sum; in a reducer of a rank's share of a
 * job's units (total_units), the tree is the job's, and a climb stops
 * below the first node holding units outside the share: each such
 * subtree is a partial sum, completed and applied as a whole sum is.
 * Units' slots come in two halves, by the round's parity (I16). Lookups
 * go through an open-addressing table built at creation and only read
 * afterwards. Nothing on this path locks or allocates.
 *
 * Slices. A large parameter may be cut into slices (reduce-scatter): its
 * tree only tracks arrivals, and the thread that completes its root
 * offers the slices (the round's tag in the parameter's slice counter);
 * it and every participant waiting at the barrier of that round claim
 * them one at a time (a compare and swap), each folding its slice
 * over the whole tree (the same nodes, the same order) and, with
 * apply_early, applying it.
 *
 * Applies. With apply_early a parameter is applied by the thread that
 * completes its sum. By default, all or nothing: once every participant
 * is at the barrier and no error was reported, the round's applies (one
 * task per parameter, or per slice) are offered as slices are, and the
 * participants at the barrier take them (I18).
 *
 * Rounds. adg_reducer_end is the barrier, once per participant per round,
 * with no lock. One count, outstanding, holds what the round waits for:
 * the participants not yet arrived (n at the round's start) plus the
 * slices and applies offered and not yet done. Arriving is one acq_rel
 * count-down, and so is finishing a task; offering slices counts them up
 * first, which only a participant not yet arrived can do, so the count
 * cannot touch 0 early. The thread whose count-down reaches 0 (always
 * one at the barrier) owns the round's state: all or nothing, it offers
 * the round's applies (counting them in) and helps, and the thread that
 * does the last apply finishes; else it finishes at once. Finishing
 * resets the deal, the round's error and the count, records the result,
 * and only then moves gen (release), which lets the others out (each
 * leaves on an acquire load of gen, then releases the contributions of
 * its own units and clears their slots). A participant waiting takes
 * offered slices and applies, looks a few times, yielding (the cores are
 * the backward passes'), for 200 us when every participant has a core
 * (REDUCER_SPIN_NS), and then sleeps on a futex, an event count that
 * every event it waits for bumps (reducer_wake_all says why no wake-up is
 * lost); one FUTEX_WAKE wakes every sleeper, and none of them takes a
 * lock after. So nothing at the barrier is O(T) on one thread but the
 * kernel's loop over the sleepers in that wake-up, and nothing in a
 * round is O(U) on one thread.
 *
 * Failure. The round's first error is one compare and swap; the check
 * before each apply reads it in the same total order (seq_cst), so no
 * apply starts after a failure is reported, and one that started
 * finishes. A unit that fails gives no NULL contributions at its end:
 * the parameters it did not give stay incomplete, never applied with
 * part of their contributions.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "adg.h"
#include "util.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NONE SIZE_MAX /* no unit, participant or parameter */

/* How long a participant at the barrier keeps looking before it sleeps,
 * when every participant can have a core of its own (REDUCER_SPIN_NS;
 * else REDUCER_SPINS looks at least). A sleep costs the waker a system
 * call and the sleeper its wake-up, which on a virtual machine can reach
 * tens of microseconds once its idle core has halted; a waiter that
 * sleeps starts the next round late by as much, on the round's critical
 * path. A round's units differ by tens of microseconds in the trainers,
 * longer than 32 looks (some 16 us of sched_yield) wait; looking for 200
 * us gained langid and fashion 1 to 2 % at T = 2 (docs/trainers.md).
 * With more participants than cores a looking waiter only takes time
 * slices from the threads it waits for, so it sleeps after the few
 * looks. Build with -DREDUCER_SPIN_NS=0 to compare. */
#ifndef REDUCER_SPIN_NS
#define REDUCER_SPIN_NS 200000
#endif
#define REDUCER_SPINS 32

/* Whether participants looking at the barrier should keep looking for
 * REDUCER_SPIN_NS: there are no more of them than cores this thread may
 * run on, so a looking one takes no core that a computing one needs. */
static bool reducer_may_spin(size_t n_members)
{
	cpu_set_t cpus;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	size_t cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0
			       ? (size_t)CPU_COUNT(&cpus)
			       : (online > 0 ? (size_t)online : 1);
	return REDUCER_SPIN_NS > 0 && n_members <= cores;
}

/* Refuses options for adg_reducer_new: ADG_EINVAL with reason. */
#define REDUCER_REFUSE(...) adg_fail(ADG_EINVAL, "adg_reducer_new", __VA_ARGS__)

/* One parameter, on a cache line of its own: its sum completes on one
 * thread while others climb other parameters' trees. */
struct param {
	_Alignas(ADG_CACHELINE) uint64_t id; /* the leaf's id; read-only */
	size_t n_slices;		     /* read-only */
	/* A parameter in slices: the round's tag (its barrier generation
	 * plus one, 32 bits) in the high half, the next slice to take in the
	 * low. Once its root completes, set to (tag, 0) (release), and any
	 * participant of that round claims slices with a compare and swap
	 * that keeps the tag, so that it never takes a slice of a later
	 * round (I17). Left as it is at the round's end. */
	_Atomic uint64_t slices;
};

_Static_assert(sizeof(struct param) == ADG_CACHELINE,
	       "a parameter is one cache line");

/* One partial sum of a parameter (the whole sum but for a reducer of a
 * range of units, I15), written by the thread that completes its subtree:
 * the unit whose slot holds the sum (NONE: no unit had a gradient), and
 * the round's number plus one. Read by that thread, by the threads that
 * take its slices (after their claims) and by the round's applies (after
 * the barrier). */
struct partial {
	size_t anchor;
	uint64_t completed;
};

/* An inner node of a parameter's tree. */
struct tree_node {
	/* The round's number plus one, exchanged by each side that arrives:
	 * the side that reads it back arrives second and folds. */
	atomic_uint_fast64_t mark;
	/* Per side (0 left, 1 right), the unit whose slot holds that side's
	 * sum, or NONE: written by the side before its exchange, read by
	 * the other side after its own (I15). */
	size_t anchor[2];
};

/* A unit's contribution to one parameter. */
struct slot {
	/* The value given (for a node's left side, the sum once folded),
	 * NULL for none. Written by the unit's participant before it climbs,
	 * read by the folders above after their exchanges (I15); written
	 * back by a fold, and read and cleared by the participant after the
	 * barrier (I16). */
	void *value;
	/* A contribution, NULL included, was counted this round: the
	 * exchange that sets it lets one through. */
	atomic_bool given;
};

/* One unit: the next unit dealt to the same participant this round (its
 * list, which only that participant walks), then its slots, on lines no
 * other unit writes. */
struct unit {
	_Alignas(ADG_CACHELINE) size_t next;
	/* The participant it was dealt to this round (without units, unit
	 * p's is p): written with next, read only to say who failed. */
	size_t owner;
	struct slot slots[];
};

/* One participant: what the ready hook's ctx points to. */
struct member {
	_Alignas(ADG_CACHELINE) struct adg_reducer *reducer;
	size_t index;
	/* Set by the participant's adg_reducer_end, from its start to its
	 * return: a second end, and a contribution meanwhile, are refused. */
	atomic_bool ended;
	/* The unit its gives go to (NONE: none; without units, always its
	 * own index), and the first of the units dealt to it this round
	 * (a list through struct unit's next). Written by the participant's
	 * thread; read by the backward's threads, which the backward's
	 * start orders after. */
	size_t unit, units;
	/* The trainer's own ready hook, which adg_reducer_hook found in the
	 * options and keeps, called before the reducer's (NULL: none).
	 * Written by the participant before its backward, read by the
	 * backward's threads, which the backward's start orders after. */
	adg_ready_fn then_on_ready;
	void *then_ctx;
};

/* id -> parameter index; id 0 marks an empty entry. */
struct entry {
	uint64_t id;
	size_t param;
};

/* The round's applies (all or nothing), offered at the barrier. */
struct offer {
	/* The round's barrier generation plus one while offered; never
	 * reset, so that a participant still looking for applies of an
	 * earlier round finds none. */
	atomic_uint_fast64_t published;
	atomic_size_t next; /* the next task to take */
};

/* A block from the allocator, aligned to a cache line inside it. */
struct block {
	void *base;
	size_t bytes;
};

struct adg_reducer {
	/* Read-only after creation. */
	adg_reducer_ops ops;
	adg_allocator allocator;
	size_t n_members, n_params;
	size_t n_units; /* U, this reducer's */
	bool dealt;	/* units dealt by adg_reducer_next_unit */
	/* The job's units, of which this reducer's are first_unit on (all
	 * of them, first_unit 0, but for a rank's share); the trees' leaves,
	 * a power of two at least total_units. */
	size_t first_unit, total_units, width;
	/* The tree nodes whose units are the largest subtrees within this
	 * reducer's (the root alone, but for a rank's share), in the order
	 * of their units; and each parameter's partial sums, n_partials
	 * per parameter. */
	size_t n_partials;
	size_t *partial_node;
	struct partial *partials;
	bool apply_early; /* else all or nothing */
	bool sliced;	  /* some parameter is in slices */
	bool spin;	  /* waiters look for REDUCER_SPIN_NS (reducer_wait) */
	struct param *params;
	struct tree_node *trees; /* n_params trees of width nodes (0 unused) */
	char *units;		 /* 2 halves of U blocks of unit_stride bytes */
	size_t unit_stride;
	struct member *members;
	/* The round's applies (all or nothing): apply task t is slice, or
	 * partial sum (one of the two counts is 1), t - first_task[i] of
	 * parameter i, for the i whose range holds t; first_task[n_params]
	 * is their count. */
	size_t *first_task;
	struct entry *table;
	size_t table_cap;   /* a power of two, at least twice n_params */
	unsigned int shift; /* 64 - log2(table_cap) */
	struct block self_block, params_block, trees_block, units_block,
		members_block, partials_block;

	/* The deal: the next unit to hand out, reset by the thread that
	 * finishes the round. Its own line: every participant takes from
	 * it. */
	_Alignas(ADG_CACHELINE) atomic_size_t next_unit;
	/* Units ended without error this round, reset with the deal. */
	_Alignas(ADG_CACHELINE) atomic_size_t units_done;

	/* The round's first error, 0 while none: set by one compare and
	 * swap, read before each apply, reset by the thread that finishes
	 * the round. */
	_Alignas(ADG_CACHELINE) atomic_int error;
	/* Rounds completed; bumped by the thread that finishes the round. */
	atomic_uint_fast64_t rounds;
	/* The round's first failure, where error was set: written by the
	 * thread whose report set it, after its compare and swap, and read
	 * by the thread that finishes the round, which every report comes
	 * before (see reducer_settle). Failure paths only. */
	adg_reducer_failure fault;
	struct offer applies; /* all or nothing */

	/* The barrier (see "Rounds" above). What the round waits for: the
	 * participants not yet inside their end, plus the slices and
	 * applies offered and not yet done. Counted down once by each
	 * arrival and each task (acq_rel); the thread that brings it to 0
	 * owns the round's state until it offers the applies or moves gen.
	 * Its own line: every participant and every task writes it once. */
	_Alignas(ADG_CACHELINE) atomic_size_t outstanding;
	/* The round's applies were offered (all or nothing): read and
	 * written only by the threads that bring outstanding to 0, one
	 * after the other, ordered by the count's release sequence. */
	bool applying;
	/* Rounds the barrier has let through: moved (release) by the thread
	 * that finishes a round, after result, result_fault and the next
	 * round's reset; loaded with acquire by those it lets out, with
	 * relaxed by those only looking. */
	atomic_uint_fast64_t gen;
	int result;			  /* what the round gen - 1 returns */
	adg_reducer_failure result_fault; /* and its first failure */

	/* Sleep at the barrier: an event count on a futex. wake_seq is
	 * bumped after each event a sleeper waits for (gen moved, slices or
	 * applies offered); sleepers counts the participants between their
	 * decision to sleep and their return from the kernel, so that a
	 * wake-up with no one asleep costs no system call. Its own line:
	 * spinners read gen, not these. */
	_Alignas(ADG_CACHELINE) _Atomic uint32_t wake_seq;
	_Atomic uint32_t sleepers;
};

/* ------------------------------------------------------------- layout */

/* size bytes at a cache line's boundary: the allocator promises malloc's
 * alignment only, so ask for a line more. b is what to free. NULL on
 * failure. */
static void *reducer_alloc_aligned(const adg_allocator *a, size_t size,
				   struct block *b)
{
	b->bytes = size + ADG_CACHELINE;
	b->base = a->alloc(b->bytes, a->ctx);
	if (b->base == NULL)
		return NULL;
	void *p = (void *)adg_round_up((uintptr_t)b->base, ADG_CACHELINE);
	memset(p, 0, size);
	return p;
}

static void reducer_free_block(const adg_allocator *a, struct block *b)
{
	if (b->base != NULL)
		a->free(b->base, b->bytes, a->ctx);
}

/* The round under way. Relaxed: bumped only by the thread that finishes
 * the round, before the barrier lets anyone into the next round. */
static uint64_t reducer_round(const struct adg_reducer *r)
{
	return atomic_load_explicit(&r->rounds, memory_order_relaxed);
}

/* Unit u's block in round's half of the units. Two halves, by the
 * round's parity (I16): a participant still releasing round k's values
 * after the barrier never meets one dealt the same unit in round k + 1,
 * which begins as soon as the barrier lets it out; and round k + 2
 * cannot begin before every participant has ended k + 1, after its
 * release of k. */
static struct unit *reducer_unit_at(const struct adg_reducer *r, uint64_t round,
				    size_t u)
{
	return (struct unit *)(r->units +
			       ((round & 1) * r->n_units + u) * r->unit_stride);
}

/* Unit u's slot of parameter i in the round under way. */
static struct slot *reducer_slot_of(const struct adg_reducer *r, size_t u,
				    size_t i)
{
	return &reducer_unit_at(r, reducer_round(r), u)->slots[i];
}

/* Parameter i's tree: nodes 1 to width - 1, node n's children 2n and
 * 2n + 1, leaf u at width + u (leaves have no node). */
static struct tree_node *reducer_tree_of(const struct adg_reducer *r, size_t i)
{
	return r->trees + i * r->width;
}

static size_t reducer_home_of(const struct adg_reducer *r, uint64_t id)
{
	return (size_t)adg_id_hash(id, r->shift);
}

/* The parameter index of id, or NONE. */
static size_t reducer_lookup(const struct adg_reducer *r, uint64_t id)
{
	size_t mask = r->table_cap - 1;
	if (id == 0)
		return NONE;
	for (size_t i = reducer_home_of(r, id);; i = (i + 1) & mask) {
		if (r->table[i].id == id)
			return r->table[i].param;
		if (r->table[i].id == 0)
			return NONE;
	}
}

/* Fills the table and the parameters' ids; false for a repeated id. */
static bool reducer_index_params(struct adg_reducer *r, const uint64_t *ids)
{
	size_t mask = r->table_cap - 1;
	for (size_t k = 0; k < r->n_params; k++) {
		size_t i = reducer_home_of(r, ids[k]);
		while (r->table[i].id != 0) {
			if (r->table[i].id == ids[k]) {
				REDUCER_REFUSE("param_ids[%zu] repeats "
					       "param_ids[%zu] (id %" PRIu64
					       ")",
					       k, r->table[i].param, ids[k]);
				return false;
			}
			i = (i + 1) & mask;
		}
		r->table[i] = (struct entry){ids[k], k};
		r->params[k].id = ids[k];
	}
	return true;
}

/* Frees what adg_reducer_new allocated (any of it NULL). */
static void reducer_free_blocks(struct adg_reducer *r)
{
	const adg_allocator *a = &r->allocator;
	if (r->table != NULL)
		a->free(r->table, r->table_cap * sizeof *r->table, a->ctx);
	if (r->first_task != NULL)
		a->free(r->first_task, (r->n_params + 1) * sizeof(size_t),
			a->ctx);
	reducer_free_block(a, &r->partials_block);
	reducer_free_block(a, &r->members_block);
	reducer_free_block(a, &r->units_block);
	reducer_free_block(a, &r->trees_block);
	reducer_free_block(a, &r->params_block);
	adg_allocator copy = *a; /* r goes with the last free */
	struct block self = r->self_block;
	reducer_free_block(&copy, &self);
}

/* Whether the options' counts and ops are as adg_reducer_new requires:
 * 0, or ADG_EINVAL with its reason. */
static int reducer_counts_valid(const adg_reducer_options *o)
{
	if (o->n_participants == 0)
		return REDUCER_REFUSE("options->n_participants is 0");
	if (o->n_params == 0)
		return REDUCER_REFUSE("options->n_params is 0");
	if (o->n_units > ADG_REDUCER_MAX_UNITS)
		return REDUCER_REFUSE("options->n_units is %zu, above "
				      "ADG_REDUCER_MAX_UNITS (%zu)",
				      o->n_units, ADG_REDUCER_MAX_UNITS);
	if (o->param_ids == NULL)
		return REDUCER_REFUSE("options->param_ids is NULL");
	if (o->ops.add == NULL || o->ops.apply == NULL ||
	    o->ops.release == NULL)
		return REDUCER_REFUSE("options->ops.%s is NULL",
				      o->ops.add == NULL     ? "add"
				      : o->ops.apply == NULL ? "apply"
							     : "release");
	int allocator = adg_allocator_check("adg_reducer_new", &o->allocator);
	if (allocator != 0)
		return allocator;
	if (o->total_units == 0 && o->first_unit != 0)
		return REDUCER_REFUSE("options->first_unit is %zu without "
				      "total_units",
				      o->first_unit);
	if (o->total_units != 0 && o->n_units == 0)
		return REDUCER_REFUSE("options->total_units is %zu but "
				      "n_units is 0: a range needs units",
				      o->total_units);
	if (o->total_units > ADG_REDUCER_MAX_UNITS)
		return REDUCER_REFUSE("options->total_units is %zu, above "
				      "ADG_REDUCER_MAX_UNITS (%zu)",
				      o->total_units, ADG_REDUCER_MAX_UNITS);
	if (o->total_units != 0 && o->first_unit > o->total_units - o->n_units)
		return REDUCER_REFUSE(
			"units %zu to %zu (first_unit %zu, "
			"n_units %zu) do not fit in total_units "
			"%zu",
			o->first_unit, o->first_unit + o->n_units - 1,
			o->first_unit, o->n_units, o->total_units);
	return 0;
}

/* Whether options are as adg_reducer_new requires, but for ids repeated
 * (reducer_index_params finds those): 0, or ADG_EINVAL with its reason;
 * *sliced: some parameter is in slices. */
static int reducer_options_valid(const adg_reducer_options *o, bool *sliced)
{
	int rc = reducer_counts_valid(o);
	if (rc != 0)
		return rc;
	const size_t *slices = o->param_slices;
	*sliced = false;
	for (size_t k = 0; k < o->n_params; k++) {
		if (o->param_ids[k] == 0)
			return REDUCER_REFUSE("param_ids[%zu] is 0", k);
		if (slices != NULL &&
		    (slices[k] == 0 || slices[k] > ADG_REDUCER_MAX_SLICES))
			return REDUCER_REFUSE("param_slices[%zu] is %zu (1 to "
					      "ADG_REDUCER_MAX_SLICES, %u)",
					      k, slices[k],
					      ADG_REDUCER_MAX_SLICES);
		*sliced |= slices != NULL && slices[k] > 1;
	}
	if (*sliced && o->ops.add_slice == NULL)
		return REDUCER_REFUSE("a parameter is in slices but "
				      "options->ops.add_slice is NULL");
	if (*sliced && o->total_units != 0)
		return REDUCER_REFUSE("a parameter is in slices in a reducer "
				      "of a range of units (total_units)");
	return 0;
}

/* The units reducer_find_partials looks for: [lo, hi) of the job's total
 * (a tree's leaves past total hold no unit). */
struct reducer_range {
	size_t total;
	size_t lo;
	size_t hi;
};

/* The nodes of the largest subtrees whose units, those below
 * range->total, are all in [range->lo, range->hi), in the order of their
 * units, below node (its first unit first, count of them, a power of
 * two); into nodes unless NULL. Returns how many. */
static size_t reducer_find_partials(const struct reducer_range *range,
				    size_t node, size_t first, size_t count,
				    size_t *nodes)
{
	size_t end =
		first + count < range->total ? first + count : range->total;
	if (first >= end || end <= range->lo || first >= range->hi)
		return 0; /* no unit of the range */
	if (range->lo <= first && end <= range->hi) {
		if (nodes != NULL)
			nodes[0] = node;
		return 1;
	}
	size_t half = count / 2; /* count > 1: a leaf is in or out */
	size_t n = reducer_find_partials(range, 2 * node, first, half, nodes);
	return n + reducer_find_partials(range, 2 * node + 1, first + half,
					 half,
					 nodes != NULL ? nodes + n : NULL);
}

/* The sizes of a reducer's blocks. */
struct reducer_layout {
	size_t units;	      /* U, this reducer's */
	size_t total;	      /* the job's */
	size_t width;	      /* a power of two, >= total */
	size_t n_partials;    /* per parameter */
	size_t partials_size; /* their nodes, then every parameter's */
	size_t unit_stride;   /* a unit's block, in whole lines */
	size_t units_size;    /* the units' blocks, both halves */
	size_t trees_size;    /* the parameters' trees */
	size_t members_size;  /* the participants */
	size_t params_size;
	size_t table_cap;  /* a power of two */
	unsigned int log2; /* of table_cap */
};

/* Whether size bytes, plus a line for the alignment, can be asked for. */
static bool reducer_fits(size_t size)
{
	return size <= SIZE_MAX - ADG_CACHELINE;
}

/* The sizes for t participants, o's units (0: t) and n parameters: a
 * unit's block rounded up to whole lines; the table at least twice the
 * parameters, so that a probe run stays short. false when one would
 * overflow. */
static bool reducer_layout(size_t t, const adg_reducer_options *o, size_t n,
			   struct reducer_layout *l)
{
	size_t stride;
	l->units = o->n_units != 0 ? o->n_units : t;
	l->total = o->total_units != 0 ? o->total_units : l->units;
	if (l->units > SIZE_MAX / 2)
		return false;
	for (l->width = 1; l->width < l->total; l->width *= 2)
		if (l->width > SIZE_MAX / 2)
			return false;
	struct reducer_range range = {l->total, o->first_unit,
				      o->first_unit + l->units};
	l->n_partials = reducer_find_partials(&range, 1, 0, l->width, NULL);
	if (__builtin_mul_overflow(n, l->n_partials, &l->partials_size) ||
	    __builtin_mul_overflow(l->partials_size, sizeof(struct partial),
				   &l->partials_size) ||
	    __builtin_add_overflow(l->partials_size,
				   l->n_partials * sizeof(size_t),
				   &l->partials_size) ||
	    !reducer_fits(l->partials_size))
		return false;
	l->table_cap = 4;
	l->log2 = 2;
	if (__builtin_mul_overflow(n, sizeof(struct slot), &stride) ||
	    __builtin_add_overflow(stride, sizeof(struct unit), &stride) ||
	    stride > SIZE_MAX - 2 * ADG_CACHELINE)
		return false;
	l->unit_stride = adg_round_up(stride, ADG_CACHELINE);
	while (l->table_cap / 2 < n &&
	       l->table_cap <= SIZE_MAX / 2 / sizeof(struct entry)) {
		l->table_cap *= 2;
		l->log2++;
	}
	return l->table_cap / 2 >= n &&
	       !__builtin_mul_overflow(2 * l->units, l->unit_stride,
				       &l->units_size) &&
	       reducer_fits(l->units_size) &&
	       !__builtin_mul_overflow(n, l->width, &l->trees_size) &&
	       !__builtin_mul_overflow(l->trees_size, sizeof(struct tree_node),
				       &l->trees_size) &&
	       reducer_fits(l->trees_size) &&
	       !__builtin_mul_overflow(t, sizeof(struct member),
				       &l->members_size) &&
	       reducer_fits(l->members_size) &&
	       !__builtin_mul_overflow(n, sizeof(struct param),
				       &l->params_size) &&
	       reducer_fits(l->params_size) && n < SIZE_MAX / sizeof(size_t);
}

/* Each parameter's slices (1 for a whole one) and where its tasks (a
 * slice or a partial sum each) start in the round's applies; false when
 * their count overflows. */
static bool reducer_fill_tasks(struct adg_reducer *r, const size_t *slices)
{
	size_t first = 0;
	for (size_t k = 0; k < r->n_params; k++) {
		r->params[k].n_slices = slices != NULL ? slices[k] : 1;
		r->first_task[k] = first;
		if (__builtin_add_overflow(
			    first, r->params[k].n_slices * r->n_partials,
			    &first))
			return false;
	}
	r->first_task[r->n_params] = first;
	return true;
}

/* Lays out the partial sums in their block and finds their nodes. */
static void reducer_fill_partials(struct adg_reducer *r, char *block)
{
	r->partials = (struct partial *)block;
	r->partial_node = (size_t *)(block + r->n_params * r->n_partials *
						     sizeof(struct partial));
	struct reducer_range range = {r->total_units, r->first_unit,
				      r->first_unit + r->n_units};
	(void)reducer_find_partials(&range, 1, 0, r->width, r->partial_node);
	for (size_t j = 0; j < r->n_params * r->n_partials; j++)
		r->partials[j].anchor = NONE;
}

/* The reason of an allocation adg_reducer_new could not make. */
static __attribute__((cold, noinline)) int reducer_no_memory(const char *what)
{
	return adg_fail(ADG_ENOMEM, "adg_reducer_new",
			"the allocator gave no memory for %s", what);
}

/* Allocates and fills r's blocks with r's allocator. Returns 0,
 * ADG_ENOMEM, or ADG_EINVAL for a repeated id; on error what was
 * allocated is left for reducer_free_blocks. */
static int reducer_fill(struct adg_reducer *r, const adg_reducer_options *o,
			const struct reducer_layout *l)
{
	const adg_allocator *a = &r->allocator;
	r->params = reducer_alloc_aligned(a, l->params_size, &r->params_block);
	r->trees = r->params == NULL ? NULL
				     : reducer_alloc_aligned(a, l->trees_size,
							     &r->trees_block);
	r->units = r->trees == NULL ? NULL
				    : reducer_alloc_aligned(a, l->units_size,
							    &r->units_block);
	r->members = r->units == NULL
			     ? NULL
			     : reducer_alloc_aligned(a, l->members_size,
						     &r->members_block);
	char *partials = r->members == NULL
				 ? NULL
				 : reducer_alloc_aligned(a, l->partials_size,
							 &r->partials_block);
	if (partials == NULL)
		return reducer_no_memory("the reducer's blocks");
	reducer_fill_partials(r, partials);
	size_t table_size = r->table_cap * sizeof *r->table;
	r->table = a->alloc(table_size, a->ctx);
	if (r->table == NULL)
		return reducer_no_memory("the parameters' table");
	memset(r->table, 0, table_size);
	r->first_task = a->alloc((r->n_params + 1) * sizeof(size_t), a->ctx);
	if (r->first_task == NULL)
		return reducer_no_memory("the applies' table");
	if (!reducer_index_params(r, o->param_ids))
		return ADG_EINVAL; /* its reason written */
	if (!reducer_fill_tasks(r, o->param_slices))
		return reducer_no_memory("the applies (their count overflows)");
	for (size_t u = 0; u < r->n_units; u++)
		for (uint64_t half = 0; half < 2; half++) {
			reducer_unit_at(r, half, u)->next = NONE;
			reducer_unit_at(r, half, u)->owner = u; /* no units */
		}
	for (size_t p = 0; p < r->n_members; p++) {
		struct member *m = &r->members[p];
		m->reducer = r;
		m->index = p;
		/* Without units, participant p is unit p, for good. */
		m->unit = r->dealt ? NONE : p;
		m->units = r->dealt ? NONE : p;
	}
	return 0;
}

int adg_reducer_new(const adg_reducer_options *options, adg_reducer **out)
{
	if (out != NULL)
		*out = NULL;
	bool sliced;
	if (options == NULL || out == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				options == NULL ? "options" : "out");
	adg_reducer_options o;
	int rc = ADG_ABI_READ(__func__, "options", &o, options,
			      ADG_ABI_FIRST_REDUCER_OPTIONS);
	if (rc != 0)
		return rc;
	options = &o;
	rc = reducer_options_valid(options, &sliced);
	if (rc != 0)
		return rc;
	/* Zeroed: gcc 12 at -O1 cannot see that reducer_layout fills it
	 * when it returns true, and warns. */
	struct reducer_layout l = {0};
	if (!reducer_layout(options->n_participants, options, options->n_params,
			    &l))
		return reducer_no_memory("its blocks (their sizes overflow)");

	adg_allocator a = options->allocator;
	if (a.alloc == NULL)
		a = adg_default_allocator;
	struct block self;
	struct adg_reducer *r = reducer_alloc_aligned(&a, sizeof *r, &self);
	if (r == NULL)
		return reducer_no_memory("the reducer");
	r->self_block = self;
	r->allocator = a;
	r->ops = options->ops;
	r->n_members = options->n_participants;
	r->n_params = options->n_params;
	r->n_units = l.units;
	r->dealt = options->n_units != 0;
	r->first_unit = options->first_unit;
	r->total_units = l.total;
	r->width = l.width;
	r->n_partials = l.n_partials;

	r->apply_early = options->apply_early != 0;
	r->sliced = sliced;
	r->spin = reducer_may_spin(r->n_members);
	r->unit_stride = l.unit_stride;
	r->table_cap = l.table_cap;
	r->shift = 64 - l.log2;
	rc = reducer_fill(r, options, &l);
	if (rc != 0) {
		reducer_free_blocks(r);
		return rc;
	}
	/* Relaxed: the reducer reaches other threads through the caller. */
	atomic_store_explicit(&r->outstanding, r->n_members,
			      memory_order_relaxed);
	*out = r;
	return 0;
}

/* ------------------------------------------------------- contributions */

/* Makes f the round's first failure (its code the round's error) unless
 * one was reported first. seq_cst: one total order with the check before
 * each apply (reducer_abandoned), so that an apply whose check comes
 * after this does not start. The one that sets error writes the record:
 * no other thread writes it this round. */
static __attribute__((cold, noinline)) void
reducer_report(struct adg_reducer *r, const adg_reducer_failure *f)
{
	int none = 0;
	if (atomic_compare_exchange_strong_explicit(&r->error, &none, f->code,
						    memory_order_seq_cst,
						    memory_order_seq_cst))
		r->fault = *f;
}

/* A failure that names no participant: an add_slice, an apply, or the
 * round's units (param_id 0). */
static __attribute__((cold, noinline)) void
reducer_report_at(struct adg_reducer *r, adg_reducer_failure_site site,
		  int code, uint64_t param_id)
{
	adg_reducer_failure f = {.code = code,
				 .site = site,
				 .participant = SIZE_MAX,
				 .param_id = param_id,
				 .unit = ADG_REDUCER_NO_UNIT};
	reducer_report(r, &f);
}

/* Whether the round was abandoned; seq_cst: see reducer_report. */
static bool reducer_abandoned(struct adg_reducer *r)
{
	return atomic_load_explicit(&r->error, memory_order_seq_cst) != 0;
}

static struct partial *reducer_partial_of(const struct adg_reducer *r, size_t i,
					  size_t j)
{
	return &r->partials[i * r->n_partials + j];
}

/* Partial sum j's first unit and count: its tree node's units below
 * total_units. */
static void reducer_partial_units(const struct adg_reducer *r, size_t j,
				  size_t *first, size_t *count)
{
	size_t node = r->partial_node[j], level = 0;
	while ((node << level) < r->width)
		level++;
	*first = (node << level) - r->width;
	size_t end = *first + ((size_t)1 << level);
	*count = (end < r->total_units ? end : r->total_units) - *first;
}

/* Applies slice k of parameter i's partial sum j (the whole of it: k 0
 * of 1, j 0 of 1). */
static int reducer_apply(struct adg_reducer *r, size_t i, size_t j, size_t k)
{
	const struct param *p = &r->params[i];
	const struct partial *s = reducer_partial_of(r, i, j);
	ADG_ASSERT(s->completed == reducer_round(r) + 1); /* I15 */
	adg_reduction reduction = {
		.param = i,
		.id = p->id,
		.round = reducer_round(r),
		.sum = s->anchor != NONE
			       ? reducer_slot_of(r, s->anchor, i)->value
			       : NULL,
		.slice = k,
		.n_slices = p->n_slices,
	};
	reducer_partial_units(r, j, &reduction.first_unit, &reduction.n_units);
	return adg_callback_result(r->ops.apply(&reduction, r->ops.ctx));
}

/* Folds slice k of parameter i over the leaves first to first + count - 1
 * (count a power of two), in the tree's order, into the leftmost
 * non-NULL one, which it returns (NONE: none). The first error stops the
 * adds (*rc). */
static size_t reducer_fold_slice(struct adg_reducer *r, size_t i, size_t k,
				 size_t first, size_t count, int *rc)
{
	if (first >= r->n_units)
		return NONE; /* padding */
	if (count == 1)
		return reducer_slot_of(r, first, i)->value != NULL ? first
								   : NONE;
	size_t half = count / 2;
	size_t left = reducer_fold_slice(r, i, k, first, half, rc);
	size_t right = reducer_fold_slice(r, i, k, first + half, half, rc);
	if (left == NONE)
		return right;
	if (right != NONE && *rc == 0)
		*rc = adg_callback_result(
			r->ops.add_slice(reducer_slot_of(r, left, i)->value,
					 reducer_slot_of(r, right, i)->value, k,
					 r->params[i].n_slices, r->ops.ctx));
	return left;
}

/* How many sleepers one wake-up wakes. INT_MAX: all of them, in the
 * waker's one system call; each runs as soon as the kernel's loop reaches
 * it and leaves with no lock to take (the barrier's state is atomics).
 * 2 makes a wake tree, each woken sleeper waking two more: the loop
 * leaves the waker's thread, but log2(T) wake-up latencies (microseconds
 * each) come one after another on the round's critical path, where the
 * loop costs well under one per sleeper. On 2 cores (adg-bench's rounds
 * workload, T = 2 to 8, oversubscribed) the two measured the same within
 * the noise, so the simpler is kept; build with -DREDUCER_WAKE_FANOUT=2
 * to compare them on a machine with many cores (docs/trainers.md). */
#ifndef REDUCER_WAKE_FANOUT
#define REDUCER_WAKE_FANOUT INT_MAX
#endif

static void reducer_futex_wake(struct adg_reducer *r, int n)
{
	syscall(SYS_futex, &r->wake_seq, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Wakes the participants asleep at the barrier, after an event they wait
 * for (gen moved, slices or applies offered) was made. No wake-up is
 * lost. A sleeper (reducer_wait, reducer_sleep) reads wake_seq, looks for
 * the events, counts itself in sleepers, and asks the kernel to sleep
 * only if wake_seq still holds what it read (FUTEX_WAIT compares and
 * queues under the futex's lock, which FUTEX_WAKE takes too). Here the
 * event comes first, then the bump, then the load of sleepers, all
 * seq_cst, in one total order with the sleeper's (ThreadSanitizer has no
 * fences, hence none here):
 * - the sleeper read wake_seq after the bump: that load acquired the
 *   event, which its look then sees, and it does not sleep;
 * - else, its count comes after the load below: then so does it after
 *   the bump, and the kernel's compare sees wake_seq moved: no sleep;
 * - else the load below sees its count, and FUTEX_WAKE either finds it
 *   queued or comes before its compare, which then sees wake_seq moved.
 * The events themselves are read through their own atomics (gen, the
 * offers' words), never inferred from a wake-up: ThreadSanitizer does not
 * model the futex, and a sleeper may wake for nothing. */
static void reducer_wake_all(struct adg_reducer *r)
{
	atomic_fetch_add_explicit(&r->wake_seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&r->sleepers, memory_order_seq_cst) != 0)
		reducer_futex_wake(r, REDUCER_WAKE_FANOUT);
}

/* Sleeps in the kernel unless wake_seq has moved from seq, read before
 * the caller looked for events (see reducer_wake_all). A 32-bit count
 * wraps only after 2^32 events between the read and the compare. */
static void reducer_sleep(struct adg_reducer *r, uint32_t seq)
{
	atomic_fetch_add_explicit(&r->sleepers, 1, memory_order_seq_cst);
	syscall(SYS_futex, &r->wake_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL,
		0);
	/* Relaxed: a late decrement costs a waker a needless system call,
	 * never a sleeper its wake-up. */
	uint32_t left = atomic_fetch_sub_explicit(&r->sleepers, 1,
						  memory_order_relaxed);
	/* A wake tree: pass the wake-up on while others sleep. */
	if (REDUCER_WAKE_FANOUT != INT_MAX && left > 1)
		reducer_futex_wake(r, REDUCER_WAKE_FANOUT);
}

/* One slice or apply of the round's offered work is done; returns
 * whether it was the last thing the round waited for, which makes this
 * thread the one that settles it (reducer_settle). acq_rel: the release
 * puts this task's writes (its fold, its apply, a report) before that
 * thread's acquire, through the count's release sequence. Only a thread
 * at the barrier can be the last: one whose participant has not arrived
 * keeps the count above 0. */
static bool reducer_task_done(struct adg_reducer *r)
{
	return atomic_fetch_sub_explicit(&r->outstanding, 1,
					 memory_order_acq_rel) == 1;
}

/* A parameter's slices word for round gen, next slice k. */
static uint64_t reducer_slices_word(uint64_t gen, size_t k)
{
	return (uint64_t)(uint32_t)(gen + 1) << 32 | k;
}

/* Claims the next slice of parameter p in round gen: its number, or NONE
 * when the round offers none left (or never offered them). The compare
 * and swap keeps the tag: a participant still in round gen's barrier
 * once round gen + 1, dealt without it, offered the same parameter's
 * slices, finds none, where a bare fetch_add on a counter that the new
 * round reset handed it one of them, folded without the new round's
 * acquire and (reading the round stale) in the wrong half of the units
 * (the reducer_rounds stress test caught it under ThreadSanitizer).
 * Acquire on success: pairs with reducer_publish's release, which heads
 * the release sequence that the claims continue, so that the slots and
 * the anchor written before it are seen. A 32-bit tag: no participant
 * lags more than one round behind one that publishes. */
static size_t reducer_claim_slice(struct param *p, uint64_t gen)
{
	uint64_t want = reducer_slices_word(gen, 0);
	/* Relaxed: a first look; the compare and swap reads it again. */
	uint64_t w = atomic_load_explicit(&p->slices, memory_order_relaxed);
	do {
		if (w >> 32 != want >> 32 || (uint32_t)w >= p->n_slices)
			return NONE;
	} while (!atomic_compare_exchange_weak_explicit(&p->slices, &w, w + 1,
							memory_order_acquire,
							memory_order_relaxed));
	return (uint32_t)w;
}

/* Takes slices of parameter i in round gen until none is left. Once
 * offered, every slice runs, whatever is reported meanwhile: a
 * parameter is never left half updated by another participant's failure
 * (I17). Returns whether a slice it did was the round's last task
 * (reducer_task_done). */
static bool reducer_take_slices(struct adg_reducer *r, size_t i, uint64_t gen)
{
	struct param *p = &r->params[i];
	bool last = false;
	for (;;) {
		size_t k = reducer_claim_slice(p, gen);
		if (k == NONE)
			return last;
		int rc = 0;
		(void)reducer_fold_slice(r, i, k, 0, r->width, &rc);
		adg_reducer_failure_site site = ADG_REDUCER_FAILED_ADD;
		if (rc == 0 && r->apply_early) {
			rc = reducer_apply(r, i, 0, k); /* one partial: whole */
			site = ADG_REDUCER_FAILED_APPLY;
		}
		if (rc != 0)
			reducer_report_at(r, site, rc, p->id);
		last |= reducer_task_done(r);
	}
}

/* Takes the round's applies (all or nothing) until none is left; an
 * apply not started once the round is abandoned is skipped (I18).
 * Returns whether one it did was the round's last task. */
static bool reducer_take_applies(struct adg_reducer *r)
{
	size_t n_tasks = r->first_task[r->n_params];
	bool last = false;
	for (;;) {
		/* Relaxed: the counter only hands out distinct applies; what
		 * an apply reads was offered before (published, acquire). A
		 * participant still here once the round is over finds none
		 * left: the next round's applies cannot be offered (next
		 * reset) before it arrives there. */
		size_t t = atomic_fetch_add_explicit(&r->applies.next, 1,
						     memory_order_relaxed);
		if (t >= n_tasks)
			return last;
		size_t lo = 0, hi = r->n_params; /* first_task[lo] <= t */
		while (hi - lo > 1) {
			size_t mid = lo + (hi - lo) / 2;
			if (r->first_task[mid] <= t)
				lo = mid;
			else
				hi = mid;
		}
		if (!reducer_abandoned(r)) {
			size_t k = t - r->first_task[lo];
			int rc = r->n_partials == 1
					 ? reducer_apply(r, lo, 0, k)
					 : reducer_apply(r, lo, k, 0);
			if (rc != 0)
				reducer_report_at(r, ADG_REDUCER_FAILED_APPLY,
						  rc, r->params[lo].id);
		}
		last |= reducer_task_done(r);
	}
}

/* Whether parameter i has slices of round gen not yet taken. Relaxed:
 * a hint; reducer_claim_slice claims, with acquire. */
static bool reducer_offers_slices(const struct param *p, uint64_t gen)
{
	uint64_t w;
	if (p->n_slices <= 1)
		return false;
	w = atomic_load_explicit(&p->slices, memory_order_relaxed);
	return w >> 32 == reducer_slices_word(gen, 0) >> 32 &&
	       (uint32_t)w < p->n_slices;
}

/* Whether the round's applies of round gen are offered and not all
 * taken; acquire and relaxed as in reducer_offers_slices. */
static bool reducer_offers_applies(struct adg_reducer *r, uint64_t gen)
{
	return atomic_load_explicit(&r->applies.published,
				    memory_order_acquire) == gen + 1 &&
	       atomic_load_explicit(&r->applies.next, memory_order_relaxed) <
		       r->first_task[r->n_params];
}

/* Takes any slice or apply of round gen offered and not yet taken;
 * returns whether one it did was the round's last task. Any participant
 * may, from its end (the barrier), so that a large parameter's sum and
 * update, and the round's applies, are split among the threads that
 * wait. */
static bool reducer_help(struct adg_reducer *r, uint64_t gen)
{
	bool last = false;
	for (size_t i = 0; r->sliced && i < r->n_params; i++)
		if (reducer_offers_slices(&r->params[i], gen))
			last |= reducer_take_slices(r, i, gen);
	if (reducer_offers_applies(r, gen))
		last |= reducer_take_applies(r);
	return last;
}

/* Parameter i's root is complete and its tree in slices: offers its
 * slices to every participant and takes them itself. */
static void reducer_publish(struct adg_reducer *r, size_t i)
{
	struct param *p = &r->params[i];
	/* Relaxed: counted before any slice can be taken (the offer comes
	 * after, with release, and a slice's count-down after its claim's
	 * acquire), and while this contribution's participant, not yet
	 * arrived, keeps the count above 0: it cannot reach 0 early. */
	atomic_fetch_add_explicit(&r->outstanding, p->n_slices,
				  memory_order_relaxed);
	/* Relaxed: the barrier cannot move during the round, which this
	 * contribution's participant has not ended. */
	uint64_t gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
	/* Release: the slots and the anchor before, for the claims'
	 * acquire. */
	atomic_store_explicit(&p->slices, reducer_slices_word(gen, 0),
			      memory_order_release);
	reducer_wake_all(r); /* participants asleep at the barrier help */
	bool last = reducer_take_slices(r, i, gen);
	ADG_ASSERT(!last); /* this participant has not arrived */
	(void)last;
}

/* Parameter i's partial sum j (its sum but for a rank's share) is
 * complete, in anchor's slot: offer its slices, or (apply_early) apply
 * it, unless the round was abandoned. */
static int reducer_complete(struct adg_reducer *r, size_t i, size_t j,
			    size_t anchor)
{
	struct param *p = &r->params[i];
	struct partial *s = reducer_partial_of(r, i, j);
	s->anchor = anchor;
	s->completed = reducer_round(r) + 1;
	if (reducer_abandoned(r))
		return 0;
	if (p->n_slices > 1) {
		reducer_publish(r, i);
		return 0; /* a slice's error is the round's, not this give's */
	}
	int rc = r->apply_early ? reducer_apply(r, i, j, 0) : 0;
	if (rc != 0)
		reducer_report_at(r, ADG_REDUCER_FAILED_APPLY, rc, p->id);
	return rc;
}

/* Whether node, of level (2^level leaves), is the root of a partial sum:
 * the root, or a node whose parent holds units of the job outside this
 * reducer's. */
static bool reducer_partial_root(const struct adg_reducer *r, size_t node,
				 size_t level)
{
	if (node == 1)
		return true;
	size_t first = ((node / 2) << (level + 1)) - r->width;
	size_t end = first + ((size_t)2 << level);
	if (end > r->total_units)
		end = r->total_units;
	return first < r->first_unit || end > r->first_unit + r->n_units;
}

/* The partial sum whose root is node. */
static size_t reducer_partial_at(const struct adg_reducer *r, size_t node)
{
	size_t j = 0;
	while (r->partial_node[j] != node)
		j++; /* there: partial_node holds every partial root */
	return j;
}

/* An add failed folding unit u's contribution to parameter i: u's
 * participant's, whose thread (or backward) runs this climb. */
static __attribute__((cold, noinline)) void
reducer_report_add(struct adg_reducer *r, size_t u, size_t i, int code)
{
	adg_reducer_failure f = {
		.code = code,
		.site = ADG_REDUCER_FAILED_ADD,
		.participant = reducer_unit_at(r, reducer_round(r), u)->owner,
		.param_id = r->params[i].id,
		.unit = ADG_REDUCER_NO_UNIT,
	};
	reducer_report(r, &f);
}

/* Unit u's contribution to parameter i is in its slot: climbs the tree
 * (u's leaf is the job's first_unit + u), folding at each node it reaches
 * second, until a node it reaches first or a partial sum's root (the
 * root, for a reducer of the whole job) (I15). Returns 0 or an add's or
 * apply's code. */
static int reducer_arrive(struct adg_reducer *r, size_t u, size_t i)
{
	struct tree_node *tree = reducer_tree_of(r, i);
	uint64_t mark = reducer_round(r) + 1;
	bool whole = r->params[i].n_slices == 1;
	size_t anchor = reducer_slot_of(r, u, i)->value != NULL ? u : NONE;
	size_t node = r->width + r->first_unit + u, level = 0;
	for (; !reducer_partial_root(r, node, level); level++, node /= 2) {
		size_t side = node & 1;
		/* A left side whose right holds no unit meets no one. */
		if (side == 0 &&
		    ((node + 1) << level) - r->width >= r->total_units)
			continue;

		struct tree_node *t = &tree[node / 2];
		t->anchor[side] = anchor;
		/* acq_rel: the release publishes this side's anchor and the
		 * slots and folds below it; the side that reads this mark
		 * back acquires them (I15). */
		if (atomic_exchange_explicit(&t->mark, mark,
					     memory_order_acq_rel) != mark)
			return 0; /* first here: the other side climbs on */
		size_t other = t->anchor[side ^ 1];
		size_t left = side ? other : anchor,
		       right = side ? anchor : other;
		anchor = left != NONE ? left : right;
		if (!whole || left == NONE || right == NONE)
			continue; /* slices fold at the root; NULL passes */
		if (reducer_abandoned(r))
			return 0; /* no sum will be applied */
		int rc = adg_callback_result(r->ops.add(
			&reducer_slot_of(r, left, i)->value,
			reducer_slot_of(r, right, i)->value, r->ops.ctx));
		if (rc != 0) {
			reducer_report_add(r, u, i, rc);
			return rc;
		}
	}
	return reducer_complete(r, i, reducer_partial_at(r, node), anchor);
}

/* The reason participant is refused by func: NULL, or out of range. */
static __attribute__((cold, noinline)) int
reducer_bad_participant(const char *func, const adg_reducer *r,
			size_t participant)
{
	if (r == NULL)
		return adg_fail(ADG_EINVAL, func, "reducer is NULL");
	return adg_fail(ADG_EINVAL, func,
			"participant %zu out of range (%zu participants)",
			participant, r->n_members);
}

/* The reason m is refused a unit's call by func (ADG_ESTATE). */
static __attribute__((cold, noinline)) int
reducer_unit_refused(const char *func, const struct adg_reducer *r,
		     const struct member *m)
{
	if (!r->dealt)
		return adg_fail(ADG_ESTATE, func,
				"the reducer has no units (n_units 0)");
	if (atomic_load_explicit(&m->ended, memory_order_relaxed))
		return adg_fail(ADG_ESTATE, func,
				"participant %zu is ending its round",
				m->index);
	if (m->unit == NONE)
		return adg_fail(ADG_ESTATE, func,
				"participant %zu has no unit (deal one with "
				"adg_reducer_next_unit)",
				m->index);
	return adg_fail(ADG_ESTATE, func,
			"participant %zu has not ended unit %zu "
			"(adg_reducer_unit_end)",
			m->index, r->first_unit + m->unit);
}

/* The reason of a give that failed with rc: refused (ADG_ESTATE, value not
 * taken), or an add's or apply's code from its climb. */
static __attribute__((cold, noinline)) int
reducer_give_failed(const char *func, const struct adg_reducer *r,
		    const struct member *m, size_t i, int rc)
{
	if (rc != ADG_ESTATE)
		return adg_fail(rc, func,
				"folding or applying parameter id %" PRIu64
				" returned %s: the round is abandoned",
				r->params[i].id,
				adg_code_text(rc, (char[32]){0}));
	if (atomic_load_explicit(&m->ended, memory_order_relaxed))
		return adg_fail(rc, func,
				"participant %zu is ending its round (value "
				"not taken)",
				m->index);
	if (m->unit == NONE)
		return adg_fail(rc, func,
				"participant %zu has no unit (value not taken)",
				m->index);
	return adg_fail(rc, func,
			"participant %zu's unit %zu already has parameter id "
			"%" PRIu64 " (value not taken)",
			m->index, r->first_unit + m->unit, r->params[i].id);
}

/* Hands parameter i's contribution of m's unit to the reducer. */
static int reducer_give(struct adg_reducer *r, struct member *m, size_t i,
			void *value)
{
	/* Relaxed: set by this participant's own end, which its gives come
	 * before; read here only to refuse a give made out of order. */
	if (atomic_load_explicit(&m->ended, memory_order_relaxed) ||
	    m->unit == NONE)
		return ADG_ESTATE;
	struct slot *s = reducer_slot_of(r, m->unit, i);
	/* Relaxed: only atomicity matters, so that one of two gives of the
	 * same slot wins; the slot's own writes are ordered by the climb's
	 * exchanges. The reset to false (reducer_release_own) comes before
	 * the unit is dealt again, in a later round. */
	if (atomic_exchange_explicit(&s->given, true, memory_order_relaxed))
		return ADG_ESTATE;
	s->value = value;
	return reducer_arrive(r, m->unit, i);
}

int adg_reducer_give(adg_reducer *reducer, size_t participant, uint64_t id,
		     void *value)
{
	if (reducer == NULL || participant >= reducer->n_members)
		return reducer_bad_participant(__func__, reducer, participant);
	if (value == NULL)
		return ADG_FAIL(ADG_EINVAL, "value is NULL");
	size_t i = reducer_lookup(reducer, id);
	if (i == NONE)
		return ADG_FAIL(ADG_EINVAL,
				"id %" PRIu64 " is not a parameter (value not "
				"taken)",
				id);
	struct member *m = &reducer->members[participant];
	int rc = reducer_give(reducer, m, i, value);
	return adg_likely(rc == 0)
		       ? 0
		       : reducer_give_failed(__func__, reducer, m, i, rc);
}

/* The ready hook of adg_reducer_hook: ctx is the participant. The
 * trainer's own hook first, so that it sees a parameter's gradient
 * before the reducer takes it. */
static int reducer_on_ready(uint64_t id, void **grad, void *ctx)
{
	struct member *m = ctx;
	struct adg_reducer *r = m->reducer;
	if (m->then_on_ready != NULL) {
		int rc = adg_callback_result(
			m->then_on_ready(id, grad, m->then_ctx));
		if (rc != 0)
			return rc;
	}
	if (*grad == NULL)
		return 0; /* a NULL contribution, at the unit's end */
	size_t i = reducer_lookup(r, id);
	if (i == NONE)
		return 0; /* not a parameter: it stays in the container */
	int rc = reducer_give(r, m, i, *grad);
	if (rc != ADG_ESTATE)
		*grad = NULL; /* taken, whatever add and apply said */
	return adg_likely(rc == 0)
		       ? 0
		       : reducer_give_failed("adg_reducer_hook's on_ready", r,
					     m, i, rc);
}

int adg_reducer_hook(adg_reducer *reducer, size_t participant,
		     adg_backward_options *options)
{
	if (reducer == NULL || participant >= reducer->n_members)
		return reducer_bad_participant(__func__, reducer, participant);
	if (options == NULL)
		return ADG_FAIL(ADG_EINVAL, "options is NULL");
	/* The options are the caller's, read and written in place: the
	 * fields it sets are in every size the check accepts. */
	int rc = adg_abi_check(__func__, "options", options, sizeof *options,
			       ADG_ABI_FIRST_BACKWARD_OPTIONS);
	if (rc != 0)
		return rc;
	struct member *m = &reducer->members[participant];
	/* The options' own hook, kept and called first; options already
	 * hooked to this participant (a loop that hooks every round) keep
	 * the one they had. */
	if (options->on_ready != reducer_on_ready) {
		m->then_on_ready = options->on_ready;
		m->then_ctx = options->on_ready_ctx;
		if (options->on_ready == NULL)
			options->leaves_only = 1;
	}
	options->on_ready = reducer_on_ready;
	options->on_ready_ctx = m;
	return 0;
}

/* ---------------------------------------------------------------- units */

int adg_reducer_next_unit(adg_reducer *reducer, size_t participant,
			  size_t *unit)
{
	if (unit != NULL)
		*unit = ADG_REDUCER_NO_UNIT;
	if (reducer == NULL || participant >= reducer->n_members)
		return reducer_bad_participant(__func__, reducer, participant);
	if (unit == NULL)
		return ADG_FAIL(ADG_EINVAL, "unit is NULL");
	struct adg_reducer *r = reducer;
	struct member *m = &r->members[participant];
	/* Relaxed: see reducer_give. */
	if (!r->dealt || m->unit != NONE ||
	    atomic_load_explicit(&m->ended, memory_order_relaxed))
		return reducer_unit_refused(__func__, r, m);
	if (reducer_abandoned(r))
		return 0; /* no use computing more */
	/* Relaxed: the counter only hands out distinct units; the unit's
	 * slots were cleared before the barrier that began this round. */
	size_t u = atomic_fetch_add_explicit(&r->next_unit, 1,
					     memory_order_relaxed);
	if (u >= r->n_units)
		return 0;
	reducer_unit_at(r, reducer_round(r), u)->next = m->units;
	reducer_unit_at(r, reducer_round(r), u)->owner = m->index;
	m->units = u;
	m->unit = u;
	*unit = r->first_unit + u;
	return 0;
}

/* m ended its unit or round with result, from the backward that failed
 * at step (NULL: not said). */
static __attribute__((cold, noinline)) void
reducer_report_result(struct adg_reducer *r, const struct member *m, int result,
		      const adg_failure *step)
{
	adg_reducer_failure f = {
		.code = adg_callback_result(result),
		.site = ADG_REDUCER_FAILED_RESULT,
		.participant = m->index,
		.unit = r->dealt && m->unit != NONE ? r->first_unit + m->unit
						    : ADG_REDUCER_NO_UNIT,
	};
	if (step != NULL) {
		f.step = *step;
		f.step.size = sizeof f.step; /* the caller's may differ */
	}
	reducer_report(r, &f);
}

/* Ends m's unit with result: its missing contributions count as NULL,
 * or result abandons the round (step: where its backward failed, or
 * NULL). Returns 0 or the first code of a climb. */
static int reducer_close_unit(struct adg_reducer *r, struct member *m,
			      int result, const adg_failure *step)
{
	size_t u = m->unit;
	int first = 0;
	if (result != 0) {
		reducer_report_result(r, m, result, step);
	} else {
		for (size_t i = 0; i < r->n_params; i++) {
			struct slot *s = reducer_slot_of(r, u, i);
			/* Relaxed: see reducer_give. */
			if (atomic_exchange_explicit(&s->given, true,
						     memory_order_relaxed))
				continue;
			int rc = reducer_arrive(r, u, i);
			if (first == 0)
				first = rc;
		}
		/* Relaxed: read by the thread that settles the round, after
		 * this participant's arrival (acq_rel) at the barrier. */
		atomic_fetch_add_explicit(&r->units_done, 1,
					  memory_order_relaxed);
	}
	if (r->dealt)
		m->unit = NONE;
	return first;
}

static int reducer_unit_end(const char *func, adg_reducer *reducer,
			    size_t participant, int result,
			    const adg_failure *step)
{
	if (reducer == NULL || participant >= reducer->n_members)
		return reducer_bad_participant(func, reducer, participant);
	struct member *m = &reducer->members[participant];
	/* Relaxed: see reducer_give. */
	if (!reducer->dealt || m->unit == NONE ||
	    atomic_load_explicit(&m->ended, memory_order_relaxed))
		return reducer_unit_refused(func, reducer, m);
	int rc = reducer_close_unit(reducer, m, result, step);
	return rc == 0 ? 0
		       : adg_fail(rc, func,
				  "a fold of unit's NULL contributions "
				  "returned %s: the round is abandoned",
				  adg_code_text(rc, (char[32]){0}));
}

int adg_reducer_unit_end(adg_reducer *reducer, size_t participant, int result)
{
	return reducer_unit_end(__func__, reducer, participant, result, NULL);
}

int adg_reducer_unit_end_with(adg_reducer *reducer, size_t participant,
			      const adg_failure *failure)
{
	adg_failure step;
	if (failure != NULL) {
		int rc = ADG_ABI_READ(__func__, "failure", &step, failure,
				      ADG_ABI_FIRST_FAILURE);
		if (rc != 0)
			return rc;
	}
	return reducer_unit_end(__func__, reducer, participant,
				failure != NULL ? step.code : 0,
				failure != NULL ? &step : NULL);
}

/* --------------------------------------------------------- the barrier */

/* Every participant is inside its end, past its contributions, and
 * every slice and apply offered is done: this thread brought outstanding
 * to 0, and its acquire there made all of that, and every report, seen
 * here. Until it offers the applies or moves gen, the round's state is
 * its own. All or nothing: the first time, offers the round's applies
 * (unless it was abandoned), counting them in outstanding, and returns
 * false; else the round is over. */
static bool reducer_settle(struct adg_reducer *r, uint64_t gen)
{
	/* Relaxed: every unit end came before its participant's arrival,
	 * which the count's acquire ordered before this. */
	if (atomic_load_explicit(&r->units_done, memory_order_relaxed) !=
	    r->n_units)
		reducer_report_at(r, ADG_REDUCER_FAILED_UNITS, ADG_ESTATE,
				  0); /* a unit was not done */
	if (r->apply_early || r->applying || reducer_abandoned(r))
		return true;
	r->applying = true;
	/* Release: heads the release sequence that the applies' count-downs
	 * continue, so that the thread whose count-down reaches 0 sees
	 * applying set. Counted before any apply can be taken (published
	 * comes after, with release), and next reset before it too. */
	atomic_store_explicit(&r->outstanding, r->first_task[r->n_params],
			      memory_order_release);
	atomic_store_explicit(&r->applies.next, 0, memory_order_relaxed);
	atomic_store_explicit(&r->applies.published, gen + 1,
			      memory_order_release);
	reducer_wake_all(r); /* the sleepers take applies */
	return false;
}

/* On the thread that saw the round over, alone with the round's state:
 * makes the next round start clean (I16), records the round's result,
 * and lets the participants out. Returns the round's result. */
static int reducer_finish_round(struct adg_reducer *r, uint64_t gen)
{
	/* Relaxed, all: gen's release below orders these before every
	 * participant's next round. */
	int rc = atomic_load_explicit(&r->error, memory_order_relaxed);
	if (adg_unlikely(rc != 0)) {
		r->result_fault = r->fault;
		r->result_fault.round = reducer_round(r);
	}
	r->result = rc;
	atomic_store_explicit(&r->next_unit, 0, memory_order_relaxed);
	atomic_store_explicit(&r->units_done, 0, memory_order_relaxed);
	atomic_store_explicit(&r->error, 0, memory_order_relaxed);
	atomic_store_explicit(&r->outstanding, r->n_members,
			      memory_order_relaxed);
	r->applying = false;
	/* Release: pairs with adg_reducer_rounds' acquire load, so that a
	 * thread that sees the count sees the round's applies. */
	atomic_fetch_add_explicit(&r->rounds, 1, memory_order_release);
	/* Release: pairs with the acquire in reducer_barrier, so that a
	 * participant let out sees all of the above, and its arrival in the
	 * next round comes after the reset of outstanding. */
	atomic_store_explicit(&r->gen, gen + 1, memory_order_release);
	reducer_wake_all(r);
	return rc;
}

/* Whether the barrier let round gen through, or there is work to take.
 * Looked at in a short spin and before sleeping: a wake-up from the
 * kernel costs more than a small batch's work. Relaxed gen: a look;
 * reducer_barrier reads it again with acquire before it leaves. */
static bool reducer_worth_waking(struct adg_reducer *r, uint64_t gen)
{
	if (atomic_load_explicit(&r->gen, memory_order_relaxed) != gen)
		return true;
	for (size_t i = 0; r->sliced && i < r->n_params; i++)
		if (reducer_offers_slices(&r->params[i], gen))
			return true;
	return reducer_offers_applies(r, gen);
}

static uint64_t reducer_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Waits at the barrier of round gen until it moves or work shows up,
 * and takes the work: looks, yielding the core to any thread still at
 * work (the cores are the backward passes'), for REDUCER_SPINS looks and,
 * when it may spin, until REDUCER_SPIN_NS has passed; then sleeps.
 * Returns whether a task it did was the round's last. */
static bool reducer_wait(struct adg_reducer *r, uint64_t gen)
{
	uint64_t until = r->spin ? reducer_now_ns() + REDUCER_SPIN_NS : 0;
	for (int spin = 0;
	     spin < REDUCER_SPINS || (until != 0 && reducer_now_ns() < until);
	     spin++) {
		if (reducer_worth_waking(r, gen))
			return reducer_help(r, gen);
		sched_yield();
	}
	/* seq_cst, and before looking: see reducer_wake_all. */
	uint32_t seq = atomic_load_explicit(&r->wake_seq, memory_order_seq_cst);
	if (reducer_worth_waking(r, gen))
		return reducer_help(r, gen);
	reducer_sleep(r, seq);
	return false;
}

/* Waits for the round's other participants, taking slices and applies
 * meanwhile; the thread that brings outstanding to 0 with the round's
 * last task finishes it. Returns the round's result, and fills *fault
 * with its first failure. Arriving is one atomic count-down, leaving one
 * acquire load (and, for a sleeper, the wake-up): no lock, nothing
 * serialized among the participants. */
static int reducer_barrier(struct adg_reducer *r, adg_reducer_failure *fault)
{
	/* Relaxed: the barrier cannot move before this participant is in. */
	uint64_t gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
	bool last = reducer_help(r, gen);
	ADG_ASSERT(!last); /* not arrived: the count is above 0 */
	/* acq_rel: the release puts this participant's contributions, and
	 * the folds and reports they made, before the thread that settles
	 * the round; the acquire makes this thread that one if it is last. */
	last = atomic_fetch_sub_explicit(&r->outstanding, 1,
					 memory_order_acq_rel) == 1;
	for (;;) {
		if (last && reducer_settle(r, gen)) {
			int rc = reducer_finish_round(r, gen);
			if (adg_unlikely(rc != 0))
				*fault = r->result_fault;
			return rc;
		}
		/* Acquire: pairs with reducer_finish_round's release. */
		if (atomic_load_explicit(&r->gen, memory_order_acquire) != gen)
			break;
		last = reducer_wait(r, gen);
	}
	/* result cannot move before this participant ends the next round. */
	int rc = r->result;
	if (adg_unlikely(rc != 0))
		*fault = r->result_fault;
	return rc;
}

/* After the barrier: hands the values of this participant's units of
 * round back and clears their slots for round + 2. */
static void reducer_release_own(struct adg_reducer *r, struct member *m,
				uint64_t round)
{
	for (size_t u = m->units; u != NONE;
	     u = reducer_unit_at(r, round, u)->next) {
		for (size_t i = 0; i < r->n_params; i++) {
			struct slot *s =
				&reducer_unit_at(r, round, u)->slots[i];
			void *value = s->value;
			s->value = NULL;
			/* Relaxed: see reducer_give. */
			atomic_store_explicit(&s->given, false,
					      memory_order_relaxed);
			if (value != NULL)
				r->ops.release(value, m->index, r->ops.ctx);
		}
	}
	if (r->dealt)
		m->units = NONE;
	/* Relaxed: see reducer_give. Last, so that a call from release is
	 * refused. */
	atomic_store_explicit(&m->ended, false, memory_order_relaxed);
}

/* "step 'mul' of node 17", what a backward's failure names, for a
 * round's reason; "" when it names none. */
static void reducer_step_text(char *buf, size_t size, const adg_failure *f)
{
	char node[256];
	if (f->name != NULL)
		snprintf(node, sizeof node, "step '%s' of node %" PRIu64,
			 f->name, f->node_id);
	else
		snprintf(node, sizeof node, "node %" PRIu64, f->node_id);
	adg_errmsg_clip(node, sizeof node); /* a long name cut */
	switch (f->site) {
	case ADG_FAILED_STEP:
		snprintf(buf, size, " at %s", node);
		break;
	case ADG_FAILED_ON_STEP:
		snprintf(buf, size, " in on_step around %s", node);
		break;
	case ADG_FAILED_ON_READY:
		snprintf(buf, size, " in on_ready for %s", node);
		break;
	case ADG_FAILED_ADD:
		snprintf(buf, size, " in ops->add into %s", node);
		break;
	case ADG_FAILED_CHECK:
		snprintf(buf, size,
			 " in the value check, on a gradient that %s gave",
			 node);
		break;
	default:
		buf[0] = '\0';
	}
}

/* The reason of a failed round, the same on every participant. */
static __attribute__((cold, noinline)) int
reducer_round_failed(const char *func, const adg_reducer_failure *f)
{
	char code[32], step[320], unit[48] = "";
	adg_code_text(f->code, code);
	switch (f->site) {
	case ADG_REDUCER_FAILED_RESULT:
		reducer_step_text(step, sizeof step, &f->step);
		if (f->unit != ADG_REDUCER_NO_UNIT)
			snprintf(unit, sizeof unit, " in unit %zu", f->unit);
		return adg_fail(f->code, func,
				"round %" PRIu64 " abandoned: participant %zu "
				"failed with %s%s%s",
				f->round, f->participant, code, unit, step);
	case ADG_REDUCER_FAILED_ADD:
		if (f->participant == SIZE_MAX)
			return adg_fail(f->code, func,
					"round %" PRIu64 " abandoned: "
					"ops.add_slice returned %s folding "
					"parameter id %" PRIu64,
					f->round, code, f->param_id);
		return adg_fail(f->code, func,
				"round %" PRIu64 " abandoned: ops.add returned "
				"%s folding participant %zu's contribution to "
				"parameter id %" PRIu64,
				f->round, code, f->participant, f->param_id);
	case ADG_REDUCER_FAILED_APPLY:
		return adg_fail(f->code, func,
				"round %" PRIu64 " abandoned: ops.apply "
				"returned %s for parameter id %" PRIu64,
				f->round, code, f->param_id);
	default:
		return adg_fail(f->code, func,
				"round %" PRIu64 " abandoned with %s: it ended "
				"with units not done",
				f->round, code);
	}
}

static int reducer_end(const char *func, adg_reducer *reducer,
		       size_t participant, int result, const adg_failure *step,
		       adg_reducer_failure *fault)
{
	*fault = (adg_reducer_failure){.size = sizeof *fault,
				       .participant = SIZE_MAX,
				       .unit = ADG_REDUCER_NO_UNIT};
	if (reducer == NULL || participant >= reducer->n_members)
		return reducer_bad_participant(func, reducer, participant);
	struct adg_reducer *r = reducer;
	struct member *m = &r->members[participant];
	/* Relaxed: atomicity alone refuses a second end; see reducer_give. */
	if (atomic_exchange_explicit(&m->ended, true, memory_order_relaxed))
		return adg_fail(ADG_ESTATE, func,
				"participant %zu is already ending this round",
				participant);
	uint64_t round = reducer_round(r);
	fault->round = round;
	if (m->unit != NONE)
		(void)reducer_close_unit(r, m, result, step); /* reported */
	else if (result != 0)
		reducer_report_result(r, m, result, step);
	int rc = reducer_barrier(r, fault);
	reducer_release_own(r, m, round);
	if (adg_unlikely(rc != 0))
		reducer_round_failed(func, fault);
	return rc;
}

int adg_reducer_end(adg_reducer *reducer, size_t participant, int result)
{
	adg_reducer_failure fault;
	return reducer_end(__func__, reducer, participant, result, NULL,
			   &fault);
}

int adg_reducer_end_with(adg_reducer *reducer, size_t participant,
			 const adg_failure *failure, adg_reducer_failure *round)
{
	/* Both sized (adg.h, "ABI"), checked before the round is touched:
	 * a bad size ends nothing. */
	adg_failure step;
	if (failure != NULL) {
		int rc = ADG_ABI_READ(__func__, "failure", &step, failure,
				      ADG_ABI_FIRST_FAILURE);
		if (rc != 0)
			return rc;
	}
	if (round != NULL) {
		int rc = adg_abi_check(__func__, "round", round, sizeof *round,
				       ADG_ABI_FIRST_REDUCER_FAILURE);
		if (rc != 0)
			return rc;
	}
	adg_reducer_failure fault;
	int rc = reducer_end(__func__, reducer, participant,
			     failure != NULL ? step.code : 0,
			     failure != NULL ? &step : NULL, &fault);
	if (round != NULL)
		adg_abi_write(round, &fault, sizeof fault);
	return rc;
}

int adg_reducer_rounds(const adg_reducer *reducer, uint64_t *rounds)
{
	if (reducer == NULL || rounds == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				reducer == NULL ? "reducer" : "rounds");
	/* Acquire: pairs with reducer_finish_round's release. */
	*rounds = atomic_load_explicit(&reducer->rounds, memory_order_acquire);
	return 0;
}

/* Whether a round has begun: a unit dealt, or a contribution given. No
 * call runs beside adg_reducer_free (adg.h): relaxed. */
static bool reducer_busy(const struct adg_reducer *r)
{
	if (atomic_load_explicit(&r->outstanding, memory_order_relaxed) !=
	    r->n_members)
		return true;
	if (r->dealt)
		return atomic_load_explicit(&r->next_unit,
					    memory_order_relaxed) != 0;
	for (size_t u = 0; u < r->n_units; u++)
		for (size_t i = 0; i < r->n_params; i++)
			if (atomic_load_explicit(
				    &reducer_slot_of(r, u, i)->given,
				    memory_order_relaxed))
				return true;
	return false;
}

int adg_reducer_free(adg_reducer *reducer)
{
	if (reducer == NULL)
		return 0;
	struct adg_reducer *r = reducer;
	if (reducer_busy(r))
		return ADG_FAIL(ADG_EBUSY,
				"a round has begun and not ended (nothing "
				"freed)");
	reducer_free_blocks(r);
	return 0;
}
