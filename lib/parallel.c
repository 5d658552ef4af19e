/*
 * A taken tape run on several threads: the calling thread and the workers
 * an executor lends it.
 *
 * Readiness. Every edge (a tape node's parent slot) delivers once, when its
 * step has run; a target (a tape node, or a leaf) whose last edge delivers
 * is final. The thread that delivered that edge folds the target's
 * gradient and, for a tape node, runs its step: at once, if it is the
 * first parent that became ready (so a chain stays on one thread and costs
 * no queue), or else through its own ready queue, from which idle workers
 * steal.
 *
 * Determinism. A step's registrations land in its own edge slots, never in
 * a shared sum. A target folds its edges in a fixed order, the order of
 * its incoming list: by the tape position of the contributing step, then
 * by slot, which is the order the sequential backward adds them in. The
 * fold runs once all of them are in, so neither the number of workers nor
 * the timing changes what is added to what.
 *
 * Failure. Errors are keyed by tape position (a step's failure at its
 * position; a fold's or a hook's at its target's last contributor, just
 * after that step), the smallest key wins, and no step after it on the
 * tape starts once it is seen: the steps before it still run, as they
 * would on one thread, so the winner does not depend on timing.
 *
 * Workers. Jobs submitted to the executor enter the run through a ticket
 * that outlives it: a job that starts after the run closed finds it closed
 * and returns. A worker that runs out of work looks around briefly and
 * leaves, giving its thread back to the executor; a worker with surplus
 * work submits another job while fewer than n_workers are in. Only the
 * caller waits for the run to end: it sleeps on a futex, and the last
 * step, or new work, wakes it.
 */
#include "run.h"

#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NONE UINT32_MAX /* no position, edge or target */

/* Where a target stands (struct adg_par_arrays.state): its edges still
 * coming, all folded (a tape node is then ready), an add or the hook
 * failed on it, or (a tape node) its step ran. */
enum { WAITING, FOLDED, POISONED, RAN };

/*
 * A worker's ready queue: a LIFO list through next_ready, behind a
 * Concurrency Kit fetch-and-store spinlock. Only its owner pushes, and it
 * pops its own newest work (the parents it just made ready, still warm in
 * its cache); a thief takes from a queue only when its own is empty. So in
 * the common case each queue is touched by one thread and its lock is an
 * uncontended exchange on a line of its own, where one shared queue would
 * bounce a line between all workers on every step. Thieves peek at head
 * without the lock to skip empty queues.
 */
struct adg_ready_queue {
	_Alignas(ADG_CACHELINE) ck_spinlock_fas_t lock;
	/* Written under the lock; read without it only as a hint. */
	_Atomic uint32_t head;
	/* A worker holds this slot. */
	atomic_bool taken;
};

/* The ticket's state: this bit once the run has closed; below it, how
 * many jobs are inside the run. */
#define CLOSED (UINT64_C(1) << 63)

struct adg_par_ticket {
	atomic_uint_fast64_t state;
	/* The caller's reference, plus one per job submitted and not yet
	 * returned. */
	atomic_uint_fast32_t refs;
	struct par_run *par; /* valid while inside */
};

/* What a run on workers adds to its run (struct adg_run), on its caller's
 * stack. */
struct par_run {
	/* Set up before any job is submitted; read-only after. */
	struct adg_run *run;
	struct adg_par_arrays *a;
	adg_executor executor;
	struct adg_par_ticket *ticket;
	uint32_t n_slots;
	/* See struct adg_backward_context. */
	pthread_mutex_t serialize;
	pthread_cond_t rebuilt;

	/* Tasks made ready and not yet finished: queued or running. Zero
	 * means the run is over. */
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t in_flight;
	/* Jobs submitted and not yet gone (inside, or still to start). */
	atomic_uint_fast32_t helpers;

	/* The caller's sleep: it sleeps on wake_seq while asleep is set. */
	_Alignas(ADG_CACHELINE) _Atomic uint32_t wake_seq;
	atomic_bool asleep;
};

/* One thread's part in a run on workers. */
struct par_worker {
	struct par_run *par;
	struct adg_ready_queue *queue;
	uint32_t slot;
	struct adg_run_thread th;
};

/* ------------------------------------------------------------- scratch */

/* Lays the arrays out in block (or, with block NULL, only measures) and
 * returns the bytes they take. */
static size_t par_carve(void *block, struct adg_par_arrays *a, size_t len,
			size_t edges, size_t leaves, uint32_t n_slots)
{
	size_t targets = len + leaves, at = 0;
	char *base = block;
#define CARVE(field, count)                                                    \
	do {                                                                   \
		at = adg_round_up(at, _Alignof(__typeof__(*a->field)));        \
		if (base != NULL)                                              \
			a->field = (void *)(base + at);                        \
		at += (count) * sizeof *a->field;                              \
	} while (0)
	CARVE(queues, n_slots);
	CARVE(edge_value, edges);
	CARVE(grad, targets);
	CARVE(leaf_id, leaves);
	CARVE(edge_base, len + 1);
	CARVE(edge_target, edges);
	CARVE(pending, targets);
	CARVE(last, targets);
	CARVE(state, targets);
	CARVE(in_next, edges);
	CARVE(in_head, targets);
	CARVE(next_ready, len);
#undef CARVE
	return at;
}

bool adg_par_reserve(struct adg_registry *r, struct adg_tape *t, size_t len,
		     size_t edges, size_t leaves, uint32_t n_slots)
{
	/* Indices are 32 bits, NONE excluded: 2^32 edges would be 64 GiB of
	 * parent arrays. */
	if (edges >= NONE || len + leaves >= NONE)
		return false;
	/* The allocator promises malloc's alignment, not a cache line's:
	 * the queues start at the first line inside, up to a line in. */
	size_t bytes = par_carve(NULL, &t->par, len, edges, leaves, n_slots) +
		       ADG_CACHELINE;
	if (bytes > t->par_cap) {
		size_t cap = bytes;
		void *block = adg_alloc(r, cap);
		if (block == NULL)
			return false;
		if (t->par_cap != 0)
			adg_free(r, t->par_block, t->par_cap);
		t->par_block = block;
		t->par_cap = cap;
	}
	t->par_edges = edges;
	void *aligned =
		(void *)adg_round_up((uintptr_t)t->par_block, ADG_CACHELINE);
	par_carve(aligned, &t->par, len, edges, leaves, n_slots);
	return true;
}

/* One more edge to a target. Relaxed load and store, no locked add: no
 * worker has started, and submitting one orders these before it. */
static void par_count_up(_Atomic uint32_t *pending)
{
	atomic_store_explicit(
		pending,
		atomic_load_explicit(pending, memory_order_relaxed) + 1,
		memory_order_relaxed);
}

/* Numbers positions and edges, finds each edge's target and each target's
 * last contributor, sets the counts and builds each target's incoming list
 * in order: one pass, from the end of the tape, where a node's parents
 * (later on the tape) are numbered before it and its children (earlier)
 * come after. The table is sized for the tape's leaves, and its nodes
 * too when retained: a retained backward keeps a node's position there,
 * not in the node, which other retained passes may be running over (I14).
 * Returns the number of leaves. */
static uint32_t par_plan(struct adg_tape *t, size_t len, bool retained)
{
	struct adg_par_arrays *a = &t->par;
	uint32_t edges = (uint32_t)t->par_edges, leaves = 0;

	memset(t->keys, 0, t->keys_cap * sizeof *t->keys);
	a->edge_base[len] = edges;
	/* Relaxed stores: no worker has started; submitting one orders
	 * these before it. */
	for (size_t p = len; p-- > 0;) {
		struct adg_node *n = t->sorted[p];
		if (retained) /* pending 0: a node's key, not a leaf's */
			*adg_tape_key(t, n->id) = (struct adg_tape_key){
				.id = n->id, .index = (uint32_t)p};
		else
			n->tape_pos = (uint32_t)p;
		/* Counted up by its children's edges, which come later. */
		atomic_store_explicit(&a->pending[p], 0, memory_order_relaxed);
		a->grad[p] = NULL;
		a->state[p] = WAITING;
		a->last[p] = NONE;
		a->in_head[p] = NONE;
		edges -= n->n_parents;
		a->edge_base[p] = edges;
		/* Backwards, so that prepending builds each incoming list in
		 * edge order: by contributing position, then slot. */
		for (uint32_t k = n->n_parents; k-- > 0;) {
			uint32_t e = edges + k, target;
			uint64_t id = adg_node_parent_id(n, k);
			struct adg_node *pk = adg_node_parent(n, k);
			if (pk != NULL) {
				target = retained ? adg_tape_key(t, id)->index
						  : pk->tape_pos;
				par_count_up(&a->pending[target]);
			} else {
				struct adg_tape_key *l = adg_tape_key(t, id);
				target = (uint32_t)len + l->index;
				if (l->id == 0) { /* the leaf's first edge */
					*l = (struct adg_tape_key){
						.id = id, .index = leaves};
					target = (uint32_t)len + leaves++;
					a->leaf_id[l->index] = id;
					a->grad[target] = NULL;
					a->state[target] = WAITING;
					a->last[target] = NONE;
					a->in_head[target] = NONE;
				}
				l->pending++;
			}
			/* The first edge met, from the end, is the last. */
			if (a->last[target] == NONE)
				a->last[target] = (uint32_t)p;
			a->edge_target[e] = target;
			a->edge_value[e] = NULL;
			a->in_next[e] = a->in_head[target];
			a->in_head[target] = e;
		}
	}
	ADG_ASSERT(edges == 0);
	for (size_t i = 0; i < t->keys_cap; i++) {
		struct adg_tape_key *l = &t->keys[i];
		if (l->id != 0 && l->pending != 0) /* a leaf's */
			atomic_store_explicit(&a->pending[len + l->index],
					      l->pending, memory_order_relaxed);
	}
	return leaves;
}

/* ------------------------------------------------------------- queues */

static uint32_t par_queue_pop(struct par_run *par, struct adg_ready_queue *q)
{
	/* Relaxed peek: an empty-looking queue is skipped; a stale
	 * non-empty one costs a lock. */
	if (atomic_load_explicit(&q->head, memory_order_relaxed) == NONE)
		return NONE;
	adg_spin_lock(&q->lock);
	uint32_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
	if (pos != NONE)
		atomic_store_explicit(&q->head, par->a->next_ready[pos],
				      memory_order_relaxed);
	adg_spin_unlock(&q->lock);
	return pos;
}

/* Wakes the caller if it sleeps. Every event it may wait for (new work, the
 * run over) bumps wake_seq after it is made, and the caller reads wake_seq
 * before it looks for them: so either it sees the event, or the futex
 * finds wake_seq moved and does not sleep. seq_cst: the bump and the load
 * of asleep must not pass each other, nor the caller's store of asleep and
 * its futex wait (ThreadSanitizer has no fences, hence no fence here). */
static void par_wake_caller(struct par_run *par)
{
	atomic_fetch_add_explicit(&par->wake_seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&par->asleep, memory_order_seq_cst))
		syscall(SYS_futex, &par->wake_seq, FUTEX_WAKE_PRIVATE, 1, NULL,
			NULL, 0);
}

static void par_helper_job(void *arg);

/* One more job, if fewer than the executor's n_workers are in. */
static void par_add_helper(struct par_run *par)
{
	uint_fast32_t h =
		atomic_load_explicit(&par->helpers, memory_order_relaxed);
	do {
		if (h >= par->executor.n_workers)
			return;
	} while (!atomic_compare_exchange_weak_explicit(
		&par->helpers, &h, h + 1, memory_order_relaxed,
		memory_order_relaxed));
	/* Relaxed: the caller's reference keeps the ticket until the run
	 * closes, and the job's only starts counting after. */
	atomic_fetch_add_explicit(&par->ticket->refs, 1, memory_order_relaxed);
	if (par->executor.submit(par_helper_job, par->ticket,
				 par->executor.ctx) != 0) {
		atomic_fetch_sub_explicit(&par->ticket->refs, 1,
					  memory_order_relaxed);
		atomic_fetch_sub_explicit(&par->helpers, 1,
					  memory_order_relaxed);
	}
}

/* Queues a ready position on w's own queue, for w or a thief. */
static void par_push(struct par_worker *w, uint32_t pos)
{
	struct par_run *par = w->par;
	/* Counted before it can be taken: a thief that finishes it must not
	 * bring the count to zero while this thread's step is still in.
	 * Relaxed: the queue's lock orders this before the thief's
	 * decrement. */
	atomic_fetch_add_explicit(&par->in_flight, 1, memory_order_relaxed);
	adg_spin_lock(&w->queue->lock);
	par->a->next_ready[pos] =
		atomic_load_explicit(&w->queue->head, memory_order_relaxed);
	atomic_store_explicit(&w->queue->head, pos, memory_order_relaxed);
	adg_spin_unlock(&w->queue->lock);
	par_add_helper(par);
	if (w->slot != 0)
		par_wake_caller(par); /* slot 0 is the caller, awake */
}

/* A finished task, and none to follow it on this thread. */
static void par_task_done(struct par_run *par)
{
	/* acq_rel: release, so that what this worker did (steps, gradients,
	 * ran flags) happens before the caller's end of the run; acquire,
	 * so that the one that brings it to zero has seen every other. */
	if (atomic_fetch_sub_explicit(&par->in_flight, 1,
				      memory_order_acq_rel) == 1)
		par_wake_caller(par);
}

/* Work for w: its own queue first, then the others'. */
static uint32_t par_find_work(struct par_worker *w)
{
	struct par_run *par = w->par;
	uint32_t pos = par_queue_pop(par, w->queue);
	for (uint32_t i = 1; i < par->n_slots && pos == NONE; i++)
		pos = par_queue_pop(
			par, &par->a->queues[(w->slot + i) % par->n_slots]);
	return pos;
}

/* -------------------------------------------------------------- folding */

/* target's node, or NULL for a leaf; and its id. */
static const struct adg_node *par_target_node(const struct par_run *par,
					      uint32_t target, uint64_t *id)
{
	const struct adg_run *run = par->run;
	if (target >= run->len) {
		*id = par->a->leaf_id[target - run->len];
		return NULL;
	}
	const struct adg_node *n = run->tape->sorted[target];
	*id = n->id;
	return n;
}

/* A fold or hook on a target fails just after its last contributor's
 * step, where the target's gradient is complete on one thread as on
 * several. */
static void par_poison(struct par_run *par, uint32_t target,
		       adg_failure_site site, int rc)
{
	uint64_t id;
	const struct adg_node *n = par_target_node(par, target, &id);
	par->a->state[target] = POISONED;
	adg_failure f = adg_run_failure_at(site, rc, n, id);
	adg_run_fail(par->run,
		     adg_run_after_key(par->run, par->a->last[target]), &f);
}

/* Adds v into target's gradient, after what is there (I11: callers add
 * in fold order), on th's thread. A failing add poisons the target: what
 * comes later is freed unadded, and the target never runs or reaches the
 * hook. What is held stays in grad, for the end of the run to free. */
static void par_accumulate(struct par_run *par, struct adg_run_thread *th,
			   uint32_t target, void *v)
{
	struct adg_par_arrays *a = par->a;
	const adg_grad_ops *ops = par->run->ops;

	if (a->state[target] == POISONED) {
		ops->free(v, ops->ctx);
		return;
	}
	if (a->grad[target] == NULL) {
		a->grad[target] = v;
		return;
	}
	uint64_t id;
	const struct adg_node *n = par_target_node(par, target, &id);
	adg_run_site_begin(th, ADG_FAILED_ADD, n, id);
	int rc = adg_callback_result(ops->add(&a->grad[target], v, ops->ctx));
	adg_run_site_end(th);
	if (rc != 0)
		par_poison(par, target, ADG_FAILED_ADD, rc);
}

/* Folds target's edges, all in, in list order, on th's thread. */
static void par_gather(struct par_run *par, struct adg_run_thread *th,
		       uint32_t target)
{
	struct adg_par_arrays *a = par->a;
	for (uint32_t e = a->in_head[target]; e != NONE; e = a->in_next[e]) {
		void *v = a->edge_value[e];
		if (v == NULL)
			continue;
		a->edge_value[e] = NULL;
		par_accumulate(par, th, target, v);
	}
}

/* target's last edge is in and folded: hands its gradient to the hook.
 * Returns whether target is a tape node now ready to run. */
static bool par_complete(struct par_run *par, uint32_t target)
{
	struct adg_par_arrays *a = par->a;
	struct adg_run *run = par->run;
	if (a->state[target] == POISONED)
		return false;
	a->state[target] = FOLDED;
	bool leaf = target >= run->len;
	if (run->on_ready != NULL && (leaf || !run->leaves_only)) {
		uint64_t id;
		const struct adg_node *n = par_target_node(par, target, &id);
		uint64_t key = adg_run_after_key(run, a->last[target]);
		if (adg_run_ready(run, n, id, &a->grad[target], key) != 0) {
			a->state[target] = POISONED;
			return false;
		}
	}
	return !leaf;
}

/* After pos's step: each of its edges delivers, and the last delivery to
 * a target folds it. Returns the first tape node that became ready, for
 * this thread to run next; queues the rest. */
static uint32_t par_deliver(struct par_worker *w, uint32_t pos)
{
	struct par_run *par = w->par;
	struct adg_par_arrays *a = par->a;
	uint32_t next = NONE;

	for (uint32_t e = a->edge_base[pos]; e < a->edge_base[pos + 1]; e++) {
		uint32_t target = a->edge_target[e];
		/* acq_rel: release, so that this step's gradients (and all
		 * it did) happen before the fold; acquire, so that the last
		 * one to deliver, which folds, sees every other's. */
		if (atomic_fetch_sub_explicit(&a->pending[target], 1,
					      memory_order_acq_rel) != 1)
			continue;
		par_gather(par, &w->th, target);
		if (!par_complete(par, target))
			continue;
		if (next == NONE)
			next = target;
		else
			par_push(w, target);
	}
	return next;
}

/* ---------------------------------------------------------------- steps */

/* Runs the step at pos, or skips it after an earlier failure
 * (par_clean_up_failure releases it). Returns the position to run next, or
 * NONE. */
static uint32_t par_run_step(struct par_worker *w, uint32_t pos)
{
	struct par_run *par = w->par;
	struct adg_par_arrays *a = par->a;
	if (adg_run_stopped(par->run, pos)) {
		par_task_done(par);
		return NONE;
	}
	/* The step's gradients land in its own edges. */
	int rc = adg_run_step(&w->th, pos, a->grad[pos],
			      &a->edge_value[a->edge_base[pos]]);
	a->state[pos] = RAN;
	uint32_t next = rc == 0 ? par_deliver(w, pos) : NONE;
	/* A next task takes this one's place in the count. */
	if (next == NONE)
		par_task_done(par);
	return next;
}

/* ------------------------------------------------------------- workers */

/* Runs tasks until w finds none. */
static void par_work(struct par_worker *w, uint32_t pos)
{
	for (;;) {
		while (pos != NONE)
			pos = par_run_step(w, pos);
		pos = par_find_work(w);
		if (pos == NONE)
			return;
	}
}

static bool par_over(struct par_run *par)
{
	return atomic_load_explicit(&par->in_flight, memory_order_acquire) == 0;
}

/* The caller, out of work while steps run elsewhere: looks again a few
 * times, yielding its core to them, then sleeps until woken. */
static void par_caller_wait(struct par_worker *w)
{
	struct par_run *par = w->par;
	for (int i = 0; i < 4; i++) {
		if (par_over(par))
			return;
		uint32_t pos = par_find_work(w);
		if (pos != NONE) {
			par_work(w, pos);
			return;
		}
		sched_yield();
	}
	/* seq_cst, and before looking: see par_wake_caller. */
	uint32_t seq =
		atomic_load_explicit(&par->wake_seq, memory_order_seq_cst);
	uint32_t pos = par_find_work(w);
	if (pos == NONE && !par_over(par)) {
		atomic_store_explicit(&par->asleep, true, memory_order_seq_cst);
		syscall(SYS_futex, &par->wake_seq, FUTEX_WAIT_PRIVATE, seq,
			NULL, NULL, 0);
		atomic_store_explicit(&par->asleep, false,
				      memory_order_relaxed);
	}
	if (pos != NONE)
		par_work(w, pos);
}

/* A job: a worker of the executor enters the run, if it is still open. */
static void par_helper_job(void *arg)
{
	struct adg_par_ticket *ticket = arg;
	/* Acquire: pairs with nothing but the executor's own hand-over; the
	 * run was set up before the job was submitted. */
	uint_fast64_t s =
		atomic_load_explicit(&ticket->state, memory_order_acquire);
	do {
		if (s & CLOSED)
			goto out;
	} while (!atomic_compare_exchange_weak_explicit(
		&ticket->state, &s, s + 1, memory_order_acquire,
		memory_order_acquire));

	struct par_run *par = ticket->par;
	struct par_worker w = {.par = par};
	/* A free slot exists: fewer jobs are in than n_workers. */
	for (uint32_t i = 1; w.queue == NULL; i = i % (par->n_slots - 1) + 1) {
		bool no = false;
		if (atomic_compare_exchange_strong_explicit(
			    &par->a->queues[i].taken, &no, true,
			    memory_order_acquire, memory_order_relaxed)) {
			w.slot = i;
			w.queue = &par->a->queues[i];
		}
	}
	adg_run_thread_init(&w.th, par->run, w.slot, &par->serialize,
			    &par->rebuilt);
	/* Leaves after a few empty looks, yielding in between: on a machine
	 * with more threads than cores, a spinning worker would take the
	 * core from the step it waits for. */
	for (int idle = 0; idle < 4 && !par_over(par); idle++) {
		uint32_t pos = par_find_work(&w);
		if (pos == NONE) {
			sched_yield();
			continue;
		}
		par_work(&w, pos);
		idle = -1;
	}
	adg_run_thread_leave(&w.th);
	atomic_store_explicit(&w.queue->taken, false, memory_order_release);
	atomic_fetch_sub_explicit(&par->helpers, 1, memory_order_relaxed);
	/* Release: what this job did happens before the caller's end of the
	 * run, which waits for the count to reach zero. */
	atomic_fetch_sub_explicit(&ticket->state, 1, memory_order_release);
out:
	adg_par_ticket_put(ticket);
}

/* From malloc, not the registry's allocator: the last job to let go of
 * the ticket may run after adg_registry_free has returned and the caller
 * has let its allocator go, as the executor's contract allows. */
struct adg_par_ticket *adg_par_ticket_new(void)
{
	struct adg_par_ticket *t = malloc(sizeof *t);
	if (t == NULL)
		return NULL;
	atomic_init(&t->state, 0);
	atomic_init(&t->refs, 1);
	t->par = NULL;
	return t;
}

void adg_par_ticket_put(struct adg_par_ticket *t)
{
	/* acq_rel: the last one frees it, after everyone's use. */
	if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
		free(t);
}

/* Ends the run for jobs: none enters any more, and those inside leave. */
static void par_close(struct par_run *par)
{
	struct adg_par_ticket *t = par->ticket;
	/* Acquire (with the loop): every job that was inside has left, and
	 * what it did happens before what follows. */
	uint_fast64_t s = atomic_fetch_or_explicit(&t->state, CLOSED,
						   memory_order_acq_rel);
	while ((s & ~CLOSED) != 0) {
		sched_yield(); /* they see the run over and leave */
		s = atomic_load_explicit(&t->state, memory_order_acquire);
	}
	adg_par_ticket_put(t);
}

/* After a failed run: releases the steps that did not run and frees the
 * gradients left on the way, folded or not. */
static void par_clean_up_failure(struct par_run *par, uint32_t leaves)
{
	struct adg_par_arrays *a = par->a;
	struct adg_run *run = par->run;
	const adg_grad_ops *ops = run->ops;

	for (size_t p = 0; p < run->len + leaves; p++) {
		if (p < run->len && a->state[p] != RAN && !run->retained)
			adg_node_release_step(run->shard, run->tape->sorted[p]);
		/* A step took its gradient: what is left was never run. */
		if (a->state[p] != RAN && a->grad[p] != NULL)
			ops->free(a->grad[p], ops->ctx);
	}
	for (uint32_t e = 0; e < a->edge_base[run->len]; e++)
		if (a->edge_value[e] != NULL)
			ops->free(a->edge_value[e], ops->ctx);
}

/* I10: a successful run ran every step and delivered and folded every
 * edge. For the assertions only. */
static bool par_all_ran(const struct par_run *par)
{
	const struct adg_par_arrays *a = par->a;
	for (size_t p = 0; p < par->run->len; p++)
		if (a->state[p] != RAN ||
		    atomic_load_explicit(&a->pending[p],
					 memory_order_relaxed) != 0)
			return false;
	for (uint32_t e = 0; e < a->edge_base[par->run->len]; e++)
		if (a->edge_value[e] != NULL)
			return false;
	return true;
}

/* After the run: hands the leaves' gradients to the table, or cleans up
 * a failure. */
static void par_finish(struct par_run *par, uint32_t leaves)
{
	struct adg_par_arrays *a = par->a;
	struct adg_run *run = par->run;

	if (run->first.code != 0) {
		par_clean_up_failure(par, leaves);
		return;
	}
	ADG_ASSERT(par_all_ran(par));
	for (uint32_t l = 0; l < leaves; l++) {
		void *sum = a->grad[run->len + l];
		if (sum == NULL)
			continue;
		/* Sized for every leaf slot at take: no growing, and each id
		 * once, so no add: it cannot fail. */
		int added =
			adg_grad_table_insert(run->grads, a->leaf_id[l], sum);
		ADG_ASSERT(added == 0);
		(void)added;
	}
}

int adg_par_run(struct adg_run *run, void *seed)
{
	struct adg_tape *t = run->tape;
	struct par_run par = {
		.run = run,
		.a = &t->par,
		.executor = *run->executor,
		.ticket = run->ticket,
		.n_slots = adg_par_slots(run->executor),
	};
	struct adg_par_arrays *a = &t->par;
	uint32_t leaves = par_plan(t, run->len, run->retained);
	pthread_mutex_init(&par.serialize, NULL);
	/* The monotonic clock, for checkpoint.c's bounded wait. */
	pthread_condattr_t monotonic;
	pthread_condattr_init(&monotonic);
	pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
	pthread_cond_init(&par.rebuilt, &monotonic);
	pthread_condattr_destroy(&monotonic);
	atomic_init(&par.in_flight, 1); /* the root */
	atomic_init(&par.helpers, 0);
	atomic_init(&par.wake_seq, 0);
	atomic_init(&par.asleep, false);
	for (uint32_t i = 0; i < par.n_slots; i++) {
		ck_spinlock_fas_init(&a->queues[i].lock);
		atomic_init(&a->queues[i].head, NONE);
		atomic_init(&a->queues[i].taken, i == 0);
	}
	par.ticket->par = &par;

	/* The root runs first, with the seed, which is final from the
	 * start. */
	a->grad[0] = seed;
	a->state[0] = FOLDED;
	adg_run_root_ready(run, &a->grad[0]);
	if (run->first.code == 0) {
		struct par_worker w = {
			.par = &par,
			.queue = &a->queues[0],
			.slot = 0,
		};
		adg_run_thread_init(&w.th, run, 0, &par.serialize,
				    &par.rebuilt);
		par_work(&w, 0);
		while (!par_over(&par))
			par_caller_wait(&w);
		adg_run_thread_leave(&w.th);
	}
	par_close(&par);
	pthread_cond_destroy(&par.rebuilt);
	pthread_mutex_destroy(&par.serialize);
	/* Every job has left (par_close): first is read without the lock. */
	par_finish(&par, leaves);
	return adg_run_end(run);
}
