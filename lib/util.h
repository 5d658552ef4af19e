/*
 * What any file of lib/ may use: the core (internal.h, which includes this)
 * and its annexes, which stand on the public API (adg.h) and this header
 * alone (CONTRIBUTING.md). Nothing here knows a node, a graph or a
 * registry.
 */
#ifndef ADG_UTIL_H
#define ADG_UTIL_H

#include "adg.h"

#include <ck_cc.h>
#include <ck_md.h>
#include <stddef.h>
#include <stdint.h>

#define ADG_CACHELINE	CK_MD_CACHELINE
#define adg_likely(x)	CK_CC_LIKELY(x)
#define adg_unlikely(x) CK_CC_UNLIKELY(x)

/* Alignment is rounded up by masking (adg_round_up), and the layout checks
 * divide by it: it must be a power of two. */
#if ADG_CACHELINE <= 0 || (ADG_CACHELINE & (ADG_CACHELINE - 1)) != 0
#error "ADG_CACHELINE must be a power of two"
#endif

/* n rounded up to a multiple of align, a power of two. */
static inline uintptr_t adg_round_up(uintptr_t n, uintptr_t align)
{
	return (n + align - 1) & ~(align - 1);
}

/*
 * ADG_ASSERT states an invariant (docs/concurrency.md numbers them: I1,
 * I2, ...) and checks it in builds with ADG_ASSERTIONS: every build but
 * release (meson option `assertions`), so the tests, the stress tests and
 * the fuzzer run with them. A failure is a bug in libadg, not bad input:
 * it says where and aborts, as liburcu's debug assertions do. In release
 * builds the condition is compiled but never evaluated.
 */
#ifdef ADG_ASSERTIONS
__attribute__((noreturn, cold)) void
adg_assert_fail(const char *cond, const char *file, int line);
#define ADG_ASSERT(cond)                                                       \
	(adg_likely(cond) ? (void)0                                            \
			  : adg_assert_fail(#cond, __FILE__, __LINE__))
#else
#define ADG_ASSERT(cond) ((void)sizeof(!(cond)))
#endif

/* Maps a callback's result to the library's convention. */
static inline int adg_callback_result(int rc)
{
	return rc > 0 ? ADG_ECALLBACK : rc;
}

/* Fibonacci hashing of a node id: the product with 2^64 / phi, shifted
 * right by shift. Its high bits spread consecutive ids (a thread's batch)
 * evenly: a table of 2^k entries takes the top k (shift 64 - k). */
static inline uint64_t adg_id_hash(uint64_t id, unsigned int shift)
{
	return (id * UINT64_C(0x9e3779b97f4a7c15)) >> shift;
}

/* malloc and free, as the allocator of a registry, a reducer or a pool
 * whose options give none (util.c). */
extern const adg_allocator adg_default_allocator;

/*
 * The size rule (include/adg.h, "ABI") of a struct the caller allocates,
 * whose first member is its size_t size (abi.c). own is libadg's sizeof,
 * first the struct's first published size: the smallest a caller may give.
 * When a field is added to a struct, its first size stays what it was.
 *
 * adg_abi_check: ADG_EINVAL unless first <= size and every byte past own
 * is zero. adg_abi_read: checks, then copies the caller's options into
 * local (own bytes), zero past the caller's size. adg_abi_write: fills an
 * output the check passed with local, min(size, own) bytes, its size kept.
 */
int adg_abi_check(const void *given, size_t own, size_t first);
int adg_abi_read(void *local, size_t own, size_t first, const void *given);
void adg_abi_write(void *given, const void *local, size_t own);

/* The first published sizes (libadg.so.1, 0.2.0): today's. */
#define ADG_ABI_FIRST_REGISTRY_OPTIONS sizeof(adg_registry_options)
#define ADG_ABI_FIRST_OP_OPTIONS       sizeof(adg_op_options)
#define ADG_ABI_FIRST_BACKWARD_OPTIONS sizeof(adg_backward_options)
#define ADG_ABI_FIRST_DOT_OPTIONS      sizeof(adg_dot_options)
#define ADG_ABI_FIRST_REDUCER_OPTIONS  sizeof(adg_reducer_options)
#define ADG_ABI_FIRST_POOL_OPTIONS     sizeof(adg_pool_options)
#define ADG_ABI_FIRST_STATS	       sizeof(struct adg_stats)
#define ADG_ABI_FIRST_FAILURE	       sizeof(adg_failure)

/* Reads the caller's options *given into the local copy *local, by the
 * size rule; first names the struct's first size (ADG_ABI_FIRST_...). */
#define ADG_ABI_READ(local, given, first)                                      \
	adg_abi_read((local), sizeof *(local), (first), (given))

#endif /* ADG_UTIL_H */
