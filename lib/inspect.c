/*
 * Seeing a graph: a copy of one graph's ops taken under its lock, then
 * visited, or written as Graphviz DOT, with no lock held.
 *
 * The copy is all that is read: the lock is held only while the members
 * are counted and copied, so writers on other threads wait no longer than
 * a copy takes, and user code (the visitor, the writer) runs unlocked.
 * Every unconsumed parent of a member is a member too (I3), so comparing
 * a parent's graph pointer with the locked graph tells an op from a
 * consumed one, without reading anything else of it.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A parent that is not an op of the graph. */
struct other {
	uint64_t id;
	bool consumed; /* else a leaf */
};

/* One graph as it was: its ops, each with its parents' ids and kinds in
 * the shared arrays below. */
struct snapshot {
	struct adg_registry *registry;
	uint64_t graph_id;
	size_t n_ops, n_slots;
	adg_graph_node *ops;
	uint64_t *parent_ids;
	uint8_t *parent_kinds;
	/* Scratch for the DOT writer: the parents that are not ops. */
	struct other *others;
};

static size_t snapshot_bytes(size_t n_ops, size_t n_slots)
{
	return n_ops * sizeof(adg_graph_node) +
	       n_slots * (sizeof(struct other) + sizeof(uint64_t) +
			  sizeof(uint8_t));
}

static void snapshot_free(struct snapshot *s)
{
	if (s->ops != NULL)
		adg_free(s->registry, s->ops,
			 snapshot_bytes(s->n_ops, s->n_slots));
}

/* Depth, then id: parents (shallower) first, and one order for a given
 * graph whatever the member list's. */
static int snapshot_by_depth_then_id(const void *a, const void *b)
{
	const adg_graph_node *x = a, *y = b;
	if (x->depth != y->depth)
		return x->depth < y->depth ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

static int snapshot_take(adg_node *node, struct snapshot *s, const char *func)
{
	*s = (struct snapshot){.registry = adg_node_registry_of(node)};
	if (adg_node_is_leaf(node)) /* a leaf is in no graph */
		return adg_fail(ADG_EINVAL, func,
				"node %" PRIu64 " is a leaf, in no graph",
				node->id);
	struct adg_graph *g = adg_graph_lock_of(node);
	if (g == NULL)
		return adg_fail(ADG_ECONSUMED, func,
				"node %" PRIu64 "'s step was consumed: it is "
				"in no graph",
				node->id);
	struct adg_node *m;
	cds_list_for_each_entry (m, &g->members, link)
		s->n_slots += m->n_parents;
	s->n_ops = g->n_members;
	/* One block, from the registry's allocator; the graph stays locked
	 * for the copy only. */
	void *block =
		adg_alloc(s->registry, snapshot_bytes(s->n_ops, s->n_slots));
	if (block == NULL) {
		adg_graph_unlock_plain(g);
		return adg_fail(ADG_ENOMEM, func,
				"the allocator gave no memory for a copy of "
				"the graph (%zu ops)",
				s->n_ops);
	}
	s->ops = block;
	/* Widest alignment first: ops, others, ids, kinds. */
	s->others = (struct other *)(s->ops + s->n_ops);
	s->parent_ids = (uint64_t *)(s->others + s->n_slots);
	s->parent_kinds = (uint8_t *)(s->parent_ids + s->n_slots);
	/* Relaxed: the origin changes only under the lock, held here. */
	s->graph_id = atomic_load_explicit(&g->origin, memory_order_relaxed);
	size_t i = 0, slot = 0;
	cds_list_for_each_entry (m, &g->members, link) {
		s->ops[i++] = (adg_graph_node){
			.graph_id = s->graph_id,
			.id = m->id,
			.name = m->kind->name,
			.depth = m->depth,
			.n_parents = m->n_parents,
			.parent_ids = &s->parent_ids[slot],
			.parent_kinds = &s->parent_kinds[slot],
		};
		for (uint32_t k = 0; k < m->n_parents; k++, slot++) {
			/* An op parent's id from the op, which m holds (a
			 * LIVE node keeps its parents), consumed or not. */
			struct adg_node *p = adg_node_parent(m, k);
			s->parent_ids[slot] = adg_node_parent_id(m, k);
			s->parent_kinds[slot] = p == NULL ? ADG_PARENT_LEAF
						: adg_node_graph(p) == g
							? ADG_PARENT_OP
							: ADG_PARENT_CONSUMED;
		}
	}
	ADG_ASSERT(i == s->n_ops && slot == s->n_slots);
	/* Nothing was retired or taken: a plain unlock. */
	adg_graph_unlock_plain(g);
	qsort(s->ops, s->n_ops, sizeof *s->ops, snapshot_by_depth_then_id);
	return 0;
}

int adg_graph_visit(adg_node *node, adg_visit_fn visit, void *ctx)
{
	if (node == NULL || visit == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				node == NULL ? "node" : "visit");
	struct snapshot s;
	int rc = snapshot_take(node, &s, __func__);
	if (rc != 0)
		return rc;
	uint64_t since = adg_errmsg_serial();
	size_t i = 0;
	for (; rc == 0 && i < s.n_ops; i++)
		rc = adg_callback_result(visit(&s.ops[i], ctx));
	if (rc != 0)
		adg_fail_over(rc, __func__, since,
			      "visit returned %s for node %" PRIu64,
			      adg_code_text(rc, (char[32]){0}),
			      s.ops[i - 1].id);
	snapshot_free(&s);
	return rc;
}

/* ------------------------------------------------------------------- DOT */

/* The writer and its first error; text goes out a line at a time. */
struct dot {
	adg_write_fn write;
	void *ctx;
	int rc;
};

__attribute__((format(printf, 2, 3))) static void dot_emit(struct dot *d,
							   const char *fmt, ...)
{
	char line[512];
	va_list ap;
	if (d->rc != 0)
		return;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof line)
		n = sizeof line - 1; /* the caller keeps lines short */
	d->rc = adg_callback_result(d->write(line, (size_t)n, d->ctx));
}

/* Where to cut s[0, len) so that it does not end inside a UTF-8
 * sequence: len, or the start of a last sequence whose lead byte asks for
 * more bytes than are there. Bytes that are not UTF-8 are no sequence of
 * it, and stay. */
static size_t dot_utf8_boundary(const char *s, size_t len)
{
	size_t lead = len;
	while (lead > 0 && len - lead < 3 &&
	       ((unsigned char)s[lead - 1] & 0xC0) == 0x80)
		lead--; /* back over continuation bytes */
	if (lead == 0)
		return len;
	unsigned char b = (unsigned char)s[lead - 1];
	size_t want = b >= 0xF8	  ? 1
		      : b >= 0xF0 ? 4
		      : b >= 0xE0 ? 3
		      : b >= 0xC0 ? 2
				  : 1;
	return len - (lead - 1) < want ? lead - 1 : len;
}

/* name as the inside of a DOT string: quotes and backslashes escaped,
 * control characters as spaces, at most 200 bytes of it, cut between
 * UTF-8 characters. Other bytes pass through as they are. */
static void dot_quoted(char *out, size_t size, const char *name)
{
	size_t o = 0;
	const char *c = name;
	for (; *c != '\0' && o + 3 < size && o < 200; c++) {
		if (*c == '"' || *c == '\\')
			out[o++] = '\\';
		out[o++] = (unsigned char)*c < 0x20 ? ' ' : *c;
	}
	if (*c != '\0') /* cut short */
		o = dot_utf8_boundary(out, o);
	out[o] = '\0';
}

static void dot_write_leaf(struct dot *d, unsigned long long id,
			   const adg_dot_options *options)
{
	const char *given =
		options != NULL && options->leaf_name != NULL
			? options->leaf_name(id, options->leaf_name_ctx)
			: NULL;
	if (given == NULL) {
		dot_emit(d, "  n%llu [label=\"leaf %llu\", shape=ellipse];\n",
			 id, id);
		return;
	}
	char name[256];
	dot_quoted(name, sizeof name, given);
	dot_emit(d, "  n%llu [label=\"%s (leaf %llu)\", shape=ellipse];\n", id,
		 name, id);
}

static int dot_by_id(const void *a, const void *b)
{
	uint64_t x = ((const struct other *)a)->id;
	uint64_t y = ((const struct other *)b)->id;
	return (x > y) - (x < y);
}

/* Declares each parent that is not an op once, in id order: a leaf as an
 * ellipse, named when the options name it, a consumed op as a dashed box. */
static void dot_write_others(struct dot *d, struct snapshot *s,
			     const adg_dot_options *options)
{
	size_t n = 0;
	for (size_t slot = 0; slot < s->n_slots; slot++)
		if (s->parent_kinds[slot] != ADG_PARENT_OP)
			s->others[n++] = (struct other){
				s->parent_ids[slot],
				s->parent_kinds[slot] == ADG_PARENT_CONSUMED};
	qsort(s->others, n, sizeof *s->others, dot_by_id);
	for (size_t i = 0; i < n; i++) {
		unsigned long long id = s->others[i].id;
		if (i > 0 && s->others[i - 1].id == id)
			continue;
		if (s->others[i].consumed)
			dot_emit(d,
				 "  n%llu [label=\"%llu (consumed)\", "
				 "style=dashed];\n",
				 id, id);
		else
			dot_write_leaf(d, id, options);
	}
}

/* An edge from each parent to op, in slot order. With two parents or
 * more each is labelled with its slot, so that the left and right of a
 * subtraction (or the two slots of x * x) can be told apart; an op of
 * one parent has nothing to tell, and its edge stays bare. */
static void dot_write_edges(struct dot *d, const adg_graph_node *op)
{
	for (size_t k = 0; k < op->n_parents; k++) {
		unsigned long long from = op->parent_ids[k], to = op->id;
		if (op->n_parents == 1)
			dot_emit(d, "  n%llu -> n%llu;\n", from, to);
		else
			dot_emit(d, "  n%llu -> n%llu [label=\"%zu\"];\n", from,
				 to, k);
	}
}

static int dot_write_graph(const char *func, adg_node *node,
			   const adg_dot_options *options, adg_write_fn write,
			   void *ctx)
{
	if (node == NULL || write == NULL)
		return adg_fail(ADG_EINVAL, func, "%s is NULL",
				node == NULL ? "node" : "write");
	adg_dot_options o;
	if (options != NULL) {
		int rc = ADG_ABI_READ(func, "options", &o, options,
				      ADG_ABI_FIRST_DOT_OPTIONS);
		if (rc != 0)
			return rc;
		options = &o;
	}
	struct snapshot s;
	int rc = snapshot_take(node, &s, func);
	if (rc != 0)
		return rc;
	uint64_t since = adg_errmsg_serial();
	struct dot d = {.write = write, .ctx = ctx};
	dot_emit(&d, "digraph adg_graph_%llu {\n",
		 (unsigned long long)s.graph_id);
	dot_emit(&d, "  label=\"graph %llu\";\n  node [shape=box];\n",
		 (unsigned long long)s.graph_id);
	for (size_t i = 0; i < s.n_ops; i++) {
		const adg_graph_node *op = &s.ops[i];
		char name[256] = "";
		if (op->name != NULL)
			dot_quoted(name, sizeof name, op->name);
		dot_emit(&d, "  n%llu [label=\"%llu%s%s\\ndepth %u\"];\n",
			 (unsigned long long)op->id, (unsigned long long)op->id,
			 op->name != NULL ? " " : "", name, op->depth);
	}
	dot_write_others(&d, &s, options);
	for (size_t i = 0; i < s.n_ops; i++)
		dot_write_edges(&d, &s.ops[i]);
	dot_emit(&d, "}\n");
	snapshot_free(&s);
	if (d.rc != 0)
		adg_fail_over(d.rc, func, since, "write returned %s",
			      adg_code_text(d.rc, (char[32]){0}));
	return d.rc;
}

int adg_graph_write_dot(adg_node *node, adg_write_fn write, void *ctx)
{
	return dot_write_graph(__func__, node, NULL, write, ctx);
}

int adg_graph_write_dot_with(adg_node *node, const adg_dot_options *options,
			     adg_write_fn write, void *ctx)
{
	return dot_write_graph(__func__, node, options, write, ctx);
}
