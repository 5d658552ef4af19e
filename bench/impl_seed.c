/*
 * seed: the reference design (burn-autodiff 0.21's GraphMutexClient and
 * GraphLocator, ../shared/seed/) ported to C on the bench's node and step
 * code. One process-wide mutex guards the locator: `graphs` maps every
 * node id to its graph, `keys` maps each origin to the set of node ids that
 * point at its graph. Each graph has a mutex around its server (the steps
 * by node id). Ids come from one shared atomic counter, as NodeId::new does.
 * After every backward the orphan sweep clones the locator, locks every
 * graph it names, frees the graphs no handle can use, and removes their
 * entries. Merging picks the first graph found as the survivor, as burn's
 * map iteration does (here in parent order, so that runs are repeatable).
 * One change keeps the bench from deadlocking: see NodeCleaner below.
 *
 * Leaves are tracked nodes without steps, never registered, as in burn.
 */
#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct snode {
	atomic_long refs; /* handles, plus one while the server holds it */
	uint64_t id;
	uint32_t depth, n;
	bool leaf;
	uint64_t parent_ids[];
};

struct sstep {
	struct snode *node;
	const bench_step *step;
};

struct sgraph {
	pthread_mutex_t lock;
	atomic_long refs; /* locator entries plus temporary holders */
	uint64_t origin;
	bool merged;  /* its server was moved into another graph */
	u64map steps; /* node id -> struct sstep * */
};

struct sreg {
	pthread_mutex_t state; /* the global lock */
	u64map graphs;	       /* node id -> struct sgraph * */
	u64map keys;	       /* origin -> u64map * of node ids */
	atomic_uint_fast64_t next_id;
};

static struct sgraph *as_graph(uint64_t v)
{
	return (struct sgraph *)(uintptr_t)v;
}

static void graph_unref(struct sgraph *g)
{
	if (atomic_fetch_sub(&g->refs, 1) == 1) {
		pthread_mutex_destroy(&g->lock);
		u64map_destroy(&g->steps);
		free(g);
	}
}

static void node_unref(struct snode *n)
{
	if (atomic_fetch_sub(&n->refs, 1) == 1)
		free(n);
}

static void *s_open(void)
{
	struct sreg *r = calloc(1, sizeof *r);
	pthread_mutex_init(&r->state, NULL);
	u64map_init(&r->graphs, 1024);
	u64map_init(&r->keys, 256);
	atomic_init(&r->next_id, 1);
	return r;
}

static void s_close(void *reg)
{
	struct sreg *r = reg;
	size_t pos = 0;
	uint64_t k, v;
	/* Steps the sweep never got to (graphs dropped after the last
	 * backward) go with the registry. */
	while (u64map_next(&r->graphs, &pos, &k, &v)) {
		struct sgraph *g = as_graph(v);
		size_t sp = 0;
		uint64_t sk, sv;
		while (u64map_next(&g->steps, &sp, &sk, &sv)) {
			struct sstep *st = (struct sstep *)(uintptr_t)sv;
			node_unref(st->node);
			free(st);
		}
		u64map_clear(&g->steps);
	}
	pos = 0;
	while (u64map_next(&r->graphs, &pos, &k, &v))
		graph_unref(as_graph(v));
	pos = 0;
	while (u64map_next(&r->keys, &pos, &k, &v)) {
		u64map_destroy((u64map *)(uintptr_t)v);
		free((void *)(uintptr_t)v);
	}
	u64map_destroy(&r->graphs);
	u64map_destroy(&r->keys);
	pthread_mutex_destroy(&r->state);
	free(r);
}

static struct snode *snode_new(struct sreg *r, uint32_t n)
{
	struct snode *s = malloc(sizeof *s + n * sizeof(uint64_t));
	if (s == NULL)
		abort();
	atomic_init(&s->refs, 1);
	s->id = atomic_fetch_add(&r->next_id, 1);
	s->n = n;
	s->depth = 0;
	return s;
}

static void *s_leaf(void *reg)
{
	struct snode *s = snode_new(reg, 0);
	s->leaf = true;
	return s;
}

/* --- the locator, under r->state --- */

static void set_entry(struct sreg *r, uint64_t id, struct sgraph *g)
{
	uint64_t *slot = u64map_slot(&r->graphs, id);
	if (*slot != 0)
		graph_unref(as_graph(*slot));
	atomic_fetch_add(&g->refs, 1);
	*slot = (uint64_t)(uintptr_t)g;
}

static u64map *keys_of(struct sreg *r, uint64_t origin)
{
	uint64_t *slot = u64map_slot(&r->keys, origin);
	if (*slot == 0) {
		u64map *set = malloc(sizeof *set);
		u64map_init(set, 4);
		*slot = (uint64_t)(uintptr_t)set;
	}
	return (u64map *)(uintptr_t)*slot;
}

static void register_key(struct sreg *r, uint64_t origin, uint64_t key)
{
	u64map *set = keys_of(r, origin);
	if (origin != key)
		*u64map_slot(set, key) = 1;
}

static struct sgraph *new_graph(struct sreg *r, uint64_t origin)
{
	struct sgraph *g = calloc(1, sizeof *g);
	pthread_mutex_init(&g->lock, NULL);
	g->origin = origin;
	u64map_init(&g->steps, 16);
	set_entry(r, origin, g);
	keys_of(r, origin);
	return g;
}

static void remove_entry(struct sreg *r, uint64_t id)
{
	uint64_t v;
	if (!u64map_remove(&r->graphs, id, &v))
		return;
	struct sgraph *g = as_graph(v);
	uint64_t *slot = u64map_find(&r->keys, g->origin);
	if (slot != NULL) {
		u64map *set = (u64map *)(uintptr_t)*slot;
		u64map_remove(set, id, NULL);
		if (set->count == 0) {
			u64map_remove(&r->keys, g->origin, NULL);
			u64map_destroy(set);
			free(set);
		}
	}
	graph_unref(g);
}

/* merge_two: main's server takes other's steps; every key of other now
 * names main. Both graphs are locked. */
static void merge_two(struct sreg *r, struct sgraph *main, struct sgraph *other)
{
	size_t pos = 0;
	uint64_t k, v;
	while (u64map_next(&other->steps, &pos, &k, &v))
		*u64map_slot(&main->steps, k) = v;
	u64map_clear(&other->steps);
	other->merged = true;
	set_entry(r, other->origin, main);
	/* burn leaves the absorbed origin out of main's keys, so that a later
	 * merge of main does not repoint it and its entry keeps naming a dead
	 * graph; the port records it, or the bench would loop on it. */
	*u64map_slot(keys_of(r, main->origin), other->origin) = 1;
	uint64_t set_v;
	if (u64map_remove(&r->keys, other->origin, &set_v)) {
		u64map *set = (u64map *)(uintptr_t)set_v;
		u64map *main_keys = keys_of(r, main->origin);
		pos = 0;
		while (u64map_next(set, &pos, &k, NULL)) {
			set_entry(r, k, main);
			*u64map_slot(main_keys, k) = 1;
		}
		u64map_destroy(set);
		free(set);
	}
}

/* GraphLocator::select, under r->state; returns a held graph. */
static struct sgraph *locate(struct sreg *r, struct snode *node)
{
	struct sgraph *found[16];
	size_t n = 0;
	for (uint32_t i = 0; i < node->n && n < 16; i++) {
		uint64_t *v = u64map_find(&r->graphs, node->parent_ids[i]);
		if (v == NULL)
			continue;
		struct sgraph *g = as_graph(*v);
		size_t j = 0;
		while (j < n && found[j] != g)
			j++;
		if (j == n)
			found[n++] = g;
	}
	struct sgraph *g;
	if (n == 0) {
		g = new_graph(r, node->id);
	} else if (n == 1) {
		g = found[0];
		set_entry(r, node->id, g);
		register_key(r, g->origin, node->id);
	} else {
		g = found[0];
		register_key(r, g->origin, node->id);
		pthread_mutex_lock(&g->lock);
		for (size_t i = 1; i < n; i++) {
			struct sgraph *other = found[i];
			/* held across the merge, which drops its entries */
			atomic_fetch_add(&other->refs, 1);
			pthread_mutex_lock(&other->lock);
			merge_two(r, g, other);
			pthread_mutex_unlock(&other->lock);
			graph_unref(other);
		}
		set_entry(r, g->origin, g);
		set_entry(r, node->id, g);
		pthread_mutex_unlock(&g->lock);
	}
	atomic_fetch_add(&g->refs, 1);
	return g;
}

static void *s_op(void *reg, void *const *parents, size_t n,
		  const bench_step *step)
{
	struct sreg *r = reg;
	struct snode *s = snode_new(r, (uint32_t)n);
	s->leaf = false;
	for (size_t i = 0; i < n; i++) {
		struct snode *p = parents[i];
		s->parent_ids[i] = p->id;
		if (p->depth + 1 > s->depth)
			s->depth = p->depth + 1;
	}
	struct sstep *st = malloc(sizeof *st);
	st->node = s;
	st->step = step;
	atomic_fetch_add(&s->refs, 1); /* the server's */
	for (;;) {
		pthread_mutex_lock(&r->state);
		struct sgraph *g = locate(r, s);
		pthread_mutex_unlock(&r->state);
		/* register(): lock the graph, hand the step to its server.
		 * A merge may have emptied it meanwhile: then look again. */
		pthread_mutex_lock(&g->lock);
		bool merged = g->merged;
		if (!merged)
			*u64map_slot(&g->steps, s->id) =
				(uint64_t)(uintptr_t)st;
		pthread_mutex_unlock(&g->lock);
		graph_unref(g);
		if (!merged)
			return s;
	}
}

static void s_unref(void *reg, void *node)
{
	(void)reg;
	node_unref(node);
}

static uint64_t s_id(void *node)
{
	return ((struct snode *)node)->id;
}

/* The orphan sweep: every graph the locator names, after every backward. */
static void cleanup_orphaned_entries(struct sreg *r)
{
	pthread_mutex_lock(&r->state);
	size_t n = r->graphs.count, i = 0, pos = 0;
	struct sgraph **all = malloc((n + 1) * sizeof *all);
	uint64_t k, v;
	while (u64map_next(&r->graphs, &pos, &k, &v)) {
		all[i] = as_graph(v);
		atomic_fetch_add(&all[i]->refs, 1);
		i++;
	}
	pthread_mutex_unlock(&r->state);

	u64map remove;
	u64map_init(&remove, 16);
	for (size_t j = 0; j < i; j++) {
		struct sgraph *g = all[j];
		pthread_mutex_lock(&g->lock);
		/* maybe_useful: does any handle still name a node whose step
		 * the server holds? */
		bool useful = false;
		pos = 0;
		while (!useful && u64map_next(&g->steps, &pos, &k, &v)) {
			struct sstep *st = (struct sstep *)(uintptr_t)v;
			useful = atomic_load(&st->node->refs) > 1;
		}
		if (!useful) {
			/* free_unused_roots */
			pos = 0;
			while (u64map_next(&g->steps, &pos, &k, &v)) {
				struct sstep *st = (struct sstep *)(uintptr_t)v;
				*u64map_slot(&remove, k) = 1;
				node_unref(st->node);
				free(st);
			}
			u64map_clear(&g->steps);
		}
		pthread_mutex_unlock(&g->lock);
		graph_unref(g);
	}
	free(all);
	if (remove.count > 0) {
		pthread_mutex_lock(&r->state);
		pos = 0;
		while (u64map_next(&remove, &pos, &k, NULL))
			remove_entry(r, k);
		pthread_mutex_unlock(&r->state);
	}
	u64map_destroy(&remove);
}

static int s_backward(void *reg, void *root, void **grads)
{
	struct sreg *r = reg;
	struct snode *rn = root;
	u64map *gm = malloc(sizeof *gm);
	u64map_init(gm, 64);
	*grads = gm;
	u64map_add_double(gm, rn->id, 1.0);
	if (rn->leaf)
		return 0;

	struct sgraph *g;
	for (;;) {
		pthread_mutex_lock(&r->state);
		uint64_t *v = u64map_find(&r->graphs, rn->id);
		g = v != NULL ? as_graph(*v) : NULL;
		if (g != NULL)
			atomic_fetch_add(&g->refs, 1);
		pthread_mutex_unlock(&r->state);
		if (g == NULL)
			return -1; /* consumed */
		pthread_mutex_lock(&g->lock);
		if (!g->merged)
			break;
		/* merged away between the two locks: look again */
		pthread_mutex_unlock(&g->lock);
		graph_unref(g);
	}
	/* server.backward: take the reachable steps, group them by order,
	 * run them deepest first, all under the graph's lock. */
	size_t cap = 64, len = 0;
	struct sstep **tape = malloc(cap * sizeof *tape);
	u64map seen;
	u64map_init(&seen, 64);
	uint64_t sv;
	int rc = 0;
	if (u64map_remove(&g->steps, rn->id, &sv)) {
		tape[len++] = (struct sstep *)(uintptr_t)sv;
		*u64map_slot(&seen, rn->id) = 1;
	} else {
		rc = -1;
	}
	uint32_t max_depth = rn->depth;
	for (size_t i = 0; i < len; i++) {
		struct snode *n = tape[i]->node;
		for (uint32_t k = 0; k < n->n; k++) {
			uint64_t pid = n->parent_ids[k];
			uint64_t *mark = u64map_slot(&seen, pid);
			if (*mark != 0)
				continue;
			*mark = 1;
			if (!u64map_remove(&g->steps, pid, &sv))
				continue; /* a leaf, or consumed */
			if (len == cap)
				tape = realloc(tape, (cap *= 2) * sizeof *tape);
			tape[len++] = (struct sstep *)(uintptr_t)sv;
		}
	}
	u64map_destroy(&seen);
	size_t *bucket = calloc(max_depth + 2, sizeof *bucket);
	struct sstep **sorted = malloc((len + 1) * sizeof *sorted);
	for (size_t i = 0; i < len; i++)
		bucket[max_depth - tape[i]->node->depth]++;
	size_t start = 0;
	for (uint32_t d = 0; d <= max_depth; d++) {
		size_t c = bucket[d];
		bucket[d] = start;
		start += c;
	}
	for (size_t i = 0; i < len; i++)
		sorted[bucket[max_depth - tape[i]->node->depth]++] = tape[i];
	for (size_t i = 0; i < len; i++) {
		struct snode *n = sorted[i]->node;
		if (rc == 0) {
			double grad = u64map_take_double(gm, n->id);
			bench_call c = {&bench_seed, gm, grad, n->parent_ids,
					n->n};
			rc = sorted[i]->step->run(&c, sorted[i]->step);
		}
	}
	/* NodeCleaner: with the global lock, forget the consumed nodes. burn
	 * takes it while still holding the graph's lock, the reverse of a
	 * merge's order; the port lets go of the graph first, so that the
	 * bench cannot deadlock. */
	pthread_mutex_unlock(&g->lock);
	pthread_mutex_lock(&r->state);
	for (size_t i = 0; i < len; i++)
		remove_entry(r, sorted[i]->node->id);
	pthread_mutex_unlock(&r->state);
	for (size_t i = 0; i < len; i++) {
		node_unref(sorted[i]->node);
		free(sorted[i]);
	}
	free(tape);
	free(sorted);
	free(bucket);
	graph_unref(g);

	cleanup_orphaned_entries(r);
	return rc;
}

static void s_grads_free(void *grads)
{
	u64map_destroy(grads);
	free(grads);
}

static uint64_t s_graph_id(void *reg, void *node)
{
	struct sreg *r = reg;
	pthread_mutex_lock(&r->state);
	uint64_t *v = u64map_find(&r->graphs, ((struct snode *)node)->id);
	uint64_t id = v != NULL ? as_graph(*v)->origin : 0;
	pthread_mutex_unlock(&r->state);
	return id;
}

static void nothing(void *reg)
{
	(void)reg;
}

const bench_impl bench_seed = {
	.name = "seed",
	.has_graphs = true,
	.open = s_open,
	.close = s_close,
	.leaf = s_leaf,
	.op = s_op,
	.unref = s_unref,
	.id = s_id,
	.backward = s_backward,
	.grad = u64map_get_double,
	.grads_free = s_grads_free,
	.add_grad = u64map_add_slot,
	.graph_id = s_graph_id,
	.thread_begin = nothing,
	.thread_end = nothing,
};
