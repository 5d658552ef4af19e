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
#include "tape.h"

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
	struct par_run *run; /* valid while inside */
};

/* One parallel backward, on its caller's stack. */
struct par_run {
	/* Set up before any job is submitted; read-only after. */
	struct adg_tape *t;
	struct adg_par_arrays *a;
	size_t len;
	const adg_grad_ops *ops;
	const struct ready *ready;
	const struct step_hook *step_hook;
	struct adg_registry *registry;
	adg_executor executor;
	struct adg_par_ticket *ticket;
	uint32_t n_slots;
	/* See struct adg_backward_context. */
	pthread_mutex_t serialize;
	pthread_cond_t rebuilt;
	/* A retained backward: nothing is released, served or dropped
	 * (I14). */
	bool retained;

	/* Tasks made ready and not yet finished: queued or running. Zero
	 * means the run is over. */
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t in_flight;
	/* Jobs submitted and not yet gone (inside, or still to start). */
	atomic_uint_fast32_t helpers;

	/* The caller's sleep: it sleeps on wake_seq while asleep is set. */
	_Alignas(ADG_CACHELINE) _Atomic uint32_t wake_seq;
	atomic_bool asleep;

	/* The smallest error key seen, and its code (under err_lock). */
	_Alignas(ADG_CACHELINE) atomic_uint_fast64_t err_key;
	int err_code;
	pthread_mutex_t err_lock;
};

/* One thread's part in a run. */
struct worker {
	struct par_run *run;
	struct adg_ready_queue *queue;
	uint32_t slot;
	struct adg_shard *shard; /* this thread's, for releases */
	struct adg_backward_context ctx;
};

/* ------------------------------------------------------------- scratch */

/* Lays the arrays out in block (or, with block NULL, only measures) and
 * returns the bytes they take. */
static size_t carve(void *block, struct adg_par_arrays *a, size_t len,
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
		     size_t edges, size_t leaf_slots, uint32_t n_slots)
{
	/* Indices are 32 bits, NONE excluded: 2^32 edges would be 64 GiB of
	 * parent arrays. */
	if (edges >= NONE || len + leaf_slots >= NONE)
		return false;
	/* The allocator promises malloc's alignment, not a cache line's:
	 * the queues start at the first line inside, up to a line in. */
	size_t bytes = carve(NULL, &t->par, len, edges, leaf_slots, n_slots) +
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
	carve(aligned, &t->par, len, edges, leaf_slots, n_slots);
	return true;
}

/* One more edge to a target. Relaxed load and store, no locked add: no
 * worker has started, and submitting one orders these before it. */
static void count_up(_Atomic uint32_t *pending)
{
	atomic_store_explicit(
		pending,
		atomic_load_explicit(pending, memory_order_relaxed) + 1,
		memory_order_relaxed);
}

/* Numbers positions and edges, finds each edge's target and each target's
 * last contributor, sets the counts and builds each target's incoming list
 * in order: one pass, from the end of the tape, where a node's parents
 * (shallower, so later) are numbered before it and its children (earlier)
 * come after. The table is sized for the tape's leaf slots, and its nodes
 * too when retained: a retained backward keeps a node's position there,
 * not in the node, which other retained passes may be running over (I14).
 * Returns the number of leaves. */
static uint32_t plan(struct adg_tape *t, size_t len, bool retained)
{
	struct adg_par_arrays *a = &t->par;
	uint32_t edges = (uint32_t)t->par_edges, leaves = 0;

	memset(t->leaves, 0, t->leaves_cap * sizeof *t->leaves);
	a->edge_base[len] = edges;
	/* Relaxed stores: no worker has started; submitting one orders
	 * these before it. */
	for (size_t p = len; p-- > 0;) {
		struct adg_node *n = t->sorted[p];
		const uint64_t *ids = adg_node_parent_ids(n);
		if (retained) /* pending 0: a node's key, not a leaf's */
			*leaf_slot(t, n->id) = (struct leaf_pending){
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
			if (n->parents[k] != NULL) {
				target = retained ? leaf_slot(t, ids[k])->index
						  : n->parents[k]->tape_pos;
				count_up(&a->pending[target]);
			} else {
				struct leaf_pending *l = leaf_slot(t, ids[k]);
				target = (uint32_t)len + l->index;
				if (l->id == 0) { /* the leaf's first edge */
					*l = (struct leaf_pending){
						.id = ids[k], .index = leaves};
					target = (uint32_t)len + leaves++;
					a->leaf_id[l->index] = ids[k];
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
	for (size_t i = 0; i < t->leaves_cap; i++) {
		struct leaf_pending *l = &t->leaves[i];
		if (l->id != 0 && l->pending != 0) /* a leaf's */
			atomic_store_explicit(&a->pending[len + l->index],
					      l->pending, memory_order_relaxed);
	}
	return leaves;
}

/* --------------------------------------------------------------- errors */

static uint64_t step_key(uint32_t pos)
{
	return (uint64_t)pos * 2;
}

/* A fold or hook on a target: just after its last contributor's step,
 * where the target's gradient is complete on one thread as on several. */
static uint64_t target_key(const struct par_run *run, uint32_t target)
{
	return step_key(run->a->last[target]) + 1;
}

static void fail(struct par_run *run, uint64_t key, int code)
{
	pthread_mutex_lock(&run->err_lock);
	/* Relaxed: err_lock orders the writes; readers outside it only use
	 * the key to skip steps, and a stale one merely lets a step start
	 * that the smaller key would have stopped. */
	if (key < atomic_load_explicit(&run->err_key, memory_order_relaxed)) {
		atomic_store_explicit(&run->err_key, key, memory_order_relaxed);
		run->err_code = code;
	}
	pthread_mutex_unlock(&run->err_lock);
}

static bool stopped(struct par_run *run, uint32_t pos)
{
	return step_key(pos) >
	       atomic_load_explicit(&run->err_key, memory_order_relaxed);
}

/* ------------------------------------------------------------- queues */

static void queue_lock(struct adg_ready_queue *q)
{
	if (adg_unlikely(!ck_spinlock_fas_trylock(&q->lock)))
		adg_graph_lock_wait(&q->lock);
	adg_tsan_acquire(&q->lock);
}

static void queue_unlock(struct adg_ready_queue *q)
{
	adg_tsan_release(&q->lock);
	ck_spinlock_fas_unlock(&q->lock);
}

static uint32_t queue_pop(struct par_run *run, struct adg_ready_queue *q)
{
	/* Relaxed peek: an empty-looking queue is skipped; a stale
	 * non-empty one costs a lock. */
	if (atomic_load_explicit(&q->head, memory_order_relaxed) == NONE)
		return NONE;
	queue_lock(q);
	uint32_t pos = atomic_load_explicit(&q->head, memory_order_relaxed);
	if (pos != NONE)
		atomic_store_explicit(&q->head, run->a->next_ready[pos],
				      memory_order_relaxed);
	queue_unlock(q);
	return pos;
}

/* Wakes the caller if it sleeps. Every event it may wait for (new work, the
 * run over) bumps wake_seq after it is made, and the caller reads wake_seq
 * before it looks for them: so either it sees the event, or the futex
 * finds wake_seq moved and does not sleep. seq_cst: the bump and the load
 * of asleep must not pass each other, nor the caller's store of asleep and
 * its futex wait (ThreadSanitizer has no fences, hence no fence here). */
static void wake_caller(struct par_run *run)
{
	atomic_fetch_add_explicit(&run->wake_seq, 1, memory_order_seq_cst);
	if (atomic_load_explicit(&run->asleep, memory_order_seq_cst))
		syscall(SYS_futex, &run->wake_seq, FUTEX_WAKE_PRIVATE, 1, NULL,
			NULL, 0);
}

static void helper_job(void *arg);

/* One more job, if fewer than the executor's n_workers are in. */
static void add_helper(struct par_run *run)
{
	uint_fast32_t h =
		atomic_load_explicit(&run->helpers, memory_order_relaxed);
	do {
		if (h >= run->executor.n_workers)
			return;
	} while (!atomic_compare_exchange_weak_explicit(
		&run->helpers, &h, h + 1, memory_order_relaxed,
		memory_order_relaxed));
	/* Relaxed: the caller's reference keeps the ticket until the run
	 * closes, and the job's only starts counting after. */
	atomic_fetch_add_explicit(&run->ticket->refs, 1, memory_order_relaxed);
	if (run->executor.submit(helper_job, run->ticket, run->executor.ctx) !=
	    0) {
		atomic_fetch_sub_explicit(&run->ticket->refs, 1,
					  memory_order_relaxed);
		atomic_fetch_sub_explicit(&run->helpers, 1,
					  memory_order_relaxed);
	}
}

/* Queues a ready position on w's own queue, for w or a thief. */
static void push(struct worker *w, uint32_t pos)
{
	struct par_run *run = w->run;
	/* Counted before it can be taken: a thief that finishes it must not
	 * bring the count to zero while this thread's step is still in.
	 * Relaxed: the queue's lock orders this before the thief's
	 * decrement. */
	atomic_fetch_add_explicit(&run->in_flight, 1, memory_order_relaxed);
	queue_lock(w->queue);
	run->a->next_ready[pos] =
		atomic_load_explicit(&w->queue->head, memory_order_relaxed);
	atomic_store_explicit(&w->queue->head, pos, memory_order_relaxed);
	queue_unlock(w->queue);
	add_helper(run);
	if (w->slot != 0)
		wake_caller(run); /* slot 0 is the caller, awake */
}

/* A finished task, and none to follow it on this thread. */
static void task_done(struct par_run *run)
{
	/* acq_rel: release, so that what this worker did (steps, gradients,
	 * ran flags) happens before the caller's end of the run; acquire,
	 * so that the one that brings it to zero has seen every other. */
	if (atomic_fetch_sub_explicit(&run->in_flight, 1,
				      memory_order_acq_rel) == 1)
		wake_caller(run);
}

/* Work for w: its own queue first, then the others'. */
static uint32_t find_work(struct worker *w)
{
	struct par_run *run = w->run;
	uint32_t pos = queue_pop(run, w->queue);
	for (uint32_t i = 1; i < run->n_slots && pos == NONE; i++)
		pos = queue_pop(run,
				&run->a->queues[(w->slot + i) % run->n_slots]);
	return pos;
}

/* -------------------------------------------------------------- folding */

/* Adds v into target's gradient, after what is there (I11: callers add
 * in fold order). A failing add poisons the target: what comes later is
 * freed unadded, and the target never runs or reaches the hook. What is
 * held stays in grad, for the end of the run to free. */
static void accumulate(struct par_run *run, uint32_t target, void *v)
{
	struct adg_par_arrays *a = run->a;
	const adg_grad_ops *ops = run->ops;

	if (a->state[target] == POISONED) {
		ops->free(v, ops->ctx);
		return;
	}
	if (a->grad[target] == NULL) {
		a->grad[target] = v;
		return;
	}
	int rc = adg_callback_result(ops->add(&a->grad[target], v, ops->ctx));
	if (rc != 0) {
		a->state[target] = POISONED;
		fail(run, target_key(run, target), rc);
	}
}

/* With workers: folds target's edges, all in, in list order. */
static void gather(struct par_run *run, uint32_t target)
{
	struct adg_par_arrays *a = run->a;
	for (uint32_t e = a->in_head[target]; e != NONE; e = a->in_next[e]) {
		void *v = a->edge_value[e];
		if (v == NULL)
			continue;
		a->edge_value[e] = NULL;
		accumulate(run, target, v);
	}
}

/* target's last edge is in and folded: hands its gradient to the hook.
 * Returns whether target is a tape node now ready to run. */
static bool complete(struct par_run *run, uint32_t target)
{
	struct adg_par_arrays *a = run->a;
	if (a->state[target] == POISONED)
		return false;
	a->state[target] = FOLDED;
	bool leaf = target >= run->len;
	if (run->ready != NULL && (leaf || !run->ready->leaves_only)) {
		uint64_t id = leaf ? a->leaf_id[target - run->len]
				   : run->t->sorted[target]->id;
		int rc = adg_callback_result(
			run->ready->fn(id, &a->grad[target], run->ready->ctx));
		if (rc != 0) {
			a->state[target] = POISONED;
			fail(run, target_key(run, target), rc);
			return false;
		}
	}
	return !leaf;
}

/* After pos's step: each of its edges delivers, and the last delivery to
 * a target folds it. Returns the first tape node that became ready, for
 * this thread to run next; queues the rest. */
static uint32_t deliver(struct worker *w, uint32_t pos)
{
	struct par_run *run = w->run;
	struct adg_par_arrays *a = run->a;
	uint32_t next = NONE;

	for (uint32_t e = a->edge_base[pos]; e < a->edge_base[pos + 1]; e++) {
		uint32_t target = a->edge_target[e];
		/* acq_rel: release, so that this step's registrations (and
		 * all it did) happen before the fold; acquire, so that the
		 * last one to deliver, which folds, sees every other's. */
		if (atomic_fetch_sub_explicit(&a->pending[target], 1,
					      memory_order_acq_rel) != 1)
			continue;
		gather(run, target);
		if (!complete(run, target))
			continue;
		if (next == NONE)
			next = target;
		else
			push(w, target);
	}
	return next;
}

/* ---------------------------------------------------------------- steps */

/* Runs the step at pos, or skips it after an earlier failure (the end of
 * the run releases it). Returns the position to run next, or NONE. */
static uint32_t run_step(struct worker *w, uint32_t pos)
{
	struct par_run *run = w->run;
	struct adg_par_arrays *a = run->a;
	if (stopped(run, pos)) {
		task_done(run);
		return NONE;
	}
	struct adg_node *n = run->t->sorted[pos];
	struct adg_step_sink sink = {
		.node = n,
		.slots = &a->edge_value[a->edge_base[pos]],
		.ops = run->ops,
	};
	/* Only sink is read on a view: the rest stays unset. */
	adg_grads view;
	view.sink = &sink;
	w->ctx.node = n;
	adg_step_call call = {
		.registry = n->registry,
		.grads = &view,
		.node_id = n->id,
		.grad = a->grad[pos],
		.parent_ids = adg_node_parent_ids(n),
		.n_parents = n->n_parents,
		.context = &w->ctx,
		.retained = run->retained,
	};
	int rc = adg_step_run(run->step_hook, n, &call);
	if (n->ckpt != NULL && !run->retained) {
		struct adg_drops drops = {0};
		pthread_mutex_lock(&run->serialize);
		adg_ckpt_served(n, &drops);
		pthread_mutex_unlock(&run->serialize);
		adg_ckpt_free_drops(&drops); /* the caller's code: unlocked */
	}
	if (call.grad != NULL)
		run->ops->free(call.grad, run->ops->ctx);
	a->state[pos] = RAN;
	if (!run->retained)
		adg_node_release_step(w->shard, n);
	uint32_t next = NONE;
	if (rc != 0)
		fail(run, step_key(pos), rc);
	else
		next = deliver(w, pos);
	/* A next task takes this one's place in the count. */
	if (next == NONE)
		task_done(run);
	return next;
}

/* ------------------------------------------------------------- workers */

/* Runs tasks until w finds none. */
static void work(struct worker *w, uint32_t pos)
{
	for (;;) {
		while (pos != NONE)
			pos = run_step(w, pos);
		pos = find_work(w);
		if (pos == NONE)
			return;
	}
}

/* What adg_output_get needs, for the worker in slot of run. */
static struct adg_backward_context worker_context(struct par_run *run,
						  uint32_t slot)
{
	return (struct adg_backward_context){
		.stack = run->t->walked,
		.outputs =
			run->t->outputs == NULL
				? NULL
				: run->t->outputs +
					  (size_t)slot * run->t->outputs_stride,
		.serialize = &run->serialize,
		.rebuilt = &run->rebuilt,
		.retained = run->retained,
	};
}

static bool run_over(struct par_run *run)
{
	return atomic_load_explicit(&run->in_flight, memory_order_acquire) == 0;
}

/* The caller, out of work while steps run elsewhere: looks again a few
 * times, yielding its core to them, then sleeps until woken. */
static void caller_wait(struct worker *w)
{
	struct par_run *run = w->run;
	for (int i = 0; i < 4; i++) {
		if (run_over(run))
			return;
		uint32_t pos = find_work(w);
		if (pos != NONE) {
			work(w, pos);
			return;
		}
		sched_yield();
	}
	/* seq_cst, and before looking: see wake_caller. */
	uint32_t seq =
		atomic_load_explicit(&run->wake_seq, memory_order_seq_cst);
	uint32_t pos = find_work(w);
	if (pos == NONE && !run_over(run)) {
		atomic_store_explicit(&run->asleep, true, memory_order_seq_cst);
		syscall(SYS_futex, &run->wake_seq, FUTEX_WAIT_PRIVATE, seq,
			NULL, NULL, 0);
		atomic_store_explicit(&run->asleep, false,
				      memory_order_relaxed);
	}
	if (pos != NONE)
		work(w, pos);
}

/* A job: a worker of the executor enters the run, if it is still open. */
static void helper_job(void *arg)
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

	struct par_run *run = ticket->run;
	struct worker w = {.run = run};
	/* A free slot exists: fewer jobs are in than n_workers. */
	for (uint32_t i = 1; w.queue == NULL; i = i % (run->n_slots - 1) + 1) {
		bool no = false;
		if (atomic_compare_exchange_strong_explicit(
			    &run->a->queues[i].taken, &no, true,
			    memory_order_acquire, memory_order_relaxed)) {
			w.slot = i;
			w.queue = &run->a->queues[i];
		}
	}
	w.shard = adg_shard_get_or_shared(run->registry);
	w.ctx = worker_context(run, w.slot);
	/* Leaves after a few empty looks, yielding in between: on a machine
	 * with more threads than cores, a spinning worker would take the
	 * core from the step it waits for. */
	for (int idle = 0; idle < 4 && !run_over(run); idle++) {
		uint32_t pos = find_work(&w);
		if (pos == NONE) {
			sched_yield();
			continue;
		}
		work(&w, pos);
		idle = -1;
	}
	atomic_store_explicit(&w.queue->taken, false, memory_order_release);
	atomic_fetch_sub_explicit(&run->helpers, 1, memory_order_relaxed);
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
	t->run = NULL;
	return t;
}

void adg_par_ticket_put(struct adg_par_ticket *t)
{
	/* acq_rel: the last one frees it, after everyone's use. */
	if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
		free(t);
}

/* Ends the run for jobs: none enters any more, and those inside leave. */
static void close_run(struct par_run *run)
{
	struct adg_par_ticket *t = run->ticket;
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
static void clean_up_failure(struct adg_shard *shard, struct par_run *run,
			     uint32_t leaves)
{
	struct adg_par_arrays *a = run->a;
	const adg_grad_ops *ops = run->ops;

	for (size_t p = 0; p < run->len + leaves; p++) {
		if (p < run->len && a->state[p] != RAN && !run->retained)
			adg_node_release_step(shard, run->t->sorted[p]);
		/* A step took its gradient: what is left was never run. */
		if (a->state[p] != RAN && a->grad[p] != NULL)
			ops->free(a->grad[p], ops->ctx);
	}
	for (uint32_t e = 0; e < a->edge_base[run->len]; e++)
		if (a->edge_value[e] != NULL)
			ops->free(a->edge_value[e], ops->ctx);
}

/* I10, I8: a successful run ran every step, delivered and folded every
 * edge, and served every request. For the assertions only. */
static bool run_complete(const struct par_run *run)
{
	const struct adg_par_arrays *a = run->a;
	for (size_t p = 0; p < run->len; p++) {
		const struct adg_ckpt *c = run->t->sorted[p]->ckpt;
		if (a->state[p] != RAN ||
		    atomic_load_explicit(&a->pending[p],
					 memory_order_relaxed) != 0 ||
		    (c != NULL && !run->retained &&
		     (c->pending != 0 || c->value != NULL)))
			return false;
	}
	for (uint32_t e = 0; e < a->edge_base[run->len]; e++)
		if (a->edge_value[e] != NULL)
			return false;
	return true;
}

/* After the run: hands the leaves' gradients to grads (or cleans up a
 * failure), then lets go of the records and of the tape. */
static int finish(struct adg_shard *shard, struct par_run *run, int rc,
		  adg_grads *grads, uint32_t leaves)
{
	struct adg_tape *t = run->t;
	struct adg_par_arrays *a = run->a;

	if (rc != 0) {
		clean_up_failure(shard, run, leaves);
	} else {
		ADG_ASSERT(run_complete(run));
		for (uint32_t l = 0; l < leaves; l++) {
			void *sum = a->grad[run->len + l];
			if (sum == NULL)
				continue;
			/* Sized for every leaf slot at take: no growing, and
			 * each id once, so no add: it cannot fail. */
			int added =
				adg_grads_register(grads, a->leaf_id[l], sum);
			ADG_ASSERT(added == 0);
			(void)added;
		}
	}
	if (run->retained)
		return rc; /* the graph is as it was: nothing to let go */
	/* As drop_tape_links in backward.c, each node's record first. */
	for (size_t i = 0; i < run->len; i++) {
		struct adg_node *n = t->sorted[i];
		if (n->ckpt != NULL)
			adg_ckpt_drop(n);
		adg_node_release_many(shard, n, n->tape_links);
	}
	return rc;
}

int adg_par_run(struct adg_shard *shard, struct adg_tape *t, size_t len,
		void *seed, const adg_grad_ops *ops, const struct ready *ready,
		const struct step_hook *step_hook, adg_grads *grads,
		const adg_executor *executor, bool retained,
		struct adg_par_ticket *ticket)
{
	struct par_run run = {
		.t = t,
		.a = &t->par,
		.len = len,
		.ops = ops,
		.ready = ready,
		.step_hook = step_hook,
		.registry = t->sorted[0]->registry,
		.executor = *executor,
		.ticket = ticket,
		.n_slots = adg_par_slots(executor),
		.retained = retained,
	};
	struct adg_par_arrays *a = &t->par;
	uint32_t leaves = plan(t, len, retained);
	pthread_mutex_init(&run.serialize, NULL);
	/* The monotonic clock, for checkpoint.c's bounded wait. */
	pthread_condattr_t monotonic;
	pthread_condattr_init(&monotonic);
	pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
	pthread_cond_init(&run.rebuilt, &monotonic);
	pthread_condattr_destroy(&monotonic);
	pthread_mutex_init(&run.err_lock, NULL);
	atomic_init(&run.in_flight, 1); /* the root */
	atomic_init(&run.helpers, 0);
	atomic_init(&run.wake_seq, 0);
	atomic_init(&run.asleep, false);
	atomic_init(&run.err_key, UINT64_MAX);
	for (uint32_t i = 0; i < run.n_slots; i++) {
		ck_spinlock_fas_init(&a->queues[i].lock);
		atomic_init(&a->queues[i].head, NONE);
		atomic_init(&a->queues[i].taken, i == 0);
	}
	ticket->run = &run;

	/* The root runs first, with the seed, which is final from the
	 * start. */
	a->grad[0] = seed;
	a->state[0] = FOLDED;
	int rc = 0;
	if (ready != NULL && !ready->leaves_only)
		rc = adg_callback_result(
			ready->fn(t->sorted[0]->id, &a->grad[0], ready->ctx));
	if (rc == 0) {
		struct worker w = {
			.run = &run,
			.queue = &a->queues[0],
			.slot = 0,
			.shard = shard,
			.ctx = worker_context(&run, 0),
		};
		work(&w, 0);
		while (!run_over(&run))
			caller_wait(&w);
		pthread_mutex_lock(&run.err_lock);
		if (atomic_load_explicit(&run.err_key, memory_order_relaxed) !=
		    UINT64_MAX)
			rc = run.err_code;
		pthread_mutex_unlock(&run.err_lock);
	}
	close_run(&run);
	pthread_cond_destroy(&run.rebuilt);
	pthread_mutex_destroy(&run.serialize);
	pthread_mutex_destroy(&run.err_lock);
	return finish(shard, &run, rc, grads, leaves);
}
