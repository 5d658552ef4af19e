/*
 * Backward: the entry point, which builds a run (run.h), takes its tape
 * (tape.c) and hands it to a runner; and the runner of the sequential and
 * alone modes, which runs the steps in tape order on the calling thread.
 * With workers, parallel.c runs it.
 */
#include "run.h"

#include <string.h>

/* Hands node id's final gradient to the hook, which may take it; a
 * failure is recorded at key. */
static int seq_fire(struct adg_run *run, const struct adg_node *n, uint64_t id,
		    uint64_t key)
{
	void *grad = adg_grad_table_take(run->grads, id);
	int rc = adg_run_ready(run, n, id, &grad, key);
	/* Left to us: back where it was. Its entry was just freed, so this
	 * never allocates and cannot fail. */
	if (grad != NULL)
		adg_grad_table_insert(run->grads, id, grad);
	return rc;
}

/* After the step at pos ran: its parents each lost one pending
 * contribution; those with none left are final. Where the tape counted
 * each (tape.c): its id table, or a consuming tape node. */
static void seq_fire_parents(struct adg_run *run, size_t pos)
{
	struct adg_node *n = run->tape->sorted[pos];
	for (uint32_t k = 0; k < n->n_parents; k++) {
		uint64_t word = n->parents[k];
		struct adg_node *p = adg_parent_node(word);
		uint64_t id = adg_parent_id(word);
		uint32_t *pending =
			p == NULL || run->retained
				? &adg_tape_key(run->tape, id)->pending
				: &p->tape_pending;
		if (--*pending == 0 && (p == NULL || !run->leaves_only) &&
		    seq_fire(run, p, id, adg_run_after_key(run, pos)) != 0)
			return;
	}
}

/*
 * Runs the taken tape on this thread, in tape order. The root runs first,
 * with the seed, which is final from the start. A step starts only if no
 * failure is keyed at or before it: without an executor every failure
 * stops all that follows; alone, an add error is keyed after the add's
 * last contributor (run.c), and the steps before it still run, as they
 * would with workers. After a failure the steps not run are released
 * unrun.
 */
static int seq_run(struct adg_run *run, void *seed)
{
	struct adg_run_thread th;
	adg_run_thread_init(&th, run, 0, NULL, NULL);
	struct adg_tape *t = run->tape;
	if (t->window_len != 0)
		adg_grad_table_attach_window(run->grads, t->window,
					     t->window_lo, t->window_len);
	struct adg_node **sorted = run->tape->sorted;
	const size_t len = run->len;
	void *grad = seed;
	adg_run_root_ready(run, &grad);
	for (size_t i = 0; i < len; i++) {
		if (adg_likely(!adg_run_stopped(run, i))) {
			/* I7: with a hook, every contribution came. */
			ADG_ASSERT(run->first.code != 0 ||
				   run->on_ready == NULL || run->retained ||
				   sorted[i]->tape_pending == 0);
			if (i > 0)
				grad = adg_grad_table_take(run->grads,
							   sorted[i]->id);
			if (adg_run_step(&th, i, grad, NULL) == 0 &&
			    run->on_ready != NULL)
				seq_fire_parents(run, i);
			/* The keys' invariant (run.h): no failure is keyed
			 * below a step that has run. */
			ADG_ASSERT(atomic_load_explicit(&run->first_key,
							memory_order_relaxed) >=
				   adg_run_step_key(run, i));
		} else if (!run->retained) {
			adg_node_release_step(run->shard, sorted[i]);
		}
		/* Let go of it now, in the cache still: nothing after reads
		 * it (adg_run_let_go). */
		if (!run->retained)
			adg_run_let_go(run, i);
	}
	/* The leaves' gradients (and any other id's left in the window) move
	 * to the table's entries, and the window is the tape's again, its
	 * slots NULL. They were sized for the leaves: this only allocates
	 * for ids a step registered that are no parent of its. */
	if (t->window_len != 0 &&
	    adg_grad_table_detach_window(run->grads) != 0) {
		adg_failure f = {.code = ADG_ENOMEM};
		adg_run_fail(run, UINT64_MAX - 1, &f);
	}
	adg_run_thread_leave(&th);
	return adg_run_end(run);
}

/* A root that is a leaf: the table holds just the seed, which it owns from
 * here, failing or not. */
static int backward_of_leaf(struct adg_run *run, uint64_t id, void *seed)
{
	int rc = adg_grad_table_new(run->registry, run->ops, 1, &run->grads);
	if (rc != 0) {
		run->ops->free(seed, run->ops->ctx);
		return rc;
	}
	/* A new table with room: holding seed cannot fail. */
	adg_grad_table_insert(run->grads, id, seed);
	/* Its gradient is final at once: the hook's, as a tape's are, the
	 * failure keyed before any step. */
	return run->on_ready != NULL ? seq_fire(run, NULL, id, 0) : 0;
}

/* The run's context, from the options; the mode from the executor. */
static void backward_run_init(struct adg_run *run, adg_registry *registry,
			      const adg_grad_ops *ops,
			      const adg_backward_options *options)
{
	*run = (struct adg_run){
		.registry = registry,
		.ops = ops,
		.fail_lock = PTHREAD_MUTEX_INITIALIZER,
	};
	atomic_init(&run->first_key, UINT64_MAX);
	if (options == NULL)
		return;
	run->on_ready = options->on_ready;
	run->ready_ctx = options->on_ready_ctx;
	run->leaves_only = options->leaves_only != 0;
	run->on_step = options->on_step;
	run->step_ctx = options->on_step_ctx;
	run->value_check = options->value_check;
	run->value_check_ctx = options->value_check_ctx;
	run->retained = options->retain != 0;
	run->executor = options->executor;
	if (run->executor != NULL)
		run->mode = run->executor->n_workers != 0 ? ADG_RUN_PARALLEL
							  : ADG_RUN_ALONE;
}

/* Takes and runs the tape from root: root held, run built. Takes seed. */
static int backward_run(struct adg_run *run, struct adg_node *root, void *seed)
{
	/* A nested backward (a step calling adg_backward) finds the cache
	 * taken and uses a tape of its own. */
	struct adg_shard *shard = run->shard;
	run->tape = shard->tape_cache;
	shard->tape_cache = NULL;
	if (run->tape == NULL) {
		run->tape = adg_alloc(run->registry, sizeof *run->tape);
		if (run->tape == NULL) {
			run->ops->free(seed, run->ops->ctx);
			return ADG_ENOMEM;
		}
		*run->tape = (struct adg_tape){0};
	}
	/* The backward's own reference to root, for as long as it runs: a
	 * step may drop the caller's last one. Relaxed: the caller holds a
	 * reference during the call, so the count is above zero. */
	atomic_fetch_add_explicit(&root->refs, 1, memory_order_relaxed);
	int rc = adg_tape_take(run, root);
	if (rc == 0) {
		rc = run->mode == ADG_RUN_PARALLEL ? adg_par_run(run, seed)
						   : seq_run(run, seed);
		seed = NULL;	    /* the run took it */
		run->ticket = NULL; /* and let go of the ticket */
		if (run->retained)
			adg_tape_release_retained(run);
	}
	adg_node_release(shard, root);
	if (shard->tape_cache == NULL)
		shard->tape_cache = run->tape;
	else
		adg_tape_free(run->registry, run->tape);
	if (seed != NULL)
		run->ops->free(seed, run->ops->ctx);
	return rc;
}

/* Bad input, before anything is taken. */
static int backward_check(const char *func, adg_registry *registry,
			  adg_node *root, void *seed,
			  const adg_backward_options *options, adg_grads **out)
{
	if (registry == NULL || root == NULL || seed == NULL || out == NULL)
		return adg_fail(ADG_EINVAL, func, "%s is NULL",
				registry == NULL ? "registry"
				: root == NULL	 ? "root"
				: seed == NULL	 ? "seed"
						 : "out");
	const adg_executor *executor = options ? options->executor : NULL;
	if (executor != NULL && executor->submit == NULL)
		return adg_fail(ADG_EINVAL, func,
				"options->executor has no submit");
	if (executor != NULL && executor->n_workers > ADG_EXECUTOR_MAX_WORKERS)
		return adg_fail(ADG_EINVAL, func,
				"options->executor->n_workers is %u, above "
				"ADG_EXECUTOR_MAX_WORKERS (%u)",
				executor->n_workers, ADG_EXECUTOR_MAX_WORKERS);
	if (adg_node_registry_of(root) != registry)
		return adg_fail(ADG_EFOREIGN, func,
				"root (node %" PRIu64
				") belongs to another registry",
				root->id);
	return 0;
}

/* The reason of ops that cannot free seed: none at all, or one missing. */
static __attribute__((cold, noinline)) int
backward_no_ops(const char *func, const adg_grad_ops *ops)
{
	if (ops == NULL)
		return adg_fail(ADG_EINVAL, func,
				"ops is NULL and the registry has no grad_ops");
	return adg_fail(ADG_EINVAL, func, "ops has no %s",
			ops->add == NULL ? "add" : "free");
}

/* The reason of a run that failed with rc: its first failure's, which
 * the thread that failed wrote, or what the run could not allocate. */
static __attribute__((cold, noinline)) int
backward_failed(const char *func, const struct adg_run *run, uint64_t root_id,
		int rc)
{
	if (run->first.code != 0)
		return adg_fail(rc, func, "%s", run->reason);
	switch (rc) {
	case ADG_ENOMEM:
		return adg_fail(rc, func,
				"the allocator gave no memory for the tape or "
				"the gradients (nothing was taken)");
	case ADG_ECONSUMED:
		return adg_fail(rc, func,
				"root (node %" PRIu64 ")'s step was consumed "
				"by an earlier backward",
				root_id);
	case ADG_EUNAVAILABLE:
		return adg_fail(rc, func,
				"a step the backward needs was consumed, or is "
				"being run by a retained backward (nothing was "
				"taken)");
	default:
		return adg_fail(rc, func, "failed with %s",
				adg_code_text(rc, (char[32]){0}));
	}
}

/* The caller's options, by the size rule, into *copy: a bad size is bad
 * input, and then neither they nor their failure are read. Returns 0 or the
 * size rule's code; sets *options to the copy (NULL if none or unread) and
 * *report to the failure to fill (NULL if none or unread). */
static int backward_read_options(const char *func,
				 const adg_backward_options **options,
				 adg_backward_options *copy,
				 adg_failure **report)
{
	*report = NULL;
	if (*options == NULL)
		return 0;
	int rc = ADG_ABI_READ(func, "options", copy, *options,
			      ADG_ABI_FIRST_BACKWARD_OPTIONS);
	*options = rc == 0 ? copy : NULL;
	if (rc != 0 || copy->failure == NULL)
		return rc;
	rc = adg_abi_check(func, "options->failure", copy->failure,
			   sizeof *copy->failure, ADG_ABI_FIRST_FAILURE);
	if (rc == 0)
		*report = copy->failure;
	return rc;
}

/* Runs the backward from root, checked, with seed: the run built and its
 * shard and pass id set. On success *out is the gradients. Takes seed. */
static int backward_from(const char *func, struct adg_run *run, adg_node *root,
			 void *seed, adg_grads **out)
{
	int rc;
	bool explained = false; /* a reason written already */
	if (adg_node_is_leaf(root)) {
		rc = backward_of_leaf(run, root->id, seed);
	} else {
		/* Jobs submitted to the executor may outlive this call: their
		 * handle is allocated now, so that nothing is taken if it
		 * cannot be. */
		if (run->mode == ADG_RUN_PARALLEL)
			run->ticket = adg_par_ticket_new();
		if (run->mode == ADG_RUN_PARALLEL && run->ticket == NULL) {
			run->ops->free(seed, run->ops->ctx);
			rc = adg_fail(ADG_ENOMEM, func,
				      "no memory for the executor's ticket");
			explained = true;
		} else {
			rc = backward_run(run, root, seed);
		}
		if (run->ticket != NULL)
			adg_par_ticket_put(run->ticket); /* not handed on */
	}
	if (rc == 0) {
		*out = &run->grads->as_grads;
		/* The forward's last dropped output (adg_ckpt_commit): its
		 * backward is done. Only then: a failed call changes
		 * nothing. */
		adg_ckpt_free_deferred(run->shard);
	} else if (run->grads != NULL)
		adg_grad_table_free(run->grads);
	if (rc != 0 && !explained) /* after the frees: ops->free may fail */
		backward_failed(func, run, root->id, rc);
	return rc;
}

/* Fills the caller's failure, if any, with the run's first, or with rc
 * where no step failed. */
static void backward_report(adg_failure *report, const struct adg_run *run,
			    int rc)
{
	if (report == NULL)
		return;
	adg_failure f = run->first;
	if (rc != 0 && run->first.code == 0)
		f = (adg_failure){.code = rc}; /* nowhere */
	f.pass_id = run->pass_id;
	adg_abi_write(report, &f, sizeof f);
}

/* What adg_backward and adg_backward_with were called with. */
struct backward_call {
	const char *func; /* which of the two, for reasons */
	adg_registry *registry;
	adg_node *root;
	void *seed;
	const adg_grad_ops *ops;
	const adg_backward_options *options;
};

static int backward_with(const struct backward_call *c, adg_grads **out)
{
	/* The first failure's reason: the run's, kept until it returns. */
	char reason[ADG_ERRMSG_MAX];
	if (out != NULL)
		*out = NULL;
	const char *func = c->func;
	const adg_backward_options *options = c->options;
	adg_backward_options opts;
	adg_failure *report;
	int sized = backward_read_options(func, &options, &opts, &report);
	const adg_grad_ops *ops = c->ops;
	if (ops == NULL && c->registry != NULL && c->registry->has_grad_ops)
		ops = &c->registry->grad_ops; /* the value type's */
	struct adg_run run;
	backward_run_init(&run, c->registry, ops, options);
	run.reason = reason;
	int rc = ADG_EINVAL;
	if (ops == NULL || ops->add == NULL || ops->free == NULL) {
		backward_no_ops(func, ops);
		goto out; /* no way to free seed */
	}
	rc = sized != 0 ? sized
			: backward_check(func, c->registry, c->root, c->seed,
					 options, out);
	if (rc == 0) {
		run.shard = adg_shard_get(c->registry);
		if (run.shard == NULL)
			rc = adg_fail(ADG_ENOMEM, func,
				      "the allocator gave no memory for the "
				      "thread's slice");
		else
			run.pass_id = adg_next_pass_id(run.shard);
	}
	if (rc != 0) {
		if (c->seed != NULL)
			ops->free(c->seed, ops->ctx);
		goto out;
	}
	rc = backward_from(func, &run, c->root, c->seed, out);
out:
	backward_report(report, &run, rc);
	return rc;
}

int adg_backward(adg_registry *registry, adg_node *root, void *seed,
		 const adg_grad_ops *ops, adg_grads **out)
{
	struct backward_call c = {__func__, registry, root, seed, ops, NULL};
	return backward_with(&c, out);
}

int adg_backward_with(adg_registry *registry, adg_node *root, void *seed,
		      const adg_grad_ops *ops,
		      const adg_backward_options *options, adg_grads **out)
{
	struct backward_call c = {__func__, registry, root, seed, ops, options};
	return backward_with(&c, out);
}
