/*
 * The differential fuzzer's core: decodes bytes into a sequence of libadg
 * operations, runs each on a fresh registry and on the reference model
 * (tests/model/), and compares them after every operation. Shared by the
 * libFuzzer target (fuzz_target.c) and the corpus replay test
 * (tests/test_replay.c).
 *
 * Input format (documented here only; ops.def holds the codes): a header
 * byte, then a sequence of operations. The header chooses the registry's
 * checkpointing strategy: ADG_CHECKPOINT_BALANCED if its bit 0 is set,
 * ADG_CHECKPOINT_NONE otherwise (its other bits are ignored). Each
 * operation is an opcode byte followed by its argument bytes; one cut
 * short by the end of the input is not run. The opcode byte selects the
 * kind by its value modulo ADG_FUZZ_OPCODES (20); the rest of its value is
 * ignored:
 *
 *   0-2    leaf      v        a leaf of value 2v+1 (odd: products of odd
 *                             numbers never wrap to 0)
 *   3-6    op        p i...   a node on 1 + p%3 parents, the handles at
 *                             indices i (each taken modulo the handle
 *                             count, repeats allowed); f = p/3: its step
 *                             fails if f%8 == 7, and takes ownership of its
 *                             gradient if (f/8)%2 == 1; if (f/16)%2 == 1
 *                             the first index's handle moves into the
 *                             node (adg_op_moving), a drop to the model
 *   7      ref       i        a second handle to handle i
 *   8-10   drop      i        drops handle i
 *   11     backward  i s x    backward from handle i with seed 2s+1, run
 *                             as x says (below)
 *   12     backward-hook i s x  the same with adg_backward_with and a
 *                             ready hook, for leaves only if s%2 == 1; the
 *                             hook takes the gradient of id if r =
 *                             (s/2)%4 is 3, or 1 and id is even, or 2 and
 *                             id%3 == 0
 *   13     stats              compares adg_registry_stats
 *   14     graph     i        compares handle i's graph id
 *   15     backward-newest x  backward from the newest handle, seed 1
 *   16-19  op-with   p o i... the same as op with adg_op_with: o says what
 *                             it offers and asks for (below); r = f/16 how
 *                             its recompute callback ends: it fails with
 *                             its own code if r == 1, gives no output if
 *                             2, returns a positive value if 3, sets an
 *                             output and then fails with its own code if
 *                             4 (libadg frees that output), and builds the
 *                             output otherwise
 *
 * The options of op-with, from the bits of o:
 *
 *   0-1    its output: none (0), the value (1), the value and a recompute
 *          callback (2), or a recompute callback alone (3)
 *   2      memory-bound
 *   3      its step asks for its own output (want_self)
 *   4-6    its step asks for the output of parent slot k % n for each bit
 *          k set (n parents: repeats when n < 3)
 *   7      its step never calls adg_output_get for what it asked
 *
 * How a backward runs its steps (backward, backward-hook and
 * backward-newest alike) is W, and whether it is retained R, both from its
 * last argument byte x: W = x % ADG_FUZZ_EXEC_MODES (7), R =
 * (x / ADG_FUZZ_EXEC_MODES) % 2, and the rest of x is ignored. So every W
 * comes consuming (R 0) and retained (R 1, adg_backward_options.retain),
 * each at x = W + 7R. W 0 is no executor: with R 0 the backward as before
 * there was a W or an R, adg_backward (adg_backward_with without an
 * executor for backward-hook), and with R 1 adg_backward_with without an
 * executor. Any other W runs adg_backward_with with an executor
 * (adg_backward_options.executor):
 *
 *   1      one of no workers (n_workers 0): the scheduler of an executor
 *          on the calling thread alone; its submit must not be called
 *   2-4    libadg's pool of W - 1 threads (adg_pool_new, adg_pool_executor),
 *          started once per process and kept
 *   5      one of 2 workers whose submit only queues: the driver runs the
 *          functions after the backward returned, when they must return at
 *          once without calling the driver; libadg, none of them having
 *          run, may not submit more than 2
 *   6      one of 3 workers whose submit always fails
 *
 * With an executor the steps may run in any order in which each comes
 * after its node's children's, and at once; the driver then compares with
 * what the model's sequential backward gives, not with each step as it
 * runs (tests/model/model.h): the same result, gradients, hook calls (one
 * per id, each after the steps of the id's children), releases and, when
 * the backward succeeds, the same outputs freed and recomputed. When a step
 * fails, the result is still the first failure in tape order, and every
 * step before it on the tape has run; steps after it may have run too, if
 * they had started, and their rebuilds are the only counts allowed to
 * differ. Each step also checks, in every mode, that adg_step_give
 * refuses a slot out of range, and once more the first slot when every
 * slot is given, with ADG_EINVAL.
 *
 * A retained backward (R 1) runs the steps a consuming one would, in the
 * same order and with the same gradients, and takes none: each step sees
 * call->retained nonzero (zero in a consuming backward), none is released,
 * no node leaves its graph, and no output is freed; what it rebuilt stays
 * held for the backward passes after it, which run the same steps again
 * (tests/model/model.h). Reaching a consumed step it fails as a consuming
 * one does, and when a step fails every step stays registered. With an
 * executor and a failing step, the outputs that late steps rebuilt stay
 * held too.
 *
 * Options that libadg must refuse (asking for a leaf's output, or for that
 * of a parent that offers none, a recompute callback with such a parent
 * that is not a leaf, want_self without an output) are expected to fail
 * with ADG_EINVAL; nothing is made, and the handles stay as they were.
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
/* The values of a backward's W (above): x's modulus. */
#define ADG_FUZZ_EXEC_MODES 7

/* The kinds of operation, each named by the first code of its range
 * (ops.def). */
enum adg_fuzz_op {
#define OP(name, first, count, args, text) ADG_FUZZ_##name = (first),
#include "ops.def"
#undef OP
};

/* The codes implied by the counts alone: each range starts where the one
 * before ends. ADG_FUZZ_OPCODES, the modulus, is their sum. */
enum adg_fuzz_code {
#define OP(name, first, count, args, text)                                     \
	ADG_FUZZ_FIRST_##name,                                                 \
		ADG_FUZZ_LAST_##name = ADG_FUZZ_FIRST_##name + (count)-1,
#include "ops.def"
#undef OP
	ADG_FUZZ_OPCODES
};

/* So a FIRST in ops.def that leaves a gap or overlaps does not compile. */
#define OP(name, first, count, args, text)                                     \
	_Static_assert((count) >= 1 && (first) == ADG_FUZZ_FIRST_##name,       \
		       "ops.def: " #name                                       \
		       " must start where the previous ends");
#include "ops.def"
#undef OP
_Static_assert(ADG_FUZZ_OPCODES <= 256, "ops.def: more codes than a byte");

/* What inputs exercised, summed over runs: lets the replay test check that
 * the corpus covers every kind of operation and outcome. One X(name) per
 * counter, so that the struct, the sum and the report cannot disagree. */
#define ADG_FUZZ_COVERAGE(X)                                                   \
	X(ops_run)		/* operations decoded and not skipped */       \
	X(leaves)		/* adg_leaf */                                 \
	X(nodes)		/* adg_op */                                   \
	X(moves)		/* adg_op_moving: a handle moved in */         \
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
	X(cascades)		/* drops or backwards that freed 2+ nodes */   \
	X(balanced)		/* inputs run with ADG_CHECKPOINT_BALANCED */  \
	X(ops_with)		/* adg_op_with, success */                     \
	X(ops_with_refused)	/* adg_op_with, ADG_EINVAL */                  \
	X(asks_consumed)	/* adg_op_with needing a consumed parent */    \
	X(dropped_at_once)	/* values the balanced strategy dropped */     \
	X(freed_at_take)	/* outputs no step of a backward needed */     \
	X(outputs_got)		/* adg_output_get, success */                  \
	X(recomputes)		/* recompute callbacks run */                  \
	X(recompute_failures)	/* adg_output_get failed by a recompute */     \
	X(gets_skipped)		/* steps that asked, then got nothing */       \
	X(freed_after_failure)	/* outputs a failed backward freed */          \
	X(freed_unrun)		/* outputs freed with nodes dropped unrun */   \
	X(exec_caller)		/* backwards with no workers (W 1) */          \
	X(exec_pool)		/* backwards on libadg's pool (W 2-4) */       \
	X(exec_deferred)	/* backwards with a queueing submit (W 5) */   \
	X(exec_refusing)	/* backwards with a failing submit (W 6) */    \
	X(exec_failed)		/* with an executor, a step failed */          \
	X(exec_hook)		/* with an executor and a ready hook */        \
	X(retained_ok)		/* retained, root a node, success */           \
	X(retained_failed)	/* retained, a step failed */                  \
	X(retained_refused)	/* retained, ECONSUMED or EUNAVAILABLE */      \
	X(retained_exec)	/* retained with an executor */                \
	X(retained_kept)	/* outputs it rebuilt, kept after it */        \
	X(steps_rerun)		/* steps run again after a retained one */     \
	X(rerun_consumed)	/* the same in a consuming one, success */

struct adg_fuzz_coverage {
#define ADG_FUZZ_FIELD(name) uint64_t name;
	ADG_FUZZ_COVERAGE(ADG_FUZZ_FIELD)
#undef ADG_FUZZ_FIELD
	/* Backwards from a node that reached their steps (not refused), by
	 * [W][R]: so that the replay can check that the corpus runs every
	 * combination x can say. */
	uint64_t by_mode[ADG_FUZZ_EXEC_MODES][2];
};

/* Runs one input on a fresh registry; adds to *cov unless it is NULL.
 * Returns the number of operations decoded. On any difference between
 * libadg and the model, or a leak, prints what differed to stderr and
 * aborts. Set ADG_FUZZ_TRACE=1 in the environment to print each operation
 * as it runs. */
size_t adg_fuzz_run(const uint8_t *data, size_t size,
		    struct adg_fuzz_coverage *cov);

#endif
