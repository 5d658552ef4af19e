/*
 * Graph objects: the per-graph lock, placing a node in its parents' graph,
 * merging, retiring and reusing graph objects.
 *
 * The locator is the node itself: node->graph is an RCU-published pointer.
 * Finding a node's graph is one rcu_dereference, with no hash table, no lock
 * and no shared write. A merge republishes the moved nodes' pointers and
 * retires the absorbed graph objects. Graph memory is type-stable (see
 * struct adg_graph): a retired object goes to the retiring thread's pool and
 * comes back as a new graph, and leaves for the allocator only after a
 * grace period (adg_rcu_synchronize, for a batch of them: graph_defer), so
 * a reader inside a read-side section always touches a graph object, never
 * freed memory. Retiring costs no grace period on the hot path: a training
 * loop retires graphs by the million.
 *
 * Locking rules:
 * - node->graph, node->link and node->state change only while holding the
 *   lock of the graph the node is in (for a merge, both graphs' locks).
 * - Several graph locks are taken only by a merge, in rank order.
 * - No graph lock is held while a user callback runs, nor while waiting for
 *   a grace period: a retired graph is put away (graph_retire) only once
 *   the retiring thread holds no graph lock.
 */
#include "internal.h"
#include "readside.h"

#include <sched.h>
#include <stdlib.h>

/* Parents held on the stack by adg_graph_place; more use the allocator. */
#define PLACE_INLINE_PARENTS 8

#ifdef ADG_ASSERTIONS
__thread char adg_thread_identity;
#endif

static void graph_destroy(struct adg_graph *g)
{
	adg_free(g->registry, g, sizeof *g);
}

static void graph_destroy_list(struct adg_graph *g)
{
	while (g != NULL) {
		struct adg_graph *next = g->next_free;
		graph_destroy(g);
		g = next;
	}
}

void adg_graph_free_pool(struct adg_shard *shard)
{
	graph_destroy_list(shard->graph_pool);
	shard->graph_pool = NULL;
	shard->graphs_pooled = 0;
	graph_destroy_list(shard->graph_limbo);
	shard->graph_limbo = NULL;
	shard->graphs_in_limbo = 0;
}

/* A retired graph that no pool keeps: a thread that read the pointer
 * before it was taken away may still be waiting for the lock, or reading
 * its generation, so the memory goes back only after a grace period. The
 * shard's limbo collects ADG_GRAPH_LIMBO_MAX of them for one; the shared
 * fallback shard, which several threads use, waits for one at once. The
 * caller holds no graph lock and is in no section. */
static void graph_defer(struct adg_shard *shard, struct adg_graph *g)
{
	if (shard->shared) {
		adg_rcu_synchronize();
		graph_destroy(g);
		return;
	}
	g->next_free = shard->graph_limbo;
	shard->graph_limbo = g;
	if (++shard->graphs_in_limbo < ADG_GRAPH_LIMBO_MAX)
		return;
	adg_rcu_synchronize();
	graph_destroy_list(shard->graph_limbo);
	shard->graph_limbo = NULL;
	shard->graphs_in_limbo = 0;
}

static struct adg_graph *graph_new(struct adg_shard *shard,
				   struct adg_registry *r, uint64_t origin)
{
	struct adg_graph *g = shard->graph_pool;
	if (g != NULL) {
		/* Reused at once. Its lock is left alone (a stale locker
		 * may be waiting on it) and its rank stays its own;
		 * its generation moved on when it retired. */
		shard->graph_pool = g->next_free;
		shard->graphs_pooled--;
	} else {
		g = adg_alloc(r, sizeof *g);
		if (g == NULL)
			return NULL;
		ck_spinlock_fas_init(&g->lock);
#ifdef ADG_ASSERTIONS
		atomic_init(&g->owner, NULL);
#endif
		atomic_init(&g->gen, 0);
		g->rank = origin;
		g->registry = r;
	}
	/* Release: a lock-free reader that reads this origin and then the
	 * generation sees the generation this use of g runs under. */
	atomic_store_explicit(&g->origin, origin, memory_order_release);
	CDS_INIT_LIST_HEAD(&g->members);
	g->n_members = 0;
	g->retire_pending = false;
	g->next_free = NULL;
	adg_count(shard, ADG_C_GRAPHS_MADE, 1);
	return g;
}

/* Marks g, locked, retired: its generation moves on, so that a lock-free
 * reader that started on the old graph retries; adg_graph_unlock puts it
 * away. */
static void graph_mark_retired(struct adg_graph *g)
{
	ADG_ASSERT(adg_graph_held(g) && g->n_members == 0); /* I4 */
	/* Release: a reader that sees the new generation also sees the
	 * pointers republished before it. Only lock holders write gen. */
	atomic_store_explicit(
		&g->gen,
		atomic_load_explicit(&g->gen, memory_order_relaxed) + 1,
		memory_order_release);
	g->retire_pending = true;
}

/* Puts a retired graph, unlocked, in this thread's pool, or frees it after
 * a grace period when the pool is full or the shard is shared. The caller
 * holds no graph lock (graph_defer may wait for a grace period). */
static void graph_retire(struct adg_shard *shard, struct adg_graph *g)
{
	adg_count(shard, ADG_C_GRAPHS_RETIRED, 1);
	if (!shard->shared && shard->graphs_pooled < ADG_GRAPH_POOL_MAX) {
		g->next_free = shard->graph_pool;
		shard->graph_pool = g;
		shard->graphs_pooled++;
		return;
	}
	graph_defer(shard, g);
}

/* The graph a node is in; call inside a read-side section. */
static struct adg_graph *graph_of(const struct adg_node *n)
{
	struct adg_graph *g = rcu_dereference(n->graph);
	if (g != NULL)
		adg_tsan_acquire(g);
	return g;
}

/* Adds n, a node being placed, to g, which the caller has locked or not
 * yet published. */
static void graph_link(struct adg_graph *g, struct adg_node *n)
{
	/* I2: locked, or new and unpublished (no member: no one can find
	 * it). I1: the node is LIVE. */
	ADG_ASSERT(adg_graph_held(g) || g->n_members == 0);
	ADG_ASSERT(n->state == ADG_NODE_LIVE && !g->retire_pending);
	cds_list_add(&n->link, &g->members);
	g->n_members++;
	/* n is new: no other thread can reach it before the caller hands it
	 * over, which orders this store (and g's initialisation) for the
	 * receiver; lockers see it through g's lock. So a plain store, not
	 * rcu_assign_pointer, whose store fence costs about 8% of adg_op. */
	adg_tsan_release(g);
	CMM_STORE_SHARED(n->graph, g);
}

void adg_graph_detach_locked(struct adg_graph *g, struct adg_node *n)
{
	ADG_ASSERT(adg_graph_held(g) && adg_node_graph(n) == g); /* I2 */
	ADG_ASSERT(g->n_members > 0);				 /* I4 */
	cds_list_del(&n->link);
	rcu_assign_pointer(n->graph, NULL);
	if (--g->n_members == 0)
		graph_mark_retired(g);
}

/* Unlocks the n graphs of set, then puts the retired ones away once this
 * thread holds no graph lock (see adg_graph_unlock); scratch has room for
 * n. */
static void graph_unlock_all(struct adg_shard *shard, struct adg_graph **set,
			     size_t n, struct adg_graph **scratch)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++) {
		struct adg_graph *g = set[i];
		/* Read before unlocking: afterwards g belongs to the
		 * next holder. */
		if (g->retire_pending)
			scratch[k++] = g;
		g->retire_pending = false;
		adg_graph_unlock_plain(g);
	}
	for (size_t i = 0; i < k; i++)
		graph_retire(shard, scratch[i]);
}

/* Every caller holds g's lock alone: graph_retire may wait for a grace
 * period, and a reader in a section may be spinning on another lock. */
void adg_graph_unlock(struct adg_shard *shard, struct adg_graph *g)
{
	struct adg_graph *retired;
	graph_unlock_all(shard, &g, 1, &retired);
}

struct adg_graph *adg_graph_lock_of(struct adg_node *n)
{
	for (;;) {
		adg_rcu_read_lock();
		struct adg_graph *g = graph_of(n);
		if (g == NULL) {
			adg_rcu_read_unlock();
			return NULL;
		}
		/* Blocking inside a read-side section only delays grace
		 * periods; no lock holder ever waits for one. */
		adg_graph_lock(g);
		/* Under g's lock the pointer cannot move away from g, and a
		 * graph that holds a node is not retired: once it still reads
		 * g, g is the node's graph and stays so, and the read-side
		 * section may end. */
		if (graph_of(n) == g) {
			adg_rcu_read_unlock();
			return g;
		}
		/* The node moved meanwhile (a merge, a backward), or g was
		 * retired and reused: retry on what the pointer says now. */
		adg_graph_unlock_plain(g);
		adg_rcu_read_unlock();
	}
}

/* Collects the distinct graphs of node's parents into set; returns how many.
 * Inside a read-side section. */
static size_t graph_parent_graphs(const struct adg_node *node,
				  struct adg_graph **set)
{
	size_t n = 0;

	for (uint32_t i = 0; i < node->n_parents; i++) {
		const struct adg_node *p = adg_node_parent(node, i);
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

static bool graph_same_set(struct adg_graph *const *a, size_t na,
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

static void graph_sort_by_rank(struct adg_graph **set, size_t n)
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
 * The absorbed graphs are marked retired; adg_graph_unlock puts them away. */
static struct adg_graph *graph_merge_locked(struct adg_shard *shard,
					    struct adg_graph **set, size_t n)
{
	/* The largest container survives, so a node moves O(log n) times in
	 * its life; ties go to the lowest rank. The survivor carries the
	 * smallest origin: the merged id never depends on who came first. */
	struct adg_graph *survivor = set[0];
	for (size_t i = 0; i < n; i++)
		ADG_ASSERT(adg_graph_held(set[i]) && set[i]->n_members > 0);
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
	 * republished node sees the merged origin. */
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
		graph_mark_retired(g);
		adg_count(shard, ADG_C_MERGES, 1);
	}
	return survivor;
}

/* The common case: every non-leaf parent slot names the same node p (or
 * none does). The node goes where p is, or into a new graph. */
static int graph_place_with(struct adg_shard *shard, struct adg_node *node,
			    struct adg_node *p)
{
	struct adg_graph *g = p != NULL ? adg_graph_lock_of(p) : NULL;
	if (g == NULL) {
		/* p is a leaf or consumed, and neither ever joins a graph. */
		g = graph_new(shard, adg_node_registry_of(node), node->id);
		if (g == NULL)
			return ADG_ENOMEM;
		graph_link(g, node);
		return 0;
	}
	graph_link(g, node);
	adg_graph_unlock(shard, g);
	return 0;
}

/* Parents in several slots, perhaps in several graphs: lock them all, in
 * rank order, and merge. Out of line, so that adg_graph_place's common
 * case (graph_place_with) does not pay for this one's registers and stack. */
__attribute__((noinline)) static int
graph_place_several(struct adg_shard *shard, struct adg_node *node)
{
	struct adg_registry *r = adg_node_registry_of(node);
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
		adg_rcu_read_lock();
		size_t n = graph_parent_graphs(node, found);
		if (n == 0) {
			/* No parent is in a graph, and none can join one
			 * later: leaves never do, consumed nodes never
			 * again. */
			adg_rcu_read_unlock();
			struct adg_graph *g = graph_new(shard, r, node->id);
			if (g == NULL)
				rc = ADG_ENOMEM;
			else
				graph_link(g, node);
			break;
		}
		graph_sort_by_rank(found, n);
		for (size_t i = 0; i < n; i++)
			adg_graph_lock(found[i]);
		/* With every graph locked, the parents' pointers can no longer
		 * move between them. If they still name exactly these graphs,
		 * each is a live graph holding a parent, and the placement is
		 * decided. */
		if (!graph_same_set(found, n, again,
				    graph_parent_graphs(node, again))) {
			/* Unlock inside the section: a graph found stale may
			 * be freed as soon as the section ends. */
			for (size_t i = 0; i < n; i++)
				adg_graph_unlock_plain(found[i]);
			adg_rcu_read_unlock();
			continue;
		}
		/* Each graph holds a parent, so none can be retired while we
		 * hold the locks: the section may end. */
		adg_rcu_read_unlock();
		struct adg_graph *g =
			n == 1 ? found[0] : graph_merge_locked(shard, found, n);
		graph_link(g, node);
		graph_unlock_all(shard, found, n, again);
		break;
	}
	if (found != inline_sets)
		adg_free(r, found, 2 * cap * sizeof *found);
	return rc;
}

int adg_graph_place(struct adg_shard *shard, struct adg_node *node)
{
	struct adg_node *only = NULL;
	for (uint32_t i = 0; i < node->n_parents; i++) {
		struct adg_node *p = adg_node_parent(node, i);
		if (p == NULL || p == only)
			continue;
		if (only != NULL)
			return graph_place_several(shard, node);
		only = p;
	}
	return graph_place_with(shard, node, only);
}

/* node->graph with acquire ordering, for the lock-free reader below, whose
 * loads of other locations must stay after it (rcu_dereference orders only
 * loads through the pointer). */
static struct adg_graph *graph_of_acquire(const struct adg_node *n)
{
	struct adg_graph *g = __atomic_load_n(&n->graph, __ATOMIC_ACQUIRE);
	if (g != NULL)
		adg_tsan_acquire(g);
	return g;
}

/*
 * A seqlock read of the node's graph id. A graph object changes identity
 * only by retiring (gen moves on, after every member has left it) and being
 * reused; a node leaves a graph only when the graph retires (a merge moves
 * every member) or for good (consumed or freed: NULL). So:
 * - gen read, then the node seen in g: the node is in the incarnation of g
 *   that gen names, not in an earlier one (whose members had all left
 *   before gen moved on). Reading the pointer once, before gen, is not
 *   enough: the reader may have stalled across the node's move out of g,
 *   g's retirement and reuse, and a merge that brought the node back, and
 *   would then take the origin of a graph the node was not in yet.
 * - the node still in g and gen unchanged after the origin is read: the
 *   node was in that one incarnation throughout, so the origin read is an
 *   id its graph had meanwhile.
 * Every load is acquire, so none moves before the one ahead of it.
 */
int adg_node_graph_id(const adg_node *node, uint64_t *graph_id)
{
	if (node == NULL || graph_id == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				node == NULL ? "node" : "graph_id");
	uint64_t id;

	adg_rcu_read_lock();
	for (;;) {
		struct adg_graph *g = graph_of_acquire(node);
		if (g == NULL) {
			id = 0;
			break;
		}
		ADG_TEST_POINT(ADG_TP_GRAPH_ID_LOADED);
		uint64_t gen =
			atomic_load_explicit(&g->gen, memory_order_acquire);
		if (graph_of_acquire(node) != g)
			continue;
		id = atomic_load_explicit(&g->origin, memory_order_acquire);
		ADG_TEST_POINT(ADG_TP_GRAPH_ID_ORIGIN_READ);
		if (graph_of_acquire(node) == g &&
		    atomic_load_explicit(&g->gen, memory_order_acquire) == gen)
			break;
	}
	adg_rcu_read_unlock();
	*graph_id = id;
	return 0;
}
