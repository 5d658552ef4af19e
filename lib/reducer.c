/*
 * The gradient reducer: synchronous data parallelism inside one process
 * (include/adg/reducer.h; docs/concurrency.md, I15 to I17).
 *
 * Contributions. Each participant has a block of slots, one per parameter,
 * on cache lines of its own: a contribution is a plain store into the
 * giver's own slot and an atomic exchange of the slot's given flag (which
 * refuses a second one), then one acq_rel add to the parameter's count,
 * on the parameter's own line. The add that brings the count to T
 * synchronizes with every earlier one (they form one release sequence),
 * so the thread that made it reads every slot of the parameter and folds
 * them in participant order: the order of the slots, not of arrival.
 * Lookups go through an open-addressing table built at creation and only
 * read afterwards. Nothing on this path locks or allocates.
 *
 * Slices. A large parameter may be cut into slices (reduce-scatter): the
 * contribution that completes it offers them (published), and it and
 * every participant waiting at the barrier take them one at a time
 * (next_slice), folding and applying each, so that the largest layer's
 * sum and update are not one thread's while the others wait.
 *
 * Rounds. adg_reducer_end is the barrier, once per participant per round:
 * a mutex and a condition variable. A participant there takes slices,
 * looks a few times, yielding, and then sleeps (the cores are the
 * backward passes'); offering slices and finishing the last one wake the
 * sleepers. Every contribution of a participant, and so every fold and
 * apply it triggers, comes before its end; once every participant has
 * arrived and every slice is done, nothing touches the round's state but
 * the one that saw it so: it applies (apply_at_end), resets every
 * parameter's count and the round's error, and only then wakes the
 * others, each of which releases its own contributions and clears its
 * own slots before returning.
 *
 * Failure. The round's first error is one compare and swap; the check
 * before each apply reads it in the same total order (seq_cst), so no
 * apply starts after a failure is reported, and one that started
 * finishes. A participant that fails gives no NULL contributions at its
 * end: the parameters it did not give stay incomplete, never applied
 * with part of their contributions.
 */
#include "adg.h"
#include "util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#define NONE SIZE_MAX /* no participant or parameter */

/* One parameter's round, on a cache line of its own: the participants
 * count different parameters at once. */
struct param {
	_Alignas(ADG_CACHELINE) atomic_size_t arrived; /* contributions, to T */
	/* Written by the thread that brings the last contribution (it folds),
	 * read by it, by the threads that take its slices (after published),
	 * or by the last participant to end (apply_at_end, reset): ordered
	 * by arrived, published, then by the barrier. */
	size_t owner; /* the participant the sum started as; NONE: no sum */
	bool folded;  /* the fold ran whole: the sum may be applied */
	uint64_t id;  /* the leaf's id; read-only */
	/* A parameter in slices (reduce-scatter): read-only n_slices; once
	 * the last contribution is in, published is set to the round's
	 * barrier generation plus one and any participant of that round
	 * takes the next slice (next_slice) to fold and apply. Both are
	 * left as they are at the round's end, so that a participant still
	 * looking for slices of that round finds none; the next reducer_publish
	 * resets next_slice first. */
	size_t n_slices;
	atomic_uint_fast64_t published;
	atomic_size_t next_slice;
};

_Static_assert(sizeof(struct param) == ADG_CACHELINE,
	       "a parameter's round is one cache line");

/* A participant's contribution to one parameter. */
struct slot {
	/* The value given (for the parameter's owner, the sum once folded),
	 * NULL for none. Written by its participant before the count's add,
	 * read by the folder after it (I15); written back by the folder, and
	 * read and cleared by the participant after the barrier (I16). */
	void *value;
	/* A contribution, NULL included, was counted this round: the
	 * exchange that sets it lets one through. */
	atomic_bool given;
};

/* One participant: what the ready hook's ctx points to, followed by its
 * slots, on lines no other participant writes. */
struct member {
	_Alignas(ADG_CACHELINE) struct adg_reducer *reducer;
	size_t index;
	/* Set by the participant's adg_reducer_end, from its start to its
	 * return: a second end, and a contribution meanwhile, are refused. */
	atomic_bool ended;
	/* The trainer's own ready hook, which adg_reducer_hook found in the
	 * options and keeps, called before the reducer's (NULL: none).
	 * Written by the participant before its backward, read by the
	 * backward's threads, which the backward's start orders after. */
	adg_ready_fn then_on_ready;
	void *then_ctx;
	struct slot slots[];
};

_Static_assert(_Alignof(struct member) == ADG_CACHELINE,
	       "a participant's block starts a cache line");

/* id -> parameter index; id 0 marks an empty entry. */
struct entry {
	uint64_t id;
	size_t param;
};

struct adg_reducer {
	/* Read-only after creation. */
	adg_reducer_ops ops;
	adg_allocator allocator;
	size_t n_members, n_params;
	bool apply_at_end;
	struct param *params;
	char *members; /* n_members blocks of member_stride bytes */
	size_t member_stride;
	struct entry *table;
	size_t table_cap;   /* a power of two, at least twice n_params */
	unsigned int shift; /* 64 - log2(table_cap) */
	void *self_base;    /* what the allocator returned, for each block */
	void *params_base, *members_base;
	size_t self_bytes, params_bytes, members_bytes;

	/* The round's first error, 0 while none: set by one compare and
	 * swap, read before each apply, reset by the last participant to
	 * end. */
	_Alignas(ADG_CACHELINE) atomic_int error;
	/* Rounds completed; bumped by the last participant to end. */
	atomic_uint_fast64_t rounds;
	/* Slices published and not yet done: the round cannot end before. */
	atomic_size_t slices_pending;
	bool sliced; /* some parameter is in slices; read-only */

	/* The barrier, under lock. */
	_Alignas(ADG_CACHELINE) pthread_mutex_t lock;
	/* gen moved, slices were published, or the last slice is done */
	pthread_cond_t done;
	size_t n_ended; /* participants inside adg_reducer_end */
	/* Rounds the barrier has let through: written under lock, read
	 * without it by participants that look before they sleep. */
	atomic_uint_fast64_t gen;
	int result;	   /* what the round gen - 1 returns */
	size_t n_sleeping; /* participants in pthread_cond_wait */
};

/* ------------------------------------------------------------- layout */

/* size bytes at a cache line's boundary: the allocator promises malloc's
 * alignment only, so ask for a line more. *base is what to free, *bytes
 * its size. NULL on failure. */
static void *reducer_alloc_aligned(const adg_allocator *a, size_t size,
				   void **base, size_t *bytes)
{
	*bytes = size + ADG_CACHELINE;
	*base = a->alloc(*bytes, a->ctx);
	if (*base == NULL)
		return NULL;
	void *p = (void *)adg_round_up((uintptr_t)*base, ADG_CACHELINE);
	memset(p, 0, size);
	return p;
}

static struct member *reducer_member_of(const struct adg_reducer *r, size_t p)
{
	return (struct member *)(r->members + p * r->member_stride);
}

static struct slot *reducer_slot_of(const struct adg_reducer *r, size_t p,
				    size_t i)
{
	return &reducer_member_of(r, p)->slots[i];
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
			if (r->table[i].id == ids[k])
				return false;
			i = (i + 1) & mask;
		}
		r->table[i] = (struct entry){ids[k], k};
		r->params[k].id = ids[k];
		r->params[k].owner = NONE;
	}
	return true;
}

/* Frees what adg_reducer_new allocated (any of it NULL). */
static void reducer_free_blocks(struct adg_reducer *r)
{
	const adg_allocator *a = &r->allocator;
	if (r->table != NULL)
		a->free(r->table, r->table_cap * sizeof *r->table, a->ctx);
	if (r->members_base != NULL)
		a->free(r->members_base, r->members_bytes, a->ctx);
	if (r->params_base != NULL)
		a->free(r->params_base, r->params_bytes, a->ctx);
	adg_allocator copy = *a; /* r goes with the last free */
	copy.free(r->self_base, r->self_bytes, copy.ctx);
}

/* Whether options are as adg_reducer_new requires, but for ids repeated
 * (reducer_index_params finds those); *sliced: some parameter is in
 * slices. */
static bool reducer_options_valid(const adg_reducer_options *o, bool *sliced)
{
	if (o->n_participants == 0 || o->n_params == 0 ||
	    o->param_ids == NULL || o->ops.add == NULL ||
	    o->ops.apply == NULL || o->ops.release == NULL ||
	    (o->allocator.alloc == NULL) != (o->allocator.free == NULL))
		return false;
	const size_t *slices = o->param_slices;
	*sliced = false;
	for (size_t k = 0; k < o->n_params; k++) {
		if (o->param_ids[k] == 0)
			return false;
		if (slices != NULL &&
		    (slices[k] == 0 || slices[k] > ADG_REDUCER_MAX_SLICES))
			return false;
		*sliced |= slices != NULL && slices[k] > 1;
	}
	return !*sliced || o->ops.add_slice != NULL;
}

/* The sizes of a reducer's blocks. */
struct reducer_layout {
	size_t stride;	     /* a participant's block, in whole lines */
	size_t members_size; /* the participants' blocks */
	size_t params_size;
	size_t table_cap;  /* a power of two */
	unsigned int log2; /* of table_cap */
};

/* The sizes for t participants and n parameters: a participant's block
 * rounded up to whole lines; the table at least twice the parameters, so
 * that a probe run stays short. false when one would overflow, a line
 * for the alignment included. */
static bool reducer_layout(size_t t, size_t n, struct reducer_layout *l)
{
	size_t stride;
	l->table_cap = 4;
	l->log2 = 2;
	if (__builtin_mul_overflow(n, sizeof(struct slot), &stride) ||
	    __builtin_add_overflow(stride, sizeof(struct member), &stride) ||
	    stride > SIZE_MAX - 2 * ADG_CACHELINE)
		return false;
	l->stride = adg_round_up(stride, ADG_CACHELINE);
	while (l->table_cap / 2 < n &&
	       l->table_cap <= SIZE_MAX / 2 / sizeof(struct entry)) {
		l->table_cap *= 2;
		l->log2++;
	}
	return l->table_cap / 2 >= n &&
	       !__builtin_mul_overflow(t, l->stride, &l->members_size) &&
	       l->members_size <= SIZE_MAX - ADG_CACHELINE &&
	       !__builtin_mul_overflow(n, sizeof(struct param),
				       &l->params_size) &&
	       l->params_size <= SIZE_MAX - ADG_CACHELINE;
}

/* Allocates and fills r's parameters, participants' blocks and id table,
 * with r's allocator. Returns 0, ADG_ENOMEM, or ADG_EINVAL for a repeated
 * id; on error what was allocated is left for reducer_free_blocks. */
static int reducer_fill(struct adg_reducer *r, const adg_reducer_options *o,
			const struct reducer_layout *l)
{
	const adg_allocator *a = &r->allocator;
	r->params = reducer_alloc_aligned(a, l->params_size, &r->params_base,
					  &r->params_bytes);
	if (r->params == NULL)
		return ADG_ENOMEM;
	r->members = reducer_alloc_aligned(a, l->members_size, &r->members_base,
					   &r->members_bytes);
	if (r->members == NULL)
		return ADG_ENOMEM;
	size_t table_size = r->table_cap * sizeof *r->table;
	r->table = a->alloc(table_size, a->ctx);
	if (r->table == NULL)
		return ADG_ENOMEM;
	memset(r->table, 0, table_size);
	if (!reducer_index_params(r, o->param_ids))
		return ADG_EINVAL;
	for (size_t k = 0; k < r->n_params; k++)
		r->params[k].n_slices =
			o->param_slices != NULL ? o->param_slices[k] : 1;
	for (size_t p = 0; p < r->n_members; p++) {
		struct member *m = reducer_member_of(r, p);
		m->reducer = r;
		m->index = p;
	}
	return 0;
}

int adg_reducer_new(const adg_reducer_options *options, adg_reducer **out)
{
	if (out != NULL)
		*out = NULL;
	bool sliced;
	if (options == NULL || out == NULL ||
	    !reducer_options_valid(options, &sliced))
		return ADG_EINVAL;
	struct reducer_layout l;
	if (!reducer_layout(options->n_participants, options->n_params, &l))
		return ADG_ENOMEM;

	adg_allocator a = options->allocator;
	if (a.alloc == NULL)
		a = adg_default_allocator;
	void *base;
	size_t bytes;
	struct adg_reducer *r =
		reducer_alloc_aligned(&a, sizeof *r, &base, &bytes);
	if (r == NULL)
		return ADG_ENOMEM;
	r->self_base = base;
	r->self_bytes = bytes;
	r->allocator = a;
	r->ops = options->ops;
	r->n_members = options->n_participants;
	r->n_params = options->n_params;
	r->apply_at_end = options->apply_at_end != 0;
	r->sliced = sliced;
	r->member_stride = l.stride;
	r->table_cap = l.table_cap;
	r->shift = 64 - l.log2;
	int rc = reducer_fill(r, options, &l);
	if (rc != 0)
		goto out_free;
	rc = ADG_ENOMEM;
	if (pthread_mutex_init(&r->lock, NULL) != 0)
		goto out_free;
	if (pthread_cond_init(&r->done, NULL) != 0)
		goto out_destroy_lock;
	*out = r;
	return 0;

out_destroy_lock:
	pthread_mutex_destroy(&r->lock);
out_free:
	reducer_free_blocks(r);
	return rc;
}

/* ------------------------------------------------------- contributions */

/* Makes code the round's error unless one was reported first. seq_cst:
 * one total order with the check before each apply (reducer_complete), so that
 * an apply whose check comes after this does not start. */
static void reducer_report(struct adg_reducer *r, int code)
{
	int none = 0;
	atomic_compare_exchange_strong_explicit(&r->error, &none, code,
						memory_order_seq_cst,
						memory_order_seq_cst);
}

/* Folds parameter i's contributions in participant order, into the first
 * non-NULL one, which keeps the sum (I15). */
static int reducer_fold(struct adg_reducer *r, size_t i)
{
	struct param *p = &r->params[i];
	void *sum = NULL;
	size_t owner = NONE;
	int rc = 0;
	for (size_t q = 0; q < r->n_members; q++) {
		void *value = reducer_slot_of(r, q, i)->value;
		if (value == NULL)
			continue;
		if (owner == NONE) {
			owner = q;
			sum = value;
			continue;
		}
		rc = adg_callback_result(r->ops.add(&sum, value, r->ops.ctx));
		if (rc != 0)
			break;
	}
	if (owner != NONE)
		reducer_slot_of(r, owner, i)->value =
			sum; /* add may replace it */
	p->owner = owner;
	p->folded = rc == 0;
	return rc;
}

/* Applies slice k of parameter i's sum (the whole of it: k 0 of 1). */
static int reducer_apply(struct adg_reducer *r, size_t i, size_t k)
{
	const struct param *p = &r->params[i];
	adg_reduction reduction = {
		.param = i,
		.id = p->id,
		/* Relaxed: bumped only by the last participant to end, before
		 * the barrier lets anyone into the next round. */
		.round = atomic_load_explicit(&r->rounds, memory_order_relaxed),
		.sum = p->owner != NONE ? reducer_slot_of(r, p->owner, i)->value
					: NULL,
		.slice = k,
		.n_slices = p->n_slices,
	};
	return adg_callback_result(r->ops.apply(&reduction, r->ops.ctx));
}

/* The sum's owner: the first participant with a contribution. */
static size_t reducer_first_given(const struct adg_reducer *r, size_t i)
{
	for (size_t q = 0; q < r->n_members; q++)
		if (reducer_slot_of(r, q, i)->value != NULL)
			return q;
	return NONE;
}

/* Folds slice k of parameter i in participant order into the owner's
 * contribution, then applies it (unless apply_at_end). Slices are
 * disjoint: threads that take different ones never write the same
 * bytes. */
static int reducer_fold_and_apply_slice(struct adg_reducer *r, size_t i,
					size_t k)
{
	const struct param *p = &r->params[i];
	int rc = 0;
	if (p->owner != NONE) {
		void *sum = reducer_slot_of(r, p->owner, i)->value;
		for (size_t q = p->owner + 1; q < r->n_members && rc == 0;
		     q++) {
			void *value = reducer_slot_of(r, q, i)->value;
			if (value != NULL)
				rc = adg_callback_result(r->ops.add_slice(
					sum, value, k, p->n_slices,
					r->ops.ctx));
		}
	}
	if (rc == 0 && !r->apply_at_end)
		rc = reducer_apply(r, i, k);
	return rc;
}

static void reducer_wake_all(struct adg_reducer *r)
{
	pthread_mutex_lock(&r->lock);
	if (r->n_sleeping != 0)
		pthread_cond_broadcast(&r->done);
	pthread_mutex_unlock(&r->lock);
}

/* Takes slices of parameter i until none is left. Once published, every
 * slice runs, whatever is reported meanwhile: a parameter is never left
 * half updated by another participant's failure. */
static void reducer_take_slices(struct adg_reducer *r, size_t i)
{
	struct param *p = &r->params[i];
	for (;;) {
		/* Relaxed: the counter only hands out distinct slices; what
		 * a slice reads was published before (published, acquire). */
		size_t k = atomic_fetch_add_explicit(&p->next_slice, 1,
						     memory_order_relaxed);
		if (k >= p->n_slices)
			return;
		int rc = reducer_fold_and_apply_slice(r, i, k);
		if (rc != 0)
			reducer_report(r, rc);
		/* acq_rel: the slice's writes happen before the end of the
		 * round, which waits for this count to reach 0 (acquire in
		 * the barrier); the last one wakes the sleepers to see it. */
		if (atomic_fetch_sub_explicit(&r->slices_pending, 1,
					      memory_order_acq_rel) == 1)
			reducer_wake_all(r);
	}
}

/* Whether parameter i has slices of round gen not yet taken. Acquire:
 * pairs with reducer_publish's release, so that the slots, the owner and the
 * reset of next_slice written before it are seen. Relaxed next_slice: a
 * hint; reducer_take_slices claims for real. */
static bool reducer_offers_slices(const struct param *p, uint64_t gen)
{
	return p->n_slices > 1 &&
	       atomic_load_explicit(&p->published, memory_order_acquire) ==
		       gen + 1 &&
	       atomic_load_explicit(&p->next_slice, memory_order_relaxed) <
		       p->n_slices;
}

/* Takes any slice of round gen published and not yet taken; returns
 * whether it found one. Any participant may, from its end (the barrier),
 * so that a large parameter's sum and update are split among the threads
 * that wait. */
static bool reducer_help(struct adg_reducer *r, uint64_t gen)
{
	bool found = false;
	for (size_t i = 0; i < r->n_params; i++) {
		if (reducer_offers_slices(&r->params[i], gen)) {
			reducer_take_slices(r, i);
			found = true;
		}
	}
	return found;
}

/* The last contribution of a parameter in slices is in: offers its
 * slices to every participant and takes them itself. */
static void reducer_publish(struct adg_reducer *r, size_t i)
{
	struct param *p = &r->params[i];
	p->owner = reducer_first_given(r, i);
	/* A slice whose fold fails reports it: the round is abandoned, and
	 * apply_at_end applies nothing. */
	p->folded = true;
	/* Relaxed: counted before any slice can be taken (published comes
	 * after, with release), so the count cannot reach 0 early. */
	atomic_fetch_add_explicit(&r->slices_pending, p->n_slices,
				  memory_order_relaxed);
	/* Relaxed, then release: the reset, the slots and the owner before,
	 * for reducer_offers_slices' acquire. The barrier cannot move during
	 * the round: this participant has not ended it. */
	atomic_store_explicit(&p->next_slice, 0, memory_order_relaxed);
	uint64_t gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
	atomic_store_explicit(&p->published, gen + 1, memory_order_release);
	reducer_wake_all(
		r); /* participants asleep at the barrier come and help */
	reducer_take_slices(r, i);
}

/* The last contribution of parameter i is in: fold it and (unless
 * apply_at_end) apply it, unless the round was abandoned. */
static int reducer_complete(struct adg_reducer *r, size_t i)
{
	/* seq_cst: see reducer_report. An abandoned round neither folds nor
	 * applies: each slot keeps its own value for its participant. */
	if (atomic_load_explicit(&r->error, memory_order_seq_cst) != 0)
		return 0;
	if (r->params[i].n_slices > 1) {
		reducer_publish(r, i);
		return 0; /* a slice's error is the round's, not this give's */
	}
	int rc = reducer_fold(r, i);
	if (rc == 0 && !r->apply_at_end) {
		ADG_ASSERT(r->params[i].folded); /* I15 */
		rc = reducer_apply(r, i, 0);
	}
	if (rc != 0)
		reducer_report(r, rc);
	return rc;
}

/* Counts one more contribution to parameter i (its slot written). */
static int reducer_arrive(struct adg_reducer *r, size_t i)
{
	/* acq_rel: the release publishes this slot's value, the acquire of
	 * the add that makes T sees every slot (the adds form one release
	 * sequence). Pairs with the last participant's relaxed reset, which
	 * the barrier orders before the next round's adds (I16). */
	size_t n = atomic_fetch_add_explicit(&r->params[i].arrived, 1,
					     memory_order_acq_rel) +
		   1;
	ADG_ASSERT(n <= r->n_members); /* I15: one per participant */
	return n == r->n_members ? reducer_complete(r, i) : 0;
}

static int reducer_give(struct adg_reducer *r, struct member *m, size_t i,
			void *value)
{
	/* Relaxed: set by this participant's own end, which its gives come
	 * before; read here only to refuse a give made out of order. */
	if (atomic_load_explicit(&m->ended, memory_order_relaxed))
		return ADG_ESTATE;
	struct slot *s = &m->slots[i];
	/* Relaxed: only atomicity matters, so that one of two gives of the
	 * same slot wins; the slot's own writes are ordered by reducer_arrive.
	 * The reset to false (reducer_release_own) comes before the
	 * participant's next round, whichever thread gives for it then (the
	 * executor's hand-off orders it). */
	if (atomic_exchange_explicit(&s->given, true, memory_order_relaxed))
		return ADG_ESTATE;
	s->value = value;
	return reducer_arrive(r, i);
}

int adg_reducer_give(adg_reducer *reducer, size_t participant, uint64_t id,
		     void *value)
{
	if (reducer == NULL || value == NULL ||
	    participant >= reducer->n_members)
		return ADG_EINVAL;
	size_t i = reducer_lookup(reducer, id);
	if (i == NONE)
		return ADG_EINVAL;
	return reducer_give(reducer, reducer_member_of(reducer, participant), i,
			    value);
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
		return 0; /* a NULL contribution, at the end */
	size_t i = reducer_lookup(r, id);
	if (i == NONE)
		return 0; /* not a parameter: it stays in the container */
	int rc = reducer_give(r, m, i, *grad);
	if (rc != ADG_ESTATE)
		*grad = NULL; /* taken, whatever add and apply said */
	return rc;
}

int adg_reducer_hook(adg_reducer *reducer, size_t participant,
		     adg_backward_options *options)
{
	if (reducer == NULL || options == NULL ||
	    participant >= reducer->n_members)
		return ADG_EINVAL;
	struct member *m = reducer_member_of(reducer, participant);
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

/* --------------------------------------------------------- the barrier */

/* On the last participant to end, alone with the round's state: applies
 * (apply_at_end), then makes the next round start clean. Returns the
 * round's result. */
static int reducer_finish_round(struct adg_reducer *r)
{
	/* Relaxed: every report came before its reporter's arrival at the
	 * barrier, which this thread's lock acquired. */
	int rc = atomic_load_explicit(&r->error, memory_order_relaxed);
	for (size_t i = 0; i < r->n_params; i++) {
		/* I15: a round that no one abandoned has every count at T,
		 * since every participant counted every parameter. */
		ADG_ASSERT(rc != 0 ||
			   atomic_load_explicit(&r->params[i].arrived,
						memory_order_relaxed) ==
				   r->n_members);
		for (size_t k = 0;
		     rc == 0 && r->apply_at_end && k < r->params[i].n_slices;
		     k++) {
			ADG_ASSERT(r->params[i].folded); /* I15 */
			rc = reducer_apply(r, i, k);
			/* Nothing runs beside this: no check to order. */
			if (rc != 0)
				atomic_store_explicit(&r->error, rc,
						      memory_order_relaxed);
		}
	}
	rc = atomic_load_explicit(&r->error, memory_order_relaxed);
	/* Relaxed: the barrier's unlock below orders these resets before
	 * every participant's next round (I16). */
	for (size_t i = 0; i < r->n_params; i++) {
		atomic_store_explicit(&r->params[i].arrived, 0,
				      memory_order_relaxed);
		r->params[i].owner = NONE;
		r->params[i].folded = false;
	}
	atomic_store_explicit(&r->error, 0, memory_order_relaxed);
	/* Release: pairs with adg_reducer_rounds' acquire load, so that a
	 * thread that sees the count sees the round's applies. */
	atomic_fetch_add_explicit(&r->rounds, 1, memory_order_release);
	return rc;
}

/* Whether the round can end: every participant is in its end and every
 * slice published is done. Under lock. */
static bool reducer_round_over(struct adg_reducer *r)
{
	/* Acquire: pairs with reducer_take_slices' count, so that every slice's
	 * writes happen before the round's end. */
	return r->n_ended == r->n_members &&
	       atomic_load_explicit(&r->slices_pending, memory_order_acquire) ==
		       0;
}

/* Whether the barrier let round gen through, or there is a slice to take.
 * Looked at before sleeping, and in a short spin: a wake-up from the
 * kernel costs more than a small batch's work. */
static bool reducer_worth_waking(struct adg_reducer *r, uint64_t gen)
{
	if (atomic_load_explicit(&r->gen, memory_order_relaxed) != gen)
		return true;
	for (size_t i = 0; r->sliced && i < r->n_params; i++)
		if (reducer_offers_slices(&r->params[i], gen))
			return true;
	return false;
}

/* Waits for the round's other participants, taking slices of large
 * parameters meanwhile; the one that sees the round over finishes it.
 * Returns the round's result. */
static int reducer_barrier(struct adg_reducer *r)
{
	/* Relaxed: the barrier cannot move before this participant is in. */
	uint64_t gen = atomic_load_explicit(&r->gen, memory_order_relaxed);
	reducer_help(r, gen);
	pthread_mutex_lock(&r->lock);
	r->n_ended++;
	for (;;) {
		if (atomic_load_explicit(&r->gen, memory_order_relaxed) !=
		    gen) {
			/* result cannot move before this participant ends
			 * the next round. */
			int rc = r->result;
			pthread_mutex_unlock(&r->lock);
			return rc;
		}
		if (reducer_round_over(r))
			break;
		pthread_mutex_unlock(&r->lock);
		/* A few looks, yielding the core to the threads still at
		 * work, before sleeping in the kernel. */
		bool woken = false;
		for (int spin = 0; spin < 32 && !woken; spin++) {
			sched_yield();
			woken = reducer_worth_waking(r, gen);
		}
		bool helped = reducer_help(r, gen);
		pthread_mutex_lock(&r->lock);
		/* Looked at again under the lock: whoever offers slices, ends
		 * the last one or the round takes the lock to wake sleepers
		 * after, so either this sees it or that sees the sleeper. */
		if (helped || reducer_round_over(r) ||
		    reducer_worth_waking(r, gen))
			continue;
		r->n_sleeping++;
		pthread_cond_wait(&r->done, &r->lock);
		r->n_sleeping--;
	}
	/* Every participant is inside its end, past its contributions, and
	 * every slice is done: the round's state is this thread's until gen
	 * moves. Apply with the lock released (apply is the caller's
	 * code). */
	r->n_ended = 0;
	pthread_mutex_unlock(&r->lock);
	int rc = reducer_finish_round(r);
	pthread_mutex_lock(&r->lock);
	r->result = rc;
	/* Relaxed: written under lock; readers without it only look. */
	atomic_store_explicit(&r->gen, gen + 1, memory_order_relaxed);
	pthread_cond_broadcast(&r->done);
	pthread_mutex_unlock(&r->lock);
	return rc;
}

/* After the barrier: hands this participant's values back and clears its
 * slots for its next round. */
static void reducer_release_own(struct adg_reducer *r, struct member *m)
{
	for (size_t i = 0; i < r->n_params; i++) {
		struct slot *s = &m->slots[i];
		void *value = s->value;
		s->value = NULL;
		/* Relaxed: see reducer_give. */
		atomic_store_explicit(&s->given, false, memory_order_relaxed);
		if (value != NULL)
			r->ops.release(value, m->index, r->ops.ctx);
	}
	/* Relaxed: see reducer_give. Last, so that a call from release is
	 * refused. */
	atomic_store_explicit(&m->ended, false, memory_order_relaxed);
}

int adg_reducer_end(adg_reducer *reducer, size_t participant, int result)
{
	if (reducer == NULL || participant >= reducer->n_members)
		return ADG_EINVAL;
	struct adg_reducer *r = reducer;
	struct member *m = reducer_member_of(r, participant);
	/* Relaxed: atomicity alone refuses a second end; see reducer_give. */
	if (atomic_exchange_explicit(&m->ended, true, memory_order_relaxed))
		return ADG_ESTATE;
	if (result != 0) {
		reducer_report(r, adg_callback_result(result));
	} else {
		/* The parameters it gave nothing for: NULL contributions,
		 * which may complete them (errors are reported there). */
		for (size_t i = 0; i < r->n_params; i++)
			if (!atomic_exchange_explicit(&m->slots[i].given, true,
						      memory_order_relaxed))
				(void)reducer_arrive(r, i);
	}
	int rc = reducer_barrier(r);
	reducer_release_own(r, m);
	return rc;
}

int adg_reducer_rounds(const adg_reducer *reducer, uint64_t *rounds)
{
	if (reducer == NULL || rounds == NULL)
		return ADG_EINVAL;
	/* Acquire: pairs with reducer_finish_round's release. */
	*rounds = atomic_load_explicit(&reducer->rounds, memory_order_acquire);
	return 0;
}

int adg_reducer_free(adg_reducer *reducer)
{
	if (reducer == NULL)
		return 0;
	struct adg_reducer *r = reducer;
	/* No call runs beside this one (adg.h): plain reads would do, but
	 * the fields are atomic. Relaxed. */
	bool busy = r->n_ended != 0;
	for (size_t i = 0; i < r->n_params && !busy; i++)
		busy = atomic_load_explicit(&r->params[i].arrived,
					    memory_order_relaxed) != 0;
	if (busy)
		return ADG_EBUSY;
	pthread_cond_destroy(&r->done);
	pthread_mutex_destroy(&r->lock);
	reducer_free_blocks(r);
	return 0;
}
