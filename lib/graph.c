/*
 * Graph objects: the per-graph lock, placing a node in its parents' graph,
 * merging, and retiring graphs through RCU.
 *
 * The locator is the node itself: node->graph is an RCU-published pointer.
 * Finding a node's graph is one rcu_dereference, with no hash table, no lock
 * and no shared write. A merge republishes the moved nodes' pointers and
 * retires the absorbed graph objects, which readers that still hold them
 * see marked dead (and merged_into set), until call_rcu frees them.
 *
 * Locking rules:
 * - node->graph, node->link and node->state change only while holding the
 *   lock of the graph the node is in (for a merge, both graphs' locks).
 * - Several graph locks are taken only by a merge, in rank order.
 * - No graph lock is held while a user callback runs, nor while waiting for
 *   a grace period.
 */
#include "internal.h"

#include <stdlib.h>

/* Parents held on the stack by adg_graph_place; more use the allocator. */
#define PLACE_INLINE_PARENTS 8

static struct adg_graph *graph_new(struct adg_shard *shard,
				   struct adg_registry *r, uint64_t origin)
{
	struct adg_graph *g = adg_alloc(r, sizeof *g);
	if (g == NULL)
		return NULL;
	pthread_mutex_init(&g->lock, NULL);
	atomic_init(&g->origin, origin);
	g->rank = origin;
	g->merged_into = NULL;
	CDS_INIT_LIST_HEAD(&g->members);
	g->n_members = 0;
	g->dead = false;
	g->retire_pending = false;
	g->registry = r;
	adg_count(shard, ADG_C_GRAPHS_MADE, 1);
	return g;
}

static void graph_free_rcu(struct rcu_head *head)
{
	struct adg_graph *g = caa_container_of(head, struct adg_graph, rcu);
	adg_tsan_acquire(head); /* the retiring thread's work on g */
	struct adg_registry *r = g->registry;

	adg_tsan_acquire(&r->rcu_token); /* every earlier read-side section */
	pthread_mutex_destroy(&g->lock);
	adg_free(r, g, sizeof *g);
	/* For adg_registry_free, which frees r after rcu_barrier. */
	adg_tsan_release(&r->rcu_token);
}

/* The graph a node is in; call inside a read-side section. */
static struct adg_graph *graph_of(const struct adg_node *n)
{
	struct adg_graph *g = rcu_dereference(n->graph);
	if (g != NULL)
		adg_tsan_acquire(g);
	return g;
}

/* Adds n to g, which the caller has locked or not yet published. */
static void graph_link(struct adg_graph *g, struct adg_node *n)
{
	cds_list_add(&n->link, &g->members);
	g->n_members++;
	/* rcu_assign_pointer orders g's initialisation before the pointer is
	 * seen, so a reader never finds a half-built graph. */
	adg_tsan_release(g);
	rcu_assign_pointer(n->graph, g);
}

void adg_graph_detach_locked(struct adg_graph *g, struct adg_node *n)
{
	cds_list_del(&n->link);
	rcu_assign_pointer(n->graph, NULL);
	if (--g->n_members == 0) {
		/* Nothing points here any more but readers that loaded the
		 * pointer earlier; adg_graph_unlock frees it after them. */
		g->dead = true;
		g->retire_pending = true;
	}
}

void adg_graph_unlock(struct adg_shard *shard, struct adg_graph *g)
{
	/* Read before unlocking: afterwards g belongs to the next holder. */
	bool retire = g->retire_pending;

	g->retire_pending = false;
	pthread_mutex_unlock(&g->lock);
	if (retire) {
		adg_count(shard, ADG_C_GRAPHS_RETIRED, 1);
		/* A thread that read the pointer before it was taken away may
		 * still be waiting for the lock: free after a grace period.
		 * (For TSan: what this thread did to g comes before the
		 * callback, as call_rcu's queueing guarantees.) */
		adg_tsan_release(&g->rcu);
		call_rcu(&g->rcu, graph_free_rcu);
	}
}

struct adg_graph *adg_graph_lock_of(struct adg_node *n)
{
	struct adg_registry *r = n->registry;

	for (;;) {
		rcu_read_lock();
		struct adg_graph *g = graph_of(n);
		if (g == NULL) {
			adg_rcu_read_unlock(r);
			return NULL;
		}
		/* Blocking inside a read-side section only delays grace
		 * periods; no lock holder ever waits for one. */
		pthread_mutex_lock(&g->lock);
		/* Under g's lock the pointer cannot move away from g, and a
		 * graph that holds a node is not retired: once it still reads
		 * g, g outlives the read-side section. */
		if (graph_of(n) == g) {
			adg_rcu_read_unlock(r);
			return g;
		}
		/* A merge or a backward moved the node meanwhile: retry on
		 * what the pointer says now. */
		pthread_mutex_unlock(&g->lock);
		adg_rcu_read_unlock(r);
	}
}

/* Collects the distinct graphs of node's parents into set; returns how many.
 * Inside a read-side section. */
static size_t parent_graphs(const struct adg_node *node, struct adg_graph **set)
{
	size_t n = 0;

	for (uint32_t i = 0; i < node->n_parents; i++) {
		const struct adg_node *p = node->parents[i];
		if (p == NULL)
			continue; /* a leaf: leaves never join graphs */
		struct adg_graph *g = graph_of(p);
		if (g == NULL)
			continue; /* consumed: its step is gone */
		size_t j = 0;
		while (j < n && set[j] != g)
			j++;
		if (j == n)
			set[n++] = g;
	}
	return n;
}

static bool same_set(struct adg_graph *const *a, size_t na,
		     struct adg_graph *const *b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < nb; i++) {
		size_t j = 0;
		while (j < na && a[j] != b[i])
			j++;
		if (j == na)
			return false;
	}
	return true;
}

static void sort_by_rank(struct adg_graph **set, size_t n)
{
	for (size_t i = 1; i < n; i++) {
		struct adg_graph *g = set[i];
		size_t j = i;
		while (j > 0 && set[j - 1]->rank > g->rank) {
			set[j] = set[j - 1];
			j--;
		}
		set[j] = g;
	}
}

/* Merges the locked graphs of set (sorted by rank) into one and returns it.
 * The absorbed graphs are marked dead; adg_graph_unlock retires them. */
static struct adg_graph *merge_locked(struct adg_shard *shard,
				      struct adg_graph **set, size_t n)
{
	/* The largest container survives, so a node moves O(log n) times in
	 * its life; ties go to the lowest rank. The survivor carries the
	 * smallest origin: the merged id never depends on who came first. */
	struct adg_graph *survivor = set[0];
	uint64_t origin =
		atomic_load_explicit(&set[0]->origin, memory_order_relaxed);
	for (size_t i = 1; i < n; i++) {
		if (set[i]->n_members > survivor->n_members)
			survivor = set[i];
		uint64_t o = atomic_load_explicit(&set[i]->origin,
						  memory_order_relaxed);
		if (o < origin)
			origin = o;
	}
	/* Release: a lock-free reader that finds the survivor through a
	 * republished node or a merged_into link sees the merged origin. */
	atomic_store_explicit(&survivor->origin, origin, memory_order_release);

	for (size_t i = 0; i < n; i++) {
		struct adg_graph *g = set[i];
		if (g == survivor)
			continue;
		struct adg_node *m;
		adg_tsan_release(survivor);
		cds_list_for_each_entry (m, &g->members, link)
			rcu_assign_pointer(m->graph, survivor);
		cds_list_splice(&g->members, &survivor->members);
		CDS_INIT_LIST_HEAD(&g->members);
		survivor->n_members += g->n_members;
		g->n_members = 0;
		/* Readers holding g follow merged_into to the survivor. */
		rcu_assign_pointer(g->merged_into, survivor);
		g->dead = true;
		g->retire_pending = true;
		adg_count(shard, ADG_C_MERGES, 1);
	}
	return survivor;
}

int adg_graph_place(struct adg_shard *shard, struct adg_node *node)
{
	struct adg_registry *r = node->registry;
	struct adg_graph *inline_sets[2 * PLACE_INLINE_PARENTS];
	struct adg_graph **found = inline_sets;
	size_t cap = node->n_parents;
	int rc = 0;

	if (cap > PLACE_INLINE_PARENTS) {
		found = adg_alloc(r, 2 * cap * sizeof *found);
		if (found == NULL)
			return ADG_ENOMEM;
	} else {
		cap = PLACE_INLINE_PARENTS;
	}
	struct adg_graph **again = found + cap;

	for (;;) {
		rcu_read_lock();
		size_t n = parent_graphs(node, found);
		if (n == 0) {
			/* No parent is in a graph, and none can join one
			 * later: leaves never do, consumed nodes never again.
			 */
			adg_rcu_read_unlock(r);
			struct adg_graph *g = graph_new(shard, r, node->id);
			if (g == NULL)
				rc = ADG_ENOMEM;
			else
				graph_link(g, node);
			break;
		}
		sort_by_rank(found, n);
		for (size_t i = 0; i < n; i++)
			pthread_mutex_lock(&found[i]->lock);
		/* With every graph locked, the parents' pointers can no longer
		 * move between them. If they still name exactly these graphs,
		 * none is dead and the placement is decided. */
		if (!same_set(found, n, again, parent_graphs(node, again))) {
			/* Unlock inside the section: a graph found dead may
			 * be freed as soon as the section ends. */
			for (size_t i = 0; i < n; i++)
				pthread_mutex_unlock(&found[i]->lock);
			adg_rcu_read_unlock(r);
			continue;
		}
		/* Each graph holds a parent, so none can be retired while we
		 * hold the locks: the section may end. */
		adg_rcu_read_unlock(r);
		struct adg_graph *g =
			n == 1 ? found[0] : merge_locked(shard, found, n);
		graph_link(g, node);
		for (size_t i = 0; i < n; i++)
			adg_graph_unlock(shard, found[i]);
		break;
	}
	if (found != inline_sets)
		adg_free(r, found, 2 * cap * sizeof *found);
	return rc;
}

int adg_node_graph_id(const adg_node *node, uint64_t *graph_id)
{
	if (node == NULL || graph_id == NULL)
		return ADG_EINVAL;
	struct adg_registry *r = node->registry;

	rcu_read_lock();
	struct adg_graph *g = graph_of(node);
	/* A graph retired by a merge points on to its survivor. */
	while (g != NULL) {
		struct adg_graph *next = rcu_dereference(g->merged_into);
		if (next == NULL)
			break;
		adg_tsan_acquire(next);
		g = next;
	}
	*graph_id = g == NULL ? 0
			      : atomic_load_explicit(&g->origin,
						     memory_order_acquire);
	adg_rcu_read_unlock(r);
	return 0;
}
