/*
 * The reference model: see model.h. Reference counts are not kept but
 * recomputed from their definition each time something may have been freed,
 * and graph membership is a label (the graph's origin) on each node, so
 * there is no bookkeeping that could drift out of step with the rules.
 *
 * Checkpointing, likewise, keeps no request counts. An output is held
 * from its forward (unless the balanced strategy drops it at once) or from
 * its rebuild, and goes as soon as nothing needs it any more: when the
 * backward takes its tape, when the last step that asked for it returns
 * or the last planned rebuild of a child is done or will not happen, at
 * the end of the backward, or with its node freed unrun. in_use states
 * "needs" from its definition each time. A retained backward frees none:
 * release does nothing in it, and model_backward_end neither.
 */
#include "model.h"

#include <adg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A model that is misused is a bug in the fuzzer, not in libadg. */
#define MODEL_CHECK(cond)                                                      \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, "model: %s:%d: %s\n", __FILE__,        \
				__LINE__, #cond);                              \
			abort();                                               \
		}                                                              \
	} while (0)

void model_init(struct model *m, int checkpointing)
{
	memset(m, 0, sizeof *m);
	m->next_id = 1;
	m->checkpointing = checkpointing;
}

static struct model_node *live_node(struct model *m, uint64_t id)
{
	MODEL_CHECK(id >= 1 && id < m->next_id);
	MODEL_CHECK(m->node[id].alive);
	return &m->node[id];
}

static bool offers(const struct model_node *n)
{
	return n->out.value || n->out.recompute;
}

/* An output value of n is freed. */
static void free_output(struct model_node *n)
{
	MODEL_CHECK(n->held);
	n->held = false;
	n->frees++;
}

/* A node that still holds its step (and with it its parents). */
static bool holds_step(const struct model_node *n)
{
	return n->alive && !n->leaf && !n->consumed;
}

static uint64_t new_id(struct model *m)
{
	MODEL_CHECK(m->next_id <= MODEL_MAX_NODES);
	return m->next_id++;
}

uint64_t model_leaf(struct model *m, uint64_t value)
{
	uint64_t id = new_id(m);
	struct model_node *n = &m->node[id];

	*n = (struct model_node){.exists = true,
				 .alive = true,
				 .leaf = true,
				 .value = value,
				 .handles = 1};
	return id;
}

unsigned model_outputs_alive(const struct model *m, uint64_t id)
{
	return m->node[id].held + (m->deferred == id);
}

void model_free_deferred(struct model *m)
{
	if (m->deferred != 0)
		m->node[m->deferred].frees++;
	m->deferred = 0;
}

uint64_t model_op(struct model *m, const uint64_t *parents, size_t n_parents,
		  bool fails)
{
	MODEL_CHECK(n_parents >= 1 && n_parents <= MODEL_MAX_PARENTS);
	uint64_t value = 1;
	uint32_t depth = 0;
	/* The graphs to join: those of the parents that still hold a step.
	 * Leaves are in none, consumed nodes left theirs. */
	uint64_t graphs[MODEL_MAX_PARENTS];
	size_t n_graphs = 0;

	for (size_t i = 0; i < n_parents; i++) {
		const struct model_node *p = live_node(m, parents[i]);
		value *= p->value; /* modulo 2^64 */
		if (p->depth > depth)
			depth = p->depth;
		if (!holds_step(p))
			continue;
		size_t j = 0;
		while (j < n_graphs && graphs[j] != p->graph)
			j++;
		if (j == n_graphs)
			graphs[n_graphs++] = p->graph;
	}

	uint64_t id = new_id(m);
	/* The op succeeds: the last op's dropped output goes. */
	model_free_deferred(m);
	uint64_t graph = id; /* no graph found: a new one, origin id */
	if (n_graphs > 0) {
		graph = graphs[0];
		for (size_t j = 1; j < n_graphs; j++)
			if (graphs[j] < graph)
				graph = graphs[j];
		/* Several: every member of each moves to the smallest
		 * origin. */
		for (uint64_t k = 1; k < id; k++)
			for (size_t j = 0; j < n_graphs; j++)
				if (holds_step(&m->node[k]) &&
				    m->node[k].graph == graphs[j])
					m->node[k].graph = graph;
		m->merges += n_graphs - 1;
	}

	struct model_node *n = &m->node[id];
	*n = (struct model_node){.exists = true,
				 .alive = true,
				 .fails = fails,
				 .value = value,
				 .depth = depth + 1,
				 .n_parents = n_parents,
				 .graph = graph,
				 .handles = 1};
	memcpy(n->parents, parents, n_parents * sizeof *parents);
	return id;
}

uint64_t model_op_with(struct model *m, const uint64_t *parents, size_t n,
		       bool fails, const struct model_output *out, int *rc)
{
	bool offering = out->value || out->recompute;
	/* Whether a node offers an output is fixed when it is made: a leaf
	 * offers none, a consumed node still does. */
	bool valid = offering || !out->want_self;
	for (size_t w = 0; w < out->n_want; w++) {
		MODEL_CHECK(out->want[w] < n);
		valid = valid && offers(live_node(m, parents[out->want[w]]));
	}
	/* A rebuild needs the outputs of the parents that are not leaves. */
	for (size_t k = 0; k < n && out->recompute; k++) {
		const struct model_node *p = live_node(m, parents[k]);
		valid = valid && (p->leaf || offers(p));
	}
	if (!valid) {
		*rc = ADG_EINVAL; /* nothing changes, node ids included */
		return 0;
	}

	uint64_t id = model_op(m, parents, n, fails);
	struct model_node *node = &m->node[id];
	node->out = *out;
	node->held = out->value;
	/* Balanced drops at once what it can rebuild cheaply, from the node;
	 * the forward keeps it until the next op or backward succeeds. */
	if (out->value && out->recompute && out->memory_bound &&
	    m->checkpointing == ADG_CHECKPOINT_BALANCED) {
		node->held = false;
		m->deferred = id;
	}
	*rc = 0;
	return id;
}

bool model_asks(const struct model *m, uint64_t step, uint64_t target)
{
	MODEL_CHECK(step >= 1 && step < m->next_id);
	const struct model_node *n = &m->node[step];
	if (target == step)
		return n->out.want_self;
	for (size_t w = 0; w < n->out.n_want; w++)
		if (n->parents[n->out.want[w]] == target)
			return true;
	return false;
}

/* References on every node, from their definition: the caller's handles,
 * plus one per parent slot naming it in every node that still holds its
 * step. Leaves are never counted by their children. */
static void count_refs(const struct model *m, uint64_t *refs)
{
	for (uint64_t k = 1; k < m->next_id; k++)
		refs[k] = m->node[k].handles;
	for (uint64_t k = 1; k < m->next_id; k++) {
		const struct model_node *c = &m->node[k];
		if (!holds_step(c))
			continue;
		for (size_t i = 0; i < c->n_parents; i++)
			if (!m->node[c->parents[i]].leaf)
				refs[c->parents[i]]++;
	}
}

/* Frees every node without a reference, until none is left: freeing a node
 * that held its step drops its references on its parents, which may free
 * them in turn. A round visits ids from the highest down, and a parent's id
 * is below its children's, so one round follows a whole cascade; the next
 * round, recounted from scratch, must find nothing. (Freeing one at a time
 * or many at once reaches the same fixpoint: a freed node never comes
 * back.) */
static void collect(struct model *m)
{
	uint64_t refs[MODEL_MAX_NODES + 1];
	bool freed;

	do {
		freed = false;
		count_refs(m, refs);
		for (uint64_t k = m->next_id - 1; k >= 1; k--) {
			struct model_node *n = &m->node[k];
			if (!n->alive || refs[k] != 0)
				continue;
			if (holds_step(n)) {
				for (size_t i = 0; i < n->n_parents; i++)
					if (!m->node[n->parents[i]].leaf)
						refs[n->parents[i]]--;
				/* Freed unrun, or run by retained backward
				 * passes only. (A consumed node's output goes
				 * at the end of the backward that took it.) */
				if (n->held)
					free_output(n);
			}
			n->alive = false;
			n->graph = 0;
			m->nodes_freed++;
			freed = true;
		}
	} while (freed);
}

void model_ref(struct model *m, uint64_t id)
{
	live_node(m, id)->handles++;
}

void model_unref(struct model *m, uint64_t id)
{
	struct model_node *n = live_node(m, id);

	MODEL_CHECK(n->handles > 0);
	n->handles--;
	collect(m);
}

uint64_t model_graph_id(const struct model *m, uint64_t id)
{
	MODEL_CHECK(id >= 1 && id < m->next_id && m->node[id].alive);
	const struct model_node *n = &m->node[id];
	return holds_step(n) ? n->graph : 0;
}

bool model_step_released(const struct model *m, uint64_t id)
{
	MODEL_CHECK(id >= 1 && id < m->next_id);
	const struct model_node *n = &m->node[id];
	return n->exists && !n->leaf && (n->consumed || !n->alive);
}

void model_stats(const struct model *m, struct model_stats *out)
{
	bool origin_seen[MODEL_MAX_NODES + 1] = {0};

	memset(out, 0, sizeof *out);
	for (uint64_t k = 1; k < m->next_id; k++) {
		const struct model_node *n = &m->node[k];
		if (!n->alive)
			continue;
		out->live_nodes++;
		if (!holds_step(n))
			continue;
		out->live_steps++;
		/* A graph lives while some node in it holds its step. */
		if (!origin_seen[n->graph]) {
			origin_seen[n->graph] = true;
			out->live_graphs++;
		}
	}
	out->merges = m->merges;
	out->nodes_freed = m->nodes_freed;
}

/* The hook, if any, sees id's final gradient: marks whether it does and
 * whether it takes it. */
static void finalise(const struct model *m, const struct model_hook *hook,
		     uint64_t id, struct model_backward *out)
{
	if (hook == NULL || (hook->leaves_only && !m->node[id].leaf))
		return;
	out->fires[id] = true;
	out->taken[id] = out->has_grad[id] && hook->takes[id];
}

uint64_t model_fold(const struct model *m, uint64_t id)
{
	const struct model_node *n = &m->node[id];
	uint64_t sum = 0;
	if (!n->out.gets)
		return 0;
	if (n->out.want_self)
		sum += n->value;
	for (size_t w = 0; w < n->out.n_want; w++)
		sum += m->node[n->parents[n->out.want[w]]].value;
	return sum;
}

/* Which outputs of the tape anything in backward b still needs: those a
 * step of the tape asked for and has not returned from, and those a
 * planned rebuild of a child reads, while that rebuild has not happened
 * and the child's output is itself still needed (a rebuild no one needs
 * any more will not happen). A child has a larger id than its parents:
 * from the highest down, a node's children are decided before it. */
static void in_use(const struct model *m, const struct model_backward *b,
		   bool *use)
{
	for (uint64_t o = m->next_id - 1; o >= 1; o--) {
		use[o] = false;
		for (uint64_t s = o; s < m->next_id && !use[o]; s++) {
			if (!b->on_tape[s])
				continue;
			if (!b->done[s] && model_asks(m, s, o))
				use[o] = true;
			const struct model_node *n = &m->node[s];
			bool reads = b->planned[s] && !b->built[s] && use[s];
			for (size_t k = 0; k < n->n_parents && reads; k++)
				use[o] = use[o] || n->parents[k] == o;
		}
	}
}

/* Every held output of the tape that nothing needs goes; returns how many
 * went. In a retained backward none goes: they are kept for the passes
 * after it. */
static unsigned release(struct model *m, const struct model_backward *b)
{
	bool use[MODEL_MAX_NODES + 1];
	unsigned freed = 0;

	if (b->retained)
		return 0;
	in_use(m, b, use);
	for (uint64_t k = 1; k < m->next_id; k++) {
		if (b->on_tape[k] && m->node[k].held && !use[k]) {
			free_output(&m->node[k]);
			freed++;
		}
	}
	return freed;
}

/* Which outputs the tape needs, which of them must be rebuilt, and the
 * take itself: a held output no one needs goes now. */
static void take_outputs(struct model *m, struct model_backward *b)
{
	for (uint64_t s = 1; s < m->next_id; s++) {
		const struct model_node *n = &m->node[s];
		if (!b->on_tape[s])
			continue;
		if (n->out.want_self)
			b->needed[s] = true;
		for (size_t w = 0; w < n->out.n_want; w++)
			b->needed[n->parents[n->out.want[w]]] = true;
	}
	/* A child has a larger id than its parents: from the highest down,
	 * a node's need is complete when its turn comes. */
	for (uint64_t k = m->next_id - 1; k >= 1; k--) {
		const struct model_node *n = &m->node[k];
		if (!b->on_tape[k] || !b->needed[k] || n->held)
			continue;
		/* Balanced dropped it, or it offered none: it can rebuild. */
		MODEL_CHECK(n->out.recompute);
		b->planned[k] = true;
		for (size_t i = 0; i < n->n_parents; i++)
			if (!m->node[n->parents[i]].leaf)
				b->needed[n->parents[i]] = true;
	}
	b->freed_at_take += release(m, b);
}

/* The tape's order (model.h): the walk first, breadth first from the root
 * through parent slots in order, to find the tape and count each node's
 * links (the tape's slots that name it); then from the root, each node
 * placed once its last link is met, the placed waiting on a stack: last
 * in, first out, a node's parents pushed in slot order. */
static void order_tape(const struct model *m, uint64_t root,
		       struct model_backward *out)
{
	bool seen[MODEL_MAX_NODES + 1] = {0};
	unsigned links[MODEL_MAX_NODES + 1] = {0};
	uint64_t stack[MODEL_MAX_NODES];
	size_t n = 0, top = 0, placed = 0;

	out->tape[n++] = root;
	seen[root] = true;
	for (size_t i = 0; i < n; i++) {
		const struct model_node *c = &m->node[out->tape[i]];
		for (size_t k = 0; k < c->n_parents; k++) {
			uint64_t p = c->parents[k];
			if (m->node[p].leaf)
				continue;
			links[p]++;
			if (seen[p])
				continue;
			MODEL_CHECK(out->on_tape[p]);
			seen[p] = true;
			out->tape[n++] = p;
		}
	}
	stack[top++] = root;
	while (top > 0) {
		uint64_t id = stack[--top];
		const struct model_node *c = &m->node[id];
		out->tape[placed++] = id;
		for (size_t k = 0; k < c->n_parents; k++) {
			uint64_t p = c->parents[k];
			if (!m->node[p].leaf && --links[p] == 0)
				stack[top++] = p;
		}
	}
	MODEL_CHECK(placed == n);
	out->n_tape = n;
	for (size_t i = 0; i < n; i++)
		out->pos[out->tape[i]] = i;
	for (uint64_t k = 1; k < m->next_id; k++)
		MODEL_CHECK(seen[k] == out->on_tape[k]);
}

void model_backward(struct model *m, uint64_t root, uint64_t seed,
		    const struct model_hook *hook, bool retain,
		    struct model_backward *out)
{
	struct model_node *r = live_node(m, root);

	memset(out, 0, sizeof *out);
	out->retained = retain;
	if (r->leaf) {
		out->has_grad[root] = true;
		out->grad[root] = seed;
		/* A leaf root is a leaf: leaves_only or not, the hook sees
		 * it. */
		if (hook != NULL) {
			out->fires[root] = true;
			out->taken[root] = hook->takes[root];
		}
		out->n_leaf_grads = out->taken[root] ? 0 : 1;
		return;
	}
	if (r->consumed) {
		out->rc = ADG_ECONSUMED;
		return;
	}

	/* The tape: every non-leaf node reachable from root through parent
	 * slots of nodes that still hold their step. Reaching a consumed one
	 * makes the whole backward unavailable, retained or not. */
	uint64_t stack[MODEL_MAX_NODES];
	size_t top = 0;
	bool unavailable = false;
	out->on_tape[root] = true;
	stack[top++] = root;
	while (top > 0) {
		const struct model_node *n = &m->node[stack[--top]];
		for (size_t i = 0; i < n->n_parents; i++) {
			uint64_t p = n->parents[i];
			/* A leaf may be freed by now: only its id and value
			 * are used. */
			const struct model_node *pn = &m->node[p];
			if (pn->leaf || out->on_tape[p])
				continue;
			MODEL_CHECK(pn->alive); /* n holds it */
			if (pn->consumed) {
				unavailable = true;
				continue;
			}
			out->on_tape[p] = true;
			stack[top++] = p;
		}
	}
	if (unavailable) {
		memset(out->on_tape, 0, sizeof out->on_tape);
		out->rc = ADG_EUNAVAILABLE;
		return;
	}
	order_tape(m, root, out);

	/* Gradients, as if every step ran. Any order in which each node comes
	 * after all of its children will do, and ids give one: a child is
	 * created after its parents. So when k comes up, its gradient is
	 * final: the hook sees it, and may take it, before k's step runs. A
	 * step called with no gradient gives none (the fuzzer's steps
	 * do so). The arithmetic is modulo 2^64, exact in any order. */
	out->has_grad[root] = true;
	out->grad[root] = seed;
	for (uint64_t k = m->next_id - 1; k >= 1; k--) {
		const struct model_node *n = &m->node[k];
		if (!out->on_tape[k])
			continue;
		finalise(m, hook, k, out);
		if (!out->has_grad[k] || out->taken[k])
			continue;
		for (size_t i = 0; i < n->n_parents; i++) {
			uint64_t g = out->grad[k];
			for (size_t j = 0; j < n->n_parents; j++)
				if (j != i)
					g *= m->node[n->parents[j]].value;
			uint64_t p = n->parents[i];
			MODEL_CHECK(p < k);
			out->has_grad[p] = true;
			out->grad[p] += g + model_fold(m, k);
		}
	}
	/* Leaves are final once every tape node ran: the hook sees each
	 * leaf named by a tape node, with a gradient or without. */
	for (uint64_t k = 1; k < m->next_id; k++) {
		const struct model_node *n = &m->node[k];
		if (!out->on_tape[k])
			continue;
		for (size_t i = 0; i < n->n_parents; i++)
			if (m->node[n->parents[i]].leaf)
				finalise(m, hook, n->parents[i], out);
	}
	for (uint64_t k = 1; k < m->next_id; k++)
		if (m->node[k].leaf && out->has_grad[k] && !out->taken[k])
			out->n_leaf_grads++;

	take_outputs(m, out);
	for (uint64_t k = 1; k < m->next_id; k++)
		out->held_at_take[k] = out->on_tape[k] && m->node[k].held;
	/* A retained backward takes nothing: every tape node stays in its
	 * graph with its step and its references. */
	if (retain)
		return;
	/* Consumed, ran or not: each tape node leaves its graph and gives
	 * up its step and its references on its parents. Their outputs stay
	 * with the backward until model_backward_end. */
	for (uint64_t k = 1; k < m->next_id; k++) {
		if (!out->on_tape[k])
			continue;
		m->node[k].consumed = true;
		m->node[k].graph = 0;
	}
	collect(m);
}

void model_step_begin(struct model *m, struct model_backward *b, uint64_t id)
{
	MODEL_CHECK(id >= 1 && id < m->next_id);
	MODEL_CHECK(b->rc == 0 && b->on_tape[id] && !b->ran[id]);
	b->ran[id] = true;
	m->node[id].runs++;
}

/* Rebuilds o's output if it is not held: first its parents' that are not,
 * in slot order, as libadg does (the order decides which of two failing
 * recomputes runs). Returns 0, or the node whose recompute failed. */
static uint64_t build(struct model *m, struct model_backward *b, uint64_t o)
{
	struct model_node *n = &m->node[o];
	if (n->held)
		return 0;
	/* Not held, yet asked for now: the take planned to rebuild it. Once:
	 * it stays held while anything needs it (retained: to the end). */
	MODEL_CHECK(b->planned[o] && !b->built[o]);
	for (size_t k = 0; k < n->n_parents; k++) {
		if (m->node[n->parents[k]].leaf)
			continue;
		uint64_t failed = build(m, b, n->parents[k]);
		if (failed != 0)
			return failed;
	}
	n->recomputes++;
	if (n->out.recompute_fails) {
		n->frees += n->out.recompute_sets_output;
		return o;
	}
	n->held = true;
	b->built[o] = true;
	release(m, b);
	return 0;
}

uint64_t model_output_get(struct model *m, struct model_backward *b,
			  uint64_t step, uint64_t target)
{
	MODEL_CHECK(b->ran[step] && !b->done[step] && b->failed_step == 0);
	MODEL_CHECK(model_asks(m, step, target));
	uint64_t failed = build(m, b, target);
	/* The step returns the get's code: it is the one that fails. */
	if (failed != 0)
		b->failed_recompute = failed;
	return failed;
}

void model_step_end(struct model *m, struct model_backward *b, uint64_t id)
{
	const struct model_node *n = &m->node[id];
	MODEL_CHECK(b->ran[id] && !b->done[id] && b->failed_step == 0);
	b->done[id] = true;
	if (n->fails || b->failed_recompute != 0)
		b->failed_step = id;
	release(m, b);
}

void model_backward_end(struct model *m, struct model_backward *b)
{
	/* Retained: what it held before and what it rebuilt stay, for the
	 * passes after it, until a consuming backward or the node's end. */
	if (b->retained)
		return;
	for (uint64_t k = 1; k < m->next_id; k++) {
		if (b->on_tape[k] && m->node[k].held) {
			free_output(&m->node[k]);
			b->freed_at_end++;
		}
	}
}

uint64_t model_get_fails(const struct model *m, const struct model_backward *b,
			 uint64_t target)
{
	const struct model_node *n = &m->node[target];
	MODEL_CHECK(b->rc == 0 && b->on_tape[target]);
	if (b->held_at_take[target])
		return 0;
	MODEL_CHECK(b->planned[target]);
	for (size_t k = 0; k < n->n_parents; k++) {
		if (m->node[n->parents[k]].leaf)
			continue;
		uint64_t failed = model_get_fails(m, b, n->parents[k]);
		if (failed != 0)
			return failed;
	}
	return n->out.recompute_fails ? target : 0;
}

void model_run_tape(struct model *m, struct model_backward *b)
{
	MODEL_CHECK(b->rc == 0);
	for (size_t i = 0; i < b->n_tape && b->failed_step == 0; i++) {
		uint64_t id = b->tape[i];
		const struct model_node *n = &m->node[id];
		model_step_begin(m, b, id);
		/* As the fuzzer's steps get them: their own, then their
		 * slots', up to the first that fails. */
		bool failed = false;
		if (n->out.gets && n->out.want_self)
			failed = model_output_get(m, b, id, id) != 0;
		for (size_t w = 0; n->out.gets && w < n->out.n_want && !failed;
		     w++)
			failed = model_output_get(m, b, id,
						  n->parents[n->out.want[w]]) !=
				 0;
		model_step_end(m, b, id);
	}
}

void model_backward_late(struct model *m, const struct model_backward *b,
			 uint64_t id, uint64_t runs, uint64_t frees,
			 uint64_t recomputes, bool held)
{
	struct model_node *n = &m->node[id];
	MODEL_CHECK(b->rc == 0 && b->failed_step != 0 && b->on_tape[id]);
	/* A late step runs after the failure, never in place of a step that
	 * ran before it. */
	MODEL_CHECK(runs == 0 || !b->ran[id]);
	MODEL_CHECK(runs <= 1);
	/* Consuming: every output of the tape went at the end. Retained:
	 * none goes, and one a late step rebuilt stays. */
	MODEL_CHECK(b->retained ? !n->held || held : !n->held && !held);
	MODEL_CHECK(held == n->held || recomputes > 0);
	n->runs += runs;
	n->frees += frees;
	n->recomputes += recomputes;
	n->held = held;
}
