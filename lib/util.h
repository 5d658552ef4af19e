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
#include <inttypes.h>
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

/*
 * Reasons (adg_errmsg, error.c): each failing public call writes the
 * calling thread's reason as it returns its code, on the error path only:
 * `return ADG_FAIL(ADG_EINVAL, "slot %zu out of range", slot);` returns
 * ADG_EINVAL and reads "<function>: slot 5 out of range". A helper that
 * fails for a public function names that function (adg_fail), so that the
 * reason names what the caller called. Nothing on a success path writes
 * or reads them.
 */
__attribute__((cold, format(printf, 3, 4))) int
adg_fail(int code, const char *func, const char *fmt, ...);
#define ADG_FAIL(code, ...) adg_fail((code), __func__, __VA_ARGS__)

/* adg_fail for a code that a callback passed on: when the thread wrote a
 * reason with that same code since its count read `since`
 * (adg_errmsg_serial: a libadg call inside the callback failed, and the
 * callback returned its code), that reason follows this one after ": ",
 * so that the inner reason is kept and the outer adds its context. */
__attribute__((cold, format(printf, 4, 5))) int
adg_fail_over(int code, const char *func, uint64_t since, const char *fmt, ...);

/* How many reasons the calling thread has written so far: read before a
 * callback runs, for adg_fail_over after it. One TLS load. */
uint64_t adg_errmsg_serial(void);

/* Whether the thread wrote a reason for code since its count read since:
 * the reason adg_errmsg holds is then the inner failure's. */
int adg_errmsg_fresh(int code, uint64_t since);

/* text, which snprintf wrote into size bytes, without the incomplete
 * UTF-8 character a cut at its end may have left (a long step name in a
 * reason): every reason is whole UTF-8 where its names are. */
void adg_errmsg_clip(char *text, size_t size);

/* code as a reason shows it: "ADG_EVALUE (-12)" for libadg's codes, the
 * number alone for a callback's own ("-1003"). Into buf, returned. */
const char *adg_code_text(int code, char buf[static 32]);

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

/* The rule every options struct's allocator keeps: both callbacks or
 * neither. 0, or ADG_EINVAL with func's reason naming the one set. */
int adg_allocator_check(const char *func, const adg_allocator *a);

/*
 * The size rule (include/adg.h, "ABI") of a struct the caller allocates,
 * whose first member is its size_t size (abi.c). own is libadg's sizeof,
 * first the struct's first published size: the smallest a caller may give.
 * When a field is added to a struct, its first size stays what it was.
 *
 * adg_abi_check: ADG_EINVAL unless first <= size and every byte past own
 * is zero, with func's reason naming the argument what ("options").
 * adg_abi_read: checks, then copies the caller's options into local (own
 * bytes), zero past the caller's size. adg_abi_write: fills an output the
 * check passed with local, min(size, own) bytes, its size kept.
 */
int adg_abi_check(const char *func, const char *what, const void *given,
		  size_t own, size_t first);
int adg_abi_read(const char *func, const char *what, void *local, size_t own,
		 size_t first, const void *given);
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
#define ADG_ABI_FIRST_REDUCER_FAILURE  sizeof(adg_reducer_failure)

/* Reads the caller's options *given into the local copy *local, by the
 * size rule; first names the struct's first size (ADG_ABI_FIRST_...), func
 * the public function and what the argument, for the reason. */
#define ADG_ABI_READ(func, what, local, given, first)                          \
	adg_abi_read((func), (what), (local), sizeof *(local), (first), (given))

/*
 * ThreadSanitizer sees neither liburcu's publish and dereference nor its
 * grace periods. In a TSan build these tell it what RCU guarantees: what was
 * written to an object before rcu_assign_pointer happens before what a
 * reader does after rcu_dereference. (libadg's own read side and grace
 * periods, readside.c, are C11 atomics that TSan sees, and need none.)
 * Elsewhere they compile to nothing.
 */
#if defined(__SANITIZE_THREAD__)
#define ADG_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ADG_TSAN 1
#endif
#endif
#ifdef ADG_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define adg_tsan_acquire(p) __tsan_acquire((void *)(p))
#define adg_tsan_release(p) __tsan_release((void *)(p))
#else
#define adg_tsan_acquire(p) ((void)(p))
#define adg_tsan_release(p) ((void)(p))
#endif

#endif /* ADG_UTIL_H */
