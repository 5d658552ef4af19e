/* Exact sums (adg/exact.h): each sum rounded once, correctly, from the
 * exact total of its terms, so the same bits in any order and grouping;
 * and a reducer over threads' accumulators, the samples dealt to whichever
 * thread is free, giving the same weights at every thread count. */
#include <adg.h>

#include <criterion/criterion.h>
#include <fenv.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <xmmintrin.h>
#endif

TestSuite(exact, .timeout = 120);
/* The stress tier (tests/meson.build splits it off). */
TestSuite(exact_stress, .timeout = 300);

static uint32_t bits_of(float f)
{
	uint32_t b;
	memcpy(&b, &f, sizeof b);
	return b;
}

static float float_of(uint32_t b)
{
	float f;
	memcpy(&f, &b, sizeof f);
	return f;
}

/* xorshift64*: the tests' numbers, the same on every run. */
static uint64_t next_random(uint64_t *state)
{
	*state ^= *state >> 12;
	*state ^= *state << 25;
	*state ^= *state >> 27;
	return *state * UINT64_C(2685821657736338717);
}

/* A finite float of any sign and exponent (bits at random, the
 * non-finite ones redrawn). */
static float any_float(uint64_t *state)
{
	for (;;) {
		uint32_t b = (uint32_t)(next_random(state) >> 32);
		if ((b & 0x7f800000u) != 0x7f800000u)
			return float_of(b);
	}
}

/* The sum of count terms, one accumulator, rounded. */
static float exact_sum(const float *terms, size_t count)
{
	adg_exact *sum;
	cr_assert_eq(adg_exact_new(1, &sum), 0);
	for (size_t i = 0; i < count; i++)
		cr_assert_eq(adg_exact_add(sum, 0, &terms[i], 1), 0);
	float out;
	cr_assert_eq(adg_exact_round(sum, 0, &out, 1), 0);
	adg_exact_free(sum);
	return out;
}

#define SUM(...)                                                               \
	exact_sum((const float[]){__VA_ARGS__},                                \
		  sizeof((const float[]){__VA_ARGS__}) / sizeof(float))

static void expect_bits(float got, float want)
{
	cr_expect_eq(bits_of(got), bits_of(want), "got %a (0x%08x), want %a",
		     (double)got, bits_of(got), (double)want);
}

Test(exact, sums_that_floats_lose)
{
	/* Float addition loses 2^-100 beside 2^100; the exact sum keeps it. */
	expect_bits(SUM(0x1p100f, 0x1p-100f, -0x1p100f), 0x1p-100f);
	expect_bits(SUM(0x1p100f, 0x1p-100f, -0x1p100f, -0x1p-100f), 0.0f);
	/* Subnormals, exactly. */
	expect_bits(SUM(0x1p-149f, 0x1p-149f, 0x1p-149f), 0x3p-149f);
	expect_bits(SUM(FLT_MIN, -0x1p-149f), float_of(0x007fffffu));
	/* Past FLT_MAX and back: float addition would stay infinite. */
	expect_bits(SUM(FLT_MAX, FLT_MAX, -FLT_MAX), FLT_MAX);
	expect_bits(SUM(-FLT_MAX, -FLT_MAX, FLT_MAX, 1.0f), -FLT_MAX);
	expect_bits(SUM(-1.5f, 0.25f), -1.25f);
	/* Zeros: +0 for a sum of 0, whatever the zeros' signs. */
	expect_bits(SUM(-0.0f), 0.0f);
	expect_bits(SUM(-0.0f, -0.0f), 0.0f);
	expect_bits(SUM(1.0f, -1.0f), 0.0f);
}

Test(exact, rounding_is_to_nearest_ties_to_even)
{
	const float ulp = 0x1p-23f; /* of 1 */
	/* A tie below an even mantissa stays; above an odd one goes up. */
	expect_bits(SUM(1.0f, 0x1p-24f), 1.0f);
	expect_bits(SUM(1.0f + ulp, 0x1p-24f), 1.0f + 2 * ulp);
	/* Anything past the tie, however far below, breaks it. */
	expect_bits(SUM(1.0f, 0x1p-24f, 0x1p-140f), 1.0f + ulp);
	expect_bits(SUM(1.0f, 0x1p-24f, -0x1p-140f), 1.0f);
	expect_bits(SUM(-1.0f, -0x1p-24f, -0x1p-149f), -1.0f - ulp);
	/* Rounding up carries into the exponent. */
	expect_bits(SUM(0x1.fffffep0f, 0x1p-24f), 2.0f);
	/* Beyond FLT_MAX's rounding, an infinity; just below it, FLT_MAX. */
	expect_bits(SUM(FLT_MAX, FLT_MAX), INFINITY);
	expect_bits(SUM(-FLT_MAX, -0x1p103f), -INFINITY); /* a tie, odd */
	expect_bits(SUM(FLT_MAX, 0x1p102f), FLT_MAX);
}

/* Terms k * 2^e, |k| < 2^24, e in [-20, -10]: a double sums a few
 * thousand of them exactly, and rounding that double to float is the
 * correctly rounded sum. */
Test(exact, random_sums_round_as_their_exact_value)
{
	uint64_t state = 0x9e3779b97f4a7c15u;
	enum { N = 64, TERMS = 3000 };
	adg_exact *sum;
	cr_assert_eq(adg_exact_new(N, &sum), 0);
	static double reference[N];
	static float terms[N];
	for (int t = 0; t < TERMS; t++) {
		for (int i = 0; i < N; i++) {
			int64_t k = (int64_t)(next_random(&state) >> 40) -
				    (INT64_C(1) << 23);
			int e = -20 + (int)(next_random(&state) % 11);
			terms[i] = ldexpf((float)k, e);
			reference[i] += (double)terms[i];
		}
		cr_assert_eq(adg_exact_add(sum, 0, terms, N), 0);
	}
	float out[N];
	cr_assert_eq(adg_exact_round(sum, 0, out, N), 0);
	for (int i = 0; i < N; i++)
		expect_bits(out[i], (float)reference[i]);
	adg_exact_free(sum);
}

/* Sums within a hair of a tie between two floats, where a sum rounded
 * through doubles would go astray, with carries of opposite signs left
 * pending above and below them. Sum i is f + half an ulp of f + delta
 * (0 or +-2^k, far below that half) and, at random planes,
 * 2^(32(j + 1)) - 2 * 2^(32j + 31) units: 0, but as +1 in word j + 1 and
 * -2^32 in word j. It rounds to f below the tie, to f's successor above
 * it, and to the even one of the two on it. */
#define NEAR_TIES 512

static void add_near_ties(adg_exact *sum, float want[NEAR_TIES], uint64_t seed)
{
	uint64_t state = seed;
	for (size_t i = 0; i < NEAR_TIES; i++) {
		/* A normal f, exponent field 2 to 254: half an ulp of it,
		 * 2^(field - 151), is a float too. */
		uint32_t field = 2 + (uint32_t)(next_random(&state) % 253);
		uint32_t f_bits =
			field << 23 | (uint32_t)(next_random(&state) >> 41);
		float terms[3 + 3 * 2];
		size_t n = 0;
		terms[n++] = float_of(f_bits);
		terms[n++] = ldexpf(1.0f, (int)field - 151);
		int room = (int)field - 152 + 149; /* exponents below half */
		int side = room > 0 ? (int)(next_random(&state) % 3) - 1 : 0;
		if (side != 0)
			terms[n++] =
				side *
				ldexpf(1.0f, -149 + (int)(next_random(&state) %
							  (uint64_t)room));
		uint32_t successor = f_bits + 1; /* FLT_MAX's: infinity */
		uint32_t want_bits = side < 0	     ? f_bits
				     : side > 0	     ? successor
				     : (f_bits & 1u) ? successor
						     : f_bits;
		for (int c = (int)(next_random(&state) % 3); c > 0; c--) {
			int j = (int)(next_random(&state) % 8);
			float half_word = ldexpf(1.0f, 32 * j + 31 - 149);
			terms[n++] = 2 * half_word;
			terms[n++] = -half_word;
			terms[n++] = -half_word;
		}
		uint32_t sign = (uint32_t)(next_random(&state) & 1u) << 31;
		want[i] = float_of(want_bits | sign);
		/* In a random order, each term with the sum's sign. */
		for (size_t t = n; t > 0; t--) {
			size_t k = next_random(&state) % t;
			float term = float_of(bits_of(terms[k]) ^ sign);
			terms[k] = terms[t - 1];
			cr_assert_eq(adg_exact_add(sum, i, &term, 1), 0);
		}
	}
}

Test(exact, sums_near_a_tie_round_as_their_exact_value)
{
	adg_exact *sum;
	cr_assert_eq(adg_exact_new(NEAR_TIES, &sum), 0);
	static float want[NEAR_TIES], out[NEAR_TIES];
	for (uint64_t seed = 1; seed <= 20; seed++) {
		cr_assert_eq(adg_exact_clear(sum), 0);
		add_near_ties(sum, want, seed * 0x9e3779b97f4a7c15u);
		cr_assert_eq(adg_exact_round(sum, 0, out, NEAR_TIES), 0);
		for (size_t i = 0; i < NEAR_TIES; i++)
			expect_bits(out[i], want[i]);
	}
	adg_exact_free(sum);
}

/* The rounding is the library's, not the floating-point environment's:
 * the same bits under every rounding mode, and subnormal sums kept under
 * flush to zero (-ffast-math's startup code sets it). */
Test(exact, rounding_ignores_the_float_environment)
{
	adg_exact *sum;
	cr_assert_eq(adg_exact_new(NEAR_TIES + 2, &sum), 0);
	static float want[NEAR_TIES + 2], out[NEAR_TIES + 2];
	add_near_ties(sum, want, 7);
	float subnormals[2] = {0x3p-149f, -0x1.8p-130f};
	cr_assert_eq(adg_exact_add(sum, NEAR_TIES, subnormals, 2), 0);
	want[NEAR_TIES] = subnormals[0];
	want[NEAR_TIES + 1] = subnormals[1];
	const int modes[] = {FE_UPWARD, FE_DOWNWARD, FE_TOWARDZERO};
	for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
		cr_assert_eq(fesetround(modes[m]), 0);
		int rc = adg_exact_round(sum, 0, out, NEAR_TIES + 2);
		fesetround(FE_TONEAREST);
		cr_assert_eq(rc, 0);
		for (size_t i = 0; i < NEAR_TIES + 2; i++)
			expect_bits(out[i], want[i]);
	}
#ifdef __SSE2__
	unsigned csr = _mm_getcsr();
	_mm_setcsr(csr | 0x8040); /* flush to zero, denormals are zero */
	int rc = adg_exact_round(sum, 0, out, NEAR_TIES + 2);
	_mm_setcsr(csr);
	cr_assert_eq(rc, 0);
	for (size_t i = 0; i < NEAR_TIES + 2; i++)
		expect_bits(out[i], want[i]);
#endif
	adg_exact_free(sum);
}

/* Terms of every size and sign: in order into one accumulator; shuffled
 * and cut into pieces added to five accumulators in ranges, merged in
 * another order; both round to the same bits, where plain float sums of
 * the two orders differ. */
Test(exact, order_and_grouping_change_no_bit)
{
	enum { N = 40, TERMS = 500, PARTS = 5 };
	uint64_t state = 42;
	static float terms[TERMS][N];
	for (int t = 0; t < TERMS; t++)
		for (int i = 0; i < N; i++) {
			/* Exponents within 2^-60 to 2^60, so that the plain
			 * sums below stay finite. */
			float f = any_float(&state);
			terms[t][i] =
				ldexpf(frexpf(f, &(int){0}),
				       (int)(next_random(&state) % 121) - 60);
		}
	adg_exact *one, *part[PARTS];
	cr_assert_eq(adg_exact_new(N, &one), 0);
	for (int p = 0; p < PARTS; p++)
		cr_assert_eq(adg_exact_new(N, &part[p]), 0);
	float plain_in_order[N] = {0}, plain_shuffled[N] = {0};
	for (int t = 0; t < TERMS; t++) {
		cr_assert_eq(adg_exact_add(one, 0, terms[t], N), 0);
		for (int i = 0; i < N; i++)
			plain_in_order[i] += terms[t][i];
	}
	int order[TERMS];
	for (int t = 0; t < TERMS; t++)
		order[t] = t;
	for (int t = TERMS - 1; t > 0; t--) {
		int j = (int)(next_random(&state) % (uint64_t)(t + 1));
		int swap = order[t];
		order[t] = order[j];
		order[j] = swap;
	}
	for (int t = 0; t < TERMS; t++) {
		const float *row = terms[order[t]];
		/* Each term's row in two ranges, to two accumulators. */
		size_t cut = next_random(&state) % (N + 1);
		adg_exact *a = part[next_random(&state) % PARTS];
		adg_exact *b = part[next_random(&state) % PARTS];
		cr_assert_eq(adg_exact_add(a, 0, row, cut), 0);
		cr_assert_eq(adg_exact_add(b, cut, row + cut, N - cut), 0);
		for (int i = 0; i < N; i++)
			plain_shuffled[i] += row[i];
	}
	/* Merged 4, 3, 2, 1 into 0, the last in two ranges. */
	for (int p = PARTS - 1; p > 1; p--)
		cr_assert_eq(adg_exact_merge(part[0], part[p], 0, N), 0);
	cr_assert_eq(adg_exact_merge(part[0], part[1], 0, N / 2), 0);
	cr_assert_eq(adg_exact_merge(part[0], part[1], N / 2, N - N / 2), 0);
	float in_order[N], grouped[N];
	cr_assert_eq(adg_exact_round(one, 0, in_order, N), 0);
	cr_assert_eq(adg_exact_round(part[0], 0, grouped, N), 0);
	int plain_differ = 0;
	for (int i = 0; i < N; i++) {
		expect_bits(grouped[i], in_order[i]);
		plain_differ += bits_of(plain_in_order[i]) !=
				bits_of(plain_shuffled[i]);
	}
	cr_expect_gt(plain_differ, N / 2, "the data is order-sensitive");
	adg_exact_free(one);
	for (int p = 0; p < PARTS; p++)
		adg_exact_free(part[p]);
}

/* Every word and carry of a merge: 2^k in one accumulator, 2^j and then
 * -2^j in two others, merged: 2^k exactly, for k and j all over the
 * range, so that the big term cancels whatever lies below it. */
Test(exact, merges_keep_every_bit)
{
	adg_exact *a, *b, *c;
	cr_assert_eq(adg_exact_new(1, &a), 0);
	cr_assert_eq(adg_exact_new(1, &b), 0);
	cr_assert_eq(adg_exact_new(1, &c), 0);
	for (int k = -149; k <= 127; k += 6)
		for (int j = -149; j <= 127; j += 5) {
			float x = ldexpf(1.0f, k), y = ldexpf(1.0f, j);
			float minus_y = -y, out;
			adg_exact_clear(a);
			adg_exact_clear(b);
			adg_exact_clear(c);
			cr_assert_eq(adg_exact_add(a, 0, &x, 1), 0);
			cr_assert_eq(adg_exact_add(b, 0, &y, 1), 0);
			cr_assert_eq(adg_exact_add(c, 0, &minus_y, 1), 0);
			cr_assert_eq(adg_exact_merge(a, b, 0, 1), 0);
			cr_assert_eq(adg_exact_merge(c, a, 0, 1), 0);
			cr_assert_eq(adg_exact_round(c, 0, &out, 1), 0);
			cr_assert_eq(bits_of(out), bits_of(x),
				     "2^%d + 2^%d - 2^%d: %a", k, j, j,
				     (double)out);
		}
	adg_exact_free(a);
	adg_exact_free(b);
	adg_exact_free(c);
}

Test(exact, clear_and_length)
{
	adg_exact *sum;
	cr_assert_eq(adg_exact_new(3, &sum), 0);
	size_t n = 0;
	cr_assert_eq(adg_exact_length(sum, &n), 0);
	cr_expect_eq(n, 3);
	float v[3] = {1.0f, -2.0f, 0x1p-149f}, out[3];
	cr_assert_eq(adg_exact_add(sum, 0, v, 3), 0);
	cr_assert_eq(adg_exact_clear(sum), 0);
	cr_assert_eq(adg_exact_add(sum, 1, v, 2), 0);
	cr_assert_eq(adg_exact_round(sum, 0, out, 3), 0);
	expect_bits(out[0], 0.0f);
	expect_bits(out[1], 1.0f);
	expect_bits(out[2], -2.0f);
	adg_exact_free(sum);
}

Test(exact, bad_input_is_refused_and_changes_nothing)
{
	adg_exact *sum = (adg_exact *)&sum, *other, *shorter;
	cr_expect_eq(adg_exact_new(4, NULL), ADG_EINVAL);
	cr_expect_eq(adg_exact_new(0, &sum), ADG_EINVAL);
	cr_expect_null(sum);
	cr_expect_eq(adg_exact_new(SIZE_MAX / 8, &sum), ADG_EINVAL);
	cr_expect(strstr(adg_errmsg(), "adg_exact_new") != NULL, "%s",
		  adg_errmsg());
	cr_assert_eq(adg_exact_new(4, &sum), 0);
	cr_assert_eq(adg_exact_new(4, &other), 0);
	cr_assert_eq(adg_exact_new(3, &shorter), 0);
	float v[4] = {1.0f, 2.0f, 3.0f, 4.0f}, out[4];
	cr_assert_eq(adg_exact_add(sum, 0, v, 4), 0);

	cr_expect_eq(adg_exact_add(NULL, 0, v, 1), ADG_EINVAL);
	cr_expect_eq(adg_exact_add(sum, 0, NULL, 1), ADG_EINVAL);
	cr_expect_eq(adg_exact_add(sum, 0, NULL, 0), 0);
	cr_expect_eq(adg_exact_add(sum, 3, v, 2), ADG_EINVAL);
	cr_expect_eq(adg_exact_add(sum, SIZE_MAX, v, 2), ADG_EINVAL);
	cr_expect_eq(adg_exact_add(sum, 1, v, SIZE_MAX), ADG_EINVAL);
	/* A non-finite value anywhere: nothing added, the index said. */
	float bad[3] = {5.0f, 6.0f, NAN};
	cr_expect_eq(adg_exact_add(sum, 0, bad, 3), ADG_EVALUE);
	cr_expect(strstr(adg_errmsg(), "values[2]") != NULL, "%s",
		  adg_errmsg());
	bad[2] = -INFINITY;
	cr_expect_eq(adg_exact_add(sum, 1, bad, 3), ADG_EVALUE);

	cr_expect_eq(adg_exact_merge(sum, sum, 0, 4), ADG_EINVAL);
	cr_expect_eq(adg_exact_merge(sum, shorter, 0, 3), ADG_EINVAL);
	cr_expect_eq(adg_exact_merge(NULL, other, 0, 4), ADG_EINVAL);
	cr_expect_eq(adg_exact_merge(sum, NULL, 0, 4), ADG_EINVAL);
	cr_expect_eq(adg_exact_merge(sum, other, 2, 3), ADG_EINVAL);

	cr_expect_eq(adg_exact_round(NULL, 0, out, 1), ADG_EINVAL);
	cr_expect_eq(adg_exact_round(sum, 0, NULL, 1), ADG_EINVAL);
	cr_expect_eq(adg_exact_round(sum, 4, out, 1), ADG_EINVAL);
	cr_expect_eq(adg_exact_length(NULL, &(size_t){0}), ADG_EINVAL);
	cr_expect_eq(adg_exact_length(sum, NULL), ADG_EINVAL);
	cr_expect_eq(adg_exact_clear(NULL), ADG_EINVAL);
	cr_expect_eq(adg_exact_free(NULL), 0);

	cr_assert_eq(adg_exact_round(sum, 0, out, 4), 0);
	for (int i = 0; i < 4; i++)
		expect_bits(out[i], v[i]);
	adg_exact_free(sum);
	adg_exact_free(other);
	adg_exact_free(shorter);
}

/* ------------------------------------------------ through the reducer */

/* A trainer whose work cannot be cut into fixed units: each round's
 * SAMPLES samples are taken one at a time by whichever thread is free,
 * each sample's gradient (here a function of the round, the sample and
 * the weights, of every size and sign) added to the thread's own
 * accumulator of each parameter, which the reducer then merges (whole, or
 * in slices) and apply rounds and steps. The weights after ROUNDS rounds
 * must be the same bits at every T, and those of one accumulator per
 * parameter summing every sample in order on one thread. */
enum { PARAMS = 2, SAMPLES = 13, ROUNDS = 12, MAX_T = 8 };
static const size_t param_len[PARAMS] = {300, 7};
static const size_t param_slices[PARAMS] = {4, 1};

struct trainer {
	float *weights[PARAMS];
	adg_exact *mine[MAX_T][PARAMS]; /* each participant's accumulators */
	adg_reducer *reducer;
	size_t n_threads;
	atomic_size_t next_sample;
	pthread_barrier_t deal_reset;
	atomic_int bad;
	uint64_t seed;
};

/* Sample s's gradient of parameter p in round r, into g: values of every
 * scale, depending on the weights as a real gradient would. */
static void gradient(const struct trainer *tr, size_t p, size_t r, size_t s,
		     float *g)
{
	uint64_t state = tr->seed ^ (r * 1000003u + s * 7919u + p * 31u + 1);
	for (size_t i = 0; i < param_len[p]; i++) {
		float w = tr->weights[p][i];
		int e = (int)(next_random(&state) % 40) - 30;
		g[i] = ldexpf((float)(int64_t)(next_random(&state) >> 40) -
				      0x1p23f,
			      e - 23) +
		       0.001f * w;
	}
}

static void slice_range(size_t n, size_t slice, size_t n_slices, size_t *first,
			size_t *count)
{
	*first = n * slice / n_slices;
	*count = n * (slice + 1) / n_slices - *first;
}

static int merge_whole(void **sum, const void *value, void *ctx)
{
	(void)ctx;
	size_t n;
	adg_exact_length(*sum, &n);
	return adg_exact_merge(*sum, value, 0, n);
}

static int merge_slice(void *sum, const void *value, size_t slice,
		       size_t n_slices, void *ctx)
{
	(void)ctx;
	size_t n, first, count;
	adg_exact_length(sum, &n);
	slice_range(n, slice, n_slices, &first, &count);
	return adg_exact_merge(sum, value, first, count);
}

static int apply_rounded(const adg_reduction *r, void *ctx)
{
	struct trainer *tr = ctx;
	if (r->sum == NULL)
		return 0;
	size_t first, count;
	slice_range(param_len[r->param], r->slice, r->n_slices, &first, &count);
	float g[300];
	int rc = adg_exact_round(r->sum, first, g, count);
	for (size_t i = 0; i < count; i++)
		tr->weights[r->param][first + i] -= 0.01f * g[i];
	return rc;
}

/* Back to its participant after the round's barrier: cleared there for
 * the next round, which no other thread reads until then. */
static void release_cleared(void *value, size_t participant, void *ctx)
{
	struct trainer *tr = ctx;
	int mine = 0;
	for (size_t p = 0; p < PARAMS; p++)
		mine |= tr->mine[participant][p] == value;
	if (!mine || adg_exact_clear(value) != 0)
		atomic_fetch_add(&tr->bad, 1);
}

struct participant {
	struct trainer *tr;
	size_t index;
};

static void maybe_pause(uint64_t *state)
{
	if (next_random(state) % 4 == 0)
		sched_yield();
}

static void *participate(void *arg)
{
	struct participant *me = arg;
	struct trainer *tr = me->tr;
	uint64_t state = tr->seed + me->index + 1;
	float g[300];
	for (size_t r = 0; r < ROUNDS; r++) {
		for (;;) {
			size_t s = atomic_fetch_add(&tr->next_sample, 1);
			if (s >= SAMPLES)
				break;
			for (size_t p = 0; p < PARAMS; p++) {
				gradient(tr, p, r, s, g);
				if (adg_exact_add(tr->mine[me->index][p], 0, g,
						  param_len[p]) != 0)
					atomic_fetch_add(&tr->bad, 1);
			}
			maybe_pause(&state);
		}
		for (size_t p = 0; p < PARAMS; p++)
			if (adg_reducer_give(tr->reducer, me->index, p + 1,
					     tr->mine[me->index][p]) != 0)
				atomic_fetch_add(&tr->bad, 1);
		maybe_pause(&state);
		if (adg_reducer_end(tr->reducer, me->index, 0) != 0)
			atomic_fetch_add(&tr->bad, 1);
		/* Every participant has ended the round (the reducer's
		 * barrier): one resets the deal, and all wait for it before
		 * taking the next round's samples. */
		if (pthread_barrier_wait(&tr->deal_reset) ==
		    PTHREAD_BARRIER_SERIAL_THREAD)
			atomic_store(&tr->next_sample, 0);
		pthread_barrier_wait(&tr->deal_reset);
	}
	return NULL;
}

static void train(size_t n_threads, uint64_t seed, float *out[PARAMS])
{
	struct trainer tr = {.n_threads = n_threads, .seed = seed};
	for (size_t p = 0; p < PARAMS; p++) {
		tr.weights[p] = out[p];
		for (size_t i = 0; i < param_len[p]; i++)
			out[p][i] = 0.5f;
		for (size_t t = 0; t < n_threads; t++)
			cr_assert_eq(
				adg_exact_new(param_len[p], &tr.mine[t][p]), 0);
	}
	const uint64_t ids[PARAMS] = {1, 2};
	adg_reducer_options o = {
		.size = sizeof o,
		.n_participants = n_threads,
		.param_ids = ids,
		.n_params = PARAMS,
		.ops = {.add = merge_whole,
			.apply = apply_rounded,
			.release = release_cleared,
			.ctx = &tr,
			.add_slice = merge_slice},
		.param_slices = param_slices,
	};
	cr_assert_eq(adg_reducer_new(&o, &tr.reducer), 0);
	cr_assert_eq(
		pthread_barrier_init(&tr.deal_reset, NULL, (unsigned)n_threads),
		0);
	pthread_t threads[MAX_T];
	struct participant who[MAX_T];
	for (size_t t = 0; t < n_threads; t++) {
		who[t] = (struct participant){&tr, t};
		cr_assert_eq(
			pthread_create(&threads[t], NULL, participate, &who[t]),
			0);
	}
	for (size_t t = 0; t < n_threads; t++)
		pthread_join(threads[t], NULL);
	cr_expect_eq(atomic_load(&tr.bad), 0);
	pthread_barrier_destroy(&tr.deal_reset);
	adg_reducer_free(tr.reducer);
	for (size_t p = 0; p < PARAMS; p++)
		for (size_t t = 0; t < n_threads; t++)
			adg_exact_free(tr.mine[t][p]);
}

/* The same rounds on this thread: each parameter's samples summed in
 * order into one accumulator, rounded, stepped. */
static void train_in_order(uint64_t seed, float *out[PARAMS])
{
	struct trainer tr = {.seed = seed};
	for (size_t p = 0; p < PARAMS; p++) {
		tr.weights[p] = out[p];
		for (size_t i = 0; i < param_len[p]; i++)
			out[p][i] = 0.5f;
	}
	float g[300], rounded[300];
	adg_exact *sum[PARAMS];
	for (size_t p = 0; p < PARAMS; p++)
		cr_assert_eq(adg_exact_new(param_len[p], &sum[p]), 0);
	for (size_t r = 0; r < ROUNDS; r++) {
		for (size_t s = 0; s < SAMPLES; s++)
			for (size_t p = 0; p < PARAMS; p++) {
				gradient(&tr, p, r, s, g);
				cr_assert_eq(adg_exact_add(sum[p], 0, g,
							   param_len[p]),
					     0);
			}
		for (size_t p = 0; p < PARAMS; p++) {
			adg_exact_round(sum[p], 0, rounded, param_len[p]);
			for (size_t i = 0; i < param_len[p]; i++)
				out[p][i] -= 0.01f * rounded[i];
			adg_exact_clear(sum[p]);
		}
	}
	for (size_t p = 0; p < PARAMS; p++)
		adg_exact_free(sum[p]);
}

Test(exact_stress, threads_reduce_the_same_bits_at_every_t)
{
	static float want0[300], want1[7], got0[300], got1[7];
	float *want[PARAMS] = {want0, want1}, *got[PARAMS] = {got0, got1};
	const size_t counts[] = {1, 2, 3, 8};
	for (uint64_t seed = 1; seed <= 3; seed++) {
		train_in_order(seed, want);
		for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
			train(counts[k], seed, got);
			for (size_t p = 0; p < PARAMS; p++)
				cr_assert_eq(
					memcmp(got[p], want[p],
					       param_len[p] * sizeof(float)),
					0,
					"seed %d, T = %zu: parameter %zu "
					"differs",
					(int)seed, counts[k], p);
		}
	}
}
