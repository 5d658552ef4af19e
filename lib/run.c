/*
 * What every run of a backward shares, whichever mode runs it (run.h): the
 * step protocol, a step's output, failures and their keys, the hooks, and
 * the end of the run.
 */
#include "run.h"

#include <stdio.h>
#include <string.h>

#define NO_SLOT UINT32_MAX

static int step_out_accept(struct adg_grads *to, uint64_t id, void *value);

__thread struct adg_run_thread *adg_run_current
	__attribute__((tls_model("initial-exec")));

void adg_run_thread_init(struct adg_run_thread *th, struct adg_run *run,
			 uint32_t slot, pthread_mutex_t *serialize,
			 pthread_cond_t *rebuilt)
{
	struct adg_tape *t = run->tape;
	*th = (struct adg_run_thread){
		.run = run,
		.shard = slot == 0 ? run->shard
				   : adg_shard_get_or_shared(run->registry),
		.ckpt =
			{
				/* Recomputing outputs needs a work list as
				 * long as the tape; the walk order is no
				 * longer needed, so its array serves. */
				.stack = t->walked,
				.outputs =
					t->outputs == NULL
						? NULL
						: t->outputs +
							  (size_t)slot *
								  t->outputs_stride,
				.ids = t->recompute_ids == NULL
					       ? NULL
					       : t->recompute_ids +
							 (size_t)slot *
								 t->outputs_stride,
				.serialize = serialize,
				.rebuilt = rebuilt,
				.retained = run->retained,
			},
		.out =
			{
				.as_grads = {.accept = step_out_accept},
				.slots = t->marks,
				.direct = run->mode == ADG_RUN_SEQUENTIAL &&
					  run->value_check == NULL,
			},
		.more_ids = t->ids_stride == 0
				    ? NULL
				    : t->ids + (size_t)slot * t->ids_stride,
		.outer = adg_run_current,
		.errmsg_since = adg_errmsg_serial(),
	};
	adg_run_current = th;
}

/* -------------------------------------------------------------- failures */

/* "step 'mul' of node 5", or "node 5" for a node without a step name. */
static void run_node_text(char *buf, size_t size, const char *name, uint64_t id)
{
	if (name != NULL)
		snprintf(buf, size, "step '%s' of node %" PRIu64, name, id);
	else
		snprintf(buf, size, "node %" PRIu64, id);
	adg_errmsg_clip(buf, size); /* a long name cut */
}

/* The value check's rejection of the gradient n's step (named node) gave
 * for slot k; n NULL when unknown. */
static void run_check_text(char *buf, size_t size, const char *node,
			   const struct adg_node *n, uint32_t k)
{
	if (n == NULL)
		snprintf(buf, size,
			 "the value check rejected a gradient that %s gave",
			 node);
	else if (k >= n->n_parents)
		snprintf(buf, size,
			 "the value check rejected the gradient that %s gave "
			 "for slot %" PRIu32 ", past its last (%" PRIu32
			 " parents)",
			 node, k, n->n_parents);
	else
		snprintf(buf, size,
			 "the value check rejected the gradient that %s gave "
			 "for parent slot %" PRIu32 " (node %" PRIu64 ")",
			 node, k, adg_node_parent_id(n, k));
}

/* Writes what's reason into run->reason, on the thread that failed: the
 * callback and its code, then the inner reason when the callback passed
 * on a libadg call's failure. Failure path only. */
static __attribute__((cold, noinline)) void
run_fail_reason(struct adg_run *run, const adg_failure *what)
{
	const struct adg_run_thread *th = adg_run_current;
	if (th != NULL && th->run != run)
		th = NULL;
	char node[256], where[384], code[32];
	run_node_text(node, sizeof node, what->name, what->node_id);
	adg_code_text(what->code, code);
	switch (what->site) {
	case ADG_FAILED_STEP:
		snprintf(where, sizeof where, "%s returned %s", node, code);
		break;
	case ADG_FAILED_ON_STEP:
		snprintf(where, sizeof where, "on_step around %s returned %s",
			 node, code);
		break;
	case ADG_FAILED_ON_READY:
		snprintf(where, sizeof where,
			 "on_ready for node %" PRIu64 " returned %s",
			 what->node_id, code);
		break;
	case ADG_FAILED_ADD:
		snprintf(where, sizeof where,
			 "ops->add folding a gradient into node %" PRIu64
			 " returned %s",
			 what->node_id, code);
		th = NULL; /* the table's reason says the same */
		break;
	case ADG_FAILED_CHECK:
		run_check_text(where, sizeof where, node,
			       th != NULL ? th->out.node : NULL,
			       th != NULL ? th->out.rejected_slot : 0);
		snprintf(where + strlen(where), sizeof where - strlen(where),
			 " with %s", code);
		th = NULL; /* its reason is the give's: said here already */
		break;
	default:
		snprintf(where, sizeof where,
			 "the allocator gave no memory for the gradients");
		break;
	}
	bool inner =
		th != NULL && adg_errmsg_fresh(what->code, th->errmsg_since);
	snprintf(run->reason, ADG_ERRMSG_MAX, "%s%s%s", where,
		 inner ? ": " : "", inner ? adg_errmsg() : "");
}

void adg_run_fail(struct adg_run *run, uint64_t key, const adg_failure *what)
{
	/* With workers, several threads may fail at once: fail_lock orders
	 * the writes. On one thread there is no other. */
	bool shared = run->mode == ADG_RUN_PARALLEL;
	if (shared)
		pthread_mutex_lock(&run->fail_lock);
	/* Relaxed: the lock (or the one thread) orders the writes; readers
	 * outside it only use the key to skip steps (adg_run_stopped). */
	if (key < atomic_load_explicit(&run->first_key, memory_order_relaxed)) {
		atomic_store_explicit(&run->first_key, key,
				      memory_order_relaxed);
		run->first = *what;
		if (run->reason != NULL)
			run_fail_reason(run, what);
	}
	if (shared)
		pthread_mutex_unlock(&run->fail_lock);
}

/* ----------------------------------------------------------------- hooks */

int adg_run_ready(struct adg_run *run, const struct adg_node *n, uint64_t id,
		  void **grad, uint64_t key)
{
	int rc = adg_callback_result(run->on_ready(id, grad, run->ready_ctx));
	if (rc != 0) {
		adg_failure f =
			adg_run_failure_at(ADG_FAILED_ON_READY, rc, n, id);
		adg_run_fail(run, key, &f);
	}
	return rc;
}

void adg_run_root_ready(struct adg_run *run, void **grad)
{
	if (run->on_ready == NULL || run->leaves_only)
		return;
	struct adg_node *root = run->tape->sorted[0];
	/* The root's gradient is final from the start: its hook comes before
	 * the root's step, at the root's step key. */
	if (adg_run_ready(run, root, root->id, grad,
			  adg_run_step_key(run, 0)) != 0 &&
	    *grad != NULL) {
		run->ops->free(*grad, run->ops->ctx);
		*grad = NULL;
	}
}

/* ----------------------------------------------------------- step output */

/* The run whose thread o is part of. */
static inline struct adg_run *step_out_run(const struct adg_step_out *o)
{
	return caa_container_of(o, struct adg_run_thread, out)->run;
}

/* The output of the step th runs now: reset when the step gives its first
 * gradient, so that a step that gives none costs nothing here. */
static inline struct adg_step_out *step_out_now(struct adg_step_out *o)
{
	const struct adg_run_thread *th =
		caa_container_of(o, struct adg_run_thread, out);
	if (adg_unlikely(o->node != th->ckpt.node)) {
		o->node = th->ckpt.node;
		o->filled = 0;
		o->rejected = 0;
		/* With workers the step's edges start empty (NULL); on one
		 * thread the marks start unread. */
		o->marked = th->run->mode == ADG_RUN_PARALLEL;
	}
	return o;
}

/* A gradient came out of slot order: from here on the slots say which are
 * taken, so the ones from filled on (untaken, never read) are cleared. */
static void step_out_mark(struct adg_step_out *o)
{
	for (uint32_t k = o->filled; k < o->node->n_parents; k++)
		o->slots[k] = NULL;
	o->marked = true;
}

/* Takes slot k, empty, for value; filled moves past what is taken. */
static inline uint32_t step_out_take(struct adg_step_out *o, uint32_t k,
				     void *value)
{
	if (!o->marked) {
		/* In slot order (claims out of it mark first): no mark is
		 * read, so none is written. */
		ADG_ASSERT(k == o->filled);
		o->filled = k + 1;
		return k;
	}
	o->slots[k] = value;
	if (k == o->filled) {
		uint32_t next = k + 1, end = o->node->n_parents;
		while (next < end && o->slots[next] != NULL)
			next++;
		o->filled = next;
	}
	return k;
}

/* The slot a gradient for parent id takes: the first empty one naming id,
 * so that a parent's slots fill in the order of its gradients; NO_SLOT
 * when id is not a parent or its slots are all taken. */
static uint32_t step_out_claim(struct adg_step_out *o, uint64_t id, void *value)
{
	const struct adg_node *n = o->node;
	uint32_t k = o->filled, end = n->n_parents;

	/* Most steps give in slot order: slot k is then the one. */
	if (adg_likely(k < end && adg_node_parent_id(n, k) == id))
		return step_out_take(o, k, value);
	if (!o->marked)
		step_out_mark(o);
	while (k < end &&
	       (adg_node_parent_id(n, k) != id || o->slots[k] != NULL))
		k++;
	return k == end ? NO_SLOT : step_out_take(o, k, value);
}

/* An add into id's gradient failed on one thread with an executor: the
 * failure is the backward's, keyed as with workers, just after id's last
 * contributor on the tape, so that the first failure is the same with
 * workers or without. Only on failure: a scan of the tape's end, which
 * stops at the running step at the latest (it names id), so it never
 * reads a node the loop has let go of. */
static void step_out_add_failed(struct adg_step_out *o, uint32_t slot, int rc)
{
	struct adg_run *run = step_out_run(o);
	uint64_t id = adg_node_parent_id(o->node, slot);
	for (size_t p = run->len; p-- > 0;) {
		const struct adg_node *n = run->tape->sorted[p];
		for (uint32_t k = 0; k < n->n_parents; k++) {
			if (adg_node_parent_id(n, k) != id)
				continue;
			adg_failure f = adg_run_failure_at(
				ADG_FAILED_ADD, rc,
				adg_node_parent(o->node, slot), id);
			adg_run_fail(run, adg_run_after_key(run, p), &f);
			return;
		}
	}
}

/* value, in slot k now, goes on: with workers it waits in its edge for
 * the fold; on one thread it goes to the table at once, which in tape order
 * is the order a fold with workers adds it in, so the gradients are the
 * same either way. The table was sized for every tape node and leaf: it
 * does not grow. */
static int step_out_deliver(struct adg_step_out *o, uint32_t k, void *value)
{
	struct adg_run *run = step_out_run(o);
	if (run->mode == ADG_RUN_PARALLEL)
		return 0;
	uint64_t id = adg_node_parent_id(o->node, k);
	if (run->mode == ADG_RUN_SEQUENTIAL) /* the step's, as any */
		return adg_grad_table_insert(run->grads, id, value);
	/* With an executor an add error is the backward's, not the step's:
	 * with workers it happens in a later fold. Its site says so. */
	struct adg_run_thread *th =
		caa_container_of(o, struct adg_run_thread, out);
	adg_run_site_begin(th, ADG_FAILED_ADD, adg_node_parent(o->node, k), id);
	int rc = adg_grad_table_insert(run->grads, id, value);
	adg_run_site_end(th);
	if (adg_unlikely(rc != 0))
		step_out_add_failed(o, k, rc);
	return 0;
}

/* Whether id names a parent of o's node, in any slot. */
static bool step_out_has_parent(const struct adg_step_out *o, uint64_t id)
{
	for (uint32_t k = 0; k < o->node->n_parents; k++)
		if (adg_node_parent_id(o->node, k) == id)
			return true;
	return false;
}

/* adg_grads_register on call->grads, alone and with workers. */
static int step_out_accept(struct adg_grads *to, uint64_t id, void *value)
{
	struct adg_step_out *o = step_out_now(
		caa_container_of(to, struct adg_step_out, as_grads));
	uint32_t k = step_out_claim(o, id, value);
	if (k == NO_SLOT) {
		/* Not a parent, or its slots are all taken: adding here
		 * would fold in another order than the sequential backward. */
		const adg_grad_ops *ops = step_out_run(o)->ops;
		ops->free(value, ops->ctx);
		bool parent = step_out_has_parent(o, id);
		return adg_fail(ADG_EINVAL, "adg_grads_register",
				"id %" PRIu64 " is %s of node %" PRIu64
				"%s (a step's view takes one gradient per "
				"parent slot; value freed)",
				id, parent ? "a parent" : "not a parent",
				o->node->id,
				parent ? " whose slots are all taken" : "");
	}
	return step_out_deliver(o, k, value);
}

/* The reason adg_step_give refused slot of o's step: out of range, or
 * every slot naming its parent already given. */
static __attribute__((cold, noinline)) int
step_give_refused(const struct adg_step_out *o, size_t slot)
{
	const struct adg_node *n = o->node;
	if (slot >= n->n_parents)
		return adg_fail(ADG_EINVAL, "adg_step_give",
				"slot %zu out of range: node %" PRIu64
				" has %" PRIu32 " parents (value freed)",
				slot, n->id, n->n_parents);
	return adg_fail(ADG_EINVAL, "adg_step_give",
			"slot %zu given twice: every slot of node %" PRIu64
			" naming parent %" PRIu64 " is taken (value freed)",
			slot, n->id, adg_node_parent_id(n, (uint32_t)slot));
}

/* The reason of a gradient the value check rejected: the step, the slot
 * and the parent. */
static __attribute__((cold, noinline)) void
step_give_rejected(const struct adg_run_thread *th, uint32_t slot, int rc)
{
	char node[256], text[384], code[32];
	const struct adg_node *n = th->out.node;
	run_node_text(node, sizeof node, n->kind->name, n->id);
	run_check_text(text, sizeof text, node, n, slot);
	adg_fail(rc, "adg_step_give", "%s with %s (value freed)", text,
		 adg_code_text(rc, code));
}

/* value_check on a value o's step gives: 0, or the code it was
 * rejected with, kept for the step's failure (the first, if several). */
static int step_out_check(struct adg_step_out *o, const struct adg_run *run,
			  uint32_t slot, const void *value)
{
	struct adg_run_thread *th =
		caa_container_of(o, struct adg_run_thread, out);
	adg_run_site_begin(th, ADG_FAILED_CHECK, o->node, o->node->id);
	int rc = adg_callback_result(
		run->value_check(value, run->value_check_ctx));
	adg_run_site_end(th);
	if (rc != 0 && o->rejected == 0) {
		o->rejected = rc;
		o->rejected_slot = slot;
	}
	if (rc != 0)
		step_give_rejected(th, slot, rc);
	return rc;
}

/* adg_step_give off its common path: out of slot order, with workers or an
 * executor, with a value check, or bad input. Not inlined, so that the
 * common path stays short. */
static __attribute__((noinline)) int
step_out_give_slow(struct adg_run_thread *th, struct adg_step_out *o,
		   size_t slot, void *value)
{
	const adg_grad_ops *ops = th->run->ops;
	if (value == NULL)
		return adg_fail(ADG_EINVAL, "adg_step_give", "value is NULL");
	if (adg_unlikely(th->run->value_check != NULL)) {
		int rc = step_out_check(
			o, th->run,
			slot > UINT32_MAX ? UINT32_MAX : (uint32_t)slot, value);
		if (rc != 0) {
			ops->free(value, ops->ctx);
			return rc;
		}
	}
	uint32_t k = NO_SLOT;
	if (slot < o->node->n_parents)
		/* In order: the slot is the first empty one, and names its
		 * parent; no id is compared. */
		k = adg_likely(slot == o->filled)
			    ? step_out_take(o, (uint32_t)slot, value)
			    : step_out_claim(o,
					     adg_node_parent_id(o->node,
								(uint32_t)slot),
					     value);
	if (k == NO_SLOT) {
		ops->free(value, ops->ctx);
		return step_give_refused(o, slot);
	}
	int rc = step_out_deliver(o, k, value);
	return rc == 0 ? 0
		       : adg_grad_failed(rc, "adg_step_give",
					 adg_node_parent_id(o->node, k));
}

/* adg_step_give_all after a failed give: frees the values not given,
 * values[from, n_parents), with the backward's ops. */
static __attribute__((noinline)) void
step_give_all_free_from(adg_step_call *call, void *const *values, size_t from)
{
	struct adg_run_thread *th =
		caa_container_of(call->context, struct adg_run_thread, ckpt);
	const adg_grad_ops *ops = th->run->ops;
	for (size_t i = from; i < call->n_parents; i++)
		if (values[i] != NULL)
			ops->free(values[i], ops->ctx);
}

int adg_step_give(adg_step_call *call, size_t slot, void *value)
{
	if (call == NULL || call->context == NULL) /* no ops to free value */
		return adg_fail(ADG_EINVAL, "adg_step_give", "%s",
				call == NULL ? "call is NULL"
					     : "call is not a step's");
	struct adg_run_thread *th =
		caa_container_of(call->context, struct adg_run_thread, ckpt);
	struct adg_step_out *o = step_out_now(&th->out);
	/* The common path, what registering by id on the table cost: on one
	 * thread with no check, the next slot in order goes straight to
	 * the table (its window, inline), the parent's id read from the
	 * call, whose line the step has just read. */
	if (adg_likely(o->direct && slot == o->filled && !o->marked &&
		       slot < call->n_parents && value != NULL)) {
		o->filled = (uint32_t)slot + 1;
		/* A failure's reason is the table's (grads.c). */
		return adg_grad_table_insert_fast(
			th->run->grads, call->parent_ids[slot], value);
	}
	return step_out_give_slow(th, o, slot, value);
}

int adg_step_give_all(adg_step_call *call, void *const *values)
{
	if (call == NULL || call->context == NULL)
		return ADG_EINVAL; /* not a step's: no ops to free values */
	if (values == NULL)
		return ADG_EINVAL; /* nothing to take */
	for (size_t i = 0; i < call->n_parents; i++) {
		if (values[i] == NULL)
			continue;
		/* Each give takes its value, and frees it on error: what is
		 * left to free then is the slots after it. */
		int rc = adg_step_give(call, i, values[i]);
		if (adg_unlikely(rc != 0)) {
			step_give_all_free_from(call, values, i + 1);
			return rc;
		}
	}
	return 0;
}

/* ----------------------------------------------------------------- steps */

/* on_step, for n's step, in th's run. */
static int run_on_step(struct adg_run_thread *th, struct adg_node *n,
		       const adg_step_event *event)
{
	const struct adg_run *run = th->run;
	adg_run_site_begin(th, ADG_FAILED_ON_STEP, n, n->id);
	int rc = adg_callback_result(run->on_step(event, run->step_ctx));
	adg_run_site_end(th);
	return rc;
}

/* A step with on_step: between the hook's two calls. Returns the step's
 * result, or the hook's code (*site then says so): a refusal before the
 * step means the step does not run, and stops the backward as the step's
 * failure would. */
int adg_run_step_hooked(struct adg_run_thread *th, struct adg_node *n,
			adg_step_call *call, adg_failure_site *site)
{
	adg_step_event event = {.node_id = n->id, .name = n->kind->name};
	int rc = run_on_step(th, n, &event);
	if (rc != 0) {
		*site = ADG_FAILED_ON_STEP;
		return rc;
	}
	uint64_t start = adg_now_ns();
	int step_rc = adg_callback_result(n->kind->backward(call, n->user));
	event.after = 1;
	event.duration_ns = adg_now_ns() - start;
	event.result = step_rc;
	rc = run_on_step(th, n, &event);
	if (step_rc != 0)
		return step_rc;
	if (rc != 0)
		*site = ADG_FAILED_ON_STEP;
	return rc;
}

void adg_run_serve(struct adg_run_thread *th, struct adg_node *n)
{
	pthread_mutex_t *serialize = th->ckpt.serialize;
	if (serialize == NULL) {
		adg_ckpt_served(n, NULL);
		return;
	}
	struct adg_drops drops = {0};
	pthread_mutex_lock(serialize);
	adg_ckpt_served(n, &drops);
	pthread_mutex_unlock(serialize);
	adg_ckpt_free_drops(&drops);
}

void adg_run_step_failed(struct adg_run_thread *th, size_t pos,
			 adg_failure_site site, int rc)
{
	struct adg_node *n = th->run->tape->sorted[pos];
	adg_failure f = adg_run_failure_at(site, rc, n, n->id);
	adg_run_fail(th->run, adg_run_step_key(th->run, pos), &f);
}

/* --------------------------------------------------------- callback sites */

void adg_run_thread_leave(struct adg_run_thread *th)
{
	ADG_ASSERT(adg_run_current == th);
	adg_run_current = th->outer;
}

int adg_callback_site(adg_failure *where)
{
	const struct adg_run_thread *th = adg_run_current;
	if (where == NULL)
		return ADG_FAIL(ADG_EINVAL, "where is NULL");
	if (th == NULL)
		return ADG_FAIL(ADG_EINVAL,
				"no backward's callback runs on this thread");
	int rc = adg_abi_check(__func__, "where", where, sizeof *where,
			       ADG_ABI_FIRST_FAILURE);
	if (rc != 0)
		return rc;
	adg_failure_site site = th->site;
	const struct adg_node *n = th->site_node;
	uint64_t id = th->site_id;
	if (site == ADG_FAILED_NOWHERE) {
		/* In a step, or what it calls (an add on one thread, a
		 * recompute), whose failure is the step's; else in none. */
		n = th->ckpt.node;
		if (n == NULL)
			return ADG_FAIL(ADG_EINVAL,
					"between a backward's callbacks: no "
					"failure would name this one");
		site = ADG_FAILED_STEP;
		id = n->id;
	}
	adg_failure f = adg_run_failure_at(site, 0, n, id);
	f.pass_id = th->run->pass_id;
	adg_abi_write(where, &f, sizeof f);
	return 0;
}

/* ------------------------------------------------------------ end of run */

void adg_run_let_go(struct adg_run *run, size_t pos)
{
	struct adg_node *n = run->tape->sorted[pos];
	ADG_ASSERT(!run->retained && pos == run->let_go);
	/* I8: once its step has run, with no failure so far, every request
	 * for its output was served (its children's steps and its own have
	 * run) and the output is gone. What a failure left goes now,
	 * exactly once. */
	if (adg_node_ckpt(n) != NULL) {
		ADG_ASSERT(run->first.code != 0 ||
			   (adg_node_ckpt(n)->pending == 0 &&
			    adg_node_ckpt(n)->value == NULL));
		adg_ckpt_drop(n);
	}
	/* tape_links counts the references n's tape children hold on it:
	 * they have all run (they come before it on the tape), and every
	 * parent slot of a taken node names a leaf (uncounted) or another
	 * taken node, so one subtraction lets go of what the tape held of n.
	 * No later step reads n: a later step is none of n's descendants,
	 * so neither its parents nor what its recompute reads are n. */
	adg_node_release_many(run->shard, n, n->tape_links);
	run->let_go++;
}

int adg_run_end(struct adg_run *run)
{
	int rc = run->first.code;
	if (run->retained)
		return rc; /* the graph is as it was: nothing to let go */
	while (run->let_go < run->len)
		adg_run_let_go(run, run->let_go);
	return rc;
}
