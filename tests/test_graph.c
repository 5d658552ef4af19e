/* Graphs: leaves never join them, parents' graphs merge deterministically,
 * graph ids. */
#include "fixture.h"

#include <pthread.h>

FIXTURE_SUITE(graph);

static struct adg_stats stats(void)
{
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(reg, &st), 0);
	return st;
}

CHECKED_TEST(graph, ids_of_leaves_ops_and_consumed_nodes)
{
	scalar a = s_leaf(reg, 1), b = s_leaf(reg, 2);
	cr_expect_eq(s_graph(a), 0, "a leaf is in no graph");
	scalar x = s_mul(reg, a, b);
	cr_expect_eq(s_graph(x), x.id, "a new graph's id is its origin");
	scalar y = s_mul(reg, x, a);
	cr_expect_eq(s_graph(y), x.id, "a node joins its parent's graph");
	cr_expect_eq(stats().merges, 0);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	adg_grads_free(g);
	cr_expect_eq(s_graph(x), 0);
	cr_expect_eq(s_graph(y), 0);
	/* A consumed parent brings no graph: z starts its own. */
	scalar z = s_mul(reg, y, b);
	cr_expect_eq(s_graph(z), z.id);
	scalar all[] = {a, b, x, y, z};
	for (int i = 0; i < 5; i++)
		s_drop(all[i]);
}

/* 4. A leaf used in graph 1, backward, then in graph 2, backward: both
 * gradients are right; the leaf never joined either graph. */
CHECKED_TEST(graph, leaf_reused_across_graphs)
{
	scalar a = s_leaf(reg, 3), b = s_leaf(reg, 5), c = s_leaf(reg, 7);
	scalar y1 = s_mul(reg, a, b);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y1, &g), 0);
	cr_expect_eq(s_grad(g, a), 5.0);
	adg_grads_free(g);
	scalar y2 = s_mul(reg, a, c);
	cr_expect_neq(s_graph(y2), s_graph(y1));
	cr_assert_eq(s_backward(reg, y2, &g), 0);
	cr_expect_eq(s_grad(g, a), 7.0);
	cr_expect_eq(s_grad(g, c), 3.0);
	adg_grads_free(g);
	cr_expect_eq(stats().merges, 0);
	scalar all[] = {a, b, c, y1, y2};
	for (int i = 0; i < 5; i++)
		s_drop(all[i]);
}

/* Two live graphs on one shared leaf stay two graphs. */
CHECKED_TEST(graph, a_shared_leaf_does_not_merge)
{
	scalar w = s_leaf(reg, 2), a = s_leaf(reg, 3), b = s_leaf(reg, 4);
	scalar p = s_mul(reg, w, a), q = s_mul(reg, w, b);
	cr_expect_neq(s_graph(p), s_graph(q));
	cr_expect_eq(stats().live_graphs, 2);
	adg_grads *gp, *gq;
	cr_assert_eq(s_backward(reg, q, &gq), 0);
	cr_assert_eq(s_backward(reg, p, &gp), 0);
	cr_expect_eq(s_grad(gp, w), 3.0);
	cr_expect_eq(s_grad(gq, w), 4.0);
	adg_grads_free(gp);
	adg_grads_free(gq);
	scalar all[] = {w, a, b, p, q};
	for (int i = 0; i < 5; i++)
		s_drop(all[i]);
}

CHECKED_TEST(graph, joining_two_graphs_merges_to_smallest_origin)
{
	scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
	scalar x = s_mul(reg, a, b);  /* origin x */
	scalar y = s_mul(reg, b, a);  /* origin y > x */
	scalar y2 = s_mul(reg, y, a); /* makes y's graph the larger */
	scalar z = s_mul(reg, x, y2);
	cr_expect_eq(stats().merges, 1);
	cr_expect_eq(stats().live_graphs, 1);
	cr_expect_eq(s_graph(z), x.id);
	cr_expect_eq(s_graph(y), x.id, "moved nodes follow the merge");
	cr_expect_eq(s_graph(x), x.id);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, z, &g), 0);
	/* z = (ab)(ba a) = a^3 b^2 */
	cr_expect_eq(s_grad(g, a), 3.0 * 4 * 9);
	cr_expect_eq(s_grad(g, b), 2.0 * 8 * 3);
	adg_grads_free(g);
	cr_expect_eq(stats().live_graphs, 0);
	scalar all[] = {a, b, x, y, y2, z};
	for (int i = 0; i < 6; i++)
		s_drop(all[i]);
}

/* 8 threads build their own graphs on the same 4 shared leaves: no merge,
 * every gradient right. */
#define SHARED_THREADS 8
#define SHARED_ROUNDS  300

struct shared_leaves {
	scalar leaves[4];
	atomic_int wrong;
};

static void *shared_leaves_worker(void *arg)
{
	const struct thread *t = arg;
	struct shared_leaves *s = t->s;
	double scale = (double)t->i + 2;
	for (int round = 0; round < SHARED_ROUNDS; round++) {
		scalar own = s_leaf(reg, scale);
		scalar acc = s_mul(reg, own, s->leaves[0]);
		for (int k = 1; k < 4; k++) {
			scalar next = s_mul(reg, acc, s->leaves[k]);
			s_drop(acc);
			acc = next;
		}
		adg_grads *g;
		if (s_backward(reg, acc, &g) != 0) {
			atomic_fetch_add(&s->wrong, 1);
			continue;
		}
		/* d(own * l0 l1 l2 l3)/d l_k = own * prod of the others */
		for (int k = 0; k < 4; k++) {
			double want = scale;
			for (int j = 0; j < 4; j++)
				if (j != k)
					want *= s->leaves[j].value;
			void *v;
			if (adg_grads_get(g, s->leaves[k].id, &v) != 0 ||
			    *(double *)v != want)
				atomic_fetch_add(&s->wrong, 1);
		}
		adg_grads_free(g);
		s_drop(acc);
		s_drop(own);
	}
	return NULL;
}

CHECKED_TEST(graph, threads_on_shared_leaves_never_merge)
{
	struct shared_leaves s = {0};
	for (int k = 0; k < 4; k++)
		s.leaves[k] = s_leaf(reg, k + 1);
	run_threads(SHARED_THREADS, shared_leaves_worker, &s);
	cr_expect_eq(atomic_load(&s.wrong), 0);
	struct adg_stats st = stats();
	cr_expect_eq(st.merges, 0, "%llu merges",
		     (unsigned long long)st.merges);
	cr_expect_eq(st.live_nodes, 4);
	cr_expect_eq(st.live_graphs, 0);
	for (int k = 0; k < 4; k++)
		s_drop(s.leaves[k]);
}

/* 5. Four subgraphs built on four threads, joined by one op: one graph whose
 * id is the smallest origin, however the threads ran; its backward equals
 * the same expression built on one thread. */
#define JOIN_PARTS 4

struct join {
	pthread_barrier_t start;
	scalar leaves[JOIN_PARTS][2];
	scalar parts[JOIN_PARTS];
	scalar mid[JOIN_PARTS];
};

/* Part i: mid_i = l_i0 * l_i1, part_i = mid_i * l_i0. */
static void join_part(struct join *j, int i)
{
	j->mid[i] = s_mul(reg, j->leaves[i][0], j->leaves[i][1]);
	j->parts[i] = s_mul(reg, j->mid[i], j->leaves[i][0]);
}

static void *join_worker(void *arg)
{
	const struct thread *t = arg;
	struct join *j = t->s;
	pthread_barrier_wait(&j->start);
	join_part(j, t->i);
	return NULL;
}

/* Builds sum-free expression prod_i (l_i0 * l_i1 * l_i0); returns the
 * gradients of the 8 leaves. */
static void join_once(bool threaded, double grads[JOIN_PARTS][2])
{
	struct join j;
	for (int i = 0; i < JOIN_PARTS; i++) {
		j.leaves[i][0] = s_leaf(reg, i + 1);
		j.leaves[i][1] = s_leaf(reg, i + 2);
	}
	if (threaded) {
		pthread_barrier_init(&j.start, NULL, JOIN_PARTS);
		run_threads(JOIN_PARTS, join_worker, &j);
		pthread_barrier_destroy(&j.start);
	} else {
		for (int i = 0; i < JOIN_PARTS; i++)
			join_part(&j, i);
	}
	uint64_t smallest = UINT64_MAX;
	for (int i = 0; i < JOIN_PARTS; i++) {
		uint64_t origin = s_graph(j.parts[i]);
		cr_assert_eq(origin, j.mid[i].id);
		if (origin < smallest)
			smallest = origin;
	}
	uint64_t merges_before = stats().merges;
	scalar root = s_prod(reg, j.parts, JOIN_PARTS);
	cr_expect_eq(stats().merges - merges_before, JOIN_PARTS - 1);
	cr_expect_eq(s_graph(root), smallest);
	for (int i = 0; i < JOIN_PARTS; i++)
		cr_expect_eq(s_graph(j.mid[i]), smallest);
	cr_expect_eq(stats().live_graphs, 1);
	adg_grads *g;
	cr_assert_eq(s_backward(reg, root, &g), 0);
	for (int i = 0; i < JOIN_PARTS; i++)
		for (int k = 0; k < 2; k++)
			grads[i][k] = s_grad(g, j.leaves[i][k]);
	adg_grads_free(g);
	s_drop(root);
	for (int i = 0; i < JOIN_PARTS; i++) {
		s_drop(j.parts[i]);
		s_drop(j.mid[i]);
		s_drop(j.leaves[i][0]);
		s_drop(j.leaves[i][1]);
	}
}

CHECKED_TEST(graph, subgraphs_from_four_threads_join_deterministically)
{
	double want[JOIN_PARTS][2], got[JOIN_PARTS][2];
	join_once(false, want);
	for (int round = 0; round < 50; round++) {
		join_once(true, got);
		for (int i = 0; i < JOIN_PARTS; i++)
			for (int k = 0; k < 2; k++)
				cr_assert_eq(got[i][k], want[i][k],
					     "round %d leaf %d.%d", round, i,
					     k);
	}
}
