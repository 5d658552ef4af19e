/* Concurrency stress, bounded by iteration counts: every result is checked,
 * and ThreadSanitizer and AddressSanitizer builds run the same code. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

FIXTURE_SUITE(stress, .timeout = 600);

static void run_threads(int n, void *(*fn)(void *))
{
	pthread_t *t = malloc(n * sizeof *t);
	for (intptr_t i = 0; i < n; i++)
		cr_assert_eq(pthread_create(&t[i], NULL, fn, (void *)i), 0);
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	free(t);
}

/* Disjoint graphs on shared leaves, with backward, at 2, 8, 32 threads. */
static scalar params[4];
static atomic_int wrong;
static int disjoint_rounds;

static void *disjoint_worker(void *arg)
{
	double own_value = (double)((intptr_t)arg % 5 + 1);
	for (int round = 0; round < disjoint_rounds; round++) {
		scalar own = s_leaf(reg, own_value);
		scalar h = s_mul(reg, own, params[0]);
		scalar h2 = s_mul(reg, h, params[1]);
		scalar h3 = s_add(reg, h2, params[2]);
		scalar out = s_mul(reg, h3, params[3]);
		s_drop(h);
		s_drop(h2);
		s_drop(h3);
		adg_grads *g;
		if (s_backward(reg, out, &g) != 0) {
			atomic_fetch_add(&wrong, 1);
			s_drop(out);
			s_drop(own);
			continue;
		}
		/* out = (own p0 p1 + p2) p3 */
		double p0 = params[0].value, p1 = params[1].value,
		       p2 = params[2].value, p3 = params[3].value;
		double want[4] = {own_value * p1 * p3, own_value * p0 * p3, p3,
				  own_value * p0 * p1 + p2};
		for (int k = 0; k < 4; k++) {
			void *v;
			if (adg_grads_get(g, params[k].id, &v) != 0 ||
			    *(double *)v != want[k])
				atomic_fetch_add(&wrong, 1);
		}
		adg_grads_free(g);
		s_drop(out);
		s_drop(own);
	}
	return NULL;
}

static void disjoint(int threads, int rounds)
{
	for (int k = 0; k < 4; k++)
		params[k] = s_leaf(reg, k + 2);
	disjoint_rounds = rounds;
	run_threads(threads, disjoint_worker);
	cr_expect_eq(atomic_load(&wrong), 0);
	struct adg_stats st;
	adg_stats(reg, &st);
	cr_expect_eq(st.merges, 0);
	cr_expect_eq(st.live_nodes, 4);
	cr_expect_eq(st.live_steps, 0);
	cr_expect_eq(st.live_graphs, 0);
	for (int k = 0; k < 4; k++)
		s_drop(params[k]);
}

CHECKED_TEST(stress, disjoint_graphs_2_threads)
{
	disjoint(2, 4000);
}

CHECKED_TEST(stress, disjoint_graphs_8_threads)
{
	disjoint(8, 1000);
}

CHECKED_TEST(stress, disjoint_graphs_32_threads)
{
	disjoint(32, 250);
}

/* Merges in random orders while other threads look nodes up. The pool is
 * the test's; the library sees ops on random pairs of pooled nodes. */
#define POOL	  64
#define MERGERS	  4
#define READERS	  2
#define MERGE_OPS 1500
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static scalar pool[POOL];
static atomic_bool merging_done;
static scalar pool_leaf;

/* The test's own record of every op node, to compute components later. */
#define MAX_NODES (POOL + MERGERS * MERGE_OPS)
static struct {
	scalar x;
	int parent[2];
	bool starts_graph;
} made[MAX_NODES];
static atomic_int n_made;
static int pool_index[POOL];

static scalar take_ref(int slot, int *index)
{
	pthread_mutex_lock(&pool_lock);
	scalar x = pool[slot];
	*index = pool_index[slot];
	adg_node_ref(x.node);
	pthread_mutex_unlock(&pool_lock);
	return x;
}

static void *merger(void *arg)
{
	unsigned int seed = (unsigned int)(intptr_t)arg * 7919 + 1;
	for (int i = 0; i < MERGE_OPS; i++) {
		int ia, ib;
		int sa = rand_r(&seed) % POOL, sb = rand_r(&seed) % POOL;
		scalar a = take_ref(sa, &ia), b = take_ref(sb, &ib);
		scalar y = s_mul(reg, a, b);
		int idx = atomic_fetch_add(&n_made, 1);
		made[idx].x = y;
		made[idx].parent[0] = ia;
		made[idx].parent[1] = ib;
		adg_node_ref(y.node); /* made[] keeps one */
		pthread_mutex_lock(&pool_lock);
		scalar old = pool[sa];
		pool[sa] = y;
		pool_index[sa] = idx;
		pthread_mutex_unlock(&pool_lock);
		s_drop(old);
		s_drop(a);
		s_drop(b);
	}
	return NULL;
}

static void *reader(void *arg)
{
	unsigned int seed = (unsigned int)(intptr_t)arg * 31 + 7;
	long lookups = 0;
	while (!atomic_load(&merging_done)) {
		int ix;
		scalar x = take_ref(rand_r(&seed) % POOL, &ix);
		uint64_t g;
		if (adg_node_graph_id(x.node, &g) != 0 || g == 0)
			atomic_fetch_add(&wrong, 1);
		s_drop(x);
		lookups++;
	}
	return (void *)lookups;
}

/* Backward passes on graphs of their own, on the same registry and at the
 * same time as the merges: each checks its gradient. */
#define BACKWARDERS 2
static atomic_long side_passes;

static void *side_backward(void *arg)
{
	double v = 2 + (double)(intptr_t)arg;
	for (int pass = 0; pass < 20 || !atomic_load(&merging_done); pass++) {
		scalar a = s_leaf(reg, v), b = s_leaf(reg, 3);
		scalar ab = s_mul(reg, a, b), y = s_mul(reg, ab, a);
		adg_grads *g = NULL;
		void *d;
		if (s_backward(reg, y, &g) != 0 ||
		    adg_grads_get(g, a.id, &d) != 0 ||
		    *(double *)d != 2 * v * 3)
			atomic_fetch_add(&wrong, 1);
		adg_grads_free(g);
		scalar all[] = {a, b, ab, y};
		for (int i = 0; i < 4; i++)
			s_drop(all[i]);
		atomic_fetch_add(&side_passes, 1);
	}
	return NULL;
}

static pthread_barrier_t merge_start;

static void *merge_or_read(void *arg)
{
	intptr_t i = (intptr_t)arg;
	/* Everyone starts together, so that the roles overlap. */
	pthread_barrier_wait(&merge_start);
	if (i < MERGERS)
		return merger(arg);
	if (i < MERGERS + READERS)
		return reader(arg);
	return side_backward(arg);
}

/* How often the leaf occurs in each made node's product: its gradient,
 * since every value is 1. */
static double *occurrences;
static atomic_int backward_ok;

static void *pool_backward(void *arg)
{
	intptr_t t = (intptr_t)arg;
	for (int slot = (int)t; slot < POOL; slot += 4) {
		adg_grads *g;
		int rc = s_backward(reg, pool[slot], &g);
		if (rc == ADG_EUNAVAILABLE || rc == ADG_ECONSUMED)
			continue;
		void *v;
		double want = occurrences[pool_index[slot]];
		if (rc != 0 || adg_grads_get(g, pool_leaf.id, &v) != 0 ||
		    (want < 0x1p50 && *(double *)v != want))
			atomic_fetch_add(&wrong, 1);
		else
			atomic_fetch_add(&backward_ok, 1);
		adg_grads_free(g);
	}
	return NULL;
}

static int find_root(int *up, int i)
{
	while (up[i] != i)
		i = up[i] = up[up[i]];
	return i;
}

CHECKED_TEST(stress, merges_in_random_orders_with_lookups)
{
	pool_leaf = s_leaf(reg, 1);
	for (int i = 0; i < POOL; i++) {
		scalar y = s_mul(reg, pool_leaf, pool_leaf);
		made[i].x = y;
		made[i].parent[0] = made[i].parent[1] = -1;
		made[i].starts_graph = true;
		adg_node_ref(y.node);
		pool[i] = y;
		pool_index[i] = i;
	}
	atomic_store(&n_made, POOL);
	enum { ALL = MERGERS + READERS + BACKWARDERS };
	pthread_t t[ALL];
	pthread_barrier_init(&merge_start, NULL, ALL);
	for (intptr_t i = 0; i < ALL; i++)
		pthread_create(&t[i], NULL, merge_or_read, (void *)i);
	for (int i = 0; i < MERGERS; i++)
		pthread_join(t[i], NULL);
	atomic_store(&merging_done, true);
	for (int i = MERGERS; i < ALL; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&merge_start);
	cr_expect_eq(
		atomic_load(&wrong), 0,
		"a live op reported no graph, or a side backward was wrong");
	cr_expect_gt(atomic_load(&side_passes), 0);

	/* Components of the parent relation; each graph's id must be the
	 * smallest id of the graph-starting nodes in it. */
	int n = atomic_load(&n_made);
	int *up = malloc(n * sizeof *up);
	for (int i = 0; i < n; i++)
		up[i] = i;
	for (int i = 0; i < n; i++)
		for (int k = 0; k < 2; k++)
			if (made[i].parent[k] >= 0)
				up[find_root(up, made[i].parent[k])] =
					find_root(up, i);
	uint64_t *smallest = malloc(n * sizeof *smallest);
	for (int i = 0; i < n; i++)
		smallest[i] = UINT64_MAX;
	for (int i = 0; i < n; i++) {
		int r = find_root(up, i);
		if (made[i].starts_graph && made[i].x.id < smallest[r])
			smallest[r] = made[i].x.id;
	}
	struct adg_stats st;
	adg_stats(reg, &st);
	int components = 0;
	for (int i = 0; i < n; i++) {
		int r = find_root(up, i);
		cr_assert_eq(s_graph(made[i].x), smallest[r], "node %d", i);
		if (r == i)
			components++;
	}
	cr_expect_eq(st.live_graphs, (uint64_t)components);
	cr_expect_eq(st.merges, (uint64_t)(POOL - components));

	/* Backward from every pooled root at once, from several threads:
	 * the tapes overlap, so each step is taken once and the others get
	 * ADG_EUNAVAILABLE or ADG_ECONSUMED, never a partial result. */
	occurrences = malloc(n * sizeof *occurrences);
	for (int i = 0; i < n; i++)
		occurrences[i] =
			made[i].parent[0] < 0
				? 2
				: occurrences[made[i].parent[0]] +
					  occurrences[made[i].parent[1]];
	run_threads(4, pool_backward);
	cr_expect_eq(atomic_load(&wrong), 0, "a wrong or partial gradient");
	cr_expect_gt(atomic_load(&backward_ok), 0);
	for (int i = 0; i < n; i++)
		s_drop(made[i].x);
	free(up);
	free(smallest);
	free(occurrences);
	for (int i = 0; i < POOL; i++)
		s_drop(pool[i]);
	s_drop(pool_leaf);
	assert_stats(reg, 0, 0, 0);
}

/* Overlapping tapes: two threads race backward on roots that share all of
 * their ancestors; exactly one takes them. */
static scalar race_a, race_b, race_roots[2];
static int race_rc[2];
static pthread_barrier_t race_start;

static void *race_backward(void *arg)
{
	intptr_t i = (intptr_t)arg;
	adg_grads *g = NULL;
	pthread_barrier_wait(&race_start);
	race_rc[i] = s_backward(reg, race_roots[i], &g);
	if (race_rc[i] == 0) {
		/* roots a^2 b^2 and a b^3 at a = 2, b = 3: the whole
		 * gradient or nothing */
		double want_a = i == 0 ? 2 * 2.0 * 9 : 27.0;
		double want_b = i == 0 ? 2 * 4.0 * 3 : 3 * 2.0 * 9;
		void *va, *vb;
		if (adg_grads_get(g, race_a.id, &va) != 0 ||
		    adg_grads_get(g, race_b.id, &vb) != 0 ||
		    *(double *)va != want_a || *(double *)vb != want_b)
			atomic_fetch_add(&wrong, 1);
	}
	adg_grads_free(g);
	return NULL;
}

CHECKED_TEST(stress, overlapping_backward_takes_each_step_once)
{
	for (int round = 0; round < 300; round++) {
		scalar a = race_a = s_leaf(reg, 2), b = race_b = s_leaf(reg, 3);
		scalar x = s_mul(reg, a, b);
		scalar x2 = s_mul(reg, x, b);
		race_roots[0] = s_mul(reg, x2, a);
		race_roots[1] = s_mul(reg, x2, b);
		pthread_barrier_init(&race_start, NULL, 2);
		pthread_t t[2];
		for (intptr_t i = 0; i < 2; i++)
			pthread_create(&t[i], NULL, race_backward, (void *)i);
		for (int i = 0; i < 2; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&race_start);
		int ok = (race_rc[0] == 0) + (race_rc[1] == 0);
		cr_assert_eq(ok, 1, "round %d: %d %d", round, race_rc[0],
			     race_rc[1]);
		for (int i = 0; i < 2; i++)
			if (race_rc[i] != 0)
				cr_assert_eq(race_rc[i], ADG_EUNAVAILABLE);
		assert_stats(reg, 6, 1, 1);
		scalar all[] = {a, b, x, x2, race_roots[0], race_roots[1]};
		for (int i = 0; i < 6; i++)
			s_drop(all[i]);
	}
	cr_expect_eq(atomic_load(&wrong), 0);
}

/* Reference drops race with registrations that name the dropped node: the
 * registering thread holds its own reference while it calls. */
#define DROPPERS    4
#define DROP_ROUNDS 2000
static scalar shared_x;
static pthread_barrier_t drop_start;
static scalar children[DROPPERS];

static void *drop_or_use(void *arg)
{
	intptr_t i = (intptr_t)arg;
	scalar own = shared_x;
	adg_node_ref(own.node); /* taken before the barrier: ours to use */
	pthread_barrier_wait(&drop_start);
	if (i == 0)
		s_drop(shared_x); /* the creator's reference */
	children[i] = s_mul(reg, own, params[0]);
	s_drop(own);
	return NULL;
}

CHECKED_TEST(stress, drops_race_with_registrations)
{
	params[0] = s_leaf(reg, 3);
	for (int round = 0; round < DROP_ROUNDS / 10; round++) {
		scalar a = s_leaf(reg, 2);
		shared_x = s_mul(reg, a, a);
		pthread_barrier_init(&drop_start, NULL, DROPPERS);
		run_threads(DROPPERS, drop_or_use);
		pthread_barrier_destroy(&drop_start);
		/* every child keeps x and its step: each backward from a child
		 * but the first finds x consumed */
		assert_stats(reg, 3 + DROPPERS, 1 + DROPPERS, 1);
		int succeeded = 0;
		for (int i = 0; i < DROPPERS; i++) {
			adg_grads *g;
			int rc = s_backward(reg, children[i], &g);
			if (rc == 0) {
				succeeded++;
				cr_expect_eq(s_grad(g, a), 2 * 2.0 * 3);
				adg_grads_free(g);
			} else {
				cr_expect_eq(rc, ADG_EUNAVAILABLE);
			}
			s_drop(children[i]);
		}
		cr_expect_eq(succeeded, 1);
		assert_stats(reg, 2, 0, 0);
		s_drop(a);
	}
	s_drop(params[0]);
}

/* Churn: merges, unrun frees, backward passes and lookups on one shared
 * pool at once. Frees of unconsumed nodes and backward passes lock graphs
 * that merges are moving nodes out of. */
#define CHURN_THREADS 6
#define CHURN_OPS     3000
static scalar churn_pool[POOL];
static pthread_mutex_t churn_lock = PTHREAD_MUTEX_INITIALIZER;

static scalar churn_take(int slot)
{
	pthread_mutex_lock(&churn_lock);
	scalar x = churn_pool[slot];
	adg_node_ref(x.node);
	pthread_mutex_unlock(&churn_lock);
	return x;
}

static void churn_put(int slot, scalar x)
{
	pthread_mutex_lock(&churn_lock);
	scalar old = churn_pool[slot];
	churn_pool[slot] = x;
	pthread_mutex_unlock(&churn_lock);
	s_drop(old); /* may free an unrun graph, or part of one */
}

static void *churn_worker(void *arg)
{
	unsigned int seed = (unsigned int)(intptr_t)arg * 104729 + 3;
	for (int i = 0; i < CHURN_OPS; i++) {
		int kind = rand_r(&seed) % 10;
		int sa = rand_r(&seed) % POOL, sb = rand_r(&seed) % POOL;
		int sc = rand_r(&seed) % POOL;
		scalar a = churn_take(sa);
		if (kind < 6) {
			scalar b = churn_take(sb);
			churn_put(sc, s_mul(reg, a, b));
			s_drop(b);
		} else if (kind < 8) {
			adg_grads *g;
			int rc = s_backward(reg, a, &g);
			if (rc == 0) {
				void *v;
				if (adg_grads_get(g, pool_leaf.id, &v) != 0 ||
				    *(double *)v < 1)
					atomic_fetch_add(&wrong, 1);
				adg_grads_free(g);
				churn_put(sa, s_mul(reg, pool_leaf, pool_leaf));
			} else if (rc != ADG_EUNAVAILABLE &&
				   rc != ADG_ECONSUMED) {
				atomic_fetch_add(&wrong, 1);
			}
		} else {
			uint64_t gid;
			if (adg_node_graph_id(a.node, &gid) != 0)
				atomic_fetch_add(&wrong, 1);
		}
		s_drop(a);
	}
	return NULL;
}

CHECKED_TEST(stress, merges_frees_backward_and_lookups_at_once)
{
	pool_leaf = s_leaf(reg, 1);
	for (int i = 0; i < POOL; i++)
		churn_pool[i] = s_mul(reg, pool_leaf, pool_leaf);
	run_threads(CHURN_THREADS, churn_worker);
	cr_expect_eq(atomic_load(&wrong), 0);
	for (int i = 0; i < POOL; i++)
		s_drop(churn_pool[i]);
	assert_stats(reg, 1, 0, 0);
	s_drop(pool_leaf);
}

/* Regression: a backward walking to a parent that another thread's
 * backward had consumed read the parent's state, written under a lock the
 * walker did not hold and ordered before it only by the consume-ordered
 * read of the parent's graph pointer (reported by TSan in adg-bench's
 * lookup workload). The walk now tells a consumed parent by its pointer
 * alone. One thread consumes x; the other learns it only from x's graph
 * id, the way adg_op learns it, then joins x and runs backward, which
 * must fail cleanly. The steps and values here share nothing between the
 * threads (unlike the scalar backend's counters), so that as little as
 * possible orders the two. */
#define SHARE_ROUNDS 300
static adg_node *share_a, *share_x, *share_j1;
static int share_rc[2];
static atomic_bool share_joined;

static int token_add(void **sum, void *value, void *ctx)
{
	(void)sum;
	(void)value;
	(void)ctx;
	return 0;
}

static void token_free(void *value, void *ctx)
{
	(void)value;
	(void)ctx;
}

static const adg_grad_ops token_ops = {token_add, token_free, NULL};

static int token_backward(adg_step_call *call, void *user)
{
	(void)user;
	for (size_t i = 0; i < call->n_parents; i++)
		adg_grads_register(call->grads, call->parent_ids[i], (void *)1);
	return 0;
}

static adg_node *token_op(adg_node *p, adg_node *q)
{
	adg_node *parents[2] = {p, q}, *out;
	adg_step st = {token_backward, NULL, NULL};
	cr_assert_eq(adg_op(reg, parents, 2, &st, &out), 0);
	return out;
}

static void *consume_shared(void *arg)
{
	(void)arg;
	adg_grads *g = NULL;
	share_rc[0] = adg_backward(reg, share_j1, (void *)1, &token_ops, &g);
	adg_grads_free(g);
	/* Stay alive until the other thread is done: an exiting thread hands
	 * its shard back, which would order it before a later adopter. */
	while (!atomic_load_explicit(&share_joined, memory_order_relaxed))
		sched_yield();
	return NULL;
}

static void *join_consumed(void *arg)
{
	(void)arg;
	uint64_t gid = 1;
	/* No lock and no barrier between the threads: only x's graph
	 * pointer says that the other backward has taken it. */
	while (adg_node_graph_id(share_x, &gid) == 0 && gid != 0)
		sched_yield();
	adg_node *j2 = token_op(share_x, share_a);
	adg_grads *g = NULL;
	share_rc[1] = adg_backward(reg, j2, (void *)1, &token_ops, &g);
	adg_grads_free(g);
	adg_node_unref(j2);
	atomic_store_explicit(&share_joined, true, memory_order_relaxed);
	return NULL;
}

static void *consume_or_join(void *arg)
{
	return (intptr_t)arg == 0 ? consume_shared(arg) : join_consumed(arg);
}

CHECKED_TEST(stress, backward_meets_parent_consumed_by_another_thread)
{
	cr_assert_eq(adg_leaf(reg, &share_a), 0);
	for (int round = 0; round < SHARE_ROUNDS; round++) {
		share_x = token_op(share_a, share_a);
		share_j1 = token_op(share_x, share_a);
		atomic_store(&share_joined, false);
		run_threads(2, consume_or_join);
		cr_assert_eq(share_rc[0], 0, "round %d", round);
		cr_assert_eq(share_rc[1], ADG_EUNAVAILABLE, "round %d", round);
		adg_node_unref(share_j1);
		adg_node_unref(share_x);
	}
	adg_node_unref(share_a);
}

/* burn issue 5573: a concurrent backward freed steps of a graph another
 * thread was still building, so a leaf silently got no gradient. Here a
 * leaf goes through a backward and is reused in a new op on one thread
 * while other threads run backward passes on graphs of the same leaf and
 * drop their references; the reused leaf's gradient is never missing. */
#define REUSE_ROUNDS 1000
#define REUSE_OTHERS 3
static scalar reuse_leaf;
static pthread_barrier_t reuse_start;

static void *reuse_other(void *arg)
{
	double v = 5 + (double)(intptr_t)arg;
	pthread_barrier_wait(&reuse_start);
	scalar own = s_leaf(reg, v);
	scalar y = s_mul(reg, reuse_leaf, own);
	adg_grads *g;
	if (s_backward(reg, y, &g) != 0 || s_grad(g, reuse_leaf) != v)
		atomic_fetch_add(&wrong, 1);
	adg_grads_free(g);
	s_drop(y);
	s_drop(own);
	return NULL;
}

static void *reuse_main(void *arg)
{
	(void)arg;
	scalar a = s_leaf(reg, 3), b = s_leaf(reg, 4);
	scalar y1 = s_mul(reg, reuse_leaf, a);
	adg_grads *g;
	pthread_barrier_wait(&reuse_start);
	if (s_backward(reg, y1, &g) != 0 || s_grad(g, reuse_leaf) != 3)
		atomic_fetch_add(&wrong, 1);
	adg_grads_free(g);
	/* The leaf again, while the others are mid-backward. */
	scalar y2 = s_mul(reg, reuse_leaf, b);
	scalar y3 = s_mul(reg, y2, a);
	s_drop(y2);
	void *v;
	if (s_backward(reg, y3, &g) != 0 ||
	    adg_grads_get(g, reuse_leaf.id, &v) != 0 || *(double *)v != 12)
		atomic_fetch_add(&wrong, 1);
	adg_grads_free(g);
	scalar all[] = {a, b, y1, y3};
	for (int i = 0; i < 4; i++)
		s_drop(all[i]);
	return NULL;
}

static void *reuse_role(void *arg)
{
	return (intptr_t)arg == 0 ? reuse_main(arg) : reuse_other(arg);
}

CHECKED_TEST(stress, reused_leaf_never_misses_its_gradient)
{
	for (int round = 0; round < REUSE_ROUNDS; round++) {
		reuse_leaf = s_leaf(reg, 2);
		pthread_barrier_init(&reuse_start, NULL, REUSE_OTHERS + 1);
		run_threads(REUSE_OTHERS + 1, reuse_role);
		pthread_barrier_destroy(&reuse_start);
		s_drop(reuse_leaf);
		cr_assert_eq(atomic_load(&wrong), 0, "round %d", round);
	}
	assert_stats(reg, 0, 0, 0);
}

/* Nested backward from 8 threads at once: each step runs a backward on a
 * graph of its own and one on a sibling node of its own graph (which needs
 * a step this backward took: ADG_EUNAVAILABLE). */
#define NEST_THREADS 8
#define NEST_ROUNDS  100

struct nest {
	struct prod_step *inner;
	adg_node *other, *sibling;
	uint64_t other_leaf;
};

static int nest_backward(adg_step_call *call, void *user)
{
	struct nest *n = user;
	adg_grads *g;
	void *v;
	int rc = adg_backward(call->registry, n->other, scalar_box(1),
			      &scalar_ops, &g);
	if (rc != 0)
		return rc;
	if (adg_grads_get(g, n->other_leaf, &v) != 0 || *(double *)v != 7)
		atomic_fetch_add(&wrong, 1);
	adg_grads_free(g);
	g = NULL;
	if (adg_backward(call->registry, n->sibling, scalar_box(1), &scalar_ops,
			 &g) != ADG_EUNAVAILABLE)
		atomic_fetch_add(&wrong, 1);
	adg_grads_free(g);
	return prod_backward(call, n->inner);
}

static void nest_release(void *user)
{
	struct nest *n = user;
	prod_release(n->inner);
	free(n);
}

static void *nest_worker(void *arg)
{
	(void)arg;
	for (int round = 0; round < NEST_ROUNDS; round++) {
		scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3),
		       e = s_leaf(reg, 5), f = s_leaf(reg, 7);
		scalar other = s_mul(reg, e, f);
		scalar x = s_mul(reg, a, b);
		scalar sib = s_mul(reg, x, a);
		struct nest *n = malloc(sizeof *n);
		scalar factors[2] = {x, b};
		n->inner = prod_step_new(factors, 2);
		n->other = other.node;
		n->sibling = sib.node;
		n->other_leaf = e.id;
		adg_node *parents[2] = {x.node, b.node};
		adg_step st = {nest_backward, nest_release, n};
		scalar y = {.value = x.value * b.value};
		if (adg_op(reg, parents, 2, &st, &y.node) != 0) {
			atomic_fetch_add(&wrong, 1);
			nest_release(n);
			continue;
		}
		adg_node_id(y.node, &y.id);
		adg_grads *g;
		/* y = a b b: dy/da = b^2 */
		if (s_backward(reg, y, &g) != 0 || s_grad(g, a) != 9)
			atomic_fetch_add(&wrong, 1);
		adg_grads_free(g);
		scalar all[] = {a, b, e, f, other, x, sib, y};
		for (int i = 0; i < 8; i++)
			s_drop(all[i]);
	}
	return NULL;
}

CHECKED_TEST(stress, nested_backward_from_8_threads)
{
	run_threads(NEST_THREADS, nest_worker);
	cr_expect_eq(atomic_load(&wrong), 0);
	assert_stats(reg, 0, 0, 0);
}

/* A thread's shards live in a few slots (lib/registry.c): one thread that
 * works on more registries than it has slots lets go of one shard for
 * another and adopts it back later, over and over; every registry's
 * gradients and counts stay right, and each gives back all its memory. */
#define MANY_REGISTRIES 7
#define MANY_ROUNDS	300

CHECKED_TEST(stress, one_thread_more_registries_than_slots)
{
	adg_registry *regs[MANY_REGISTRIES];
	failing_alloc mem[MANY_REGISTRIES] = {0};
	for (int k = 0; k < MANY_REGISTRIES; k++) {
		adg_registry_options o = {.allocator =
						  failing_allocator(&mem[k])};
		cr_assert_eq(adg_registry_new(&o, &regs[k]), 0);
	}
	for (int round = 0; round < MANY_ROUNDS; round++)
		for (int k = 0; k < MANY_REGISTRIES; k++) {
			scalar a = s_leaf(regs[k], k + 1),
			       b = s_leaf(regs[k], 3);
			scalar y = s_mul(regs[k], a, b);
			adg_grads *g;
			cr_assert_eq(s_backward(regs[k], y, &g), 0);
			cr_assert_eq(s_grad(g, a), 3);
			cr_assert_eq(s_grad(g, b), k + 1);
			adg_grads_free(g);
			s_drop(y);
			s_drop(a);
			s_drop(b);
			assert_stats(regs[k], 0, 0, 0);
		}
	for (int k = 0; k < MANY_REGISTRIES; k++) {
		cr_assert_eq(adg_registry_free(regs[k]), 0);
		cr_expect_eq(atomic_load(&mem[k].live_bytes), 0,
			     "registry %d kept %ld bytes", k,
			     atomic_load(&mem[k].live_bytes));
	}
}

/* Threads that used a registry exit while another thread frees it: the
 * exiting threads hand their shards back under the same lock that the free
 * takes to clear every thread's slots, so neither touches what the other
 * frees. The workers are done with the registry (the contract) but not
 * joined when the free starts. */
#define EXIT_ROUNDS  200
#define EXIT_THREADS 4
static adg_registry *exit_reg;
static pthread_barrier_t exit_done;

static void *use_then_exit(void *arg)
{
	scalar a = s_leaf(exit_reg, (double)(intptr_t)arg + 1);
	scalar y = s_mul(exit_reg, a, a);
	adg_grads *g;
	if (s_backward(exit_reg, y, &g) != 0)
		atomic_fetch_add(&wrong, 1);
	adg_grads_free(g);
	s_drop(y);
	s_drop(a);
	pthread_barrier_wait(&exit_done);
	return NULL;
}

CHECKED_TEST(stress, threads_exit_while_their_registry_is_freed)
{
	for (int round = 0; round < EXIT_ROUNDS; round++) {
		failing_alloc mem = {0};
		adg_registry_options o = {.allocator = failing_allocator(&mem)};
		cr_assert_eq(adg_registry_new(&o, &exit_reg), 0);
		pthread_barrier_init(&exit_done, NULL, EXIT_THREADS + 1);
		pthread_t t[EXIT_THREADS];
		for (intptr_t i = 0; i < EXIT_THREADS; i++)
			cr_assert_eq(pthread_create(&t[i], NULL, use_then_exit,
						    (void *)i),
				     0);
		pthread_barrier_wait(&exit_done);
		cr_assert_eq(adg_registry_free(exit_reg), 0);
		cr_assert_eq(atomic_load(&mem.live_bytes), 0, "round %d",
			     round);
		for (int i = 0; i < EXIT_THREADS; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&exit_done);
	}
	cr_expect_eq(atomic_load(&wrong), 0);
}
