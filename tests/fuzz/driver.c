/*
 * The differential fuzzer's core: see driver.h.
 *
 * Gradients are heap boxes holding a uint64_t, and each step and output is
 * a heap object, so that AddressSanitizer sees a leak or a double free,
 * and the counters below see one in any build. Node values multiply modulo
 * 2^64 and gradients add modulo 2^64: exact whatever the order, so libadg
 * and the model must agree bit for bit.
 *
 * A node's output holds its value (a recompute multiplies its parents'
 * outputs, and leaves' values) and its id. A step gets every output it
 * asked for, its own first, then its slots in order, and adds their values
 * to each gradient it gives: an output that is wrong, or rebuilt from
 * wrong outputs, changes the gradients. Every step also asks for one
 * output it did not ask for, which libadg must refuse.
 *
 * A backward with an executor (driver.h: W above 0) runs steps, hooks,
 * recomputes, releases and the gradient arithmetic on several threads at
 * once. What they change is then either per node and changed by one
 * thread at a time (the step of a node is its only writer of runs,
 * got_grad, grad_in, done), or a counter changed with the atomic helpers
 * below; the model and the expectations are only read until the backward
 * returns, and the steps are checked against what does not depend on the
 * order they run in (model.h).
 */
#include "driver.h"

#include "model.h"

#include <adg.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Counters that steps, hooks, recomputes, releases and the gradient
 * arithmetic change, from any thread of a backward with an executor.
 * Relaxed: each is a tally, read by the thread that changed it (BUMPED's
 * result) or once the backward has returned, which libadg orders after
 * everything the backward ran. */
#define BUMP(x)	   ((void)__atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED))
#define UNBUMP(x)  ((void)__atomic_fetch_sub(&(x), 1, __ATOMIC_RELAXED))
#define BUMPED(x)  __atomic_add_fetch(&(x), 1, __ATOMIC_RELAXED)
#define RELAXED(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
/* A step's outcome (struct fuzz's done), read by the steps and hooks of
 * its parents, on other threads: release, paired with the acquire load,
 * so that what the step did is seen with it. (libadg orders a parent's
 * step after its children's too; this does not rely on it.) */
#define PUBLISH(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#define OBSERVE(x)    __atomic_load_n(&(x), __ATOMIC_ACQUIRE)

/* How a backward runs its steps: W, from its byte x (driver.h). */
enum exec_mode {
	EXEC_NONE,   /* no executor: the sequential backward */
	EXEC_CALLER, /* n_workers 0: the calling thread alone */
	EXEC_POOL1,  /* libadg's pool of 1, 2 or 3 threads */
	EXEC_POOL2,
	EXEC_POOL3,
	EXEC_DEFERRED, /* submit queues; run after the backward returned */
	EXEC_REFUSING, /* submit always fails */
};

/* The executors of EXEC_DEFERRED and EXEC_REFUSING offer this many. */
#define DEFERRED_WORKERS 2
#define REFUSING_WORKERS 3

struct handle {
	adg_node *node;
	uint64_t id;
	uint64_t value;
};

struct fuzz;

/* How an op-with's recompute callback ends (driver.h). */
enum recompute_end {
	RECOMPUTE_BUILDS,
	RECOMPUTE_FAILS,	   /* its own code */
	RECOMPUTE_SETS_THEN_FAILS, /* an output, then its own code: libadg
				      owns the output and frees it */
	RECOMPUTE_EMPTY,	   /* 0 and no output: ADG_ECALLBACK */
	RECOMPUTE_POSITIVE,	   /* a positive value: ADG_ECALLBACK */
};

/* A step closure: what the step needs to compute its parents' gradients,
 * and what it is checked against when libadg calls it. */
struct step {
	struct fuzz *f;
	uint64_t id; /* set once adg_op has returned */
	size_t n;
	uint64_t parent_ids[MODEL_MAX_PARENTS];
	uint64_t parent_values[MODEL_MAX_PARENTS];
	bool parent_leaf[MODEL_MAX_PARENTS];
	uint64_t value; /* the node's: its parents' values multiplied */
	bool fails;
	bool takes_grad;
	/* adg_op_with: the outputs it asks for, and whether it gets them. */
	bool want_self;
	size_t n_want;
	uint32_t want[MODEL_MAX_WANTS];
	bool gets;
	enum recompute_end recompute;
};

/* An output: the value of node id. */
struct output {
	struct fuzz *f; /* adg_output's free has no context */
	uint64_t id;
	uint64_t value;
};

struct fuzz {
	adg_registry *reg;
	adg_grad_ops ops;
	struct model model;
	struct model_backward expect;
	uint64_t running; /* the step in progress in a backward, or 0 */
	/* The backward in progress: how it runs its steps, whether it is
	 * retained, and without an executor how many of its steps have
	 * begun. */
	enum exec_mode mode;
	bool retain;
	size_t begun;
	struct handle h[ADG_FUZZ_MAX_HANDLES];
	size_t nh;
	/* Gradient boxes, step closures and outputs not yet freed. */
	long boxes_live;
	long steps_live;
	long outputs_live;
	uint64_t frees; /* outputs libadg freed, so far */
	/* Every call of a callback of the driver, for EXEC_DEFERRED: none may
	 * come after the backward returned. */
	uint64_t callbacks;
	/* EXEC_DEFERRED: what libadg submitted, to run once it returned. */
	struct {
		void (*fn)(void *arg);
		void *arg;
	} queued[DEFERRED_WORKERS];
	unsigned n_submits; /* submit calls in this backward */
	/* Per node id: what libadg did with its step. */
	unsigned runs[MODEL_MAX_NODES + 1];
	unsigned runs_before[MODEL_MAX_NODES + 1];
	unsigned releases[MODEL_MAX_NODES + 1];
	bool got_grad[MODEL_MAX_NODES + 1];
	uint64_t grad_in[MODEL_MAX_NODES + 1];
	/* In the current backward: 0 while the step of id has not returned,
	 * then DONE_OK or DONE_FAILED. */
	unsigned char done[MODEL_MAX_NODES + 1];
	/* Per node id: its outputs alive, how often libadg freed one and ran
	 * its recompute, and what adg_output_get returns when that fails. */
	unsigned out_live[MODEL_MAX_NODES + 1];
	uint64_t out_frees[MODEL_MAX_NODES + 1];
	uint64_t recomputes[MODEL_MAX_NODES + 1];
	int recompute_rc[MODEL_MAX_NODES + 1];
	/* The ready hook of the current backward: whose gradient it takes,
	 * how often it was called for each id. */
	bool takes[MODEL_MAX_NODES + 1];
	unsigned fired[MODEL_MAX_NODES + 1];
	struct adg_fuzz_coverage cov;
	/* For reports. */
	size_t op_index;
	const char *op_name;
	const uint8_t *data;
	size_t op_start, op_end; /* its bytes; op_end 0 when it has none */
	bool op_skipped;
	bool trace;
};

enum { DONE_OK = 1, DONE_FAILED = 2 };

/* Whether this thread is inside adg_output_get, where recomputes run. Per
 * thread: with an executor, steps get outputs on several at once. */
static _Thread_local bool getting;

/* The failing step of node id returns this code: a user code that names
 * the node, so that the backward's result says which step failed. */
static int fail_code(uint64_t id)
{
	return ADG_EUSER - (int)id;
}

/* The same for a failing recompute, in a range of its own. */
static int recompute_fail_code(uint64_t id)
{
	return ADG_EUSER - MODEL_MAX_NODES - (int)id;
}

static void *xmalloc(size_t size)
{
	void *p = malloc(size);
	if (p == NULL) {
		fprintf(stderr, "adg-fuzz: out of memory\n");
		abort();
	}
	return p;
}

/* Writes what the current operation is, with its bytes, for reports. */
static void describe(const struct fuzz *f, FILE *out)
{
	fprintf(out, "operation %zu (%s%s", f->op_index, f->op_name,
		f->op_skipped ? ", skipped" : "");
	if (f->op_end > 0) {
		fprintf(out, ", bytes %zu..%zu:", f->op_start, f->op_end - 1);
		for (size_t k = f->op_start; k < f->op_end; k++)
			fprintf(out, " %02x", f->data[k]);
	}
	fprintf(out, "; %zu handles, next id %" PRIu64 ")", f->nh,
		f->model.next_id);
}

__attribute__((format(printf, 2, 3), noreturn)) static void
mismatch(const struct fuzz *f, const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fprintf(stderr, "adg-fuzz: MISMATCH in ");
	describe(f, stderr);
	fprintf(stderr, ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	abort();
}

static void expect_u64(const struct fuzz *f, const char *what, uint64_t got,
		       uint64_t want)
{
	if (got != want)
		mismatch(f, "%s: libadg %" PRIu64 ", model %" PRIu64, what, got,
			 want);
}

/* The same, for a value that belongs to node id. */
static void expect_of(const struct fuzz *f, const char *what, uint64_t id,
		      uint64_t got, uint64_t want)
{
	if (got != want)
		mismatch(f,
			 "%s %" PRIu64 ": libadg %" PRIu64 ", model %" PRIu64,
			 what, id, got, want);
}

static void expect_rc(const struct fuzz *f, const char *what, int got, int want)
{
	if (got != want)
		mismatch(f, "%s returned %d (%s), model %d (%s)", what, got,
			 adg_strerror(got), want, adg_strerror(want));
}

/* ---------------------------------------------------------- gradients */

static uint64_t *box(struct fuzz *f, uint64_t v)
{
	uint64_t *p = xmalloc(sizeof *p);
	*p = v;
	BUMP(f->boxes_live);
	return p;
}

static void box_free(void *value, void *ctx)
{
	struct fuzz *f = ctx;
	BUMP(f->callbacks);
	free(value);
	UNBUMP(f->boxes_live);
}

static int box_add(void **sum, void *value, void *ctx)
{
	BUMP(((struct fuzz *)ctx)->callbacks);
	*(uint64_t *)*sum += *(uint64_t *)value;
	box_free(value, ctx);
	return 0;
}

/* ------------------------------------------------------------- outputs */

static struct output *output_new(struct fuzz *f, uint64_t id, uint64_t value)
{
	struct output *o = xmalloc(sizeof *o);
	*o = (struct output){f, id, value};
	BUMP(f->out_live[id]);
	BUMP(f->outputs_live);
	return o;
}

/* adg_output's free. */
static void output_free(void *value, void *ctx)
{
	(void)ctx;
	struct output *o = value;
	struct fuzz *f = o->f;
	BUMP(f->callbacks);
	UNBUMP(f->out_live[o->id]);
	BUMP(f->out_frees[o->id]);
	BUMP(f->frees);
	UNBUMP(f->outputs_live);
	free(o);
}

/* Frees a value that libadg refused, as its owner: not one of libadg's
 * frees. */
static void output_discard(struct output *o)
{
	o->f->out_frees[o->id]--;
	o->f->frees--;
	output_free(o, NULL);
}

/* Every node's output against the model: whether it is alive, and how
 * many times libadg ran its free and its recompute. */
static void check_outputs(const struct fuzz *f)
{
	for (uint64_t id = 1; id < f->model.next_id; id++) {
		const struct model_node *n = &f->model.node[id];
		expect_of(f, "outputs alive of node", id, f->out_live[id],
			  model_outputs_alive(&f->model, id));
		expect_of(f, "output frees of node", id, f->out_frees[id],
			  n->frees);
		expect_of(f, "recomputes of node", id, f->recomputes[id],
			  n->recomputes);
	}
}

/* --------------------------------------------------------------- steps */

/* The step of id is called, in a backward without an executor: the one
 * before it has returned. Steps run once each, in tape order (model.h),
 * and none after one failed. */
static void step_begin(struct fuzz *f, uint64_t id)
{
	struct model_backward *e = &f->expect;

	if (f->running != 0)
		model_step_end(&f->model, e, f->running);
	f->running = 0;
	/* What the previous step's return, or the take, freed. */
	check_outputs(f);
	if (e->rc != 0 || !e->on_tape[id] || e->ran[id])
		mismatch(f, "the step of %" PRIu64 " ran, model: %s", id,
			 e->ran[id] ? "it ran already" : "not on the tape");
	if (e->failed_step != 0)
		mismatch(f,
			 "the step of %" PRIu64
			 " ran after the step of %" PRIu64 " failed",
			 id, e->failed_step);
	uint64_t next = e->tape[f->begun];
	if (next != id)
		mismatch(f,
			 "the step of %" PRIu64 " (depth %" PRIu32
			 ") ran at tape position %zu, where the model's tape "
			 "has %" PRIu64 " (depth %" PRIu32 ")",
			 id, f->model.node[id].depth, f->begun, next,
			 f->model.node[next].depth);
	f->begun++;
	model_step_begin(&f->model, e, id);
	f->running = id;
}

/* The step of id is called, in a backward with an executor: any order is
 * fine in which each step comes after the steps of its node's children
 * have returned, without failing. Nothing is reported to the model: the
 * driver runs it afterwards (model_run_tape). */
static void step_begin_par(struct fuzz *f, uint64_t id)
{
	const struct model_backward *e = &f->expect;

	if (e->rc != 0 || !e->on_tape[id])
		mismatch(f,
			 "the step of %" PRIu64 " ran, model: not on the tape",
			 id);
	for (uint64_t c = id + 1; c < f->model.next_id; c++) {
		if (!e->on_tape[c])
			continue;
		const struct model_node *n = &f->model.node[c];
		for (size_t k = 0; k < n->n_parents; k++) {
			if (n->parents[k] != id)
				continue;
			unsigned char d = OBSERVE(f->done[c]);
			if (d == 0)
				mismatch(f,
					 "the step of %" PRIu64
					 " began before the step of its child "
					 "%" PRIu64 " returned",
					 id, c);
			if (d == DONE_FAILED)
				mismatch(f,
					 "the step of %" PRIu64
					 " began after the step of its child "
					 "%" PRIu64 " failed",
					 id, c);
			break;
		}
	}
}

/* Asks for an output the step did not ask for: libadg must refuse it. */
static void probe(struct fuzz *f, adg_step_call *call, const struct step *s)
{
	uint64_t id = s->id;
	for (size_t k = 0; k < s->n && model_asks(&f->model, s->id, id); k++)
		id = s->parent_ids[k];
	if (model_asks(&f->model, s->id, id))
		return; /* it asked for them all */
	void *v = &v;
	int rc = adg_output_get(call, id, &v);
	if (rc != ADG_EINVAL || v != NULL)
		mismatch(f,
			 "adg_output_get in the step of %" PRIu64
			 " for %" PRIu64 ", which it did not ask for, "
			 "returned %d (%s)%s",
			 s->id, id, rc, adg_strerror(rc),
			 v != NULL ? " and a value" : "");
}

/* A slot out of range is refused, in every mode, and its value freed: the
 * count of live boxes says so once the backward has returned. */
static void probe_slot(struct fuzz *f, adg_step_call *call,
		       const struct step *s)
{
	int rc = adg_step_give(call, s->n, box(f, 1));
	if (rc != ADG_EINVAL)
		mismatch(f,
			 "adg_step_give in the step of %" PRIu64
			 " for slot %zu of %zu returned %d (%s), not "
			 "ADG_EINVAL",
			 s->id, s->n, s->n, rc, adg_strerror(rc));
}

/* Gets the output of target, which the step asked for, and adds its value
 * to *sum. Returns 0 or the get's code. */
static int get_output(struct fuzz *f, adg_step_call *call, const struct step *s,
		      uint64_t target, uint64_t *sum)
{
	void *v = &v;
	getting = true;
	int rc = adg_output_get(call, target, &v);
	getting = false;
	if (f->trace)
		fprintf(stderr,
			"adg-fuzz:    step %" PRIu64 " gets %" PRIu64
			": %d (%s)\n",
			s->id, target, rc, adg_strerror(rc));
	/* Whatever the order, which recompute fails on the way is fixed at
	 * the take; without an executor the model follows the get too, and
	 * the two must agree. */
	uint64_t failed = model_get_fails(&f->model, &f->expect, target);
	if (f->mode == EXEC_NONE) {
		uint64_t followed =
			model_output_get(&f->model, &f->expect, s->id, target);
		if (followed != failed)
			mismatch(f,
				 "model: the get of %" PRIu64
				 " by the step of %" PRIu64
				 " fails by the recompute of %" PRIu64
				 ", predicted %" PRIu64,
				 target, s->id, followed, failed);
	}
	int want = failed != 0 ? f->recompute_rc[failed] : 0;
	if (rc != want)
		mismatch(f,
			 "adg_output_get in the step of %" PRIu64
			 " for %" PRIu64 " returned %d (%s), model %d (%s)",
			 s->id, target, rc, adg_strerror(rc), want,
			 adg_strerror(want));
	/* What it rebuilt, and freed once a rebuild no longer needed it:
	 * with an executor that depends on the order, and is checked once
	 * the backward has returned. */
	if (f->mode == EXEC_NONE)
		check_outputs(f);
	if (rc != 0) {
		if (v != NULL)
			mismatch(f, "a failed adg_output_get set a value");
		BUMP(f->cov.recompute_failures);
		return rc;
	}
	const struct output *o = v;
	if (o == NULL || o->id != target)
		mismatch(f,
			 "adg_output_get in the step of %" PRIu64
			 " for %" PRIu64 " gave the output of %" PRIu64,
			 s->id, target, o != NULL ? o->id : 0);
	BUMP(f->cov.outputs_got);
	*sum += o->value;
	return 0;
}

/* Gets what the step asked for: its own output, then its slots'. */
static int get_outputs(struct fuzz *f, adg_step_call *call,
		       const struct step *s, uint64_t *sum)
{
	int rc = 0;
	if (!s->gets) {
		if (s->want_self || s->n_want > 0)
			BUMP(f->cov.gets_skipped);
		return 0;
	}
	if (s->want_self)
		rc = get_output(f, call, s, s->id, sum);
	for (size_t w = 0; w < s->n_want && rc == 0; w++)
		rc = get_output(f, call, s, s->parent_ids[s->want[w]], sum);
	return rc;
}

/* What the step does once called: returns its result. */
static int step_run(struct fuzz *f, adg_step_call *call, struct step *s)
{
	uint64_t g = 0;
	if (call->grad != NULL) {
		g = *(uint64_t *)call->grad;
		f->got_grad[s->id] = true;
		f->grad_in[s->id] = g;
	}
	probe(f, call, s);
	probe_slot(f, call, s);
	/* A failed get fails the step with its code. */
	uint64_t sum = 0;
	int rc = get_outputs(f, call, s, &sum);
	if (rc != 0)
		return rc;
	if (call->grad == NULL)
		return s->fails ? fail_code(s->id) : 0;
	if (s->takes_grad) {
		BUMP(f->cov.grads_taken);
		box_free(call->grad, f);
		call->grad = NULL;
	}
	/* A failing step gives its gradients first, so that the failed
	 * backward has a container full of them to free. Once per parent
	 * slot, in slot order: what the fold order promises equality with
	 * the sequential backward for. */
	for (size_t i = 0; i < s->n; i++) {
		uint64_t d = g;
		for (size_t k = 0; k < s->n; k++)
			if (k != i)
				d *= s->parent_values[k];
		int rc_give = adg_step_give(call, i, box(f, d + sum));
		if (rc_give != 0)
			mismatch(f,
				 "adg_step_give in step %" PRIu64
				 " for slot %zu returned %d (%s)",
				 s->id, i, rc_give, adg_strerror(rc_give));
	}
	/* A step's output takes one gradient per slot, in every mode: with
	 * every slot taken, one more for the first is refused and freed. */
	int rc_give = adg_step_give(call, 0, box(f, 1));
	if (rc_give != ADG_EINVAL)
		mismatch(f,
			 "adg_step_give in step %" PRIu64
			 " for slot 0, with every slot given, returned %d "
			 "(%s), not ADG_EINVAL",
			 s->id, rc_give, adg_strerror(rc_give));
	return s->fails ? fail_code(s->id) : 0;
}

static int step_backward(adg_step_call *call, void *user)
{
	struct step *s = user;
	struct fuzz *f = s->f;

	BUMP(f->callbacks);
	if (call->registry != f->reg)
		mismatch(f, "step %" PRIu64 " called with a wrong registry",
			 s->id);
	if (call->node_id != s->id || call->n_parents != s->n)
		mismatch(f,
			 "step %" PRIu64 " called for node %" PRIu64
			 " with %zu parents (has %zu)",
			 s->id, call->node_id, call->n_parents, s->n);
	for (size_t i = 0; i < s->n; i++)
		if (call->parent_ids[i] != s->parent_ids[i])
			mismatch(f,
				 "step %" PRIu64 ": parent %zu is %" PRIu64
				 ", want %" PRIu64,
				 s->id, i, call->parent_ids[i],
				 s->parent_ids[i]);
	/* Retained or consumed, as the backward that runs it is. */
	if ((call->retained != 0) != f->retain)
		mismatch(f,
			 "step %" PRIu64 " called with retained %d in a %s "
			 "backward",
			 s->id, call->retained,
			 f->retain ? "retained" : "consuming");
	if (f->mode == EXEC_NONE)
		step_begin(f, s->id);
	else
		step_begin_par(f, s->id);
	/* Two threads in the step of one node at once would both see more
	 * than one run here. */
	unsigned runs = BUMPED(f->runs[s->id]);
	if (runs != f->runs_before[s->id] + 1)
		mismatch(f, "the step of %" PRIu64 " ran %u times", s->id,
			 runs - f->runs_before[s->id]);
	int rc = step_run(f, call, s);
	PUBLISH(f->done[s->id], rc != 0 ? DONE_FAILED : DONE_OK);
	return rc;
}

/* Rebuilds the output from the parents' outputs (a leaf's value for a
 * leaf), or ends as the op said. */
static int step_recompute(adg_recompute_call *call, void *user)
{
	struct step *s = user;
	struct fuzz *f = s->f;

	BUMP(f->callbacks);
	if (!getting || call->node_id != s->id || call->n_parents != s->n ||
	    call->output != NULL)
		mismatch(f,
			 "recompute of %" PRIu64 " called for %" PRIu64
			 " with %zu parents%s%s",
			 s->id, call->node_id, call->n_parents,
			 getting ? "" : ", outside adg_output_get",
			 call->output != NULL ? ", output set" : "");
	uint64_t value = 1;
	for (size_t k = 0; k < s->n; k++) {
		const struct output *p = call->parent_outputs[k];
		if (call->parent_ids[k] != s->parent_ids[k] ||
		    (p == NULL) != s->parent_leaf[k] ||
		    (p != NULL && p->id != s->parent_ids[k]))
			mismatch(f,
				 "recompute of %" PRIu64
				 ": parent %zu is %" PRIu64 " with %s output%s",
				 s->id, k, call->parent_ids[k],
				 p == NULL ? "no" : "an",
				 p != NULL && p->id != s->parent_ids[k]
					 ? " of another node"
					 : "");
		value *= p != NULL ? p->value : s->parent_values[k];
	}
	BUMP(f->recomputes[s->id]);
	BUMP(f->cov.recomputes);
	switch (s->recompute) {
	case RECOMPUTE_FAILS:
		return recompute_fail_code(s->id);
	case RECOMPUTE_SETS_THEN_FAILS:
		call->output = output_new(f, s->id, value);
		return recompute_fail_code(s->id);
	case RECOMPUTE_EMPTY:
		return 0;
	case RECOMPUTE_POSITIVE:
		return 1;
	case RECOMPUTE_BUILDS:
		break;
	}
	call->output = output_new(f, s->id, value);
	return 0;
}

static void step_release(void *user)
{
	struct step *s = user;
	struct fuzz *f = s->f;

	BUMP(f->callbacks);
	unsigned releases = BUMPED(f->releases[s->id]);
	if (releases != 1)
		mismatch(f, "step %" PRIu64 " released %u times", s->id,
			 releases);
	UNBUMP(f->steps_live);
	free(s);
}

/* -------------------------------------------------------------- checks */

/* After every operation: the counters, every handle's id and graph, which
 * steps have been released, and how often each has run (more than once
 * only by retained backward passes and a last one, of either kind). */
static void check_all(struct fuzz *f)
{
	struct adg_stats got = {.size = sizeof got};
	struct model_stats want;

	expect_rc(f, "adg_registry_stats", adg_registry_stats(f->reg, &got), 0);
	model_stats(&f->model, &want);
	expect_u64(f, "stats.live_nodes", got.live_nodes, want.live_nodes);
	expect_u64(f, "stats.live_steps", got.live_steps, want.live_steps);
	expect_u64(f, "stats.live_graphs", got.live_graphs, want.live_graphs);
	expect_u64(f, "stats.merges", got.merges, want.merges);
	expect_u64(f, "stats.nodes_freed", got.nodes_freed, want.nodes_freed);
	expect_u64(f, "step closures alive", (uint64_t)f->steps_live,
		   want.live_steps);
	expect_u64(f, "gradient boxes alive", (uint64_t)f->boxes_live, 0);
	check_outputs(f);

	for (size_t i = 0; i < f->nh; i++) {
		uint64_t id = 0, graph = 0;
		expect_rc(f, "adg_node_id", adg_node_id(f->h[i].node, &id), 0);
		expect_u64(f, "node id of a handle", id, f->h[i].id);
		expect_rc(f, "adg_node_graph_id",
			  adg_node_graph_id(f->h[i].node, &graph), 0);
		expect_of(f, "graph id of node", id, graph,
			  model_graph_id(&f->model, id));
	}
	for (uint64_t id = 1; id < f->model.next_id; id++) {
		bool released = model_step_released(&f->model, id);
		if (f->releases[id] != (released ? 1u : 0u))
			mismatch(f,
				 "step %" PRIu64
				 " released %u times, model: %s",
				 id, f->releases[id],
				 released ? "released" : "held");
		expect_of(f, "runs of the step of", id, f->runs[id],
			  f->model.node[id].runs);
	}
}

/* ---------------------------------------------------------- operations */

static void push(struct fuzz *f, adg_node *node, uint64_t id, uint64_t value)
{
	f->h[f->nh++] = (struct handle){node, id, value};
}

static void do_leaf(struct fuzz *f, uint8_t v)
{
	uint64_t value = 2 * (uint64_t)v + 1;
	adg_node *node;
	uint64_t id = 0;

	expect_rc(f, "adg_leaf", adg_leaf(f->reg, &node), 0);
	expect_rc(f, "adg_node_id", adg_node_id(node, &id), 0);
	expect_u64(f, "new leaf id", id, model_leaf(&f->model, value));
	push(f, node, id, value);
	f->cov.leaves++;
}

/* The closure of an op on the handles at idx, from p (driver.h); fills
 * parents. */
static struct step *step_new(struct fuzz *f, uint8_t p, const uint8_t *idx,
			     adg_node **parents)
{
	unsigned flags = p / 3;
	struct step *s = xmalloc(sizeof *s);

	*s = (struct step){
		.f = f,
		.n = 1 + p % 3,
		.value = 1,
		.fails = flags % 8 == 7,
		.takes_grad = (flags / 8) % 2 == 1,
	};
	for (size_t i = 0; i < s->n; i++) {
		const struct handle *h = &f->h[idx[i] % f->nh];
		parents[i] = h->node;
		s->parent_ids[i] = h->id;
		s->parent_values[i] = h->value;
		s->parent_leaf[i] = f->model.node[h->id].leaf;
		s->value *= h->value;
	}
	f->steps_live++;
	return s;
}

static void do_op(struct fuzz *f, uint8_t p, const uint8_t *idx)
{
	adg_node *parents[MODEL_MAX_PARENTS];
	/* Read before step_new: the handle the first index names. */
	size_t first = idx[0] % f->nh;
	bool moves = p / 3 / 16 % 2 == 1;
	struct step *s = step_new(f, p, idx, parents);
	adg_step step = {
		.backward = step_backward, .release = step_release, .user = s};
	adg_node *node;
	uint64_t id = 0;
	if (moves)
		expect_rc(f, "adg_op_moving",
			  adg_op_moving(f->reg, parents, s->n, 1, &step, &node),
			  0);
	else
		expect_rc(f, "adg_op",
			  adg_op(f->reg, parents, s->n, &step, &node), 0);
	expect_rc(f, "adg_node_id", adg_node_id(node, &id), 0);
	uint64_t want = model_op(&f->model, s->parent_ids, s->n, s->fails);
	expect_u64(f, "new node id", id, want);
	s->id = id;
	push(f, node, id, s->value);
	f->cov.nodes++;
	f->cov.failing_steps += s->fails;
	if (moves) {
		/* The first parent's handle is the node's now: to the model,
		 * a drop right after the op. */
		model_unref(&f->model, f->h[first].id);
		f->h[first] = f->h[--f->nh];
		f->cov.moves++;
	}
}

/* Whether the op of s names a consumed parent whose output it needs. */
static bool needs_consumed(const struct fuzz *f, const struct step *s,
			   const struct model_output *o)
{
	for (size_t k = 0; k < s->n; k++) {
		const struct model_node *p = &f->model.node[s->parent_ids[k]];
		bool wanted = o->recompute && !p->leaf;
		for (size_t w = 0; w < o->n_want; w++)
			wanted = wanted || o->want[w] == k;
		if (wanted && p->consumed)
			return true;
	}
	return false;
}

static void do_op_with(struct fuzz *f, uint8_t p, uint8_t o, const uint8_t *idx)
{
	adg_node *parents[MODEL_MAX_PARENTS];
	struct step *s = step_new(f, p, idx, parents);
	unsigned end = p / 3 / 16, kind = o & 3;
	s->recompute = end == 1	  ? RECOMPUTE_FAILS
		       : end == 2 ? RECOMPUTE_EMPTY
		       : end == 3 ? RECOMPUTE_POSITIVE
		       : end == 4 ? RECOMPUTE_SETS_THEN_FAILS
				  : RECOMPUTE_BUILDS;
	struct model_output mo = {
		.value = kind == 1 || kind == 2,
		.recompute = kind >= 2,
		.memory_bound = (o >> 2) & 1,
		.recompute_fails = s->recompute != RECOMPUTE_BUILDS,
		.recompute_sets_output =
			s->recompute == RECOMPUTE_SETS_THEN_FAILS,
		.want_self = (o >> 3) & 1,
		.gets = (o >> 7) == 0,
	};
	for (unsigned k = 0; k < 3; k++)
		if ((o >> (4 + k)) & 1)
			mo.want[mo.n_want++] = k % s->n;
	s->want_self = mo.want_self;
	s->n_want = mo.n_want;
	memcpy(s->want, mo.want, sizeof s->want);
	s->gets = mo.gets;

	/* The value is made before the node: it carries the id the model
	 * expects, which the check below confirms. */
	uint64_t next = f->model.next_id;
	adg_output out = {
		.value = mo.value ? output_new(f, next, s->value) : NULL,
		.free = output_free,
		.recompute = mo.recompute ? step_recompute : NULL,
		.memory_bound = mo.memory_bound,
	};
	adg_op_options opts = {
		.size = sizeof opts,
		.output = kind != 0 ? &out : NULL,
		.want_self = mo.want_self,
		.want_parents = mo.want,
		.n_want_parents = mo.n_want,
	};
	adg_step step = {
		.backward = step_backward, .release = step_release, .user = s};
	adg_node *node = (adg_node *)&node; /* must become NULL on error */
	bool consumed = needs_consumed(f, s, &mo);
	int rc = adg_op_with(f->reg, parents, s->n, &step, &opts, &node);
	int want_rc;
	uint64_t want = model_op_with(&f->model, s->parent_ids, s->n, s->fails,
				      &mo, &want_rc);
	expect_rc(f, "adg_op_with", rc, want_rc);
	if (f->trace)
		fprintf(stderr,
			"adg-fuzz:    adg_op_with: %d (%s), id %" PRIu64
			", output %u, want_self %d, %zu wants\n",
			rc, adg_strerror(rc), want, kind, mo.want_self,
			mo.n_want);
	if (rc != 0) {
		if (node != NULL)
			mismatch(f, "a failed adg_op_with left *out non-NULL");
		/* Nothing was taken: the value and the step are ours. */
		if (out.value != NULL) {
			expect_of(f, "outputs alive of refused node", next,
				  f->out_live[next], 1);
			output_discard(out.value);
		}
		free(s);
		f->steps_live--;
		f->cov.ops_with_refused++;
		return;
	}
	uint64_t id = 0;
	expect_rc(f, "adg_node_id", adg_node_id(node, &id), 0);
	expect_u64(f, "new node id", id, want);
	s->id = id;
	f->recompute_rc[id] =
		s->recompute == RECOMPUTE_FAILS ||
				s->recompute == RECOMPUTE_SETS_THEN_FAILS
			? recompute_fail_code(id)
		: s->recompute == RECOMPUTE_BUILDS ? 0
						   : ADG_ECALLBACK;
	push(f, node, id, s->value);
	f->cov.ops_with++;
	f->cov.failing_steps += s->fails;
	f->cov.asks_consumed += consumed;
	f->cov.dropped_at_once += f->model.deferred == id;
}

static void do_ref(struct fuzz *f, size_t i)
{
	expect_rc(f, "adg_node_ref", adg_node_ref(f->h[i].node), 0);
	model_ref(&f->model, f->h[i].id);
	push(f, f->h[i].node, f->h[i].id, f->h[i].value);
	f->cov.refs++;
}

static void do_drop(struct fuzz *f, size_t i)
{
	uint64_t freed = f->model.nodes_freed, frees = f->frees;
	expect_rc(f, "adg_node_unref", adg_node_unref(f->h[i].node), 0);
	model_unref(&f->model, f->h[i].id);
	f->h[i] = f->h[--f->nh];
	f->cov.drops++;
	f->cov.cascades += f->model.nodes_freed - freed >= 2;
	f->cov.freed_unrun += f->frees - frees;
}

/* Which steps ran in this backward: step_begin (or step_begin_par) checked
 * each as it came. Every step of the tape up to the first that fails in
 * tape order ran (model_run_tape's, with an executor), and without an
 * executor no other. Each was called with its final gradient. */
static void check_runs(struct fuzz *f)
{
	const struct model_backward *e = &f->expect;
	uint64_t failed = e->failed_step;

	for (uint64_t id = 1; id < f->model.next_id; id++) {
		unsigned ran = f->runs[id] - f->runs_before[id];
		if (e->on_tape[id] && ran == 0 &&
		    (failed == 0 || e->pos[id] < e->pos[failed]))
			mismatch(f,
				 "step %" PRIu64 " never ran in a backward "
				 "where no step before it on the tape failed",
				 id);
		if (ran == 0)
			continue;
		if (f->done[id] == 0)
			mismatch(f,
				 "the step of %" PRIu64
				 " had not returned when the backward did",
				 id);
		/* Called with NULL when none arrived or the hook took it. */
		bool want_grad = e->has_grad[id] && !e->taken[id];
		if (f->got_grad[id] != want_grad)
			mismatch(f,
				 "the step of node %" PRIu64 " got %s "
				 "gradient, model: %s",
				 id, f->got_grad[id] ? "a" : "no",
				 want_grad ? "one" : "none");
		if (want_grad)
			expect_of(f, "gradient passed to the step of node", id,
				  f->grad_in[id], e->grad[id]);
	}
}

/* The ready hook: called once per expected id, when every step that names
 * it as a parent has returned and (for a node) before its own step, with
 * the model's gradient. With an executor, on any thread, and for several
 * ids at once. */
static int on_ready(uint64_t id, void **grad, void *ctx)
{
	struct fuzz *f = ctx;
	const struct model_backward *e = &f->expect;

	BUMP(f->callbacks);
	if (id == 0 || id >= f->model.next_id || !e->fires[id])
		mismatch(f,
			 "the ready hook was called for id %" PRIu64
			 ", which the model does not expect",
			 id);
	unsigned fired = BUMPED(f->fired[id]);
	if (fired != 1)
		mismatch(f, "the ready hook was called %u times for %" PRIu64,
			 fired, id);
	for (uint64_t c = 1; c < f->model.next_id; c++) {
		if (!e->on_tape[c])
			continue;
		const struct model_node *n = &f->model.node[c];
		for (size_t k = 0; k < n->n_parents; k++)
			if (n->parents[k] == id && OBSERVE(f->done[c]) == 0)
				mismatch(
					f,
					"the ready hook was called for %" PRIu64
					" before the step of its child "
					"%" PRIu64 " returned",
					id, c);
	}
	if (RELAXED(f->runs[id]) != f->runs_before[id])
		mismatch(f,
			 "the ready hook was called for %" PRIu64
			 " after its own step",
			 id);
	if ((*grad != NULL) != e->has_grad[id])
		mismatch(f,
			 "the ready hook got %s gradient for %" PRIu64
			 ", model: %s",
			 *grad != NULL ? "a" : "no", id,
			 e->has_grad[id] ? "one" : "none");
	if (*grad == NULL)
		return 0;
	expect_of(f, "gradient passed to the ready hook for", id,
		  *(uint64_t *)*grad, e->grad[id]);
	if (f->takes[id]) {
		BUMP(f->cov.hook_takes);
		box_free(*grad, f);
		*grad = NULL;
	}
	return 0;
}

/* ----------------------------------------------------------- executors */

/* libadg's pools, one of each size, started when a backward first wants
 * one and kept for the process: adg_fuzz_run runs on one thread at a
 * time. */
static adg_pool *pools[3];
static adg_executor pool_executors[3];

static void free_pools(void)
{
	for (size_t k = 0; k < 3; k++) {
		int rc = adg_pool_free(pools[k]);
		if (rc != 0) {
			fprintf(stderr, "adg-fuzz: adg_pool_free: %d (%s)\n",
				rc, adg_strerror(rc));
			abort();
		}
		pools[k] = NULL;
	}
}

static const adg_executor *pool_executor(const struct fuzz *f, unsigned n)
{
	static bool registered;
	if (pools[n - 1] == NULL) {
		if (!registered && atexit(free_pools) != 0) {
			fprintf(stderr, "adg-fuzz: atexit: %s\n",
				strerror(errno));
			abort();
		}
		registered = true;
		int rc = adg_pool_new(n, &pools[n - 1]);
		if (rc == ADG_ENOMEM) {
			fprintf(stderr, "adg-fuzz: adg_pool_new: no memory\n");
			abort();
		}
		expect_rc(f, "adg_pool_new", rc, 0);
		expect_rc(
			f, "adg_pool_executor",
			adg_pool_executor(pools[n - 1], &pool_executors[n - 1]),
			0);
		expect_u64(f, "workers a pool offers",
			   pool_executors[n - 1].n_workers, n);
	}
	return &pool_executors[n - 1];
}

/* EXEC_CALLER's submit: with no workers, libadg must not call it. */
static int submit_never(void (*fn)(void *arg), void *arg, void *ctx)
{
	(void)fn;
	(void)arg;
	mismatch(ctx, "an executor of no workers was asked to run work");
}

/* EXEC_DEFERRED's: keeps fn for the driver to run once the backward has
 * returned. None runs before: libadg, which counts every submitted one as
 * a thread in use until it returns, submits at most DEFERRED_WORKERS. */
static int submit_deferred(void (*fn)(void *arg), void *arg, void *ctx)
{
	struct fuzz *f = ctx;
	/* Any thread of the backward may submit: the slot is its own. */
	unsigned k = BUMPED(f->n_submits) - 1;
	if (k >= DEFERRED_WORKERS)
		mismatch(f,
			 "libadg submitted %u functions to an executor of %u "
			 "workers, none of which has run",
			 k + 1, DEFERRED_WORKERS);
	f->queued[k].fn = fn;
	f->queued[k].arg = arg;
	return 0;
}

/* EXEC_REFUSING's: fails, and fn never runs. */
static int submit_refusing(void (*fn)(void *arg), void *arg, void *ctx)
{
	(void)fn;
	(void)arg;
	BUMP(((struct fuzz *)ctx)->n_submits);
	return -1;
}

/* The executor of mode, or NULL for EXEC_NONE. */
static const adg_executor *executor_of(struct fuzz *f, enum exec_mode mode,
				       adg_executor *own)
{
	switch (mode) {
	case EXEC_NONE:
		return NULL;
	case EXEC_CALLER:
		*own = (adg_executor){submit_never, f, 0};
		return own;
	case EXEC_POOL1:
	case EXEC_POOL2:
	case EXEC_POOL3:
		return pool_executor(f, mode - EXEC_POOL1 + 1);
	case EXEC_DEFERRED:
		*own = (adg_executor){submit_deferred, f, DEFERRED_WORKERS};
		return own;
	case EXEC_REFUSING:
		*own = (adg_executor){submit_refusing, f, REFUSING_WORKERS};
		return own;
	}
	abort();
}

/* EXEC_DEFERRED, once the backward has returned: runs what it submitted,
 * which must return at once having done nothing the driver can see. */
static void run_deferred(struct fuzz *f)
{
	unsigned n = f->n_submits;
	uint64_t callbacks = f->callbacks;
	for (unsigned k = 0; k < n; k++)
		f->queued[k].fn(f->queued[k].arg);
	if (f->callbacks != callbacks)
		mismatch(f,
			 "the %u functions submitted to the executor, run "
			 "after the backward returned, called the driver "
			 "%" PRIu64 " times",
			 n, f->callbacks - callbacks);
}

_Static_assert(EXEC_REFUSING + 1 == ADG_FUZZ_EXEC_MODES,
	       "driver.h: one W per mode");

static const char *const mode_names[] = {
	"sequential",	       "an executor of no workers",
	"a pool of 1",	       "a pool of 2",
	"a pool of 3",	       "a deferring executor",
	"a refusing executor",
};

/* After a failed backward with an executor: steps after the first failure
 * in tape order may have started before libadg knew of it, and rebuilt
 * outputs the sequential backward does not. Nothing the sequential one
 * did is missing; a consuming backward has freed every output of its
 * tape, a retained one none, keeping what the late steps rebuilt. The
 * model takes the rest as it came. */
static void settle_late_steps(struct fuzz *f)
{
	const struct model_backward *e = &f->expect;

	for (uint64_t id = 1; id < f->model.next_id; id++) {
		const struct model_node *n = &f->model.node[id];
		if (!e->on_tape[id])
			continue;
		/* check_runs: each ran at most once, and none is missing. */
		unsigned ran = f->runs[id] - f->runs_before[id];
		/* A failed call frees no dropped output its forward still
		 * has, and no backward sees it. */
		unsigned live = f->out_live[id] - (f->model.deferred == id);
		if (ran < e->ran[id])
			mismatch(f,
				 "the step of %" PRIu64 " did not run in a "
				 "failed backward, model: it ran",
				 id);
		if (!e->retained)
			expect_of(f,
				  "outputs alive after a failed backward, of "
				  "node",
				  id, live, 0);
		else if (live < n->held || live > 1 ||
			 (live > n->held && f->recomputes[id] == n->recomputes))
			mismatch(f,
				 "node %" PRIu64 ": %u outputs alive after a "
				 "failed retained backward, model %u, and "
				 "%" PRIu64 " late recomputes",
				 id, live, n->held,
				 f->recomputes[id] - n->recomputes);
		if (f->out_frees[id] < n->frees ||
		    f->recomputes[id] < n->recomputes)
			mismatch(f,
				 "node %" PRIu64 ": %" PRIu64
				 " output frees and %" PRIu64
				 " recomputes, fewer than the sequential "
				 "backward's %" PRIu64 " and %" PRIu64,
				 id, f->out_frees[id], f->recomputes[id],
				 n->frees, n->recomputes);
		model_backward_late(&f->model, e, id, ran - e->ran[id],
				    f->out_frees[id] - n->frees,
				    f->recomputes[id] - n->recomputes,
				    live != 0);
	}
}

/* A backward from handle i, run as mode says, retained if retain; with a
 * ready hook unless hook is NULL (its takes must point at f->takes). */
static void do_backward(struct fuzz *f, size_t i, uint64_t seed,
			const struct model_hook *hook, enum exec_mode mode,
			bool retain)
{
	struct model_backward *e = &f->expect;
	uint64_t root = f->h[i].id;
	adg_grads *out = (adg_grads *)&out; /* must become NULL on error */

	uint64_t freed = f->model.nodes_freed;
	memcpy(f->runs_before, f->runs, sizeof f->runs);
	memset(f->fired, 0, sizeof f->fired);
	memset(f->done, 0, sizeof f->done);
	/* A step that ran in an earlier retained backward runs again. */
	memset(f->got_grad, 0, sizeof f->got_grad);
	f->n_submits = 0;
	model_backward(&f->model, root, seed, hook, retain, e);
	f->cov.backward_hook += hook != NULL;
	f->cov.cascades += f->model.nodes_freed - freed >= 2;
	f->running = 0;
	f->begun = 0;
	f->mode = mode;
	f->retain = retain;
	adg_executor own;
	const adg_executor *exec = executor_of(f, mode, &own);
	int rc;
	if (hook == NULL && exec == NULL && !retain) {
		rc = adg_backward(f->reg, f->h[i].node, box(f, seed), &f->ops,
				  &out);
	} else {
		adg_backward_options o = {
			.size = sizeof o, .executor = exec, .retain = retain};
		if (hook != NULL) {
			o.on_ready = on_ready;
			o.on_ready_ctx = f;
			o.leaves_only = hook->leaves_only;
		}
		rc = adg_backward_with(f->reg, f->h[i].node, box(f, seed),
				       &f->ops, &o, &out);
	}
	if (mode == EXEC_DEFERRED)
		run_deferred(f);
	if (mode == EXEC_NONE) {
		if (f->running != 0)
			model_step_end(&f->model, e, f->running);
	} else if (e->rc == 0) {
		model_run_tape(&f->model, e);
	}
	f->running = 0;
	if (e->rc == 0)
		model_backward_end(&f->model, e);

	if (f->trace)
		fprintf(stderr,
			"adg-fuzz:    %s backward from %" PRIu64
			" (%s): %d (%s)%s\n",
			retain ? "retained" : "consuming", root,
			mode_names[mode], rc, adg_strerror(rc),
			mode == EXEC_DEFERRED || mode == EXEC_REFUSING
				? (f->n_submits > 0 ? ", submitted work"
						    : ", submitted none")
				: "");
	/* The steps that ran decide the outcome: the first to fail in tape
	 * order names itself in its code. */
	int want = e->rc;
	if (want == 0 && e->failed_recompute != 0)
		want = f->recompute_rc[e->failed_recompute];
	else if (want == 0 && e->failed_step != 0)
		want = fail_code(e->failed_step);
	if (want == 0)
		model_free_deferred(&f->model);
	if (rc != want)
		mismatch(f,
			 "adg_backward from node %" PRIu64
			 " returned %d (%s), model %d (%s)",
			 root, rc, adg_strerror(rc), want, adg_strerror(want));
	if (f->model.node[root].leaf)
		f->cov.backward_leaf++;
	else if (rc == 0)
		f->cov.backward_ok++;
	else if (rc == ADG_ECONSUMED)
		f->cov.backward_consumed++;
	else if (rc == ADG_EUNAVAILABLE)
		f->cov.backward_unavailable++;
	else
		f->cov.backward_failed++;
	if (retain && !f->model.node[root].leaf) {
		f->cov.retained_ok += rc == 0;
		f->cov.retained_refused += e->rc != 0;
		f->cov.retained_failed += e->rc == 0 && rc != 0;
		f->cov.retained_exec += e->rc == 0 && mode != EXEC_NONE;
	}
	for (uint64_t id = 1; e->rc == 0 && id < f->model.next_id; id++) {
		bool again = f->runs_before[id] > 0 && e->ran[id];
		f->cov.steps_rerun += again;
		f->cov.retained_kept += retain && e->on_tape[id] &&
					!e->held_at_take[id] &&
					f->model.node[id].held;
		f->cov.rerun_consumed += again && !retain && rc == 0;
	}
	if (e->rc == 0 && !f->model.node[root].leaf) {
		f->cov.by_mode[mode][retain]++;
		f->cov.exec_caller += mode == EXEC_CALLER;
		f->cov.exec_pool += mode >= EXEC_POOL1 && mode <= EXEC_POOL3;
		f->cov.exec_deferred += mode == EXEC_DEFERRED;
		f->cov.exec_refusing += mode == EXEC_REFUSING;
		f->cov.exec_failed += mode != EXEC_NONE && rc != 0;
		f->cov.exec_hook += mode != EXEC_NONE && hook != NULL;
	}
	f->cov.freed_at_take += e->freed_at_take;
	/* A successful backward has served every request, so it holds no
	 * output to its end (I8); a failed one frees what it held there. */
	if (rc == 0 && e->freed_at_end != 0)
		mismatch(f,
			 "the model kept %" PRIu64
			 " outputs to the end of a backward "
			 "that succeeded",
			 e->freed_at_end);
	f->cov.freed_after_failure += e->freed_at_end;
	check_runs(f);
	if (mode != EXEC_NONE && e->rc == 0 && rc != 0)
		settle_late_steps(f);
	/* After a failure the hook may have missed ids, never more. */
	for (uint64_t id = 1; hook != NULL && id < f->model.next_id; id++)
		if (f->fired[id] == 0 && e->fires[id] && rc == 0)
			mismatch(f,
				 "the ready hook was never called for %" PRIu64,
				 id);
	f->mode = EXEC_NONE;
	f->retain = false;
	if (rc != 0) {
		if (out != NULL)
			mismatch(f, "a failed backward left *out non-NULL");
		return;
	}
	if (out == NULL)
		mismatch(f, "a successful backward returned no container");

	size_t count = 0;
	expect_rc(f, "adg_grads_count", adg_grads_count(out, &count), 0);
	expect_u64(f, "gradients in the container", count, e->n_leaf_grads);
	/* The container's gradient boxes are all that is left alive. */
	expect_u64(f, "gradient boxes alive", (uint64_t)f->boxes_live, count);
	for (uint64_t id = 1; id < f->model.next_id; id++) {
		if (!e->has_grad[id] || e->taken[id] || !f->model.node[id].leaf)
			continue;
		void *v = NULL;
		int rc_get = adg_grads_get(out, id, &v);
		if (rc_get != 0)
			mismatch(f, "no gradient for leaf %" PRIu64 ": %d (%s)",
				 id, rc_get, adg_strerror(rc_get));
		expect_of(f, "gradient of leaf", id, *(uint64_t *)v,
			  e->grad[id]);
	}
	expect_rc(f, "adg_grads_free", adg_grads_free(out), 0);
}

/* A backward with a ready hook, chosen by s (see driver.h). */
static void do_backward_hook(struct fuzz *f, size_t i, uint8_t s,
			     enum exec_mode mode, bool retain)
{
	unsigned rule = (s >> 1) & 3;
	for (uint64_t id = 0; id <= MODEL_MAX_NODES; id++)
		f->takes[id] = rule == 3 || (rule == 1 && id % 2 == 0) ||
			       (rule == 2 && id % 3 == 0);
	struct model_hook hook = {.leaves_only = s & 1, .takes = f->takes};
	do_backward(f, i, 2 * (uint64_t)s + 1, &hook, mode, retain);
}

static void do_stats(struct fuzz *f)
{
	/* check_all compares every field after every operation; this kind
	 * exists so that inputs can ask for it between other operations. */
	struct adg_stats st = {.size = sizeof st};
	expect_rc(f, "adg_registry_stats", adg_registry_stats(f->reg, &st), 0);
	f->cov.stats++;
}

static void do_graph(struct fuzz *f, size_t i)
{
	uint64_t graph = UINT64_MAX;
	expect_rc(f, "adg_node_graph_id",
		  adg_node_graph_id(f->h[i].node, &graph), 0);
	expect_u64(f, "graph id", graph, model_graph_id(&f->model, f->h[i].id));
	f->cov.graph_queries++;
}

/* ---------------------------------------------------------------- run */

/* The kinds, in ops.def's order, with their argument bytes and names. */
static const struct op_info {
	enum adg_fuzz_op kind; /* its first code */
	unsigned count, args;
	const char *name;
} op_table[] = {
#define OP(name, first, count, args, text)                                     \
	{ADG_FUZZ_##name, (count), (args), (text)},
#include "ops.def"
#undef OP
};

static const struct op_info *decode(uint8_t byte)
{
	unsigned code = byte % ADG_FUZZ_OPCODES;
	size_t i = 0;
	while (code >= op_table[i].kind + op_table[i].count)
		i++;
	return &op_table[i];
}

/* Whether an operation of this kind is skipped now: it needs a handle and
 * there is none, or makes one and there is no room. */
static bool skipped(const struct fuzz *f, enum adg_fuzz_op kind)
{
	bool full = f->nh == ADG_FUZZ_MAX_HANDLES, empty = f->nh == 0;
	switch (kind) {
	case ADG_FUZZ_LEAF:
		return full;
	case ADG_FUZZ_OP:
	case ADG_FUZZ_OP_WITH:
	case ADG_FUZZ_REF:
		return full || empty;
	case ADG_FUZZ_STATS:
		return false;
	case ADG_FUZZ_DROP:
	case ADG_FUZZ_BACKWARD:
	case ADG_FUZZ_BACKWARD_HOOK:
	case ADG_FUZZ_GRAPH:
	case ADG_FUZZ_BACKWARD_NEWEST:
		return empty;
	}
	return true;
}

/* Decodes and runs one operation at *pos; returns false at the end of the
 * input. */
static bool step_once(struct fuzz *f, const uint8_t *data, size_t size,
		      size_t *pos)
{
	if (*pos >= size)
		return false;
	size_t start = *pos;
	const struct op_info *op = decode(data[(*pos)++]);
	if (size - *pos < op->args)
		return false;
	const uint8_t *arg = data + *pos;
	*pos += op->args;
	if (op->kind == ADG_FUZZ_OP || op->kind == ADG_FUZZ_OP_WITH) {
		size_t n = 1 + arg[0] % 3; /* then the parents' indices */
		if (size - *pos < n)
			return false;
		*pos += n;
	}

	/* The handle an operation names by its first argument. */
	size_t i = op->args > 0 && f->nh > 0 ? arg[0] % f->nh : 0;
	/* A backward's W, and whether it is retained: its last argument
	 * byte x (driver.h). Decoded for every kind, used by backwards only. */
	uint8_t x = op->args > 0 ? arg[op->args - 1] : 0;
	enum exec_mode mode = (enum exec_mode)(x % ADG_FUZZ_EXEC_MODES);
	bool retain = x / ADG_FUZZ_EXEC_MODES % 2 == 1;
	bool skip = skipped(f, op->kind);
	f->op_name = op->name;
	f->op_start = start;
	f->op_end = *pos;
	f->op_skipped = skip;
	if (f->trace) {
		fprintf(stderr, "adg-fuzz: ");
		describe(f, stderr);
		fputc('\n', stderr);
	}
	if (!skip) {
		f->cov.ops_run++;
		switch (op->kind) {
		case ADG_FUZZ_LEAF:
			do_leaf(f, arg[0]);
			break;
		case ADG_FUZZ_OP:
			do_op(f, arg[0], arg + 1);
			break;
		case ADG_FUZZ_OP_WITH:
			do_op_with(f, arg[0], arg[1], arg + 2);
			break;
		case ADG_FUZZ_REF:
			do_ref(f, i);
			break;
		case ADG_FUZZ_DROP:
			do_drop(f, i);
			break;
		case ADG_FUZZ_BACKWARD:
			do_backward(f, i, 2 * (uint64_t)arg[1] + 1, NULL, mode,
				    retain);
			break;
		case ADG_FUZZ_BACKWARD_HOOK:
			do_backward_hook(f, i, arg[1], mode, retain);
			break;
		case ADG_FUZZ_STATS:
			do_stats(f);
			break;
		case ADG_FUZZ_GRAPH:
			do_graph(f, i);
			break;
		case ADG_FUZZ_BACKWARD_NEWEST:
			do_backward(f, f->nh - 1, 1, NULL, mode, retain);
			break;
		}
	}
	check_all(f);
	return true;
}

size_t adg_fuzz_run(const uint8_t *data, size_t size,
		    struct adg_fuzz_coverage *cov)
{
	struct fuzz *f = xmalloc(sizeof *f);
	memset(f, 0, sizeof *f);
	const char *trace = getenv("ADG_FUZZ_TRACE");
	f->trace = trace != NULL && trace[0] == '1';
	f->ops = (adg_grad_ops){box_add, box_free, f};
	/* The header byte, if any: the strategy. */
	adg_registry_options options = {
		.size = sizeof options,
		.checkpointing = size > 0 && (data[0] & 1)
					 ? ADG_CHECKPOINT_BALANCED
					 : ADG_CHECKPOINT_NONE,
	};
	model_init(&f->model, options.checkpointing);
	f->cov.balanced = options.checkpointing == ADG_CHECKPOINT_BALANCED;
	f->data = data;
	f->op_name = "adg_registry_new";
	expect_rc(f, "adg_registry_new", adg_registry_new(&options, &f->reg),
		  0);

	size_t pos = size > 0 ? 1 : 0, ran = 0;
	while (ran < ADG_FUZZ_MAX_OPS) {
		f->op_index = ran;
		if (!step_once(f, data, size, &pos))
			break;
		ran++;
	}

	/* Drop every handle, newest first, checking as we go: whatever is
	 * left must then be freed. */
	f->op_index = ran;
	while (f->nh > 0) {
		f->op_name = "final drop";
		f->op_end = 0;
		do_drop(f, f->nh - 1);
		check_all(f);
		f->op_index++;
	}
	struct model_stats want;
	model_stats(&f->model, &want);
	if (want.live_nodes != 0 || want.live_steps != 0 ||
	    want.live_graphs != 0)
		mismatch(f, "the model kept nodes without handles");
	f->op_name = "adg_registry_free";
	expect_rc(f, "adg_registry_free", adg_registry_free(f->reg), 0);
	expect_u64(f, "step closures leaked", (uint64_t)f->steps_live, 0);
	expect_u64(f, "gradient boxes leaked", (uint64_t)f->boxes_live, 0);
	expect_u64(f, "outputs leaked", (uint64_t)f->outputs_live, 0);
	if (cov != NULL) {
		f->cov.merges = f->model.merges;
#define ADG_FUZZ_ADD(name) cov->name += f->cov.name;
		ADG_FUZZ_COVERAGE(ADG_FUZZ_ADD)
#undef ADG_FUZZ_ADD
		for (size_t w = 0; w < ADG_FUZZ_EXEC_MODES; w++)
			for (size_t r = 0; r < 2; r++)
				cov->by_mode[w][r] += f->cov.by_mode[w][r];
	}
	free(f);
	return ran;
}
