/* The reducer's barrier under stress (issue 42): many short rounds at
 * T = 8 and 16 participants (more threads than a small machine's cores),
 * with random pauses and, in about half the rounds, a failure: one or two
 * participants ending with an error, a unit ending with one, or a
 * parameter's apply returning one.
 *
 * The rounds' fates come from a seed (printed with any failure) and the
 * round's number, so the test's thread knows what each round must give.
 * Every participant records what its adg_reducer_end_with returned and
 * the round's failure it was told; once all are joined, the test checks
 * that the participants of each round agree, that the round's result is
 * the one its fate calls for, that a round that succeeded applied each
 * parameter (each slice of the one in slices) once, with the sum of its
 * units' contributions, and, all or nothing, that a round abandoned by a
 * participant or a unit applied nothing. Contributions are small
 * integers, so a sum is exact whatever the order; the order itself is
 * test_reducer.c's business. */
#include "fixture.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

TestSuite(reducer_rounds, .timeout = 600);

#define MAXT	   16
#define MAXU	   (MAXT + 3)
#define NP	   3 /* parameters; the last in NV slices */
#define NV	   4 /* a gradient's elements */
#define SLICED	   (NP - 1)
#define ROUNDS	   1500
#define FAIL_CODE  (ADG_EUSER - 11)
#define UNIT_CODE  (ADG_EUSER - 12)
#define APPLY_CODE (ADG_EUSER - 13)

struct grad {
	double v[NV];
};

/* What a round must do. */
enum fate { CLEAN, ONE_FAILS, TWO_FAIL, UNIT_FAILS, APPLY_FAILS };

struct plan {
	enum fate fate;
	int p1, p2;  /* the participants that fail */
	size_t unit; /* the unit that fails */
};

/* What participant p's end of a round returned and told it. */
struct seen {
	int rc;
	adg_reducer_failure f;
};

struct rounds {
	adg_reducer *red;
	uint64_t ids[NP];
	size_t slices[NP];
	int t, u;
	bool early;
	uint64_t seed;
	/* Unit u's contribution to parameter i in round k, in the half of
	 * k's parity: the participant that was dealt u in round k - 1 may
	 * still be releasing its own. */
	struct grad vals[2][MAXU][NP];
	/* By round: the sums applied, and how many applies ran. */
	double (*applied)[NP][NV];
	atomic_int (*applies)[NP];
	struct seen (*seen)[MAXT];
	atomic_long given, released;
	atomic_int bad;
};

static __thread int this_participant = -1;
static __thread unsigned int pause_seed;

/* Nothing, a yield or a sleep of up to 50 us, at random, one in `one_in`
 * times. */
static void pause_now(int one_in)
{
	int r = rand_r(&pause_seed);
	if (r % one_in != 0)
		return;
	r /= one_in;
	if (r % 2 == 0) {
		sched_yield();
	} else {
		struct timespec ts = {0, (r / 2 % 50) * 1000};
		nanosleep(&ts, NULL);
	}
}

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15u;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
	return x ^ (x >> 31);
}

static struct plan plan_of(const struct rounds *s, uint64_t k)
{
	uint64_t h = mix(s->seed ^ mix(k));
	int what = (int)(h % 8);
	h /= 8;
	struct plan p = {
		.fate = what < 4 ? CLEAN : (enum fate)(what - 3),
		.p1 = (int)(h % (uint64_t)s->t),
		.p2 = (int)(h / 64 % (uint64_t)s->t),
		.unit = (size_t)(h / 4096 % (uint64_t)s->u),
	};
	return p;
}

/* Whether unit u gives parameter i in round k (else a NULL one). */
static bool gives(uint64_t k, size_t u, int i)
{
	return (k + u * 3 + (uint64_t)i) % 7 != 0;
}

static double contribution(uint64_t k, size_t u, int i, int j)
{
	return (double)((k * 7 + u * 5 + (uint64_t)i * 3 + (uint64_t)j) % 13) -
	       6.0;
}

static int grad_add(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	struct grad *a = *sum;
	const struct grad *b = value;
	for (int j = 0; j < NV; j++)
		a->v[j] += b->v[j];
	return 0;
}

static int grad_add_slice(void *sum, const void *value, size_t slice,
			  size_t n_slices, void *ctx)
{
	(void)ctx, (void)n_slices;
	((struct grad *)sum)->v[slice] +=
		((const struct grad *)value)->v[slice];
	return 0;
}

static int rounds_apply(const adg_reduction *red, void *ctx)
{
	struct rounds *s = ctx;
	pause_now(16);
	int i = (int)red->param;
	if (red->round >= ROUNDS || i >= NP || red->id != s->ids[i]) {
		atomic_fetch_add(&s->bad, 1);
		return 0;
	}
	const struct grad *g = red->sum;
	for (int j = 0; j < NV; j++)
		if (i != SLICED || (size_t)j == red->slice)
			s->applied[red->round][i][j] = g != NULL ? g->v[j] : 0;
	atomic_fetch_add(&s->applies[red->round][i], 1);
	if (i == 0 && plan_of(s, red->round).fate == APPLY_FAILS)
		return APPLY_CODE;
	return 0;
}

static void rounds_release(void *value, size_t participant, void *ctx)
{
	struct rounds *s = ctx;
	(void)value;
	if ((int)participant != this_participant)
		atomic_fetch_add(&s->bad, 1);
	atomic_fetch_add(&s->released, 1);
}

/* A give's or unit end's result: 0, or with apply_early the failing
 * apply's code, which this call may have run. */
static void check_call(struct rounds *s, const struct plan *pl, int rc)
{
	if (rc != 0 &&
	    !(rc == APPLY_CODE && s->early && pl->fate == APPLY_FAILS))
		atomic_fetch_add(&s->bad, 1);
}

/* Participant p's units of round k, dealt until none is left. */
static void run_units(struct rounds *s, size_t p, uint64_t k,
		      const struct plan *pl)
{
	for (;;) {
		size_t u;
		if (adg_reducer_next_unit(s->red, p, &u) != 0)
			atomic_fetch_add(&s->bad, 1);
		if (u == ADG_REDUCER_NO_UNIT)
			return;
		pause_now(8);
		for (int i = 0; i < NP; i++) {
			if (!gives(k, u, i))
				continue;
			struct grad *g = &s->vals[k & 1][u][i];
			for (int j = 0; j < NV; j++)
				g->v[j] = contribution(k, u, i, j);
			atomic_fetch_add(&s->given, 1);
			check_call(s, pl,
				   adg_reducer_give(s->red, p, s->ids[i], g));
		}
		int result =
			pl->fate == UNIT_FAILS && u == pl->unit ? UNIT_CODE : 0;
		check_call(s, pl, adg_reducer_unit_end(s->red, p, result));
	}
}

static void *rounds_participant(void *arg)
{
	struct thread *th = arg;
	struct rounds *s = th->s;
	size_t p = (size_t)th->i;
	this_participant = th->i;
	pause_seed = (unsigned int)(s->seed ^ (uint64_t)th->i);
	for (uint64_t k = 0; k < ROUNDS; k++) {
		struct plan pl = plan_of(s, k);
		run_units(s, p, k, &pl);
		bool fails = (pl.fate == ONE_FAILS && th->i == pl.p1) ||
			     (pl.fate == TWO_FAIL &&
			      (th->i == pl.p1 || th->i == pl.p2));
		adg_failure failure = {.size = sizeof failure,
				       .code = FAIL_CODE};
		struct seen *seen = &s->seen[k][p];
		seen->f.size = sizeof seen->f;
		pause_now(4);
		seen->rc = adg_reducer_end_with(
			s->red, p, fails ? &failure : NULL, &seen->f);
	}
	return NULL;
}

/* The sum of round k's contributions to parameter i, element j. */
static double expected_sum(const struct rounds *s, uint64_t k, int i, int j)
{
	double sum = 0;
	for (size_t u = 0; u < (size_t)s->u; u++)
		if (gives(k, u, i))
			sum += contribution(k, u, i, j);
	return sum;
}

/* Round k's result as its plan calls for, and the participants' agreement
 * on it. */
static void check_result(const struct rounds *s, uint64_t k)
{
	struct plan pl = plan_of(s, k);
	const struct seen *first = &s->seen[k][0];
	static const int want[] = {0, FAIL_CODE, FAIL_CODE, UNIT_CODE,
				   APPLY_CODE};
	cr_assert_eq(first->rc, want[pl.fate], "seed %llu round %llu: %d",
		     (unsigned long long)s->seed, (unsigned long long)k,
		     first->rc);
	cr_assert_eq(first->f.code, first->rc);
	cr_assert_eq(first->f.round, k);
	for (int p = 1; p < s->t; p++) {
		const struct seen *o = &s->seen[k][p];
		cr_assert(o->rc == first->rc && o->f.site == first->f.site &&
				  o->f.participant == first->f.participant &&
				  o->f.unit == first->f.unit &&
				  o->f.param_id == first->f.param_id &&
				  o->f.round == first->f.round,
			  "seed %llu round %llu: participant %d was told "
			  "otherwise",
			  (unsigned long long)s->seed, (unsigned long long)k,
			  p);
	}
	const adg_reducer_failure *f = &first->f;
	switch (pl.fate) {
	case CLEAN:
		cr_assert_eq(f->site, ADG_REDUCER_FAILED_NOWHERE);
		break;
	case ONE_FAILS:
	case TWO_FAIL:
		cr_assert_eq(f->site, ADG_REDUCER_FAILED_RESULT);
		cr_assert(
			(int)f->participant == pl.p1 ||
			(pl.fate == TWO_FAIL && (int)f->participant == pl.p2));
		break;
	case UNIT_FAILS:
		cr_assert_eq(f->site, ADG_REDUCER_FAILED_RESULT);
		cr_assert_eq(f->unit, pl.unit);
		break;
	case APPLY_FAILS:
		cr_assert_eq(f->site, ADG_REDUCER_FAILED_APPLY);
		cr_assert_eq(f->param_id, s->ids[0]);
		break;
	}
}

/* Round k's applies: each parameter (slice) once with its sum when the
 * round succeeded; none, all or nothing, when a participant or a unit
 * abandoned it. */
static void check_applies(const struct rounds *s, uint64_t k)
{
	enum fate fate = plan_of(s, k).fate;
	for (int i = 0; i < NP; i++) {
		int n = atomic_load(&s->applies[k][i]);
		if (fate == CLEAN) {
			cr_assert_eq(n, i == SLICED ? NV : 1,
				     "seed %llu round %llu param %d",
				     (unsigned long long)s->seed,
				     (unsigned long long)k, i);
			for (int j = 0; j < NV; j++)
				cr_assert_eq(s->applied[k][i][j],
					     expected_sum(s, k, i, j),
					     "seed %llu round %llu param %d",
					     (unsigned long long)s->seed,
					     (unsigned long long)k, i);
		} else if (!s->early && fate != APPLY_FAILS) {
			cr_assert_eq(n, 0, "seed %llu round %llu: applied",
				     (unsigned long long)s->seed,
				     (unsigned long long)k);
		}
	}
}

static void run_rounds(int t, bool early)
{
	struct rounds *s = calloc(1, sizeof *s);
	cr_assert_not_null(s);
	s->applied = calloc(ROUNDS, sizeof *s->applied);
	s->applies = calloc(ROUNDS, sizeof *s->applies);
	s->seen = calloc(ROUNDS, sizeof *s->seen);
	cr_assert(s->applied && s->applies && s->seen);
	s->t = t;
	s->u = t + 3;
	s->early = early;
	s->seed = (uint64_t)time(NULL) * 1000003u + (uint64_t)t;
	for (int i = 0; i < NP; i++) {
		s->ids[i] = (uint64_t)(100 + 7 * i);
		s->slices[i] = i == SLICED ? NV : 1;
	}
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = (size_t)t,
		.n_units = (size_t)s->u,
		.param_ids = s->ids,
		.param_slices = s->slices,
		.n_params = NP,
		.ops = {.add = grad_add,
			.apply = rounds_apply,
			.release = rounds_release,
			.ctx = s,
			.add_slice = grad_add_slice},
		.apply_early = early,
	};
	cr_assert_eq(adg_reducer_new(&o, &s->red), 0);
	run_threads(t, rounds_participant, s);
	cr_assert_eq(atomic_load(&s->bad), 0, "seed %llu",
		     (unsigned long long)s->seed);
	cr_assert_eq(atomic_load(&s->released), atomic_load(&s->given));
	uint64_t rounds;
	cr_assert_eq(adg_reducer_rounds(s->red, &rounds), 0);
	cr_assert_eq(rounds, ROUNDS);
	for (uint64_t k = 0; k < ROUNDS; k++) {
		check_result(s, k);
		check_applies(s, k);
	}
	cr_assert_eq(adg_reducer_free(s->red), 0);
	free(s->applied);
	free(s->applies);
	free(s->seen);
	free(s);
}

Test(reducer_rounds, short_rounds_agree_at_8_and_16_all_or_nothing)
{
	run_rounds(8, false);
	run_rounds(16, false);
}

Test(reducer_rounds, short_rounds_agree_at_8_and_16_applied_early)
{
	run_rounds(8, true);
	run_rounds(16, true);
}
