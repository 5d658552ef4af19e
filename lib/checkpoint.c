/*
 * Checkpointing: the forward outputs a backward's steps ask for, kept or
 * recomputed, with counted lifetimes.
 *
 * At registration an op may offer its output (a value, a way to recompute
 * it from its parents' outputs, or both) and name the outputs its step will
 * ask for: its own, or its parents'. The strategy decides, once, whether an
 * offered value is kept or dropped for recomputation. Requests are counted
 * per backward, when the tape is taken: one per step that asks, plus one
 * per parent slot of each recomputed node that some request needs. Kept
 * outputs no request needs are freed there and then; the others as their
 * last request is served: by the step that asked, by the rebuild that
 * read it, or by a planned rebuild that will not happen (its own requests
 * all served, it was never asked for). Whether a node offers an output at
 * all is a flag of the node, fixed at registration, which any holder may
 * read. The record lives in the node, so it follows the node through
 * merges, and only the node's owner touches it: no lock.
 *
 * A retained backward owns no record: several may run over one node at
 * once. It counts no request and frees no output. It reads an output with
 * an acquire load and publishes one it rebuilt with a compare and swap:
 * if another pass published first, its copy goes and the other's is
 * used. No lock is held across a recompute, which may run backward
 * passes of its own, retained ones included. What it publishes stays
 * held until a consuming backward (whose walk waits for the retained
 * passes to end, I14) or the node's end frees it.
 */
#include "checkpoint.h"

#include <errno.h>
#include <time.h>

static size_t ckpt_size(size_t n_want_parents)
{
	return sizeof(struct adg_ckpt) + n_want_parents * sizeof(uint32_t);
}

/* Lets go of n's kept value, if any: frees it now, or, with drops (the
 * run's output lock is held), puts it on drops for adg_ckpt_free_drops
 * once the lock is released. A record is dropped at most once while the
 * lock is held: its count reaches zero once, and nothing refills it. */
static void ckpt_drop_value(struct adg_node *n, struct adg_drops *drops)
{
	struct adg_ckpt *c = adg_node_ckpt(n);
	if (c->value == NULL)
		return;
	if (drops == NULL) {
		c->free(c->value, c->free_ctx);
	} else {
		ADG_ASSERT(c->dropped == NULL);
		c->dropped = c->value;
		c->drop_next = drops->head;
		drops->head = n;
	}
	c->value = NULL;
}

void adg_ckpt_free_drops(struct adg_drops *drops)
{
	while (drops->head != NULL) {
		struct adg_ckpt *c = adg_node_ckpt(drops->head);
		void *value = c->dropped;
		drops->head = c->drop_next;
		c->dropped = NULL;
		c->free(value, c->free_ctx);
	}
}

/* Whether n offers an output. Not its record: the caller holds n, but a
 * backward on another thread may be consuming n and freeing its record;
 * the flag never changes, so the answer does not depend on timing. */
static bool ckpt_offers(const struct adg_node *n)
{
	return (n->flags & ADG_NODE_F_OFFERS_OUTPUT) != 0;
}

/* The reason an options' want is refused: want_parents[i] names slot k,
 * which is past the parents or names one that offers no output. */
static __attribute__((cold, noinline)) int
ckpt_want_refused(const char *func, adg_node *const *parents,
		  uint32_t n_parents, size_t i, uint32_t k)
{
	if (k >= n_parents)
		return adg_fail(ADG_EINVAL, func,
				"options->want_parents[%zu] is %" PRIu32
				", past the last slot (%" PRIu32 " parents)",
				i, k, n_parents);
	return adg_fail(ADG_EINVAL, func,
			"options->want_parents[%zu] names parent %" PRIu32
			" (node %" PRIu64 "), %s",
			i, k, parents[k]->id,
			adg_node_is_leaf(parents[k])
				? "a leaf, which offers no output"
				: "which offers no output");
}

/* The reason a malformed options is refused, but for its wants. */
static __attribute__((cold, noinline)) int
ckpt_options_refused(const char *func, const adg_op_options *o)
{
	const adg_output *out = o->output;
	if (out != NULL && out->free == NULL)
		return adg_fail(ADG_EINVAL, func,
				"options->output has no free");
	if (out != NULL && out->value == NULL && out->recompute == NULL)
		return adg_fail(ADG_EINVAL, func,
				"options->output has neither value nor "
				"recompute");
	if (o->want_self && out == NULL)
		return adg_fail(ADG_EINVAL, func,
				"options->want_self is set but options->output "
				"is NULL: the node offers no output");
	if (o->n_want_parents > 0 && o->want_parents == NULL)
		return adg_fail(ADG_EINVAL, func,
				"options->want_parents is NULL with "
				"n_want_parents %zu",
				o->n_want_parents);
	return adg_fail(ADG_EINVAL, func,
			"options->n_want_parents is %zu, above UINT32_MAX",
			o->n_want_parents);
}

int adg_ckpt_attach(struct adg_node *node, adg_node *const *parents,
		    const adg_op_options *o, const char *func)
{
	const adg_output *out = o->output;
	if ((out != NULL && (out->free == NULL ||
			     (out->value == NULL && out->recompute == NULL))) ||
	    (o->want_self && out == NULL) ||
	    (o->n_want_parents > 0 && o->want_parents == NULL) ||
	    o->n_want_parents > UINT32_MAX) /* the record counts in 32 bits */
		return ckpt_options_refused(func, o);
	for (size_t i = 0; i < o->n_want_parents; i++)
		if (o->want_parents[i] >= node->n_parents ||
		    !ckpt_offers(parents[o->want_parents[i]]))
			/* out of range, a leaf, no output */
			return ckpt_want_refused(func, parents, node->n_parents,
						 i, o->want_parents[i]);
	if (out != NULL && out->recompute != NULL)
		for (uint32_t k = 0; k < node->n_parents; k++)
			if (!adg_node_is_leaf(parents[k]) &&
			    !ckpt_offers(parents[k]))
				/* nothing to rebuild from */
				return adg_fail(
					ADG_EINVAL, func,
					"parent %" PRIu32 " (node %" PRIu64
					") offers no output to recompute "
					"from (options->output->recompute "
					"needs every non-leaf parent's)",
					k, parents[k]->id);

	struct adg_registry *r = adg_node_registry_of(node);
	struct adg_ckpt *c = adg_alloc(r, ckpt_size(o->n_want_parents));
	if (c == NULL)
		return adg_fail(ADG_ENOMEM, func,
				"the allocator gave no memory for the "
				"checkpointing record");
	*c = (struct adg_ckpt){
		.free = out ? out->free : NULL,
		.free_ctx = out ? out->ctx : NULL,
		.recompute = out ? out->recompute : NULL,
		.want_self = o->want_self != 0,
		.n_want_parents = (uint32_t)o->n_want_parents,
	};
	for (size_t i = 0; i < o->n_want_parents; i++)
		c->want_parents[i] = o->want_parents[i];
	c->value = out ? out->value : NULL;
	c->memory_bound = out && out->memory_bound;
	*adg_node_ckpt_slot(node) = c;
	if (out != NULL)
		node->flags |= ADG_NODE_F_OFFERS_OUTPUT;
	/* Relaxed: a hint that backward passes read to skip the work when no
	 * node has a record; a node with one is published to them by the
	 * caller, after this. */
	if (!atomic_load_explicit(&r->uses_checkpoints, memory_order_relaxed))
		atomic_store_explicit(&r->uses_checkpoints, true,
				      memory_order_relaxed);
	return 0;
}

void adg_ckpt_commit(struct adg_shard *shard, struct adg_node *node)
{
	struct adg_ckpt *c = adg_node_ckpt(node);
	/* The strategy, once the op is in: balanced drops at once what it can
	 * rebuild cheaply, from the record (a backward rebuilds it) but not
	 * from memory: the forward that offered it may still be reading it,
	 * so it waits in the caller's shard for the thread's next op or
	 * backward that succeeds, or for the registry's end. It leaves the
	 * node now, while no other thread can reach the node: whatever comes
	 * to the node next (a backward on any thread, consuming or retained;
	 * its free) never meets it, and the shard is the owner's alone, so
	 * no atomic and no lock. (Node makers have shards of their own: no
	 * shared one comes here.) */
	if (c->value == NULL || !c->memory_bound || c->recompute == NULL ||
	    adg_node_registry_of(node)->checkpointing !=
		    ADG_CHECKPOINT_BALANCED)
		return;
	ADG_ASSERT(!shard->shared);
	ADG_ASSERT(shard->deferred.value == NULL); /* freed by the caller */
	shard->deferred = (struct adg_deferred_output){
		.value = c->value, .free = c->free, .ctx = c->free_ctx};
	c->value = NULL;
}

void adg_ckpt_free_deferred_slow(struct adg_shard *shard)
{
	struct adg_deferred_output d = shard->deferred;
	/* Cleared first: the free is the caller's code, which may call
	 * libadg again on this thread. */
	shard->deferred.value = NULL;
	d.free(d.value, d.ctx);
}

static void ckpt_request(struct adg_node *n)
{
	adg_node_ckpt(n)->pending++;
}

/* One request on n served: the output goes with the last. A node planned
 * for a rebuild that has not happened and that no one needs any more will
 * not be rebuilt: it goes on *unbuilt, once (its count reaches zero once),
 * for ckpt_serve to let go of what the rebuild would have read. */
static void ckpt_serve_one(struct adg_node *n, struct adg_node **unbuilt,
			   struct adg_drops *drops)
{
	struct adg_ckpt *c = adg_node_ckpt(n);
	ADG_ASSERT(c->pending > 0); /* I8: every serve had its request */
	if (--c->pending != 0)
		return;
	ckpt_drop_value(n, drops);
	if (c->rebuild_planned) {
		c->rebuild_planned = false;
		c->unbuilt_next = *unbuilt;
		*unbuilt = n;
	}
}

/* Serves one request on n, and those of rebuilds that will not happen,
 * up the graph: a work list through the records, not recursion, so that a
 * long chain of them cannot overflow the stack. */
static void ckpt_serve(struct adg_node *n, struct adg_drops *drops)
{
	struct adg_node *unbuilt = NULL;

	ckpt_serve_one(n, &unbuilt, drops);
	while (unbuilt != NULL) {
		struct adg_node *u = unbuilt;
		unbuilt = adg_node_ckpt(u)->unbuilt_next;
		for (uint32_t k = 0; k < u->n_parents; k++)
			if (adg_node_parent(u, k) != NULL)
				ckpt_serve_one(adg_node_parent(u, k), &unbuilt,
					       drops);
	}
}

void adg_ckpt_plan(struct adg_node **tape, size_t len)
{
	/* The steps' requests first. Every node asked for is on this tape:
	 * it is the node itself or a parent that offers an output, hence not
	 * a leaf, and the walk took every non-leaf parent. */
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = tape[i];
		struct adg_ckpt *c = adg_node_ckpt(n);
		if (c == NULL)
			continue;

		if (c->want_self)
			ckpt_request(n);
		for (uint32_t k = 0; k < c->n_want_parents; k++)
			ckpt_request(adg_node_parent(n, c->want_parents[k]));
	}
	/* Then what recomputing needs, in tape order: every request on a
	 * node comes from it or from its descendants, earlier on the tape
	 * (each node comes after its children), so its count is complete
	 * when its turn comes. A node rebuilt once needs each parent once. */
	for (size_t i = 0; i < len; i++) {
		struct adg_node *n = tape[i];
		struct adg_ckpt *c = adg_node_ckpt(n);
		if (c == NULL || c->pending == 0 || c->value != NULL)
			continue;
		c->rebuild_planned = true;
		for (uint32_t k = 0; k < n->n_parents; k++)
			if (adg_node_parent(n, k) != NULL)
				ckpt_request(adg_node_parent(n, k));
	}
	/* What nothing asks for goes now, not at the end. */
	for (size_t i = 0; i < len; i++) {
		struct adg_ckpt *c = adg_node_ckpt(tape[i]);
		if (c != NULL && c->pending == 0)
			ckpt_drop_value(tape[i], NULL);
	}
}

void adg_ckpt_served(struct adg_node *n, struct adg_drops *drops)
{
	struct adg_ckpt *c = adg_node_ckpt(n);
	if (c->want_self)
		ckpt_serve(n, drops);
	for (uint32_t k = 0; k < c->n_want_parents; k++)
		ckpt_serve(adg_node_parent(n, c->want_parents[k]), drops);
}

void adg_ckpt_drop(struct adg_node *n)
{
	struct adg_ckpt *c = adg_node_ckpt(n);
	ckpt_drop_value(n, NULL);
	*adg_node_ckpt_slot(n) = NULL;
	adg_free(adg_node_registry_of(n), c, ckpt_size(c->n_want_parents));
}

/* n's output, or NULL. Acquire: pairs with ckpt_publish, so that a retained
 * pass sees all of an output another published. A consuming backward owns
 * the records it reads; the load costs it nothing more. */
static void *ckpt_held(const struct adg_node *n)
{
	return __atomic_load_n(&adg_node_ckpt(n)->value, __ATOMIC_ACQUIRE);
}

/* A retained pass's rebuilt output: published unless another pass
 * published one first; returns what is left to free (the copy that lost),
 * or NULL. Release: what recompute wrote into it happens before a
 * reader's use. */
static void *ckpt_publish(struct adg_node *n, void *output)
{
	void *none = NULL;
	if (!__atomic_compare_exchange_n(&adg_node_ckpt(n)->value, &none,
					 output, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_ACQUIRE))
		return output;
	return NULL;
}

/* Calls n's recompute with its parents' outputs, which the caller keeps
 * held meanwhile. On success *output is the new output; on failure
 * nothing is left to free. */
static int ckpt_recompute(struct adg_backward_context *ctx, struct adg_node *n,
			  void **output)
{
	void **outputs = ctx->outputs;
	for (uint32_t k = 0; k < n->n_parents; k++) {
		struct adg_node *p = adg_node_parent(n, k);
		outputs[k] = p != NULL ? ckpt_held(p) : NULL;
	}
	/* The running step's ids are in its thread's scratch: these go in
	 * the recompute's own. */
	adg_node_fill_parent_ids(n, ctx->ids);
	adg_recompute_call call = {
		.node_id = n->id,
		.n_parents = n->n_parents,
		.parent_ids = ctx->ids,
		.parent_outputs = outputs,
		.output = NULL,
	};
	int rc = adg_callback_result(
		adg_node_ckpt(n)->recompute(&call, n->user));
	if (rc == 0 && call.output == NULL)
		rc = ADG_ECALLBACK; /* said yes, gave nothing */
	if (rc != 0 && call.output != NULL)
		adg_node_ckpt(n)->free(
			call.output,
			adg_node_ckpt(n)
				->free_ctx); /* set before failing: ours too */
	*output = rc == 0 ? call.output : NULL;
	return rc;
}

/* The next node to rebuild for target: the first on a path of missing
 * outputs up from target whose parents' outputs are all held; NULL when
 * target is held, or on error (*rc). A work list, not recursion, so that
 * a long chain of recomputed nodes cannot overflow the stack: the path is
 * ctx->stack[0, *top), kept between calls (*top 0 starts it afresh), and
 * the node returned stays on it until found held. */
static struct adg_node *ckpt_next_rebuild(struct adg_backward_context *ctx,
					  struct adg_node *target, size_t *top,
					  int *rc)
{
	if (*top == 0)
		ctx->stack[(*top)++] = target;
	while (*top > 0) {
		struct adg_node *n = ctx->stack[*top - 1];
		if (ckpt_held(n) != NULL) {
			(*top)--;
			continue;
		}
		if (adg_node_ckpt(n)->recompute == NULL) {
			*rc = ADG_EUNAVAILABLE; /* a count went wrong */
			return NULL;
		}
		struct adg_node *missing = NULL;
		for (uint32_t k = 0; k < n->n_parents && missing == NULL; k++) {
			struct adg_node *p = adg_node_parent(n, k);
			if (p != NULL && ckpt_held(p) == NULL)
				missing = p;
		}
		if (missing == NULL)
			return n;
		/* Each node enters once: it leaves the list only once held,
		 * and the graph has no cycle. */
		ctx->stack[(*top)++] = missing;
	}
	return NULL;
}

/* A consuming backward's rebuilt output of n: kept while a request needs
 * it and no other copy is there; returns what is left to free (a copy
 * nobody needs), or NULL. The first copy kept stands for the rebuild the
 * take planned, whose reads of the parents it serves (drops: see
 * ckpt_drop_value). */
static void *ckpt_keep(struct adg_node *n, void *output,
		       struct adg_drops *drops)
{
	struct adg_ckpt *c = adg_node_ckpt(n);
	if (ckpt_held(n) != NULL || c->pending == 0)
		return output;
	c->value = output;
	if (c->rebuild_planned) {
		c->rebuild_planned = false;
		for (uint32_t k = 0; k < n->n_parents; k++)
			if (adg_node_parent(n, k) != NULL)
				ckpt_serve(adg_node_parent(n, k), drops);
	}
	return NULL;
}

/* Rebuilds target's output on one thread, and first its parents' where
 * they are not held. */
static int ckpt_materialise(struct adg_backward_context *ctx,
			    struct adg_node *target)
{
	int rc = 0;
	size_t top = 0;
	struct adg_node *n;
	while ((n = ckpt_next_rebuild(ctx, target, &top, &rc)) != NULL) {
		void *output;
		rc = ckpt_recompute(ctx, n, &output);
		if (rc != 0)
			break;
		/* A retained backward counted nothing: what it rebuilds stays
		 * held, for the passes after it. */
		void *surplus = ctx->retained ? ckpt_publish(n, output)
					      : ckpt_keep(n, output, NULL);
		if (surplus != NULL)
			adg_node_ckpt(n)->free(surplus,
					       adg_node_ckpt(n)->free_ctx);
	}
	return rc;
}

/* Rebuilds this thread has claimed and is in the middle of, on an
 * executor, whatever the run. A thread that holds one never sleeps
 * waiting for another's rebuild: it builds a copy of its own instead. So
 * a sleeper holds no claim, and no cycle of waits can form through
 * claims: not across threads, and not on one thread whose recompute runs
 * steps of its own backward (a cooperative executor draining its queue)
 * that ask for the output being rebuilt below them. */
static __thread unsigned rebuilds_held;

/* How long a thread sleeps for a rebuild before it builds a copy of its
 * own: far longer than a rebuild should take, so that copies are rare,
 * and a bound on a wait that an executor could otherwise make endless
 * (a claimant whose recompute waits for a step that, inside a wait of
 * its own, runs a job of this backward asking for the same output). */
#define REBUILD_PATIENCE_NS 1000000000L

/* Sleeps on ctx->rebuilt until woken or REBUILD_PATIENCE_NS has passed;
 * returns false on the latter. The condition variable runs on the
 * monotonic clock (parallel.c). */
static bool ckpt_wait_for_rebuild(struct adg_backward_context *ctx)
{
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_nsec += REBUILD_PATIENCE_NS % 1000000000L;
	until.tv_sec +=
		REBUILD_PATIENCE_NS / 1000000000L + until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	return pthread_cond_timedwait(ctx->rebuilt, ctx->serialize, &until) !=
	       ETIMEDOUT;
}

/* Frees, with the run's output lock released, what was let go of under
 * it: a copy nobody needs, and outputs whose last request was served. An
 * output's free is the caller's code, and runs with no libadg lock held. */
static void ckpt_free_unlocked(struct adg_backward_context *ctx,
			       struct adg_node *n, void *surplus,
			       struct adg_drops *drops)
{
	if (surplus == NULL && drops->head == NULL)
		return;
	pthread_mutex_unlock(ctx->serialize);
	if (surplus != NULL)
		adg_node_ckpt(n)->free(surplus, adg_node_ckpt(n)->free_ctx);
	adg_ckpt_free_drops(drops);
	pthread_mutex_lock(ctx->serialize);
}

/* ckpt_materialise with an executor's workers: the records and the work list
 * under the run's output lock, each recompute and each output's free
 * outside it. In a consuming backward each rebuild is claimed: others
 * that need the output sleep until it ends, so an output asked for by
 * several steps at once is rebuilt once (unless a sleep runs out of
 * patience: then a copy). Every rebuild, claimed or a copy, takes a
 * request of its own on each parent while it reads them unlocked, so that
 * none is freed under it. Retained passes claim too, within the run, but
 * count nothing and free nothing: against another pass's claim they
 * build a copy, and ckpt_publish keeps the first. The work list is the
 * run's, shared by its workers: each search starts afresh from target,
 * under the lock. */
static int ckpt_materialise_shared(struct adg_backward_context *ctx,
				   struct adg_node *target)
{
	int rc = 0;
	bool patient = true;
	pthread_mutex_lock(ctx->serialize);
	for (;;) {
		size_t top = 0;
		struct adg_node *n = ckpt_next_rebuild(ctx, target, &top, &rc);
		if (n == NULL)
			break;
		struct adg_ckpt *c = adg_node_ckpt(n);
		/* The claim names the run (its lock's address): retained
		 * passes share records, so a claim of another pass is not one
		 * this run's sleepers would be woken for; its output is then
		 * built as a copy, and ckpt_publish keeps the first. Atomic for
		 * them; a consuming run's records are its own. Acquire and
		 * release: a claim's end comes after its output is in. */
		const void *run = ctx->serialize;
		const void *builder =
			__atomic_load_n(&c->builder, __ATOMIC_ACQUIRE);
		if (builder == run && rebuilds_held == 0 && patient) {
			patient = ckpt_wait_for_rebuild(ctx);
			continue;
		}
		const void *none = NULL;
		bool claimed = builder == NULL &&
			       __atomic_compare_exchange_n(
				       &c->builder, &none, run, false,
				       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
		if (claimed)
			rebuilds_held++;
		if (!ctx->retained)
			for (uint32_t k = 0; k < n->n_parents; k++)
				if (adg_node_parent(n, k) != NULL)
					ckpt_request(adg_node_parent(n, k));
		pthread_mutex_unlock(ctx->serialize);
		void *output;
		rc = ckpt_recompute(ctx, n, &output);
		pthread_mutex_lock(ctx->serialize);
		if (claimed) {
			__atomic_store_n(&c->builder, NULL, __ATOMIC_RELEASE);
			rebuilds_held--;
			pthread_cond_broadcast(ctx->rebuilt);
		}
		void *surplus = NULL;
		struct adg_drops drops = {0};
		if (ctx->retained) {
			if (rc == 0)
				surplus = ckpt_publish(n, output);
		} else {
			if (rc == 0)
				surplus = ckpt_keep(n, output, &drops);
			for (uint32_t k = 0; k < n->n_parents; k++)
				if (adg_node_parent(n, k) != NULL)
					ckpt_serve(adg_node_parent(n, k),
						   &drops);
		}
		ckpt_free_unlocked(ctx, n, surplus, &drops);
		if (rc != 0)
			break;
		patient = true;
	}
	pthread_mutex_unlock(ctx->serialize);
	return rc;
}

int adg_output_get(adg_step_call *call, uint64_t id, void **value)
{
	if (value != NULL)
		*value = NULL;
	if (call == NULL || value == NULL || call->context == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s",
				call == NULL	? "call is NULL"
				: value == NULL ? "value is NULL"
						: "call is not a step's");
	struct adg_backward_context *ctx = call->context;
	struct adg_node *n = ctx->node, *target = NULL;
	struct adg_ckpt *c = adg_node_ckpt(n);
	if (c == NULL)
		return ADG_FAIL(ADG_EINVAL,
				"node %" PRIu64 " asked for no output: it was "
				"made without adg_op_options",
				n->id);
	if (c->want_self && id == n->id)
		target = n;
	for (uint32_t k = 0; k < c->n_want_parents && target == NULL; k++)
		if (adg_node_parent_id(n, c->want_parents[k]) == id)
			target = adg_node_parent(n, c->want_parents[k]);
	if (target == NULL) /* not an output this step asked for */
		return ADG_FAIL(ADG_EINVAL,
				"id %" PRIu64 " is not an output node %" PRIu64
				"'s step asked for (want_self, want_parents)",
				id, n->id);
	uint64_t since = adg_errmsg_serial();
	int rc = ctx->serialize != NULL ? ckpt_materialise_shared(ctx, target)
					: ckpt_materialise(ctx, target);
	/* Held until this step is served: its own request stands. */
	if (rc == 0)
		*value = ckpt_held(target);
	else
		adg_fail_over(rc, __func__, since,
			      "rebuilding node %" PRIu64 "'s output failed "
			      "with %s",
			      id, adg_code_text(rc, (char[32]){0}));
	return rc;
}
