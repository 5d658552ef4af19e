/*
 * Seeing a graph: adg_graph_visit and adg_graph_write_dot (a copy taken
 * under the graph's lock, read back here), step names, and on_step, the
 * hook around each step, with and without an executor.
 */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

FIXTURE_SUITE(inspect);
FIXTURE_SUITE(inspect_stress);
FIXTURE_SUITE(on_step);
TestSuite(inspect_alloc); /* opens its registry itself */

/* An op over parents, its step the scalar backend's product, named. */
static scalar named_op(const scalar *parents, size_t n, const char *name)
{
	adg_node *nodes[8];
	double value = 1;
	for (size_t i = 0; i < n; i++) {
		nodes[i] = parents[i].node;
		value *= parents[i].value;
	}
	adg_step step = {.backward = prod_backward,
			 .release = prod_release,
			 .user = prod_step_new(parents, n),
			 .name = name};
	scalar out = {.value = value};
	cr_assert_eq(adg_op(reg, nodes, n, &step, &out.node), 0);
	adg_node_id(out.node, &out.id);
	return out;
}

/* What a visit saw: each op's fields, copied. */
struct seen {
	size_t n;
	struct {
		uint64_t graph_id, id, depth;
		char name[32];
		size_t n_parents;
		uint64_t parent_ids[8];
		uint8_t parent_kinds[8];
	} op[64];
	int stop_after; /* 0: never; else return stop_code after that many */
	int stop_code;
};

static int record(const adg_graph_node *node, void *ctx)
{
	struct seen *s = ctx;
	cr_assert_lt(s->n, 64);
	cr_assert_leq(node->n_parents, 8);
	s->op[s->n].graph_id = node->graph_id;
	s->op[s->n].id = node->id;
	s->op[s->n].depth = node->depth;
	snprintf(s->op[s->n].name, sizeof s->op[s->n].name, "%s",
		 node->name ? node->name : "(none)");
	s->op[s->n].n_parents = node->n_parents;
	/* k < 8 again: gcc -O3 does not see the assertion bound it. */
	for (size_t k = 0; k < node->n_parents && k < 8; k++) {
		s->op[s->n].parent_ids[k] = node->parent_ids[k];
		s->op[s->n].parent_kinds[k] = node->parent_kinds[k];
	}
	s->n++;
	if (s->stop_after != 0 && (int)s->n == s->stop_after)
		return s->stop_code;
	return 0;
}

/* a, b leaves; p = a b ("mul"), q = p p ("square": a repeated parent),
 * r = q b (unnamed): one graph of three ops. */
CHECKED_TEST(inspect, visit_sees_ops_names_depths_and_parent_kinds)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar p = named_op((scalar[]){a, b}, 2, "mul");
	scalar q = named_op((scalar[]){p, p}, 2, "square");
	scalar r = named_op((scalar[]){q, b}, 2, NULL);
	struct seen s = {0};
	cr_assert_eq(adg_graph_visit(q.node, record, &s), 0);
	cr_assert_eq(s.n, 3);
	uint64_t graph;
	adg_node_graph_id(r.node, &graph);
	/* By depth: p (1), q (2), r (3). */
	uint64_t want_ids[3] = {p.id, q.id, r.id};
	const char *want_names[3] = {"mul", "square", "(none)"};
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(s.op[i].graph_id, graph);
		cr_assert_eq(s.op[i].id, want_ids[i]);
		cr_assert_eq(s.op[i].depth, (uint64_t)i + 1);
		cr_assert_str_eq(s.op[i].name, want_names[i]);
		cr_assert_eq(s.op[i].n_parents, 2);
	}
	cr_assert_eq(s.op[0].parent_ids[0], a.id);
	cr_assert_eq(s.op[0].parent_kinds[0], ADG_PARENT_LEAF);
	cr_assert_eq(s.op[0].parent_kinds[1], ADG_PARENT_LEAF);
	cr_assert_eq(s.op[1].parent_ids[0], p.id);
	cr_assert_eq(s.op[1].parent_ids[1], p.id);
	cr_assert_eq(s.op[1].parent_kinds[0], ADG_PARENT_OP);
	cr_assert_eq(s.op[1].parent_kinds[1], ADG_PARENT_OP);
	cr_assert_eq(s.op[2].parent_kinds[0], ADG_PARENT_OP);
	cr_assert_eq(s.op[2].parent_kinds[1], ADG_PARENT_LEAF);
	s_drop(r);
	s_drop(q);
	s_drop(p);
	s_drop(a);
	s_drop(b);
}

/* A parent that a backward consumed shows as such; the consumed node and
 * a leaf have no graph to see. */
CHECKED_TEST(inspect, consumed_parent_shows_and_bad_input_is_refused)
{
	scalar a = s_leaf(reg, 2);
	scalar p = named_op((scalar[]){a, a}, 2, "p");
	adg_grads *g;
	cr_assert_eq(s_backward(reg, p, &g), 0); /* consumes p */
	adg_grads_free(g);
	scalar c = named_op((scalar[]){p, a}, 2, "c");
	struct seen s = {0};
	cr_assert_eq(adg_graph_visit(c.node, record, &s), 0);
	cr_assert_eq(s.n, 1);
	cr_assert_eq(s.op[0].parent_kinds[0], ADG_PARENT_CONSUMED);
	cr_assert_eq(s.op[0].parent_kinds[1], ADG_PARENT_LEAF);

	cr_assert_eq(adg_graph_visit(p.node, record, &s), ADG_ECONSUMED);
	cr_assert_eq(adg_graph_visit(a.node, record, &s), ADG_EINVAL);
	cr_assert_eq(adg_graph_visit(NULL, record, &s), ADG_EINVAL);
	cr_assert_eq(adg_graph_visit(c.node, NULL, &s), ADG_EINVAL);
	cr_assert_eq(s.n, 1, "a refused call visits nothing");
	s_drop(c);
	s_drop(p);
	s_drop(a);
}

CHECKED_TEST(inspect, visitor_code_stops_the_visit)
{
	scalar a = s_leaf(reg, 2);
	scalar x = a;
	scalar ops[5];
	for (int i = 0; i < 5; i++)
		x = ops[i] = named_op((scalar[]){x}, 1, "link");
	struct seen s = {.stop_after = 2, .stop_code = ADG_EUSER - 7};
	cr_assert_eq(adg_graph_visit(x.node, record, &s), ADG_EUSER - 7);
	cr_assert_eq(s.n, 2);
	s = (struct seen){.stop_after = 1, .stop_code = 3};
	cr_assert_eq(adg_graph_visit(x.node, record, &s), ADG_ECALLBACK);
	cr_assert_eq(s.n, 1);
	for (int i = 4; i >= 0; i--)
		s_drop(ops[i]);
	s_drop(a);
}

/* ------------------------------------------------------------------- DOT */

/* A growing buffer that the writer appends to; fail_at: the call that
 * fails (0: none). */
struct text {
	char *buf;
	size_t len, cap;
	int calls, fail_at;
};

static int append(const char *text, size_t len, void *ctx)
{
	struct text *t = ctx;
	if (++t->calls == t->fail_at)
		return ADG_EUSER - 1;
	if (t->len + len + 1 > t->cap) {
		t->cap = (t->len + len + 1) * 2;
		t->buf = realloc(t->buf, t->cap);
		cr_assert_not_null(t->buf);
	}
	memcpy(t->buf + t->len, text, len);
	t->len += len;
	t->buf[t->len] = '\0';
	return 0;
}

/* DOT read back: node statements and edges, counted by line. */
struct parsed {
	size_t nodes, edges, leaves, consumed;
	bool opens, closes;
};

static struct parsed parse_dot(const char *text)
{
	struct parsed p = {0};
	char *copy = strdup(text), *save = NULL;
	for (char *line = strtok_r(copy, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		unsigned long long a, b;
		if (strncmp(line, "digraph adg_graph_", 18) == 0)
			p.opens = true;
		else if (strcmp(line, "}") == 0)
			p.closes = true;
		else if (sscanf(line, "  n%llu -> n%llu;", &a, &b) == 2)
			p.edges++;
		else if (sscanf(line, "  n%llu [", &a) == 1) {
			p.nodes++;
			p.leaves += strstr(line, "shape=ellipse") != NULL;
			p.consumed += strstr(line, "style=dashed") != NULL;
		}
	}
	free(copy);
	return p;
}

/* Whether text is well-formed UTF-8 (no overlong forms or surrogates
 * checked: a cut sequence is what this is for). */
static bool utf8_whole(const char *text)
{
	const unsigned char *c = (const unsigned char *)text;
	while (*c != 0) {
		int more = *c < 0x80 ? 0 : *c >= 0xF0 ? 3 : *c >= 0xE0 ? 2 : 1;
		if (*c >= 0x80 && *c < 0xC0)
			return false; /* a continuation with no lead */
		c++;
		for (; more > 0; more--, c++)
			if ((*c & 0xC0) != 0x80)
				return false;
	}
	return true;
}

/* A valid UTF-8 name of 301 bytes ("a" and 100 three-byte euro signs)
 * is cut to at most 200 bytes between characters: 66 euro signs, 199
 * bytes. It was cut at byte 200, inside the 67th, and the DOT was not
 * UTF-8 (5 of 5 runs). Bytes that are not UTF-8 pass through unchanged. */
CHECKED_TEST(inspect, dot_cuts_a_long_name_between_characters)
{
	static char name[302], stray[] = "x\xff\xfe y";
	name[0] = 'a';
	for (int i = 0; i < 100; i++)
		memcpy(name + 1 + 3 * i, "\xe2\x82\xac", 3);
	scalar a = s_leaf(reg, 2);
	scalar p = named_op((scalar[]){a}, 1, name);
	scalar q = named_op((scalar[]){p}, 1, stray);
	struct text t = {0};
	cr_assert_eq(adg_graph_write_dot(q.node, append, &t), 0);
	char label[256];
	snprintf(label, sizeof label, " %.199s\\ndepth 1\"", name);
	cr_expect_not_null(strstr(t.buf, label), "%s", t.buf);
	cr_expect_not_null(strstr(t.buf, " x\xff\xfe y\\ndepth 2\""), "%s",
			   t.buf);
	/* Up to the end of the long name's label (the stray bytes come
	 * after it, on the deeper op's line) the text is UTF-8. */
	char *cut = strstr(t.buf, label);
	cr_assert_not_null(cut);
	cut[strlen(label)] = '\0';
	cr_expect(utf8_whole(t.buf), "%s", t.buf);
	free(t.buf);
	s_drop(q);
	s_drop(p);
	s_drop(a);
}

/* Leaf names for the DOT: W for a, none for b (plain label), quoted
 * like an op's name. */
static const char *name_of_a(uint64_t id, void *ctx)
{
	const uint64_t *a_id = ctx;
	return id == *a_id ? "W \"one\"" : NULL;
}

CHECKED_TEST(inspect, dot_names_leaves_the_options_name)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar p = named_op((scalar[]){a, b}, 2, "mul");
	struct text t = {0};
	adg_dot_options o = {.size = sizeof o,
			     .leaf_name = name_of_a,
			     .leaf_name_ctx = &a.id};
	cr_assert_eq(adg_graph_write_dot_with(p.node, &o, append, &t), 0);
	char want[96];
	snprintf(want, sizeof want,
		 "n%llu [label=\"W \\\"one\\\" (leaf %llu)\", shape=ellipse]",
		 (unsigned long long)a.id, (unsigned long long)a.id);
	cr_expect_not_null(strstr(t.buf, want), "%s", t.buf);
	snprintf(want, sizeof want,
		 "n%llu [label=\"leaf %llu\", shape=ellipse]",
		 (unsigned long long)b.id, (unsigned long long)b.id);
	cr_expect_not_null(strstr(t.buf, want), "%s", t.buf);
	free(t.buf);
	/* NULL options: as adg_graph_write_dot. */
	t = (struct text){0};
	cr_assert_eq(adg_graph_write_dot_with(p.node, NULL, append, &t), 0);
	cr_expect_null(strstr(t.buf, "W "), "%s", t.buf);
	free(t.buf);
	s_drop(p);
	s_drop(a);
	s_drop(b);
}

/* Whether text has the edge line from -> to, with label (NULL: bare). */
static bool has_edge(const char *text, uint64_t from, uint64_t to,
		     const char *label)
{
	char want[96];
	if (label == NULL)
		snprintf(want, sizeof want, "  n%llu -> n%llu;\n",
			 (unsigned long long)from, (unsigned long long)to);
	else
		snprintf(want, sizeof want,
			 "  n%llu -> n%llu [label=\"%s\"];\n",
			 (unsigned long long)from, (unsigned long long)to,
			 label);
	return strstr(text, want) != NULL;
}

/* The edges of an op with two parents or more carry their slots, so
 * that a - b is told from b - a, and the two slots of d * d apart; the
 * edge of an op with one parent stays bare. Before, every edge was bare
 * and a - b drew as b - a could. */
CHECKED_TEST(inspect, dot_labels_the_slots_of_an_op_with_two_parents)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar d = named_op((scalar[]){a, b}, 2, "sub");
	scalar sq = named_op((scalar[]){d, d}, 2, "square");
	scalar n = named_op((scalar[]){sq}, 1, "neg");
	struct text t = {0};
	cr_assert_eq(adg_graph_write_dot(n.node, append, &t), 0);
	cr_expect(has_edge(t.buf, a.id, d.id, "0"), "%s", t.buf);
	cr_expect(has_edge(t.buf, b.id, d.id, "1"), "%s", t.buf);
	cr_expect(has_edge(t.buf, d.id, sq.id, "0"), "%s", t.buf);
	cr_expect(has_edge(t.buf, d.id, sq.id, "1"), "%s", t.buf);
	cr_expect(has_edge(t.buf, sq.id, n.id, NULL), "%s", t.buf);
	cr_expect_eq(parse_dot(t.buf).edges, 5, "%s", t.buf);
	free(t.buf);
	s_drop(n);
	s_drop(sq);
	s_drop(d);
	s_drop(a);
	s_drop(b);
}

/* Two graphs merged by a join, a repeated parent, a consumed parent and
 * a name that needs escaping: every op, leaf and consumed op once, an
 * edge per parent slot. */
CHECKED_TEST(inspect,
	     dot_has_a_node_per_op_leaf_and_consumed_and_an_edge_per_slot)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3), c = s_leaf(reg, 5);
	scalar gone = named_op((scalar[]){c}, 1, "gone");
	adg_grads *g;
	cr_assert_eq(s_backward(reg, gone, &g), 0);
	adg_grads_free(g);
	scalar p = named_op((scalar[]){a, b}, 2, "say \"hi\"\\");
	scalar q = named_op((scalar[]){b, b}, 2, "q");
	scalar j = named_op((scalar[]){p, q, gone}, 3, "join");
	struct text t = {0};
	cr_assert_eq(adg_graph_write_dot(q.node, append, &t), 0);
	struct parsed d = parse_dot(t.buf);
	cr_assert(d.opens && d.closes, "%s", t.buf);
	/* 3 ops, 2 leaves (a, b; c is only gone's), 1 consumed. */
	cr_assert_eq(d.nodes, 6, "%s", t.buf);
	cr_assert_eq(d.leaves, 2, "%s", t.buf);
	cr_assert_eq(d.consumed, 1, "%s", t.buf);
	cr_assert_eq(d.edges, 2 + 2 + 3, "%s", t.buf);
	cr_assert_not_null(strstr(t.buf, "say \\\"hi\\\"\\\\"), "%s", t.buf);
	uint64_t graph;
	adg_node_graph_id(j.node, &graph);
	char title[64];
	snprintf(title, sizeof title, "label=\"graph %llu\"",
		 (unsigned long long)graph);
	cr_assert_not_null(strstr(t.buf, title), "%s", t.buf);

	/* A writer's code stops the writing and is the result. */
	struct text short_one = {.fail_at = 3};
	cr_assert_eq(adg_graph_write_dot(q.node, append, &short_one),
		     ADG_EUSER - 1);
	cr_assert_eq(short_one.calls, 3);
	cr_assert_eq(adg_graph_write_dot(NULL, append, &t), ADG_EINVAL);
	cr_assert_eq(adg_graph_write_dot(q.node, NULL, &t), ADG_EINVAL);
	cr_assert_eq(adg_graph_write_dot(a.node, append, &t), ADG_EINVAL);
	cr_assert_eq(adg_graph_write_dot(gone.node, append, &t), ADG_ECONSUMED);
	free(short_one.buf);
	free(t.buf);
	s_drop(j);
	s_drop(q);
	s_drop(p);
	s_drop(gone);
	s_drop(a);
	s_drop(b);
	s_drop(c);
}

/* Out of memory: nothing is visited or written, and the next call
 * works. */
Test(inspect_alloc, out_of_memory_visits_and_writes_nothing)
{
	adg_registry_options o = {.size = sizeof o,
				  .allocator =
					  failing_allocator(&fixture_alloc)};
	fixture_open(&o);
	scalar a = s_leaf(reg, 2);
	scalar x = named_op((scalar[]){a, a}, 2, "x");
	struct seen s = {0};
	struct text t = {0};
	atomic_store(&fixture_alloc.fail_in, 1);
	cr_assert_eq(adg_graph_visit(x.node, record, &s), ADG_ENOMEM);
	atomic_store(&fixture_alloc.fail_in, 1);
	cr_assert_eq(adg_graph_write_dot(x.node, append, &t), ADG_ENOMEM);
	cr_assert_eq(s.n, 0);
	cr_assert_eq(t.calls, 0);
	cr_assert_eq(adg_graph_visit(x.node, record, &s), 0);
	cr_assert_eq(s.n, 1);
	s_drop(x);
	s_drop(a);
	fixture_close();
}

/* One thread grows a graph (chains on a shared root leaf, merged by
 * joins) while another writes it again and again: every copy is whole,
 * its edges the sum of its ops' parents, and the op count never shrinks.
 */
struct grow {
	scalar leaf;
	atomic_bool done;
	atomic_bool dumped; /* the dumper's first copy is made */
	scalar kept[2400];  /* 1 + 2000 links + 200 joins */
	int n_kept;
};

static void *grower(void *arg)
{
	struct grow *s = ((struct thread *)arg)->s;
	scalar x = s->kept[0]; /* from the first op: one graph throughout */
	/* Grow only once the dumper is at work: copies overlap growth. */
	while (!atomic_load(&s->dumped))
		sched_yield();
	for (int i = 0; i < 2000; i++) {
		x = s->kept[s->n_kept++] =
			named_op((scalar[]){x, s->leaf}, 2, "grow");
		if (i % 10 == 9 && s->n_kept > 5)
			s->kept[s->n_kept++] =
				named_op((scalar[]){x, s->kept[s->n_kept - 5]},
					 2, "join");
	}
	atomic_store(&s->done, true);
	return NULL;
}

static int count_op(const adg_graph_node *node, void *ctx)
{
	size_t *counts = ctx;
	counts[0]++;
	counts[1] += node->n_parents;
	return 0;
}

static void *dumper(void *arg)
{
	struct grow *s = ((struct thread *)arg)->s;
	size_t last_ops = 0;
	int dumps = 0;
	while (!atomic_load(&s->done) || dumps < 3) {
		/* The first op is there from the start (see below). */
		struct text t = {0};
		cr_assert_eq(adg_graph_write_dot(s->kept[0].node, append, &t),
			     0);
		struct parsed d = parse_dot(t.buf);
		cr_assert(d.opens && d.closes);
		size_t ops = d.nodes - d.leaves - d.consumed;
		cr_assert_eq(d.leaves, 1, "one shared leaf");
		cr_assert_geq(ops, last_ops, "a copy lost ops");
		cr_assert_eq(d.edges, 2 * ops, "each op has two parents");
		last_ops = ops;
		free(t.buf);
		size_t counts[2] = {0};
		cr_assert_eq(adg_graph_visit(s->kept[0].node, count_op, counts),
			     0);
		cr_assert_eq(counts[1], 2 * counts[0]);
		dumps++;
		atomic_store(&s->dumped, true);
	}
	/* Grown: the last copy has every op. */
	size_t counts[2] = {0};
	cr_assert_eq(adg_graph_visit(s->kept[0].node, count_op, counts), 0);
	cr_assert_eq(counts[0], (size_t)s->n_kept);
	return NULL;
}

CHECKED_TEST(inspect_stress,
	     copies_are_whole_while_another_thread_grows_the_graph)
{
	struct grow *s = calloc(1, sizeof *s); /* too big for a stack */
	cr_assert_not_null(s);
	s->leaf = s_leaf(reg, 1);
	s->kept[s->n_kept++] =
		named_op((scalar[]){s->leaf, s->leaf}, 2, "first");
	pthread_t grow_thread, dump_thread;
	struct thread g = {s, 0}, d = {s, 1};
	pthread_create(&dump_thread, NULL, dumper, &d);
	pthread_create(&grow_thread, NULL, grower, &g);
	pthread_join(grow_thread, NULL);
	pthread_join(dump_thread, NULL);
	for (int i = s->n_kept - 1; i >= 0; i--)
		s_drop(s->kept[i]);
	s_drop(s->leaf);
	free(s);
}

/* --------------------------------------------------------------- on_step */

/* What on_step saw: per node, its before and after calls, their threads,
 * the name, and the after's duration and result. */
struct step_log {
	pthread_mutex_t lock;
	size_t n;
	struct {
		uint64_t id;
		int befores, afters;
		pthread_t before_thread, after_thread;
		char name[16];
		int result;
		uint64_t duration_ns;
	} node[128];
	uint64_t refuse_before; /* a node id whose before is refused */
	uint64_t refuse_after;	/* ... whose after is */
};

static int log_step(const adg_step_event *e, void *ctx)
{
	struct step_log *l = ctx;
	pthread_mutex_lock(&l->lock);
	size_t i = 0;
	while (i < l->n && l->node[i].id != e->node_id)
		i++;
	if (i == l->n && l->n < 128)
		l->node[l->n++].id = e->node_id;
	if (i < 128) {
		snprintf(l->node[i].name, sizeof l->node[i].name, "%s",
			 e->name ? e->name : "(none)");
		if (e->after) {
			l->node[i].afters++;
			l->node[i].after_thread = pthread_self();
			l->node[i].result = e->result;
			l->node[i].duration_ns = e->duration_ns;
		} else {
			l->node[i].befores++;
			l->node[i].before_thread = pthread_self();
		}
	}
	pthread_mutex_unlock(&l->lock);
	if (!e->after && e->node_id == l->refuse_before)
		return ADG_EUSER - 2;
	if (e->after && e->node_id == l->refuse_after)
		return ADG_EUSER - 3;
	return 0;
}

/* A tree of 2 x 8 chains of 4 named links on one leaf, joined at a root:
 * 1 + 16 * 4 steps. Returns the root; links[] gets the chains' ops. */
static scalar tree(scalar leaf, scalar links[64])
{
	scalar ends[16];
	for (int b = 0; b < 16; b++) {
		scalar x = leaf;
		for (int i = 0; i < 4; i++) {
			x = links[b * 4 + i] =
				named_op((scalar[]){x}, 1, "link");
		}
		ends[b] = x;
	}
	adg_node *nodes[16];
	for (int b = 0; b < 16; b++)
		nodes[b] = ends[b].node;
	adg_step step = {.backward = prod_backward,
			 .release = prod_release,
			 .user = prod_step_new(ends, 16),
			 .name = "root"};
	scalar root = {.value = 1};
	cr_assert_eq(adg_op(reg, nodes, 16, &step, &root.node), 0);
	adg_node_id(root.node, &root.id);
	return root;
}

static void drop_tree(scalar root, scalar leaf, scalar links[64])
{
	s_drop(root);
	for (int i = 63; i >= 0; i--)
		s_drop(links[i]);
	s_drop(leaf);
}

static int step_backward_with(const adg_executor *executor,
			      struct step_log *log, scalar root)
{
	adg_backward_options o = {.size = sizeof o,
				  .executor = executor,
				  .on_step = log_step,
				  .on_step_ctx = log};
	adg_grads *g = NULL;
	int rc = adg_backward_with(reg, root.node, scalar_box(1), &scalar_ops,
				   &o, &g);
	adg_grads_free(g);
	return rc;
}

/* Without an executor, alone, and on pools of 1 and 3 threads: each step
 * gets one before and one after, on one thread, with its name. */
CHECKED_TEST(on_step, once_before_and_after_each_step_on_its_thread)
{
	adg_pool *pools[2];
	cr_assert_eq(adg_pool_new(1, &pools[0]), 0);
	cr_assert_eq(adg_pool_new(3, &pools[1]), 0);
	adg_executor executors[3] = {{.submit = NULL}};
	adg_pool_executor(pools[0], &executors[1]);
	adg_pool_executor(pools[1], &executors[2]);
	executors[0] = executors[1];
	executors[0].n_workers = 0;
	for (int mode = 0; mode < 4; mode++) {
		scalar leaf = s_leaf(reg, 1), links[64];
		scalar root = tree(leaf, links);
		struct step_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};
		cr_assert_eq(step_backward_with(
				     mode == 0 ? NULL : &executors[mode - 1],
				     &log, root),
			     0);
		cr_assert_eq(log.n, 65, "mode %d", mode);
		for (size_t i = 0; i < log.n; i++) {
			cr_assert_eq(log.node[i].befores, 1);
			cr_assert_eq(log.node[i].afters, 1);
			cr_assert(pthread_equal(log.node[i].before_thread,
						log.node[i].after_thread));
			cr_assert_eq(log.node[i].result, 0);
			cr_assert_str_eq(log.node[i].name,
					 log.node[i].id == root.id ? "root"
								   : "link");
		}
		drop_tree(root, leaf, links);
	}
	adg_pool_free(pools[0]);
	adg_pool_free(pools[1]);
}

/* A step that spins reports at least the time it spun. */
static int slow_backward(adg_step_call *call, void *user)
{
	(void)user;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do
		clock_gettime(CLOCK_MONOTONIC, &t1);
	while ((t1.tv_sec - t0.tv_sec) * 1000000000L +
		       (t1.tv_nsec - t0.tv_nsec) <
	       2000000);
	return adg_step_give(call, 0, scalar_box(1));
}

CHECKED_TEST(on_step, duration_covers_the_step)
{
	scalar a = s_leaf(reg, 1);
	adg_step step = {.backward = slow_backward, .name = "slow"};
	scalar x = {.value = 1};
	cr_assert_eq(adg_op(reg, &a.node, 1, &step, &x.node), 0);
	struct step_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};
	cr_assert_eq(step_backward_with(NULL, &log, x), 0);
	cr_assert_eq(log.n, 1);
	cr_assert_geq(log.node[0].duration_ns, 2000000);
	s_drop(x);
	s_drop(a);
}

/* A refusal before a step: it does not run, the backward fails with the
 * hook's code, and every step is released once (the fixture checks the
 * closures). A refusal after: the same, once the step has run. */
CHECKED_TEST(on_step, a_refusal_stops_the_backward_as_a_failing_step)
{
	adg_pool *pool;
	cr_assert_eq(adg_pool_new(2, &pool), 0);
	adg_executor exec;
	adg_pool_executor(pool, &exec);
	for (int mode = 0; mode < 4; mode++) {
		scalar leaf = s_leaf(reg, 1), links[64];
		scalar root = tree(leaf, links);
		/* The last link of chain 5: refused there. */
		uint64_t target = links[5 * 4 + 3].id;
		struct step_log log = {.lock = PTHREAD_MUTEX_INITIALIZER};
		if (mode % 2 == 0)
			log.refuse_before = target;
		else
			log.refuse_after = target;
		int rc =
			step_backward_with(mode < 2 ? NULL : &exec, &log, root);
		cr_assert_eq(rc, mode % 2 == 0 ? ADG_EUSER - 2 : ADG_EUSER - 3,
			     "mode %d", mode);
		for (size_t i = 0; i < log.n; i++)
			if (log.node[i].id == target)
				cr_assert_eq(log.node[i].afters,
					     mode % 2 == 0 ? 0 : 1);
		drop_tree(root, leaf, links);
	}
	adg_pool_free(pool);
}
