/*
 * Node slabs (lib/slab.c): nodes freed by threads other than the one that
 * made them go back to their slab, and the slab to the allocator, while
 * the threads that made them run on or exit.
 */
#include "fixture.h"

#include <pthread.h>
#include <stdlib.h>

/* On fixture_alloc, whose bytes the tests read. */
static void open_counted(void)
{
	adg_registry_options o = {.size = sizeof o,
				  .allocator =
					  failing_allocator(&fixture_alloc)};
	fixture_open(&o);
}

TestSuite(slabs, .init = open_counted);

struct handles {
	scalar *x;
	size_t n;
};

static void *drop_all(void *arg)
{
	struct handles *h = arg;
	for (size_t i = 0; i < h->n; i++)
		s_drop(h->x[i]);
	return NULL;
}

/* Nodes made on this thread and freed on another: their slabs go back
 * once this thread, making more, takes those frees. Without that, the
 * bytes would stay at their peak. */
CHECKED_TEST(slabs, slabs_freed_by_another_thread_go_back)
{
	enum { N = 100000 };
	struct handles h = {calloc(N, sizeof(scalar)), N};
	cr_assert_not_null(h.x);
	long before = atomic_load(&fixture_alloc.live_bytes);
	for (size_t i = 0; i < N; i++)
		h.x[i] = s_leaf(reg, (double)i);
	long peak = atomic_load(&fixture_alloc.live_bytes) - before;
	cr_assert_gt(peak, (long)N * 64, "a leaf's bytes or more a leaf");
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, drop_all, &h), 0);
	pthread_join(t, NULL);
	/* More than a slab page of nodes, so that the maker runs out of room in
	 * one and takes the other thread's frees. */
	scalar more[256];
	for (int i = 0; i < 256; i++)
		more[i] = s_leaf(reg, i);
	long after = atomic_load(&fixture_alloc.live_bytes) - before;
	cr_expect_lt(after, peak / 2, "%ld bytes left of %ld", after, peak);
	for (int i = 0; i < 256; i++)
		s_drop(more[i]);
	assert_stats(reg, 0, 0, 0);
	free(h.x);
}

/* Makers build graphs (leaves, ops of 1 to 3 parents from slabs, and of
 * 9 parents from the allocator), hand every handle over and exit; other
 * threads run backward on some roots, check the gradients and drop
 * everything, while the makers exit and new makers adopt their shards. */
#define MAKERS	    4
#define DROPPERS    3
#define ROUNDS	    10
#define PER_MAKER   2000
#define QUEUE_SLOTS (MAKERS * PER_MAKER * 3)

/* What a maker hands over: a root, its two leaves, and which graph it is
 * (make_then_exit), for the gradient of a. */
struct made {
	scalar y, a, b;
	int kind;
};

struct exchange {
	pthread_mutex_t lock;
	struct made queue[QUEUE_SLOTS];
	size_t head, tail;
	atomic_int makers_left;
	atomic_int wrong;
};

static void put(struct exchange *e, struct made m)
{
	pthread_mutex_lock(&e->lock);
	e->queue[e->tail++ % QUEUE_SLOTS] = m;
	pthread_mutex_unlock(&e->lock);
}

static bool take(struct exchange *e, struct made *m)
{
	pthread_mutex_lock(&e->lock);
	bool some = e->head != e->tail;
	if (some)
		*m = e->queue[e->head++ % QUEUE_SLOTS];
	pthread_mutex_unlock(&e->lock);
	return some;
}

static void *make_then_exit(void *arg)
{
	struct thread *t = arg;
	struct exchange *e = t->s;
	for (int i = 0; i < PER_MAKER; i++) {
		scalar a = s_leaf(reg, 2), b = s_leaf(reg, 3);
		scalar f[9] = {a, b, a, b, a, b, a, b, a};
		scalar y;
		switch (i % 4) {
		case 0: /* one parent: a */
			y = s_prod(reg, f, 1);
			break;
		case 1:
			y = s_mul(reg, a, b);
			break;
		case 2: /* (a b) b a */
			f[0] = s_mul(reg, a, b);
			y = s_prod(reg, f, 3);
			s_drop(f[0]);
			break;
		default: /* a^5 b^4, from the allocator */
			y = s_prod(reg, f, 9);
			break;
		}
		put(e, (struct made){y, a, b, i % 4});
	}
	atomic_fetch_sub(&e->makers_left, 1);
	return NULL;
}

/* d/da of each kind of root at a = 2, b = 3: a, a b, a^2 b^2, a^5 b^4. */
static const double expected_da[] = {1, 3, 2 * 2 * 9, 5 * 16 * 81};

static void *drop_what_comes(void *arg)
{
	struct thread *t = arg;
	struct exchange *e = t->s;
	struct made m;
	for (unsigned seen = 0;; seen++) {
		if (!take(e, &m)) {
			if (atomic_load(&e->makers_left) == 0 && !take(e, &m))
				return NULL;
			sched_yield();
			continue;
		}
		/* Every other root runs backward first; the drops come in
		 * three orders, so that leaves go first, last or between. */
		if (seen % 2 == 0) {
			adg_grads *g;
			if (s_backward(reg, m.y, &g) != 0) {
				atomic_fetch_add(&e->wrong, 1);
			} else {
				if (s_grad(g, m.a) != expected_da[m.kind])
					atomic_fetch_add(&e->wrong, 1);
				adg_grads_free(g);
			}
		}
		scalar order[3][3] = {
			{m.y, m.a, m.b}, {m.a, m.b, m.y}, {m.a, m.y, m.b}};
		for (int k = 0; k < 3; k++)
			s_drop(order[seen % 3][k]);
	}
}

CHECKED_TEST(slabs_stress, nodes_freed_by_other_threads_while_makers_exit,
	     .init = open_counted)
{
	struct exchange *e = calloc(1, sizeof *e);
	cr_assert_not_null(e);
	pthread_mutex_init(&e->lock, NULL);
	for (int round = 0; round < ROUNDS; round++) {
		atomic_store(&e->makers_left, MAKERS);
		pthread_t m[MAKERS], d[DROPPERS];
		struct thread ma[MAKERS], da[DROPPERS];
		for (int i = 0; i < MAKERS; i++) {
			ma[i] = (struct thread){e, i};
			cr_assert_eq(pthread_create(&m[i], NULL, make_then_exit,
						    &ma[i]),
				     0);
		}
		for (int i = 0; i < DROPPERS; i++) {
			da[i] = (struct thread){e, i};
			cr_assert_eq(pthread_create(&d[i], NULL,
						    drop_what_comes, &da[i]),
				     0);
		}
		for (int i = 0; i < MAKERS; i++)
			pthread_join(m[i], NULL);
		for (int i = 0; i < DROPPERS; i++)
			pthread_join(d[i], NULL);
		cr_assert_eq(e->head, e->tail);
		assert_stats(reg, 0, 0, 0);
	}
	cr_expect_eq(atomic_load(&e->wrong), 0);
	pthread_mutex_destroy(&e->lock);
	free(e);
}

/* Past some 20 MiB of one thread's nodes of one parent count, the default
 * allocator's slabs are 2 MiB mappings of libadg's own, advised for huge
 * pages (slab.c). A chain of this many products takes several. */
#define HUGE_CHAIN 300000
#define HUGE_SLAB  ((uint64_t)2 << 20)

static scalar long_chain(scalar w)
{
	scalar y = s_mul(reg, w, w);
	for (int i = 1; i < HUGE_CHAIN; i++) {
		scalar z = s_mul(reg, y, w);
		s_drop(y);
		y = z;
	}
	return y;
}

/* Runs y's backward, checks w's gradient (w is 1: one per product, one
 * more for the first), and drops y. */
static void backward_long_chain(scalar y, scalar w)
{
	adg_grads *g;
	cr_assert_eq(s_backward(reg, y, &g), 0);
	cr_expect_eq(s_grad(g, w), HUGE_CHAIN + 1.0);
	adg_grads_free(g);
	s_drop(y);
}

static struct adg_stats stats_now(void)
{
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(reg, &st), 0);
	return st;
}

FIXTURE_SUITE(huge_slabs);

/* The graph on mapped slabs runs backward as any other. Once its nodes
 * are freed, the slabs stay mapped as spares for the next graphs, which
 * map more only for what the first cut from the allocator's blocks: a
 * trainer's steps from the third on fault nothing in. */
CHECKED_TEST(huge_slabs, a_long_chain_takes_them_and_the_next_reuses_them)
{
	scalar w = s_leaf(reg, 1);
	scalar y = long_chain(w);
	struct adg_stats first = stats_now();
	cr_assert_gt(first.slab_bytes, (uint64_t)HUGE_CHAIN * 96);
	cr_assert_geq(first.slab_bytes_huge, 3 * HUGE_SLAB,
		      "%llu bytes in huge slabs of %llu in slabs",
		      (unsigned long long)first.slab_bytes_huge,
		      (unsigned long long)first.slab_bytes);
	cr_assert_eq(first.slab_bytes_huge % HUGE_SLAB, 0);
	backward_long_chain(y, w);
	cr_expect_eq(stats_now().slab_bytes_huge, first.slab_bytes_huge,
		     "the huge slabs are kept");
	/* The second chain takes the spares, then maps what its first
	 * slabs of the allocator's held; the third maps nothing. */
	y = long_chain(w);
	uint64_t second = stats_now().slab_bytes_huge;
	cr_expect_geq(second, first.slab_bytes_huge);
	cr_expect_leq(second, first.slab_bytes + HUGE_SLAB,
		      "%llu bytes in huge slabs after %llu in slabs",
		      (unsigned long long)second,
		      (unsigned long long)first.slab_bytes);
	backward_long_chain(y, w);
	y = long_chain(w);
	cr_expect_eq(stats_now().slab_bytes_huge, second,
		     "the third chain maps no more");
	backward_long_chain(y, w);
	s_drop(w);
	assert_stats(reg, 0, 0, 0);
}

struct chain_made {
	scalar w, y;
};

static void *make_long_chain(void *arg)
{
	struct chain_made *c = arg;
	c->y = long_chain(c->w);
	return NULL;
}

/* A chain made on a thread that exits, run and freed on this one: every
 * node goes back to a mapped slab through its remote frees; the slabs
 * stay with the exited thread's slice until the registry frees it. */
CHECKED_TEST(huge_slabs, freed_by_another_thread)
{
	struct chain_made c = {.w = s_leaf(reg, 1)};
	pthread_t t;
	cr_assert_eq(pthread_create(&t, NULL, make_long_chain, &c), 0);
	pthread_join(t, NULL);
	cr_assert_geq(stats_now().slab_bytes_huge, 3 * HUGE_SLAB);
	backward_long_chain(c.y, c.w);
	s_drop(c.w);
	assert_stats(reg, 0, 0, 0);
}

/* With an allocator of the caller's, libadg maps nothing of its own: every
 * slab, however many, is the allocator's. */
CHECKED_TEST(slabs, none_huge_with_an_allocator_of_the_callers)
{
	long before = atomic_load(&fixture_alloc.live_bytes);
	scalar w = s_leaf(reg, 1);
	scalar y = long_chain(w);
	struct adg_stats st = stats_now();
	cr_expect_eq(st.slab_bytes_huge, 0);
	cr_expect_gt(st.slab_bytes, (uint64_t)HUGE_CHAIN * 96);
	cr_expect_geq(atomic_load(&fixture_alloc.live_bytes) - before,
		      (long)st.slab_bytes);
	backward_long_chain(y, w);
	s_drop(w);
	assert_stats(reg, 0, 0, 0);
}

/*
 * A slab the allocator refuses. The thread's current slab is full when the
 * refusal comes; the failed op must leave the slab lists as they were, so
 * that frees of the full slab's nodes, local or remote, find it and the
 * next ops succeed once the allocator gives again. Seen failing with the
 * full slab marked as not findable before its replacement existed: a free
 * then listed the current slab as one with room, the next fill took it
 * from that list while full ("invariant violated: p != NULL"; without
 * assertions, ADG_ENOMEM from an allocator that refused nothing).
 */
static struct {
	adg_allocator counted; /* fixture_alloc's */
	atomic_bool refuse_slabs;
} refusing;

/* Slabs are 32 KiB or more; nothing else libadg takes here is. */
static void *refusing_alloc(size_t size, void *ctx)
{
	(void)ctx;
	if (size >= (32 << 10) && atomic_load(&refusing.refuse_slabs))
		return NULL;
	return refusing.counted.alloc(size, refusing.counted.ctx);
}

static void refusing_free(void *p, size_t size, void *ctx)
{
	(void)ctx;
	refusing.counted.free(p, size, refusing.counted.ctx);
}

static void open_refusing(void)
{
	refusing.counted = failing_allocator(&fixture_alloc);
	atomic_store(&refusing.refuse_slabs, false);
	adg_registry_options o = {
		.size = sizeof o,
		.allocator = {refusing_alloc, refusing_free, NULL}};
	fixture_open(&o);
}

TestSuite(slab_refused, .init = open_refusing);

/* Fills this thread's slab of leaves while the allocator refuses a new
 * one: returns the leaves made, which all lie in one slab (the first leaf
 * was made before the refusal, so the slab exists). */
static size_t fill_until_refused(scalar *x, size_t cap)
{
	x[0] = s_leaf(reg, 0);
	atomic_store(&refusing.refuse_slabs, true);
	size_t n = 1;
	for (;; n++) {
		cr_assert_lt(n, cap, "no refusal in %zu leaves", cap);
		adg_node *leaf = NULL;
		int rc = adg_leaf(reg, &leaf);
		if (rc != 0) {
			cr_assert_eq(rc, ADG_ENOMEM, "%s", adg_strerror(rc));
			cr_assert_null(leaf);
			break;
		}
		x[n] = (scalar){.node = leaf};
	}
	assert_stats(reg, n, 0, 0);
	atomic_store(&refusing.refuse_slabs, false);
	return n;
}

static void *drop_one(void *arg)
{
	s_drop(*(scalar *)arg);
	return NULL;
}

/* After the refusal, one of the full slab's nodes is freed (on this
 * thread, or on another), then more leaves than a slab holds are made. */
static void refused_then_freed(bool remotely)
{
	enum { CAP = 4096 };
	scalar *x = calloc(2 * CAP, sizeof *x);
	cr_assert_not_null(x);
	size_t n = fill_until_refused(x, CAP);
	size_t gone = n / 2;
	if (remotely) {
		pthread_t t;
		cr_assert_eq(pthread_create(&t, NULL, drop_one, &x[gone]), 0);
		pthread_join(t, NULL);
	} else {
		s_drop(x[gone]);
	}
	x[gone] = x[--n];
	for (size_t i = 0; i < CAP; i++, n++) {
		adg_node *leaf = NULL;
		int rc = adg_leaf(reg, &leaf);
		cr_assert_eq(rc, 0, "leaf %zu after the refusal: %s", i,
			     adg_strerror(rc));
		x[n] = (scalar){.node = leaf};
	}
	assert_stats(reg, n, 0, 0);
	for (size_t i = 0; i < n; i++)
		s_drop(x[i]);
	assert_stats(reg, 0, 0, 0);
	/* Only the current slab stays, empty: one of 32 KiB to 1 MiB. */
	struct adg_stats st = {.size = sizeof st};
	cr_assert_eq(adg_registry_stats(reg, &st), 0);
	cr_expect(st.slab_bytes >= (32 << 10) && st.slab_bytes <= (1 << 20) &&
			  (st.slab_bytes & (st.slab_bytes - 1)) == 0,
		  "%llu bytes of slabs kept with no node alive",
		  (unsigned long long)st.slab_bytes);
	free(x);
}

CHECKED_TEST(slab_refused, then_a_local_free)
{
	refused_then_freed(false);
}

CHECKED_TEST(slab_refused, then_a_remote_free)
{
	refused_then_freed(true);
}
