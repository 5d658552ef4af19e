/*
 * The differential fuzzer's core: decodes bytes into a sequence of libadg
 * operations, runs each on a fresh registry and on the reference model
 * (tests/model/), and compares them after every operation. Shared by the
 * libFuzzer target (fuzz_target.c) and the corpus replay test
 * (tests/test_replay.c).
 *
 * Input format: a sequence of operations, each an opcode byte followed by
 * its argument bytes; an operation cut short by the end of the input is
 * not run. The opcode byte selects the kind by its value modulo 16:
 *
 *   0-2    leaf      v        a leaf of value 2v+1 (odd: products of odd
 *                             numbers never wrap to 0)
 *   3-6    op        p i...   a node on 1 + p%3 parents, the handles at
 *                             indices i (each taken modulo the handle
 *                             count, repeats allowed); f = p/3: its step
 *                             fails if f%8 == 7, and takes ownership of its
 *                             gradient if (f/8)%2 == 1
 *   7      ref       i        a second handle to handle i
 *   8-10   drop      i        drops handle i
 *   11     backward  i s      backward from handle i with seed 2s+1
 *   12     backward-hook i s  the same with adg_backward_with and a ready
 *                             hook, for leaves only if s%2 == 1; the hook
 *                             takes the gradient of id if r = (s/2)%4 is
 *                             3, or 1 and id is even, or 2 and id%3 == 0
 *   13     stats              compares adg_stats
 *   14     graph     i        compares handle i's graph id
 *   15     backward-newest    backward from the newest handle, seed 1
 *
 * Handles live in an array; a new handle goes at the end, a dropped one is
 * replaced by the last. An operation that would need a handle when there is
 * none, or a new handle when there are ADG_FUZZ_MAX_HANDLES, is skipped
 * (its bytes still read). At most ADG_FUZZ_MAX_OPS operations are decoded;
 * then every handle is dropped and the registry freed.
 */
#ifndef ADG_FUZZ_DRIVER_H
#define ADG_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#define ADG_FUZZ_MAX_HANDLES 64
#define ADG_FUZZ_MAX_OPS     512

/* Opcodes, one per kind (the first value of each range above). */
enum adg_fuzz_opcode {
	ADG_FUZZ_LEAF = 0,
	ADG_FUZZ_OP = 3,
	ADG_FUZZ_REF = 7,
	ADG_FUZZ_DROP = 8,
	ADG_FUZZ_BACKWARD = 11,
	ADG_FUZZ_BACKWARD_HOOK = 12,
	ADG_FUZZ_STATS = 13,
	ADG_FUZZ_GRAPH = 14,
	ADG_FUZZ_BACKWARD_NEWEST = 15,
};

/* What inputs exercised, summed over runs: lets the replay test check that
 * the corpus covers every kind of operation and outcome. One X(name) per
 * counter, so that the struct, the sum and the report cannot disagree. */
#define ADG_FUZZ_COVERAGE(X)                                                   \
	X(ops_run)		/* operations decoded and not skipped */       \
	X(leaves)		/* adg_leaf */                                 \
	X(nodes)		/* adg_op */                                   \
	X(refs)			/* adg_node_ref */                             \
	X(drops)		/* adg_node_unref, the final ones included */  \
	X(stats)		/* stats operations */                         \
	X(graph_queries)	/* graph operations */                         \
	X(backward_leaf)	/* root a leaf */                              \
	X(backward_ok)		/* root a node, success */                     \
	X(backward_consumed)	/* ADG_ECONSUMED */                            \
	X(backward_unavailable) /* ADG_EUNAVAILABLE */                         \
	X(backward_failed)	/* a step failed */                            \
	X(backward_hook)	/* with a ready hook (adg_backward_with) */    \
	X(hook_takes)		/* gradients the hook took */                  \
	X(failing_steps)	/* nodes whose step fails */                   \
	X(grads_taken)		/* steps that took their gradient */           \
	X(merges)		/* graphs absorbed into another */             \
	X(cascades)		/* drops or backwards that freed 2+ nodes */

struct adg_fuzz_coverage {
#define ADG_FUZZ_FIELD(name) uint64_t name;
	ADG_FUZZ_COVERAGE(ADG_FUZZ_FIELD)
#undef ADG_FUZZ_FIELD
};

/* Runs one input on a fresh registry; adds to *cov unless it is NULL.
 * Returns the number of operations decoded. On any difference between
 * libadg and the model, or a leak, prints what differed to stderr and
 * aborts. Set ADG_FUZZ_TRACE=1 in the environment to print each operation
 * as it runs. */
size_t adg_fuzz_run(const uint8_t *data, size_t size,
		    struct adg_fuzz_coverage *cov);

#endif
