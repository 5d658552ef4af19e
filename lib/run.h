/*
 * The runner: what every backward shares, whichever of its three modes
 * runs it. adg_backward_with (backward.c) builds one run context, takes
 * the tape into it (tape.c), and runs it: on the calling thread in tape
 * order (backward.c), or on an executor's workers (parallel.c). Every
 * mode runs each step with one protocol (adg_run_step), records failures
 * with one pair of keys, and ends with one end of run (run.c).
 */
#ifndef ADG_RUN_H
#define ADG_RUN_H

#include "checkpoint.h"
#include "grads.h"
#include "tape.h"

#include <time.h>

/* How a run runs its steps. */
enum adg_run_mode {
	/* No executor: on the calling thread, in tape order, the steps
	 * registering into the run's table directly. */
	ADG_RUN_SEQUENTIAL,
	/* An executor with no worker: as sequential, but each step gives its
	 * gradients to a step output, with an executor's rules (adg.h:
	 * adg_backward_options.executor). */
	ADG_RUN_ALONE,
	/* An executor's workers (parallel.c). */
	ADG_RUN_PARALLEL,
};

struct adg_par_ticket;

/* One backward, built once by adg_backward_with; read-only once it runs,
 * but for first (under fail_lock with workers). */
struct adg_run {
	struct adg_registry *registry;
	struct adg_shard *shard; /* the calling thread's */
	uint64_t pass_id;	 /* adg_step_call.pass_id */
	struct adg_tape *tape;
	size_t len; /* of the tape */
	enum adg_run_mode mode;
	/* A retained backward: nothing is released, served or dropped
	 * (I14). */
	bool retained;
	const adg_grad_ops *ops;
	/* The hooks, from the options; NULL when not set. */
	adg_ready_fn on_ready;
	void *ready_ctx;
	bool leaves_only;
	adg_step_hook_fn on_step;
	void *step_ctx;
	int (*value_check)(const void *value, void *ctx);
	void *value_check_ctx;
	const adg_executor *executor;
	/* With workers: the jobs' handle, allocated before the tape is
	 * taken so that running never allocates. */
	struct adg_par_ticket *ticket;
	/* The gradients: every one on one thread; the leaves' with
	 * workers, which hold the rest in the scheduler's arrays. */
	struct adg_grad_table *grads;
	/* The first failure in tape order: its key (adg_run_step_key),
	 * read without the lock by threads deciding whether to start a
	 * step, and what it was. */
	atomic_uint_fast64_t first_key;
	adg_failure first;
	/* The first failure's reason (adg_errmsg), ADG_ERRMSG_MAX bytes of
	 * the caller's frame, written with first on the thread that failed
	 * (which holds the inner reason of a libadg call inside the callback)
	 * and made the caller's thread's reason when the backward returns. */
	char *reason;
	/* A consuming run: the positions below it were let go of
	 * (adg_run_let_go). */
	size_t let_go;
	pthread_mutex_t fail_lock; /* with workers: around first's writes */
};

/* A step's output: where a step gives its gradients, one per parent slot
 * (adg_step_give, and adg_grads_register on call->grads alone and with
 * workers). With workers the slots are the step's edges, where the values
 * wait for their fold; on one thread the values go to the table at once,
 * in the order a fold with workers adds them in, and the slots are marks.
 * Every slot below filled is taken; marks from filled on are kept only
 * once a gradient came out of slot order (marked). */
struct adg_step_out {
	struct adg_grads as_grads; /* call->grads alone and with workers */
	const struct adg_node *node;
	void **slots;
	uint32_t filled;
	bool marked;
	/* On one thread with no value check: a gradient given in slot
	 * order goes straight to the table (adg_step_give). Set once. */
	bool direct;
	/* What value_check rejected a gradient of node's with (0: none):
	 * node's step then fails with it, whatever it returns. */
	int rejected;
	/* The slot of the gradient rejected first, for the reason. */
	uint32_t rejected_slot;
};

/* One thread's part in a run: what its steps' calls point at. */
struct adg_run_thread {
	struct adg_run *run;
	struct adg_shard *shard; /* this thread's, for releases */
	/* call->context: what adg_output_get needs. */
	struct adg_backward_context ckpt;
	struct adg_step_out out;
	/* The running step's parent ids (adg_step_call.parent_ids), filled
	 * from its parent slots, which hold a leaf's id but an op's pointer
	 * (internal.h): ids for up to ADG_RUN_INLINE_IDS parents, the
	 * common case, more_ids (the tape's, this worker slot's, reserved
	 * when the tape was taken; NULL when no tape node needs it) for
	 * more. Each thread of a run has its own. */
	uint64_t *more_ids;
	uint64_t ids[ADG_RUN_INLINE_IDS];
	/* What adg_callback_site answers for a callback this thread runs
	 * for the run outside a step's own code (a value check, on_step, an
	 * add with an executor): the failure's site, and the node (NULL for
	 * a leaf) and id it would name; ADG_FAILED_NOWHERE between such
	 * calls. Inside a step, ckpt.node is the step's node; between steps
	 * it is NULL. Set around those calls only, never per add on one
	 * thread: the sequential add path pays nothing for it. */
	adg_failure_site site;
	const struct adg_node *site_node;
	uint64_t site_id;
	/* What was current when this thread entered the run
	 * (adg_run_thread_init), put back when it leaves. */
	struct adg_run_thread *outer;
	/* The thread's reason count when it entered the run
	 * (adg_errmsg_serial): a failing callback's code whose reason was
	 * written since is a libadg call's, kept in the run's reason. */
	uint64_t errmsg_since;
};

/* The run thread whose callbacks the calling thread runs now, for
 * adg_callback_site; NULL outside every run. initial-exec, as
 * adg_self: one load from the thread pointer. */
extern __thread struct adg_run_thread *adg_run_current
	__attribute__((tls_model("initial-exec")));

/* th's thread leaves its run: what adg_run_thread_init found current is
 * again (a run entered inside a callback of another, a nested backward or
 * a job an executor runs inside a wait, gives the outer one back). */
void adg_run_thread_leave(struct adg_run_thread *th);

/* th runs a callback whose failure the backward reports at site, naming
 * n (NULL for a leaf) and id, until adg_run_site_end. Never nested on one
 * thread of a run: a value check and an add with an executor run inside a
 * step's give, on_step and the workers' adds outside any step. */
static inline void adg_run_site_begin(struct adg_run_thread *th,
				      adg_failure_site site,
				      const struct adg_node *n, uint64_t id)
{
	ADG_ASSERT(th->site == ADG_FAILED_NOWHERE);
	th->site = site;
	th->site_node = n;
	th->site_id = id;
}

static inline void adg_run_site_end(struct adg_run_thread *th)
{
	th->site = ADG_FAILED_NOWHERE;
}

/* Fills th's array for n's parent ids and returns it. */
static inline const uint64_t *adg_run_step_ids(struct adg_run_thread *th,
					       const struct adg_node *n)
{
	uint64_t *ids = adg_likely(n->n_parents <= ADG_RUN_INLINE_IDS)
				? th->ids
				: th->more_ids;
	ADG_ASSERT(ids != NULL);
	adg_node_fill_parent_ids(n, ids);
	return ids;
}

/* Fills th for run, on the thread with worker slot `slot` (0: the
 * caller's); serialize and rebuilt with workers, else NULL. The calling
 * thread takes part in the run from here on, until adg_run_thread_leave:
 * th is current, and its callbacks answer for th (adg_callback_site). */
void adg_run_thread_init(struct adg_run_thread *th, struct adg_run *run,
			 uint32_t slot, pthread_mutex_t *serialize,
			 pthread_cond_t *rebuilt);

/*
 * Failure keys order failures as the sequential backward meets them, so
 * that the first in tape order wins whatever the timing: a step's failure
 * (or on_step's around it) at position p has key 2p; one that happens
 * after step p and before step p + 1 (an add or on_ready on a target whose
 * last contributor is p) has 2p + 1; on_ready for the root, before any
 * step, has 0. The invariant they keep: a step starts only if its key is
 * below the first failure's, so a failure at key k stops exactly the steps
 * from k on; and no failure is ever keyed below a step that has already
 * run, since every failure happens at or after the step its key names.
 */
static inline uint64_t adg_run_step_key(const struct adg_run *run, size_t pos)
{
	ADG_ASSERT(pos < run->len);
	return (uint64_t)pos * 2;
}

static inline uint64_t adg_run_after_key(const struct adg_run *run, size_t pos)
{
	return adg_run_step_key(run, pos) + 1;
}

/* Whether the step at pos must not start: a failure keyed at or before it
 * is known. Relaxed: a stale key merely lets a step start that the
 * smaller key would have stopped, as a step already running would. */
static inline bool adg_run_stopped(const struct adg_run *run, size_t pos)
{
	return adg_run_step_key(run, pos) >=
	       atomic_load_explicit(&run->first_key, memory_order_relaxed);
}

/* Records a failure at key, with what it was; the smallest key wins. */
void adg_run_fail(struct adg_run *run, uint64_t key, const adg_failure *what);

/* A failure's report for n (a tape node, or NULL for a leaf id). */
static inline adg_failure adg_run_failure_at(adg_failure_site site, int code,
					     const struct adg_node *n,
					     uint64_t id)
{
	return (adg_failure){.code = code,
			     .site = site,
			     .node_id = id,
			     .name = n != NULL ? n->kind->name : NULL};
}

/* on_ready for the root, before any step: on failure records it (key 0)
 * and frees what the hook left of *grad. */
void adg_run_root_ready(struct adg_run *run, void **grad);

/* on_ready for id (n its node, NULL for a leaf) once its gradient is
 * final; a failure is recorded at key. Returns on_ready's result. */
int adg_run_ready(struct adg_run *run, const struct adg_node *n, uint64_t id,
		  void **grad, uint64_t key);

/* adg_run_step's paths off the common one (run.c): a step with on_step
 * around it (*site says when the hook failed); serving a step's
 * checkpoint requests; recording a step's failure. */
int adg_run_step_hooked(struct adg_run_thread *th, struct adg_node *n,
			adg_step_call *call, adg_failure_site *site);
void adg_run_serve(struct adg_run_thread *th, struct adg_node *n);
void adg_run_step_failed(struct adg_run_thread *th, size_t pos,
			 adg_failure_site site, int rc);

/*
 * What a run touches after calling out to user code (a step, a release, a
 * recompute, a hook, ops) stays alive whatever that code does: each
 * non-root tape node is held by its tape children's references until it
 * has run and is let go of (adg_run_let_go; nothing reads it after), the
 * root by the backward's own reference (backward_run), the records by the
 * tape (only this backward owns a consumed node's record), the scratch by
 * this run (a nested backward finds the shard's tape taken and uses its
 * own), and the table by this run (no step sees it outside its call).
 *
 * The step protocol, every mode's: runs the step at position pos of th's
 * run with grad, its gradient, final (the step's now, or freed here), with
 * on_step around it; serves its checkpoint requests; frees what the step
 * left of grad; releases the step in a consuming run. slots: the step's
 * edges with workers, where its output puts its gradients; NULL on one
 * thread. A failure is recorded at the step's key. Returns 0 or the
 * failure's code. Inline: it is the loop body of the sequential backward,
 * where a call costs more than the rest (callgrind).
 */
static inline int adg_run_step(struct adg_run_thread *th, size_t pos,
			       void *grad, void **slots)
{
	struct adg_run *run = th->run;
	struct adg_node *n = run->tape->sorted[pos];

	/* The step's output resets itself on its first gradient (run.c);
	 * the edges are where it puts them with workers. */
	th->ckpt.node = n;
	if (slots != NULL)
		th->out.slots = slots;
	adg_step_call call = {
		.registry = adg_node_registry_of(n),
		.grads = run->mode == ADG_RUN_SEQUENTIAL ? &run->grads->as_grads
							 : &th->out.as_grads,
		.node_id = n->id,
		.grad = grad,
		.parent_ids = adg_run_step_ids(th, n),
		.n_parents = n->n_parents,
		.context = &th->ckpt,
		.retained = run->retained,
		.pass_id = run->pass_id,
	};
	adg_failure_site site = ADG_FAILED_STEP;
	int rc =
		adg_likely(run->on_step == NULL)
			? adg_callback_result(n->kind->backward(&call, n->user))
			: adg_run_step_hooked(th, n, &call, &site);
	/* The step has returned: what runs next on this thread (the
	 * release, ops->free, hooks) is in no step (adg_callback_site). A
	 * give's output notices a new step by ckpt.node alone, which the
	 * next step sets. */
	th->ckpt.node = NULL;
	if (adg_unlikely(run->value_check != NULL) && th->out.node == n &&
	    th->out.rejected != 0) {
		rc = th->out.rejected;
		site = ADG_FAILED_CHECK;
	}
	if (adg_node_ckpt(n) != NULL && !run->retained)
		adg_run_serve(th, n);
	if (call.grad != NULL)
		run->ops->free(call.grad, run->ops->ctx);
	if (!run->retained)
		adg_node_release_step(th->shard, n);
	if (adg_unlikely(rc != 0))
		adg_run_step_failed(th, pos, site, rc);
	return rc;
}

/* A consuming run lets go of the node at pos, the next not let go of,
 * once its step has run or been skipped: its checkpointing record, and
 * the references its tape children held on it (freeing it if nothing
 * else holds it). On one thread each node goes as the loop passes it,
 * while it is still in the cache; with workers, at the end. */
void adg_run_let_go(struct adg_run *run, size_t pos);

/* The end of every run, once no step runs any more: a consuming run lets
 * go of what is left (adg_run_let_go). Returns the run's result,
 * first.code. */
int adg_run_end(struct adg_run *run);

/* parallel.c: runs the taken tape on the calling thread and the
 * executor's workers (at least one); leaf gradients land in run->grads
 * at the end. The run lets go of run->ticket. */
int adg_par_run(struct adg_run *run, void *seed);

/* A backward's handle for the jobs it submits, which may outlive it and
 * its registry (parallel.c). */
struct adg_par_ticket *adg_par_ticket_new(void);
void adg_par_ticket_put(struct adg_par_ticket *ticket);

/* How many worker slots an executor needs: the caller's and its workers'. */
static inline uint32_t adg_par_slots(const adg_executor *e)
{
	return 1 + e->n_workers;
}

static inline uint64_t adg_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif /* ADG_RUN_H */
