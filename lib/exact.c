/*
 * Exact sums of floats (adg/exact.h): each sum an integer count of units
 * of 2^-149 (the smallest subnormal), in DIGITS signed 64-bit words of
 * base 2^32. A float m * 2^e (m < 2^24) is m shifted to its place: at
 * most 55 bits, so it lands in two adjacent words, and adding it is two
 * integer adds. Carries are deferred: a word only moves by less than 2^32
 * a term, and the words are carried (normalized) before any could
 * overflow. An annex: it stands on nothing but the C library and util.h.
 */
#include "util.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Words 0 to 7 take the terms (a float's top bit is bit 276 of the
 * count); word 8 takes the carries out of word 7, so the sum's magnitude
 * may reach 2^(256 + 62) units, 2^169. */
#define DIGITS	   9
#define DIGIT_BITS 32
#define DIGIT_MASK 0xffffffffu

/* Words 0 to 7 of every sum stay below bound * 2^32 in magnitude: 1 once
 * carried, one more for each term added, the other's bound more for each
 * merge. Up to MAX_BOUND every word is below 2^62, so that a merge of two
 * such accumulators cannot overflow; an add that would pass it carries
 * every sum first, a merge that would carries the sums it merges. */
#ifdef ADG_EXACT_MAX_BOUND
#define MAX_BOUND ((uint64_t)(ADG_EXACT_MAX_BOUND)) /* tests/: carry often */
#else
#define MAX_BOUND (UINT64_C(1) << 30)
#endif

struct adg_exact {
	size_t n;
	/* The bound above, for every sum. Atomic, relaxed: merges into
	 * disjoint ranges of one accumulator run at once and each adds its
	 * other's; it only ever overstates, and each range's words are
	 * ordered after the calls that raised it for them by whatever
	 * ordered those calls (adg/exact.h's thread rules). */
	uint64_t bound;
	int64_t words[]; /* n * DIGITS: sum i at words[i * DIGITS] */
};

static float float_bits(uint32_t bits)
{
	float f;
	memcpy(&f, &bits, sizeof f);
	return f;
}

static int64_t *sum_words(adg_exact *sum, size_t i)
{
	return sum->words + i * DIGITS;
}

static const int64_t *sum_words_const(const adg_exact *sum, size_t i)
{
	return sum->words + i * DIGITS;
}

/* Carries words 0 to 7 of one sum into the next, leaving each in
 * [0, 2^32); the top word takes what is left, sign included. */
static void carry(int64_t w[DIGITS])
{
	for (int d = 0; d < DIGITS - 1; d++) {
		/* An arithmetic shift: floor division, so a negative word
		 * borrows from the next. */
		int64_t c = w[d] >> DIGIT_BITS;
		w[d] -= (int64_t)((uint64_t)c << DIGIT_BITS);
		w[d + 1] += c;
	}
}

static void normalize(adg_exact *sum)
{
	for (size_t i = 0; i < sum->n; i++)
		carry(sum_words(sum, i));
	__atomic_store_n(&sum->bound, 1, __ATOMIC_RELAXED);
}

/* first + count within n, without overflow. */
static bool in_range(size_t n, size_t first, size_t count)
{
	return first <= n && count <= n - first;
}

int adg_exact_new(size_t n, adg_exact **out)
{
	if (out == NULL)
		return ADG_FAIL(ADG_EINVAL, "out is NULL");
	*out = NULL;
	if (n == 0)
		return ADG_FAIL(ADG_EINVAL, "no sums (n is 0)");
	size_t per_sum = DIGITS * sizeof(int64_t);
	if (n > (SIZE_MAX - sizeof(adg_exact)) / per_sum)
		return ADG_FAIL(ADG_EINVAL, "%zu sums overflow a size", n);
	adg_exact *sum = calloc(1, sizeof *sum + n * per_sum);
	if (sum == NULL)
		return ADG_FAIL(ADG_ENOMEM, "no memory for %zu sums", n);
	sum->n = n;
	__atomic_store_n(&sum->bound, 1, __ATOMIC_RELAXED);
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
	memset(sum->words, 0, sum->n * DIGITS * sizeof(int64_t));
	__atomic_store_n(&sum->bound, 1, __ATOMIC_RELAXED);
	return 0;
}

int adg_exact_add(adg_exact *sum, size_t first, const float *values,
		  size_t count)
{
	if (sum == NULL)
		return ADG_FAIL(ADG_EINVAL, "sum is NULL");
	if (values == NULL && count > 0)
		return ADG_FAIL(ADG_EINVAL, "values is NULL");
	if (!in_range(sum->n, first, count))
		return ADG_FAIL(ADG_EINVAL,
				"sums %zu to %zu + %zu past the %zu sums",
				first, first, count, sum->n);
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
		uint64_t placed = m << (shift % DIGIT_BITS); /* < 2^55 */
		int64_t negative = -(int64_t)(bits >> 31);   /* 0 or -1 */
		int64_t low = (int64_t)(placed & DIGIT_MASK);
		int64_t high = (int64_t)(placed >> DIGIT_BITS);
		int64_t *w = sum_words(sum, first + i) + shift / DIGIT_BITS;
		w[0] += (low ^ negative) - negative;
		w[1] += (high ^ negative) - negative;
	}
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
	if (!in_range(sum->n, first, count))
		return ADG_FAIL(ADG_EINVAL,
				"sums %zu to %zu + %zu past the %zu sums",
				first, first, count, sum->n);
	uint64_t bound = __atomic_load_n(&sum->bound, __ATOMIC_RELAXED),
		 other_bound = __atomic_load_n(&other->bound, __ATOMIC_RELAXED);
	int64_t *w = sum_words(sum, first);
	const int64_t *o = sum_words_const(other, first);
	if (bound + other_bound <= MAX_BOUND) {
		/* Every word stays below 2^62: word by word, no carry. */
		__atomic_fetch_add(&sum->bound, other_bound, __ATOMIC_RELAXED);
		for (size_t k = 0; k < count * DIGITS; k++)
			w[k] += o[k];
		return 0;
	}
	/* Each word below 2^62 + 2^62 after the add; carried at once, the
	 * range is left normalized, within the bound sum already has. */
	for (size_t i = 0; i < count; i++, w += DIGITS, o += DIGITS) {
		for (int d = 0; d < DIGITS; d++)
			w[d] += o[d];
		carry(w);
	}
	return 0;
}

/* The float nearest sum i, ties to even. */
static float round_one(const int64_t words[DIGITS])
{
	int64_t w[DIGITS];
	memcpy(w, words, sizeof w);
	carry(w);
	/* Carried, words 0 to 7 are digits and the top word holds the sign:
	 * a negative sum is negated and carried again, so that w is its
	 * magnitude. */
	uint32_t sign = 0;
	if (w[DIGITS - 1] < 0) {
		for (int d = 0; d < DIGITS; d++)
			w[d] = -w[d];
		carry(w);
		sign = 0x80000000u;
	}
	/* A top word of 2^32 or more is 2^288 units, 2^139: no float. */
	if ((uint64_t)w[DIGITS - 1] >> DIGIT_BITS)
		return float_bits(sign | 0x7f800000u);
	int top = DIGITS - 1;
	while (top > 0 && w[top] == 0)
		top--;
	if (w[top] == 0)
		return 0.0f; /* +0, whatever the terms' signs */
	/* p: the magnitude's top bit. */
	int p = top * DIGIT_BITS + 31 - __builtin_clz((uint32_t)w[top]);
	if (p < 24) {
		/* Under 2^24 units: the count itself is the float's bits (a
		 * subnormal below 2^23, else exponent field 1 and the hidden
		 * bit at 2^23). */
		return float_bits(sign | (uint32_t)w[0]);
	}
	/* The 24 bits from p down, the next (half), and whether any below it
	 * is set (sticky), from a window of the top word and the one below
	 * it: bit j of the window is bit j + 32 * (top - 1) of the count. */
	uint64_t window = (uint64_t)w[top] << DIGIT_BITS;
	if (top > 0)
		window |= (uint64_t)w[top - 1];
	int low = p - 23 - DIGIT_BITS * (top - 1); /* 9 to 40 */
	uint64_t m = window >> low;
	bool half = (window >> (low - 1)) & 1u;
	uint64_t below = window & ((UINT64_C(1) << (low - 1)) - 1);
	for (int d = 0; d < top - 1; d++)
		below |= (uint64_t)w[d];
	if (half && (below != 0 || (m & 1u)))
		m++;
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

int adg_exact_round(const adg_exact *sum, size_t first, float *out,
		    size_t count)
{
	if (sum == NULL)
		return ADG_FAIL(ADG_EINVAL, "sum is NULL");
	if (out == NULL && count > 0)
		return ADG_FAIL(ADG_EINVAL, "out is NULL");
	if (!in_range(sum->n, first, count))
		return ADG_FAIL(ADG_EINVAL,
				"sums %zu to %zu + %zu past the %zu sums",
				first, first, count, sum->n);
	for (size_t i = 0; i < count; i++)
		out[i] = round_one(sum_words_const(sum, first + i));
	return 0;
}
