/* Concurrency stress, bounded by iteration counts: every result is checked,
 * and ThreadSanitizer and AddressSanitizer builds run the same code. Each
 * scenario keeps its state in a struct of its own, which its threads get
 * through their argument. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

FIXTURE_SUITE(stress, .timeout = 600);

/* Disjoint graphs on shared leaves, with backward, at 2, 8, 32 threads. */
struct disjoint {
	scalar params[4];
	int rounds;
	atomic_int wrong;
};

static void *disjoint_worker(void *arg)
{
	const struct thread *t = arg;
	struct disjoint *d = t->s;
	const scalar *params = d->params;
	double own_value = (double)(t->i % 5 + 1);
	for (int round = 0; round < d->rounds; round++) {
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
			atomic_fetch_add(&d->wrong, 1);
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
				atomic_fetch_add(&d->wrong, 1);
		}
		adg_grads_free(g);
		s_drop(out);
		s_drop(own);
	}
	return NULL;
}

static void disjoint(int threads, int rounds)
{
	struct disjoint d = {.rounds = rounds};
	for (int k = 0; k < 4; k++)
		d.params[k] = s_leaf(reg, k + 2);
	run_threads(threads, disjoint_worker, &d);
	cr_expect_eq(atomic_load(&d.wrong), 0);
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(reg, &st);
	cr_expect_eq(st.merges, 0);
	cr_expect_eq(st.live_nodes, 4);
	cr_expect_eq(st.live_steps, 0);
	cr_expect_eq(st.live_graphs, 0);
	for (int k = 0; k < 4; k++)
		s_drop(d.params[k]);
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
/* Backward passes on graphs of their own, on the same registry and at the
 * same time as the merges: each checks its gradient. */
#define BACKWARDERS 2
/* The test's own record of every op node, to compute components later. */
#define MAX_NODES (POOL + MERGERS * MERGE_OPS)

struct merges {
	pthread_mutex_t lock; /* guards pool and pool_index */
	scalar pool[POOL];
	int pool_index[POOL];
	scalar leaf;
	struct {
		scalar x;
		int parent[2];
		bool starts_graph;
	} made[MAX_NODES];
	atomic_int n_made;
	atomic_bool merging_done;
	pthread_barrier_t start;
	atomic_long side_passes;
	/* How often the leaf occurs in each made node's product: its
	 * gradient, since every value is 1. */
	double *occurrences;
	atomic_int backward_ok, wrong;
};

static scalar take_ref(struct merges *m, int slot, int *index)
{
	pthread_mutex_lock(&m->lock);
	scalar x = m->pool[slot];
	*index = m->pool_index[slot];
	adg_node_ref(x.node);
	pthread_mutex_unlock(&m->lock);
	return x;
}

static void merger(struct merges *m, int i)
{
	unsigned int seed = (unsigned int)i * 7919 + 1;
	for (int op = 0; op < MERGE_OPS; op++) {
		int ia, ib;
		int sa = rand_r(&seed) % POOL, sb = rand_r(&seed) % POOL;
		scalar a = take_ref(m, sa, &ia), b = take_ref(m, sb, &ib);
		scalar y = s_mul(reg, a, b);
		int idx = atomic_fetch_add(&m->n_made, 1);
		m->made[idx].x = y;
		m->made[idx].parent[0] = ia;
		m->made[idx].parent[1] = ib;
		adg_node_ref(y.node); /* made[] keeps one */
		pthread_mutex_lock(&m->lock);
		scalar old = m->pool[sa];
		m->pool[sa] = y;
		m->pool_index[sa] = idx;
		pthread_mutex_unlock(&m->lock);
		s_drop(old);
		s_drop(a);
		s_drop(b);
	}
}

static void reader(struct merges *m, int i)
{
	unsigned int seed = (unsigned int)i * 31 + 7;
	while (!atomic_load(&m->merging_done)) {
		int ix;
		scalar x = take_ref(m, rand_r(&seed) % POOL, &ix);
		uint64_t g;
		if (adg_node_graph_id(x.node, &g) != 0 || g == 0)
			atomic_fetch_add(&m->wrong, 1);
		s_drop(x);
	}
}

static void side_backward(struct merges *m, int i)
{
	double v = 2 + (double)i;
	for (int pass = 0; pass < 20 || !atomic_load(&m->merging_done);
	     pass++) {
		scalar a = s_leaf(reg, v), b = s_leaf(reg, 3);
		scalar ab = s_mul(reg, a, b), y = s_mul(reg, ab, a);
		adg_grads *g = NULL;
		void *d;
		if (s_backward(reg, y, &g) != 0 ||
		    adg_grads_get(g, a.id, &d) != 0 ||
		    *(double *)d != 2 * v * 3)
			atomic_fetch_add(&m->wrong, 1);
		adg_grads_free(g);
		scalar all[] = {a, b, ab, y};
		for (int k = 0; k < 4; k++)
			s_drop(all[k]);
		atomic_fetch_add(&m->side_passes, 1);
	}
}

static void *merge_or_read(void *arg)
{
	const struct thread *t = arg;
	struct merges *m = t->s;
	/* Everyone starts together, so that the roles overlap. */
	pthread_barrier_wait(&m->start);
	if (t->i < MERGERS)
		merger(m, t->i);
	else if (t->i < MERGERS + READERS)
		reader(m, t->i);
	else
		side_backward(m, t->i);
	return NULL;
}

static void *pool_backward(void *arg)
{
	const struct thread *t = arg;
	struct merges *m = t->s;
	for (int slot = t->i; slot < POOL; slot += 4) {
		adg_grads *g;
		int rc = s_backward(reg, m->pool[slot], &g);
		if (rc == ADG_EUNAVAILABLE || rc == ADG_ECONSUMED)
			continue;
		void *v;
		double want = m->occurrences[m->pool_index[slot]];
		if (rc != 0 || adg_grads_get(g, m->leaf.id, &v) != 0 ||
		    (want < 0x1p50 && *(double *)v != want))
			atomic_fetch_add(&m->wrong, 1);
		else
			atomic_fetch_add(&m->backward_ok, 1);
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
	struct merges *m = calloc(1, sizeof *m);
	cr_assert_not_null(m);
	pthread_mutex_init(&m->lock, NULL);
	m->leaf = s_leaf(reg, 1);
	for (int i = 0; i < POOL; i++) {
		scalar y = s_mul(reg, m->leaf, m->leaf);
		m->made[i].x = y;
		m->made[i].parent[0] = m->made[i].parent[1] = -1;
		m->made[i].starts_graph = true;
		adg_node_ref(y.node);
		m->pool[i] = y;
		m->pool_index[i] = i;
	}
	atomic_store(&m->n_made, POOL);
	enum { ALL = MERGERS + READERS + BACKWARDERS };
	pthread_t t[ALL];
	struct thread arg[ALL];
	pthread_barrier_init(&m->start, NULL, ALL);
	for (int i = 0; i < ALL; i++) {
		arg[i] = (struct thread){m, i};
		pthread_create(&t[i], NULL, merge_or_read, &arg[i]);
	}
	for (int i = 0; i < MERGERS; i++)
		pthread_join(t[i], NULL);
	atomic_store(&m->merging_done, true);
	for (int i = MERGERS; i < ALL; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&m->start);
	cr_expect_eq(
		atomic_load(&m->wrong), 0,
		"a live op reported no graph, or a side backward was wrong");
	cr_expect_gt(atomic_load(&m->side_passes), 0);

	/* Components of the parent relation; each graph's id must be the
	 * smallest id of the graph-starting nodes in it. */
	int n = atomic_load(&m->n_made);
	int *up = malloc(n * sizeof *up);
	for (int i = 0; i < n; i++)
		up[i] = i;
	for (int i = 0; i < n; i++)
		for (int k = 0; k < 2; k++)
			if (m->made[i].parent[k] >= 0)
				up[find_root(up, m->made[i].parent[k])] =
					find_root(up, i);
	uint64_t *smallest = malloc(n * sizeof *smallest);
	for (int i = 0; i < n; i++)
		smallest[i] = UINT64_MAX;
	for (int i = 0; i < n; i++) {
		int r = find_root(up, i);
		if (m->made[i].starts_graph && m->made[i].x.id < smallest[r])
			smallest[r] = m->made[i].x.id;
	}
	struct adg_stats st = {.size = sizeof st};
	adg_registry_stats(reg, &st);
	int components = 0;
	for (int i = 0; i < n; i++) {
		int r = find_root(up, i);
		cr_assert_eq(s_graph(m->made[i].x), smallest[r], "node %d", i);
		if (r == i)
			components++;
	}
	cr_expect_eq(st.live_graphs, (uint64_t)components);
	cr_expect_eq(st.merges, (uint64_t)(POOL - components));

	/* Backward from every pooled root at once, from several threads:
	 * the tapes overlap, so each step is taken once and the others get
	 * ADG_EUNAVAILABLE or ADG_ECONSUMED, never a partial result. */
	m->occurrences = malloc(n * sizeof *m->occurrences);
	for (int i = 0; i < n; i++)
		m->occurrences[i] =
			m->made[i].parent[0] < 0
				? 2
				: m->occurrences[m->made[i].parent[0]] +
					  m->occurrences[m->made[i].parent[1]];
	run_threads(4, pool_backward, m);
	cr_expect_eq(atomic_load(&m->wrong), 0, "a wrong or partial gradient");
	cr_expect_gt(atomic_load(&m->backward_ok), 0);
	for (int i = 0; i < n; i++)
		s_drop(m->made[i].x);
	free(up);
	free(smallest);
	free(m->occurrences);
	for (int i = 0; i < POOL; i++)
		s_drop(m->pool[i]);
	s_drop(m->leaf);
	assert_stats(reg, 0, 0, 0);
	pthread_mutex_destroy(&m->lock);
	free(m);
}

/* Overlapping tapes: two threads race backward on roots that share all of
 * their ancestors; exactly one takes them. */
struct overlap {
	scalar a, b, roots[2];
	int rc[2];
	pthread_barrier_t start;
	atomic_int wrong;
};

static void *race_backward(void *arg)
{
	const struct thread *t = arg;
	struct overlap *o = t->s;
	int i = t->i;
	adg_grads *g = NULL;
	pthread_barrier_wait(&o->start);
	o->rc[i] = s_backward(reg, o->roots[i], &g);
	if (o->rc[i] == 0) {
		/* roots a^2 b^2 and a b^3 at a = 2, b = 3: the whole
		 * gradient or nothing */
		double want_a = i == 0 ? 2 * 2.0 * 9 : 27.0;
		double want_b = i == 0 ? 2 * 4.0 * 3 : 3 * 2.0 * 9;
		void *va, *vb;
		if (adg_grads_get(g, o->a.id, &va) != 0 ||
		    adg_grads_get(g, o->b.id, &vb) != 0 ||
		    *(double *)va != want_a || *(double *)vb != want_b)
			atomic_fetch_add(&o->wrong, 1);
	}
	adg_grads_free(g);
	return NULL;
}

CHECKED_TEST(stress, overlapping_backward_takes_each_step_once)
{
	struct overlap o = {0};
	for (int round = 0; round < 300; round++) {
		scalar a = o.a = s_leaf(reg, 2), b = o.b = s_leaf(reg, 3);
		scalar x = s_mul(reg, a, b);
		scalar x2 = s_mul(reg, x, b);
		o.roots[0] = s_mul(reg, x2, a);
		o.roots[1] = s_mul(reg, x2, b);
		pthread_barrier_init(&o.start, NULL, 2);
		run_threads(2, race_backward, &o);
		pthread_barrier_destroy(&o.start);
		int ok = (o.rc[0] == 0) + (o.rc[1] == 0);
		cr_assert_eq(ok, 1, "round %d: %d %d", round, o.rc[0], o.rc[1]);
		for (int i = 0; i < 2; i++)
			if (o.rc[i] != 0)
				cr_assert_eq(o.rc[i], ADG_EUNAVAILABLE);
		assert_stats(reg, 6, 1, 1);
		scalar all[] = {a, b, x, x2, o.roots[0], o.roots[1]};
		for (int i = 0; i < 6; i++)
			s_drop(all[i]);
	}
	cr_expect_eq(atomic_load(&o.wrong), 0);
}

/* Reference drops race with registrations that name the dropped node: the
 * registering thread holds its own reference while it calls. */
#define DROPPERS    4
#define DROP_ROUNDS 2000

struct drops {
	scalar w, x;
	pthread_barrier_t start;
	scalar children[DROPPERS];
};

static void *drop_or_use(void *arg)
{
	const struct thread *t = arg;
	struct drops *d = t->s;
	scalar own = d->x;
	adg_node_ref(own.node); /* taken before the barrier: ours to use */
	pthread_barrier_wait(&d->start);
	if (t->i == 0)
		s_drop(d->x); /* the creator's reference */
	d->children[t->i] = s_mul(reg, own, d->w);
	s_drop(own);
	return NULL;
}

CHECKED_TEST(stress, drops_race_with_registrations)
{
	struct drops d = {.w = s_leaf(reg, 3)};
	for (int round = 0; round < DROP_ROUNDS / 10; round++) {
		scalar a = s_leaf(reg, 2);
		d.x = s_mul(reg, a, a);
		pthread_barrier_init(&d.start, NULL, DROPPERS);
		run_threads(DROPPERS, drop_or_use, &d);
		pthread_barrier_destroy(&d.start);
		/* every child keeps x and its step: each backward from a child
		 * but the first finds x consumed */
		assert_stats(reg, 3 + DROPPERS, 1 + DROPPERS, 1);
		int succeeded = 0;
		for (int i = 0; i < DROPPERS; i++) {
			adg_grads *g;
			int rc = s_backward(reg, d.children[i], &g);
			if (rc == 0) {
				succeeded++;
				cr_expect_eq(s_grad(g, a), 2 * 2.0 * 3);
				adg_grads_free(g);
			} else {
				cr_expect_eq(rc, ADG_EUNAVAILABLE);
			}
			s_drop(d.children[i]);
		}
		cr_expect_eq(succeeded, 1);
		assert_stats(reg, 2, 0, 0);
		s_drop(a);
	}
	s_drop(d.w);
}

/* Churn: merges, unrun frees, backward passes and lookups on one shared
 * pool at once. Frees of unconsumed nodes and backward passes lock graphs
 * that merges are moving nodes out of. */
#define CHURN_THREADS 6
#define CHURN_OPS     3000

struct churn {
	pthread_mutex_t lock; /* guards pool */
	scalar pool[POOL];
	scalar leaf;
	atomic_int wrong;
};

/* A reference of the caller's own to slots[i], a handle that other
 * threads replace under lock. */
static scalar slot_take(pthread_mutex_t *lock, scalar *slots, int i)
{
	pthread_mutex_lock(lock);
	scalar x = slots[i];
	adg_node_ref(x.node);
	pthread_mutex_unlock(lock);
	return x;
}

/* Puts x in slots[i], under lock, and drops the handle it replaces. */
static void slot_put(pthread_mutex_t *lock, scalar *slots, int i, scalar x)
{
	pthread_mutex_lock(lock);
	scalar old = slots[i];
	slots[i] = x;
	pthread_mutex_unlock(lock);
	s_drop(old); /* may free an unrun graph, or part of one */
}

static void *churn_worker(void *arg)
{
	const struct thread *t = arg;
	struct churn *c = t->s;
	unsigned int seed = (unsigned int)t->i * 104729 + 3;
	for (int i = 0; i < CHURN_OPS; i++) {
		int kind = rand_r(&seed) % 10;
		int sa = rand_r(&seed) % POOL, sb = rand_r(&seed) % POOL;
		int sc = rand_r(&seed) % POOL;
		scalar a = slot_take(&c->lock, c->pool, sa);
		if (kind < 6) {
			scalar b = slot_take(&c->lock, c->pool, sb);
			slot_put(&c->lock, c->pool, sc, s_mul(reg, a, b));
			s_drop(b);
		} else if (kind < 8) {
			adg_grads *g;
			int rc = s_backward(reg, a, &g);
			if (rc == 0) {
				void *v;
				if (adg_grads_get(g, c->leaf.id, &v) != 0 ||
				    *(double *)v < 1)
					atomic_fetch_add(&c->wrong, 1);
				adg_grads_free(g);
				slot_put(&c->lock, c->pool, sa,
					 s_mul(reg, c->leaf, c->leaf));
			} else if (rc != ADG_EUNAVAILABLE &&
				   rc != ADG_ECONSUMED) {
				atomic_fetch_add(&c->wrong, 1);
			}
		} else {
			uint64_t gid;
			if (adg_node_graph_id(a.node, &gid) != 0)
				atomic_fetch_add(&c->wrong, 1);
		}
		s_drop(a);
	}
	return NULL;
}

CHECKED_TEST(stress, merges_frees_backward_and_lookups_at_once)
{
	struct churn c = {.leaf = s_leaf(reg, 1)};
	pthread_mutex_init(&c.lock, NULL);
	for (int i = 0; i < POOL; i++)
		c.pool[i] = s_mul(reg, c.leaf, c.leaf);
	run_threads(CHURN_THREADS, churn_worker, &c);
	cr_expect_eq(atomic_load(&c.wrong), 0);
	for (int i = 0; i < POOL; i++)
		s_drop(c.pool[i]);
	assert_stats(reg, 1, 0, 0);
	s_drop(c.leaf);
	pthread_mutex_destroy(&c.lock);
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

struct share {
	adg_node *a, *x, *j1;
	int rc[2];
	atomic_bool joined;
};

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
		adg_step_give(call, i, (void *)1);
	return 0;
}

static adg_node *token_op(adg_node *p, adg_node *q)
{
	adg_node *parents[2] = {p, q}, *out;
	adg_step st = {
		.backward = token_backward, .release = NULL, .user = NULL};
	cr_assert_eq(adg_op(reg, parents, 2, &st, &out), 0);
	return out;
}

static void consume_shared(struct share *s)
{
	adg_grads *g = NULL;
	s->rc[0] = adg_backward(reg, s->j1, (void *)1, &token_ops, &g);
	adg_grads_free(g);
	/* Stay alive until the other thread is done: an exiting thread hands
	 * its shard back, which would order it before a later adopter. */
	while (!atomic_load_explicit(&s->joined, memory_order_relaxed))
		sched_yield();
}

static void join_consumed(struct share *s)
{
	uint64_t gid = 1;
	/* No lock and no barrier between the threads: only x's graph
	 * pointer says that the other backward has taken it. */
	while (adg_node_graph_id(s->x, &gid) == 0 && gid != 0)
		sched_yield();
	adg_node *j2 = token_op(s->x, s->a);
	adg_grads *g = NULL;
	s->rc[1] = adg_backward(reg, j2, (void *)1, &token_ops, &g);
	adg_grads_free(g);
	adg_node_unref(j2);
	atomic_store_explicit(&s->joined, true, memory_order_relaxed);
}

static void *consume_or_join(void *arg)
{
	const struct thread *t = arg;
	if (t->i == 0)
		consume_shared(t->s);
	else
		join_consumed(t->s);
	return NULL;
}

CHECKED_TEST(stress, backward_meets_parent_consumed_by_another_thread)
{
	struct share s = {0};
	cr_assert_eq(adg_leaf(reg, &s.a), 0);
	for (int round = 0; round < SHARE_ROUNDS; round++) {
		s.x = token_op(s.a, s.a);
		s.j1 = token_op(s.x, s.a);
		atomic_store(&s.joined, false);
		run_threads(2, consume_or_join, &s);
		cr_assert_eq(s.rc[0], 0, "round %d", round);
		cr_assert_eq(s.rc[1], ADG_EUNAVAILABLE, "round %d", round);
		adg_node_unref(s.j1);
		adg_node_unref(s.x);
	}
	adg_node_unref(s.a);
}

/* burn issue 5573: a concurrent backward freed steps of a graph another
 * thread was still building, so a leaf silently got no gradient. Here a
 * leaf goes through a backward and is reused in a new op on one thread
 * while other threads run backward passes on graphs of the same leaf and
 * drop their references; the reused leaf's gradient is never missing. */
#define REUSE_ROUNDS 1000
#define REUSE_OTHERS 3

struct reuse {
	scalar leaf;
	pthread_barrier_t start;
	atomic_int wrong;
};

static void reuse_other(struct reuse *r, int i)
{
	double v = 5 + (double)i;
	pthread_barrier_wait(&r->start);
	scalar own = s_leaf(reg, v);
	scalar y = s_mul(reg, r->leaf, own);
	adg_grads *g;
	if (s_backward(reg, y, &g) != 0 || s_grad(g, r->leaf) != v)
		atomic_fetch_add(&r->wrong, 1);
	adg_grads_free(g);
	s_drop(y);
	s_drop(own);
}

static void reuse_main(struct reuse *r)
{
	scalar a = s_leaf(reg, 3), b = s_leaf(reg, 4);
	scalar y1 = s_mul(reg, r->leaf, a);
	adg_grads *g;
	pthread_barrier_wait(&r->start);
	if (s_backward(reg, y1, &g) != 0 || s_grad(g, r->leaf) != 3)
		atomic_fetch_add(&r->wrong, 1);
	adg_grads_free(g);
	/* The leaf again, while the others are mid-backward. */
	scalar y2 = s_mul(reg, r->leaf, b);
	scalar y3 = s_mul(reg, y2, a);
	s_drop(y2);
	void *v;
	if (s_backward(reg, y3, &g) != 0 ||
	    adg_grads_get(g, r->leaf.id, &v) != 0 || *(double *)v != 12)
		atomic_fetch_add(&r->wrong, 1);
	adg_grads_free(g);
	scalar all[] = {a, b, y1, y3};
	for (int i = 0; i < 4; i++)
		s_drop(all[i]);
}

static void *reuse_role(void *arg)
{
	const struct thread *t = arg;
	if (t->i == 0)
		reuse_main(t->s);
	else
		reuse_other(t->s, t->i);
	return NULL;
}

CHECKED_TEST(stress, reused_leaf_never_misses_its_gradient)
{
	struct reuse r = {0};
	for (int round = 0; round < REUSE_ROUNDS; round++) {
		r.leaf = s_leaf(reg, 2);
		pthread_barrier_init(&r.start, NULL, REUSE_OTHERS + 1);
		run_threads(REUSE_OTHERS + 1, reuse_role, &r);
		pthread_barrier_destroy(&r.start);
		s_drop(r.leaf);
		cr_assert_eq(atomic_load(&r.wrong), 0, "round %d", round);
	}
	assert_stats(reg, 0, 0, 0);
}

/* Nested backward from 8 threads at once: each step runs a backward on a
 * graph of its own and one on a sibling node of its own graph (which needs
 * a step this backward took: ADG_EUNAVAILABLE). */
#define NEST_THREADS 8
#define NEST_ROUNDS  100

/* A step's closure; wrong is the scenario's count of wrong results. */
struct nest {
	struct prod_step *inner;
	adg_node *other, *sibling;
	uint64_t other_leaf;
	atomic_int *wrong;
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
		atomic_fetch_add(n->wrong, 1);
	adg_grads_free(g);
	g = NULL;
	if (adg_backward(call->registry, n->sibling, scalar_box(1), &scalar_ops,
			 &g) != ADG_EUNAVAILABLE)
		atomic_fetch_add(n->wrong, 1);
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
	const struct thread *t = arg;
	atomic_int *wrong = t->s;
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
		n->wrong = wrong;
		adg_node *parents[2] = {x.node, b.node};
		adg_step st = {.backward = nest_backward,
			       .release = nest_release,
			       .user = n};
		scalar y = {.value = x.value * b.value};
		if (adg_op(reg, parents, 2, &st, &y.node) != 0) {
			atomic_fetch_add(wrong, 1);
			nest_release(n);
			continue;
		}
		adg_node_id(y.node, &y.id);
		adg_grads *g;
		/* y = a b b: dy/da = b^2 */
		if (s_backward(reg, y, &g) != 0 || s_grad(g, a) != 9)
			atomic_fetch_add(wrong, 1);
		adg_grads_free(g);
		scalar all[] = {a, b, e, f, other, x, sib, y};
		for (int i = 0; i < 8; i++)
			s_drop(all[i]);
	}
	return NULL;
}

CHECKED_TEST(stress, nested_backward_from_8_threads)
{
	atomic_int wrong = 0;
	run_threads(NEST_THREADS, nest_worker, &wrong);
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
		adg_registry_options o = {.size = sizeof o,
					  .allocator =
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

struct exiting {
	adg_registry *r;
	pthread_barrier_t done;
	atomic_int wrong;
};

static void *use_then_exit(void *arg)
{
	const struct thread *t = arg;
	struct exiting *e = t->s;
	scalar a = s_leaf(e->r, (double)t->i + 1);
	scalar y = s_mul(e->r, a, a);
	adg_grads *g;
	if (s_backward(e->r, y, &g) != 0)
		atomic_fetch_add(&e->wrong, 1);
	adg_grads_free(g);
	s_drop(y);
	s_drop(a);
	pthread_barrier_wait(&e->done);
	return NULL;
}

CHECKED_TEST(stress, threads_exit_while_their_registry_is_freed)
{
	struct exiting e = {0};
	for (int round = 0; round < EXIT_ROUNDS; round++) {
		failing_alloc mem = {0};
		adg_registry_options o = {.size = sizeof o,
					  .allocator = failing_allocator(&mem)};
		cr_assert_eq(adg_registry_new(&o, &e.r), 0);
		pthread_barrier_init(&e.done, NULL, EXIT_THREADS + 1);
		pthread_t t[EXIT_THREADS];
		struct thread arg[EXIT_THREADS];
		for (int i = 0; i < EXIT_THREADS; i++) {
			arg[i] = (struct thread){&e, i};
			cr_assert_eq(pthread_create(&t[i], NULL, use_then_exit,
						    &arg[i]),
				     0);
		}
		pthread_barrier_wait(&e.done);
		cr_assert_eq(adg_registry_free(e.r), 0);
		cr_assert_eq(atomic_load(&mem.live_bytes), 0, "round %d",
			     round);
		for (int i = 0; i < EXIT_THREADS; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&e.done);
	}
	cr_expect_eq(atomic_load(&e.wrong), 0);
}

/* A step of a backward on reg works on more registries than a thread has
 * slots, so reg's slot goes to another registry while the backward still
 * runs on reg's shard; meanwhile a second thread starts on reg. It must
 * get a shard of its own: the one the backward runs on stays this
 * thread's until it exits, or two threads would write one shard's ids,
 * counters and caches. */
#define SLOT_OTHERS 6

struct slot_steal {
	adg_registry *others[SLOT_OTHERS];
	atomic_int stage; /* 1: the step let reg's slot go; 2: thread 2 ran */
	atomic_int wrong;
};

static int many_registries_step(adg_step_call *call, void *user)
{
	(void)call;
	struct slot_steal *s = user;
	for (int k = 0; k < SLOT_OTHERS; k++) {
		scalar x = s_leaf(s->others[k], 1);
		s_drop(x);
	}
	atomic_store(&s->stage, 1);
	while (atomic_load(&s->stage) != 2)
		sched_yield();
	return 0;
}

static void *start_on_reg(void *arg)
{
	struct slot_steal *s = arg;
	while (atomic_load(&s->stage) != 1)
		sched_yield();
	/* Ops and backward passes, which use the shard's ids, counters,
	 * node slabs and tape, as the backward on the other thread does
	 * once its step returns. */
	for (int i = 0; i < 64; i++) {
		scalar x = s_leaf(reg, 3), y = s_mul(reg, x, x);
		adg_grads *g;
		if (s_backward(reg, y, &g) != 0 || s_grad(g, x) != 6)
			atomic_fetch_add(&s->wrong, 1);
		adg_grads_free(g);
		s_drop(y);
		s_drop(x);
		if (i == 15)
			atomic_store(&s->stage, 2); /* and go on meanwhile */
	}
	return NULL;
}

CHECKED_TEST(stress, a_step_on_many_registries_keeps_its_shard)
{
	struct slot_steal s = {0};
	for (int k = 0; k < SLOT_OTHERS; k++)
		cr_assert_eq(adg_registry_new(NULL, &s.others[k]), 0);
	scalar a = s_leaf(reg, 2);
	adg_step st = {
		.backward = many_registries_step, .release = NULL, .user = &s};
	adg_node *y;
	cr_assert_eq(adg_op(reg, &a.node, 1, &st, &y), 0);
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, start_on_reg, &s), 0);
	adg_grads *g;
	cr_assert_eq(adg_backward(reg, y, scalar_box(1), &scalar_ops, &g), 0);
	/* Made while the other thread makes its own: ids stay unique. */
	scalar after[32];
	for (int i = 0; i < 32; i++)
		after[i] = s_leaf(reg, 1);
	pthread_join(t, NULL);
	cr_expect_eq(atomic_load(&s.wrong), 0);
	adg_grads_free(g);
	for (int i = 0; i < 32; i++)
		s_drop(after[i]);
	adg_node_unref(y);
	s_drop(a);
	assert_stats(reg, 0, 0, 0);
	for (int k = 0; k < SLOT_OTHERS; k++)
		cr_assert_eq(adg_registry_free(s.others[k]), 0);
}

/* libadg's read side (lib/readside.c): graphs freed past a thread's pool
 * after a grace period, while other threads look nodes' graphs up
 * lock-free and place nodes in them, and the reader threads come and go
 * (each registers its reader word on its first section and unregisters it
 * at exit, while grace periods scan the list). The merger retires more
 * graphs than it makes, so its pool fills and its limbo is freed after a
 * grace period every ADG_GRAPH_LIMBO_MAX merges; a reader inside a section
 * on a freed graph is a use-after-free under ASan. */
#define FREED_SLOTS	 64
#define FREED_MERGES	 16000
#define FREED_READERS	 2
#define FREED_READER_OPS 50

struct freed {
	pthread_mutex_t lock; /* guards slot */
	scalar slot[FREED_SLOTS];
	scalar leaf;
	atomic_bool done;
	atomic_long lookups;
	atomic_int wrong;
};

/* Fresh one-node graphs in random slots. */
static void freed_maker(struct freed *f)
{
	unsigned int seed = 17;
	while (!atomic_load(&f->done))
		slot_put(&f->lock, f->slot, rand_r(&seed) % FREED_SLOTS,
			 s_mul(reg, f->leaf, f->leaf));
}

/* Two slots' graphs merged: one of them retires on this thread. Until
 * the readers have looked up a reader's worth too: on 2 cores the merges
 * may otherwise all be done before the first reader thread runs. */
static void freed_merger(struct freed *f)
{
	unsigned int seed = 4242;
	for (int i = 0;
	     i < FREED_MERGES || atomic_load(&f->lookups) < FREED_READER_OPS;
	     i++) {
		int sa = rand_r(&seed) % FREED_SLOTS;
		int sb = rand_r(&seed) % FREED_SLOTS;
		scalar a = slot_take(&f->lock, f->slot, sa),
		       b = slot_take(&f->lock, f->slot, sb);
		slot_put(&f->lock, f->slot, sa, s_mul(reg, a, b));
		s_drop(a);
		s_drop(b);
	}
	atomic_store(&f->done, true);
}

static void *freed_short_reader(void *arg)
{
	struct freed *f = arg;
	unsigned int seed = (unsigned int)atomic_load(&f->lookups) + 1;
	for (int i = 0; i < FREED_READER_OPS; i++) {
		scalar x = slot_take(&f->lock, f->slot,
				     rand_r(&seed) % FREED_SLOTS);
		uint64_t g;
		if (adg_node_graph_id(x.node, &g) != 0 || g == 0)
			atomic_fetch_add(&f->wrong, 1);
		scalar y = s_mul(reg, x, f->leaf); /* placed in x's graph */
		s_drop(y);
		s_drop(x);
		atomic_fetch_add(&f->lookups, 1);
	}
	return NULL;
}

static void *freed_role(void *arg)
{
	const struct thread *t = arg;
	struct freed *f = t->s;
	if (t->i == 0) {
		freed_maker(f);
	} else if (t->i == 1) {
		freed_merger(f);
	} else {
		while (!atomic_load(&f->done)) {
			pthread_t r;
			if (pthread_create(&r, NULL, freed_short_reader, f) !=
			    0) {
				atomic_fetch_add(&f->wrong, 1);
				break;
			}
			pthread_join(r, NULL);
		}
	}
	return NULL;
}

CHECKED_TEST(stress, lookups_race_graphs_freed_after_a_grace_period)
{
	struct freed f = {.lock = PTHREAD_MUTEX_INITIALIZER};
	f.leaf = s_leaf(reg, 1);
	for (int i = 0; i < FREED_SLOTS; i++)
		f.slot[i] = s_mul(reg, f.leaf, f.leaf);
	run_threads(2 + FREED_READERS, freed_role, &f);
	cr_expect_eq(atomic_load(&f.wrong), 0);
	cr_expect_gt(atomic_load(&f.lookups), 0);
	for (int i = 0; i < FREED_SLOTS; i++)
		s_drop(f.slot[i]);
	s_drop(f.leaf);
}

/* adg_op_moving on many threads at once: each thread takes a reference of
 * its own to a shared non-leaf node and moves it into the first node of a
 * chain, then moves each node into the next, while the others do the
 * same: the shared node's count is written by every thread without the
 * caller's drops, and its graph merged into by every chain. Every other
 * chain runs a retained backward (the shared node's step stays for the
 * others), the rest are dropped unrun. Whatever the interleaving, the
 * gradients are the closed form's and every node but the shared one and
 * the leaves is freed (the fixture checks the steps and values). */
#define MOVED_THREADS 4
#define MOVED_CHAINS  300
#define MOVED_LENGTH  20

struct moved {
	scalar base, leaf;
	atomic_int wrong;
};

static void *moved_chains(void *arg)
{
	const struct thread *t = arg;
	struct moved *m = t->s;
	adg_backward_options retain = {.size = sizeof retain, .retain = 1};
	for (int c = 0; c < MOVED_CHAINS; c++) {
		cr_assert_eq(adg_node_ref(m->base.node), 0);
		scalar x = m->base;
		for (int k = 0; k < MOVED_LENGTH; k++) {
			scalar f[2] = {x, m->leaf};
			x = s_prod_moving(reg, f, 2, 1);
		}
		if ((c + t->i) % 2 == 0) {
			adg_grads *g;
			/* d(base leaf^L)/dleaf, base and leaf 1, base not
			 * over leaf. */
			if (adg_backward_with(reg, x.node, scalar_box(1),
					      &scalar_ops, &retain, &g) != 0 ||
			    s_grad(g, m->leaf) != MOVED_LENGTH)
				atomic_fetch_add(&m->wrong, 1);
			adg_grads_free(g);
		}
		s_drop(x);
	}
	return NULL;
}

CHECKED_TEST(stress, moved_references_race_on_a_shared_node)
{
	struct moved m = {.leaf = s_leaf(reg, 1)};
	scalar l2 = s_leaf(reg, 1), l3 = s_leaf(reg, 1);
	m.base = s_mul(reg, l2, l3);
	run_threads(MOVED_THREADS, moved_chains, &m);
	cr_expect_eq(atomic_load(&m.wrong), 0);
	assert_stats(reg, 4, 1, 1); /* the leaves, and the base alone */
	s_drop(m.base);
	s_drop(l3);
	s_drop(l2);
	s_drop(m.leaf);
}
