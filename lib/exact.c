/*
 * Exact sums of floats (adg/exact.h): each sum an integer count of units
 * of 2^-149 (the smallest subnormal), in DIGITS signed 64-bit words of
 * base 2^32. A float m * 2^e (m < 2^24) is m shifted to its place: at
 * most 55 bits, so it lands in two adjacent words, and adding it is two
 * integer adds. Carries are deferred: a word only moves by less than 2^32
 * a term, and the words are carried before any could overflow.
 *
 * Word d of every sum lies in plane d, n words in a row, and the
 * accumulator notes which planes may hold anything: a gradient's terms
 * span a few planes of the nine (2^-60 to 2^4, say: 3 to 5), and merges,
 * clears and rounds touch only those, plane by plane, in loops the
 * compiler vectorizes. An annex: it stands on the C library and util.h.
 */
#include "util.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Words 0 to 7 take the terms (a float's top bit is bit 276 of the
 * count); word 8 takes the carries out of word 7, so the sum's magnitude
 * may reach 2^(256 + 61) units, 2^168. */
#define DIGITS	   9
#define DIGIT_BITS 32
#define DIGIT_MASK 0xffffffffu
#define ALL_PLANES ((1u << DIGITS) - 1)

/* Every word stays below bound * 2^32 in magnitude, beside what it holds
 * of the sum itself: 1 once carried, one more for each term added, the
 * other's bound more for each merge. Up to MAX_BOUND every word is below
 * 2^62, so that a merge of two such accumulators cannot overflow; an add
 * that would pass it carries every sum first, a merge that would carries
 * the sums it merges. */
#ifdef ADG_EXACT_MAX_BOUND
#define MAX_BOUND ((uint64_t)(ADG_EXACT_MAX_BOUND)) /* tests/: carry often */
#else
#define MAX_BOUND (UINT64_C(1) << 30)
#endif

struct adg_exact {
	size_t n;
	/* Words from one plane to the next: n rounded up to a cache line's
	 * worth, and one line more, so that the same sum's words in two
	 * planes never sit a multiple of 4 KiB apart (n is often a multiple
	 * of 512), where loads and stores of neighbouring planes would alias
	 * in the store buffer and wait on each other. */
	size_t stride;
	/* The bound above, for every sum; and the planes that may hold a
	 * word other than 0 (bit d: plane d). Both atomic, relaxed: merges
	 * into disjoint ranges of one accumulator run at once and each
	 * raises them; they only ever overstate, and each range's words
	 * are ordered after the calls that raised them for it by whatever
	 * ordered those calls (adg/exact.h's thread rules). */
	uint64_t bound;
	uint32_t planes;
	int64_t words[]; /* DIGITS planes: word d of sum i at d * stride + i */
};

static float float_bits(uint32_t bits)
{
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

static int64_t *plane(adg_exact *sum, int d)
{
	return sum->words + (size_t)d * sum->stride;
}

static const int64_t *plane_const(const adg_exact *sum, int d)
{
	return sum->words + (size_t)d * sum->stride;
}

static uint32_t planes_of(const adg_exact *sum)
{
	return __atomic_load_n(&sum->planes, __ATOMIC_RELAXED);
}

/* Planes from the lowest of mask up: where a carry can put something. */
static uint32_t planes_from_lowest(uint32_t mask)
{
	return mask == 0 ? 0 : ALL_PLANES & ~((1u << __builtin_ctz(mask)) - 1);
}

/* Carries sums [first, first + count) from plane lo up, plane by plane:
 * each word of planes lo to 7 ends in [0, 2^32), plane 8 takes what is
 * left, sign included. The same as carrying each sum word by word, as
 * plane d is done before plane d + 1 takes its carries. */
static void carry_range(adg_exact *sum, size_t first, size_t count, int lo)
{
	for (int d = lo; d < DIGITS - 1; d++) {
		int64_t *w = plane(sum, d) + first,
			*up = plane(sum, d + 1) + first;
		for (size_t i = 0; i < count; i++) {
			/* An arithmetic shift: floor division, so that a
			 * negative word borrows from the next. */
			int64_t c = w[i] >> DIGIT_BITS;
			w[i] -= (int64_t)((uint64_t)c << DIGIT_BITS);
			up[i] += c;
		}
	}
}

static void normalize(adg_exact *sum)
{
	uint32_t mask = planes_of(sum);
	if (mask != 0)
		carry_range(sum, 0, sum->n, __builtin_ctz(mask));
	__atomic_fetch_or(&sum->planes, planes_from_lowest(mask),
			  __ATOMIC_RELAXED);
	__atomic_store_n(&sum->bound, 1, __ATOMIC_RELAXED);
}

/* Whether sums [first, first + count) are sum's (without overflow);
 * else func's reason. */
static int check_range(const adg_exact *sum, size_t first, size_t count,
		       const char *func)
{
	if (first <= sum->n && count <= sum->n - first)
		return 0;
	return adg_fail(ADG_EINVAL, func,
			"sums %zu to %zu + %zu past the %zu sums", first, first,
			count, sum->n);
}

/* What add and round check alike, for func: sum and the caller's array
 * (called name) given, and a range of sum's. */
static int check_span(const adg_exact *sum, const void *array, const char *name,
		      size_t first, size_t count, const char *func)
{
	if (sum == NULL)
		return adg_fail(ADG_EINVAL, func, "sum is NULL");
	if (array == NULL && count > 0)
		return adg_fail(ADG_EINVAL, func, "%s is NULL", name);
	return check_range(sum, first, count, func);
}

int adg_exact_new(size_t n, adg_exact **out)
{
	if (out == NULL)
		return ADG_FAIL(ADG_EINVAL, "out is NULL");
	*out = NULL;
	if (n == 0)
		return ADG_FAIL(ADG_EINVAL, "no sums (n is 0)");
	size_t line = ADG_CACHELINE / sizeof(int64_t);
	size_t per_plane = DIGITS * sizeof(int64_t);
	if (n > (SIZE_MAX - sizeof(adg_exact)) / per_plane - 2 * line)
		return ADG_FAIL(ADG_EINVAL, "%zu sums overflow a size", n);
	size_t stride = adg_round_up(n, line) + line;
	adg_exact *sum = calloc(1, sizeof *sum + stride * per_plane);
	if (sum == NULL)
		return ADG_FAIL(ADG_ENOMEM, "no memory for %zu sums", n);
	sum->n = n;
	sum->stride = stride;
	__atomic_store_n(&sum->bound, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&sum->planes, 0, __ATOMIC_RELAXED);
	*out = sum;
	return 0;
}

int adg_exact_free(adg_exact *sum)
{
	free(sum);
	return 0;
}

int adg_exact_length(const adg_exact *sum, size_t *n)
{
	if (sum == NULL || n == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				sum == NULL ? "sum" : "n");
	*n = sum->n;
	return 0;
}

int adg_exact_clear(adg_exact *sum)
{
	if (sum == NULL)
		return ADG_FAIL(ADG_EINVAL, "sum is NULL");
	uint32_t mask = planes_of(sum);
	for (int d = 0; d < DIGITS; d++)
		if (mask >> d & 1u)
			memset(plane(sum, d), 0, sum->n * sizeof(int64_t));
	__atomic_store_n(&sum->planes, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&sum->bound, 1, __ATOMIC_RELAXED);
	return 0;
}

int adg_exact_add(adg_exact *sum, size_t first, const float *values,
		  size_t count)
{
	int rc = check_span(sum, values, "values", first, count, __func__);
	if (rc != 0)
		return rc;
	/* All or nothing: a non-finite value is refused before any is
	 * added, so that a failed call leaves the sums as they were. */
	for (size_t i = 0; i < count; i++) {
		uint32_t bits;
		memcpy(&bits, &values[i], sizeof bits);
		if ((bits & 0x7f800000u) == 0x7f800000u)
			return ADG_FAIL(ADG_EVALUE, "values[%zu] is not finite",
					i);
	}
	if (__atomic_load_n(&sum->bound, __ATOMIC_RELAXED) >= MAX_BOUND)
		normalize(sum);
	__atomic_fetch_add(&sum->bound, 1, __ATOMIC_RELAXED);
	int64_t *words = sum->words + first;
	size_t n = sum->stride;
	uint32_t touched = 0;
	for (size_t i = 0; i < count; i++) {
		uint32_t bits;
		memcpy(&bits, &values[i], sizeof bits);
		uint32_t exponent = (bits >> 23) & 0xffu;
		/* value = m * 2^(exponent - 150) with the hidden bit for a
		 * normal, m * 2^-149 for a subnormal: m units shifted by
		 * exponent - 1, or by 0. Branch-free, as signs and the odd
		 * subnormal come in no order a predictor could learn. */
		uint32_t normal = exponent != 0;
		uint64_t m = (bits & 0x7fffffu) | (uint64_t)normal << 23;
		unsigned shift = exponent - normal;
		unsigned d = shift / DIGIT_BITS;
		uint64_t placed = m << (shift % DIGIT_BITS); /* < 2^55 */
		int64_t negative = -(int64_t)(bits >> 31);   /* 0 or -1 */
		int64_t low = (int64_t)(placed & DIGIT_MASK);
		int64_t high = (int64_t)(placed >> DIGIT_BITS);
		int64_t *w = words + (size_t)d * n + i;
		w[0] += (low ^ negative) - negative;
		w[n] += (high ^ negative) - negative;
		/* Zeros (most of a ReLU layer's gradient) touch no plane. */
		touched |= (uint32_t)(m != 0) * (3u << d);
	}
	__atomic_fetch_or(&sum->planes, touched, __ATOMIC_RELAXED);
	return 0;
}

int adg_exact_merge(adg_exact *sum, const adg_exact *other, size_t first,
		    size_t count)
{
	if (sum == NULL || other == NULL)
		return ADG_FAIL(ADG_EINVAL, "%s is NULL",
				sum == NULL ? "sum" : "other");
	if (sum == other)
		return ADG_FAIL(ADG_EINVAL,
				"sum and other are one accumulator");
	if (sum->n != other->n)
		return ADG_FAIL(ADG_EINVAL, "lengths differ: %zu and %zu",
				sum->n, other->n);
	int rc = check_range(sum, first, count, __func__);
	if (rc != 0)
		return rc;
	uint64_t bound = __atomic_load_n(&sum->bound, __ATOMIC_RELAXED),
		 other_bound = __atomic_load_n(&other->bound, __ATOMIC_RELAXED);
	uint32_t mask = planes_of(other);
	bool carry = bound + other_bound > MAX_BOUND;
	if (carry) {
		/* Each word below 2^62 + 2^62 after the add; carried at
		 * once, from the lowest plane either holds, the range is
		 * left within the bound sum already has, but its carries
		 * may reach any plane above. */
		uint32_t both = planes_of(sum) | mask;
		__atomic_fetch_or(&sum->planes, planes_from_lowest(both),
				  __ATOMIC_RELAXED);
	} else {
		__atomic_fetch_add(&sum->bound, other_bound, __ATOMIC_RELAXED);
		__atomic_fetch_or(&sum->planes, mask, __ATOMIC_RELAXED);
	}
	for (int d = 0; d < DIGITS; d++) {
		if (!(mask >> d & 1u))
			continue;
		int64_t *w = plane(sum, d) + first;
		const int64_t *o = plane_const(other, d) + first;
		for (size_t i = 0; i < count; i++)
			w[i] += o[i];
	}
	uint32_t held = planes_of(sum);
	if (carry && held != 0)
		carry_range(sum, first, count, __builtin_ctz(held));
	return 0;
}

/* The float nearest the sum whose words are w[lo] to w[hi] (the others
 * 0), ties to even. Changes w. Branch-free but for rounding's rare cases:
 * signs and magnitudes come in no order a predictor could learn. */
static float round_one(int64_t w[DIGITS], int lo, int hi)
{
	/* Carried, words lo to hi - 1 are digits and w[hi] holds the rest,
	 * sign included: as digits hi and hi + 1, two's complement. */
	for (int d = lo; d < hi; d++) {
		int64_t c = w[d] >> DIGIT_BITS;
		w[d] -= (int64_t)((uint64_t)c << DIGIT_BITS);
		w[d + 1] += c;
	}
	uint32_t limb[DIGITS + 1] = {0};
	for (int d = lo; d < hi; d++)
		limb[d] = (uint32_t)w[d];
	limb[hi] = (uint32_t)(uint64_t)w[hi];
	limb[hi + 1] = (uint32_t)((uint64_t)w[hi] >> DIGIT_BITS);
	/* The magnitude: for a negative sum, invert and add 1. */
	uint32_t negative = (uint32_t)((uint64_t)w[hi] >> 63);
	uint32_t flip = 0u - negative;
	uint64_t c = negative;
	uint32_t nonzero = 0; /* bit d: limb d is not 0 */
	for (int d = lo; d <= hi + 1; d++) {
		c += limb[d] ^ flip;
		limb[d] = (uint32_t)c;
		c >>= DIGIT_BITS;
		nonzero |= (uint32_t)(limb[d] != 0) << d;
	}
	uint32_t sign = negative << 31;
	if (nonzero == 0)
		return 0.0f; /* +0, whatever the terms' signs */
	int top = 31 - __builtin_clz(nonzero);
	/* p: the magnitude's top bit. */
	int p = top * DIGIT_BITS + 31 - __builtin_clz(limb[top]);
	if (p < 24) {
		/* Under 2^24 units: the count itself is the float's bits (a
		 * subnormal below 2^23, else exponent field 1 and the hidden
		 * bit at 2^23). */
		return float_bits(sign | limb[0]);
	}
	/* The 24 bits from p down, the next (half), and whether any below it
	 * is set (sticky), from a window of the top limb and the one below
	 * it: bit j of the window is bit j + 32 * (top - 1) of the count. */
	uint64_t window = (uint64_t)limb[top] << DIGIT_BITS;
	if (top > 0)
		window |= limb[top - 1];
	int low = p - 23 - DIGIT_BITS * (top - 1); /* 9 to 40 */
	uint64_t m = window >> low;
	bool half = (window >> (low - 1)) & 1u;
	bool below = (window & ((UINT64_C(1) << (low - 1)) - 1)) != 0 ||
		     (top > 1 && (nonzero & ((1u << (top - 1)) - 1)) != 0);
	m += half & (below | (m & 1u));
	if (m >> 24) { /* rounded up to 2^24 */
		m >>= 1;
		p++;
	}
	/* value = m * 2^(p - 23 - 149), m in [2^23, 2^24): exponent field
	 * p - 22, an infinity from 255 on. */
	int exponent = p - 22;
	if (exponent >= 255)
		return float_bits(sign | 0x7f800000u);
	return float_bits(sign | (uint32_t)exponent << 23 |
			  (uint32_t)(m & 0x7fffffu));
}

/* Sum i rounded by round_one, from planes lo to hi. */
static float round_exactly(const adg_exact *sum, size_t i, int lo, int hi)
{
	int64_t w[DIGITS];
	for (int d = lo; d <= hi; d++)
		w[d] = plane_const(sum, d)[i];
	return round_one(w, lo, hi);
}

/* 2^e, for e within a normal double's exponents. */
static double power_of_two(int e)
{
	uint64_t bits = (uint64_t)(e + 1023) << 52;
	double x;
	memcpy(&x, &bits, sizeof x);
	return x;
}

/* Whether the floating-point environment rounds to nearest and keeps
 * subnormal floats, as round_fast assumes: a trainer may have called
 * fesetround, or been linked with -ffast-math's flush to zero. Each kind
 * of operation round_fast rounds with is asked (an emulator, valgrind's,
 * may honour the mode in some and not others): a double addition, an
 * integer's conversion to double and a double's to float, each a quarter
 * of an ulp above a value and three quarters (or at a tie) so that every
 * other mode shows. Volatile, so that the compiler, which assumes the
 * default, folds nothing. */
static bool default_float_env(void)
{
	volatile double one = 1.0, quarter_ulp = 0x1p-54,
			three_quarters_ulp = 0x1.8p-53,
			float_quarter = 1.0 + 0x1p-25,
			float_three_quarters = 1.0 + 0x1.8p-24, tiny = 0x1p-149;
	/* Ties of int64 to double: to even, 2^53 and 2^53 + 4. */
	volatile int64_t tie_down = (INT64_C(1) << 53) + 1,
			 tie_up = (INT64_C(1) << 53) + 3;
	return one + quarter_ulp == one && one + three_quarters_ulp != one &&
	       (double)tie_down == 0x1p53 && (double)tie_up == 0x1p53 + 4 &&
	       (float)float_quarter == 1.0f &&
	       (float)float_three_quarters != 1.0f && (float)tiny != 0.0f;
}

/* Sums per round_fast pass: its doubles stay in L1. */
#define FAST_CHUNK 128

/* Rounds sums [first, first + count), count <= FAST_CHUNK, through
 * doubles: v, the words' values summed, and s, their magnitudes summed.
 * Each word's conversion and each addition errs by at most 2^-53 of what
 * it makes, so v is within 18 * 2^-53 * s < 2^-48 * s of the sum (s, not
 * |v|: words of opposite signs, a carry not yet made, may cancel). Where
 * v - s * 2^-47 and v + s * 2^-47 round to the same float, so does the
 * sum, as rounding is monotonic; the margin also covers those two
 * subtractions' own errors. Else (a tie, or a sum within 2^-47 of one, or
 * of 0) the sum is rounded exactly. Both ways give the same bits; this
 * one costs a few ns a sum instead of 10 to 20. */
static void round_fast(const adg_exact *sum, uint32_t mask, size_t first,
		       float *out, size_t count)
{
	double v[FAST_CHUNK] = {0}, s[FAST_CHUNK] = {0};
	for (int d = 0; d < DIGITS; d++) {
		if (!(mask >> d & 1u))
			continue;
		const int64_t *w = plane_const(sum, d) + first;
		double unit = power_of_two(d * DIGIT_BITS - 149);
		for (size_t i = 0; i < count; i++) {
			double t = (double)w[i] * unit;
			v[i] += t;
			s[i] += __builtin_fabs(t);
		}
	}
	int lo = __builtin_ctz(mask), hi = 31 - __builtin_clz(mask);
	for (size_t i = 0; i < count; i++) {
		double margin = s[i] * 0x1p-47;
		float below = (float)(v[i] - margin),
		      above = (float)(v[i] + margin);
		uint32_t below_bits, above_bits;
		memcpy(&below_bits, &below, sizeof below_bits);
		memcpy(&above_bits, &above, sizeof above_bits);
		/* Bits, not values: -0 and +0 differ, and a sum of 0 is +0. */
		if (below_bits == above_bits) {
			out[i] = below;
			continue;
		}
		out[i] = round_exactly(sum, first + i, lo, hi);
	}
}

int adg_exact_round(const adg_exact *sum, size_t first, float *out,
		    size_t count)
{
	int rc = check_span(sum, out, "out", first, count, __func__);
	if (rc != 0)
		return rc;
	uint32_t mask = planes_of(sum);
	if (mask == 0) {
		memset(out, 0, count * sizeof *out); /* +0 */
		return 0;
	}
	if (default_float_env()) {
		for (size_t done = 0; done < count; done += FAST_CHUNK) {
			size_t n = count - done < FAST_CHUNK ? count - done
							     : FAST_CHUNK;
			round_fast(sum, mask, first + done, out + done, n);
		}
		return 0;
	}
	int lo = __builtin_ctz(mask), hi = 31 - __builtin_clz(mask);
	for (size_t i = 0; i < count; i++)
		out[i] = round_exactly(sum, first + i, lo, hi);
	return 0;
}
