/*
 * libadg's exact sums: arrays of float sums that give the same bits
 * whatever the order of their terms. An annex (lib/exact.c): built on
 * nothing but the C library. Part of <adg.h>, which includes it where its
 * section stands; including this header alone includes <adg.h>.
 */
#ifndef ADG_EXACT_H
#define ADG_EXACT_H

#include "../adg.h" /* beside this one, whatever the include path */

#ifdef __cplusplus
extern "C" {
#endif

/* n sums of float terms, each kept exactly: a fixed-point integer in
 * nine 64-bit words (72 bytes a sum) counting units of 2^-149, the
 * smallest subnormal, exact for any number of terms while the sum stays
 * below 2^160 in magnitude (FLT_MAX is about 2^128). Integer addition is
 * associative, so a sum's bits depend on the terms alone: not on their order,
 * on how they were grouped into accumulators that were then merged, nor on
 * which thread added which. adg_exact_round rounds each sum once, to nearest
 * (ties to even).
 *
 * For a trainer whose contributions cannot be fixed work units of the
 * reducer (adg/reducer.h): each thread adds the float gradient of each
 * piece of work it takes (a sample, a graph) into an accumulator of its
 * own, in any number and order, and the threads' accumulators are merged
 * (a reducer's add and add_slice, with no units) and rounded. The weights
 * are then the same at every thread count, as long as each piece's float
 * gradient is computed alone (a backward each): the terms must not
 * depend on how pieces were grouped. The price: 72 bytes a sum, and on
 * the machine of docs/bench.md ("Exact sums") about 3.4 ns a term, 0.3
 * to 0.5 ns a sum to merge and 3 to 9 ns to round, against under 0.1 ns
 * for a float add.
 *
 * Threads: one thread at a time adds to or clears an accumulator.
 * adg_exact_merge into disjoint ranges of one accumulator, and
 * adg_exact_round of it, may run at once on several threads, while no
 * thread adds to or clears the accumulators they read. */

typedef struct adg_exact adg_exact;

/* A new accumulator of n sums, each 0, in *out.
 * Errors: ADG_EINVAL (NULL out, n 0, or n so large that its size
 * overflows), ADG_ENOMEM. */
ADG_API int adg_exact_new(size_t n, adg_exact **out);

/* Frees sum. NULL is a no-op that returns 0. */
ADG_API int adg_exact_free(adg_exact *sum);

/* Fills *n with the number of sums. Errors: ADG_EINVAL (NULL argument). */
ADG_API int adg_exact_length(const adg_exact *sum, size_t *n);

/* Sets every sum to 0. Errors: ADG_EINVAL (NULL). */
ADG_API int adg_exact_clear(adg_exact *sum);

/* Adds values[i] to sum first + i, for i < count, exactly. -0 adds as 0.
 * Errors: ADG_EINVAL (NULL sum, NULL values with count > 0, a range past
 * the sums), ADG_EVALUE (a value is infinite or NaN: nothing is added,
 * and the reason names the first such index). */
ADG_API int adg_exact_add(adg_exact *sum, size_t first, const float *values,
			  size_t count);

/* Adds other's sums first to first + count - 1 to the same sums of sum,
 * exactly; other is only read. Errors: ADG_EINVAL (NULL, sum and other the
 * same accumulator, lengths that differ, a range past the sums). */
ADG_API int adg_exact_merge(adg_exact *sum, const adg_exact *other,
			    size_t first, size_t count);

/* Writes sums first to first + count - 1, each rounded once to the
 * nearest float (ties to even), to out[0] to out[count - 1]: +0 for a sum
 * of 0, an infinity for one beyond FLT_MAX's rounding, as IEEE addition
 * would give, whatever the caller's rounding mode or flush to zero.
 * Errors: ADG_EINVAL (NULL, a range past the sums). */
ADG_API int adg_exact_round(const adg_exact *sum, size_t first, float *out,
			    size_t count);

#ifdef __cplusplus
}
#endif

#endif /* ADG_EXACT_H */
