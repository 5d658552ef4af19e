/*
 * libadg: records the backward graphs of a reverse-mode autodiff engine and
 * runs backward passes over them, for trainers that run many threads at once.
 *
 * The tensor math is the caller's: libadg sees steps (callbacks) and gradient
 * values (opaque pointers). It keeps track of which steps belong together, in
 * which order they run, and when their memory can go.
 *
 * Conventions, for every function below unless its comment says otherwise:
 * - It returns 0 on success or a negative ADG_E* code; adg_strerror() names
 *   the code, and adg_errmsg() says on the same thread what was wrong, in
 *   which function, with which argument. On error nothing has changed and
 *   out-parameters are untouched,
 *   except that pointer out-parameters are set to NULL, and that a gradient
 *   handed over is freed (the table below).
 * - Who owns what, one rule per kind of value. A gradient value is handed
 *   over for good: libadg owns it from the call on and frees it (with the
 *   backward's grad ops) on error, so that a failing caller has nothing to
 *   clean up. The parts of a node are handed over with the node: on error
 *   there is no node, and the caller still owns them.
 *
 *   | value                              | success      | error              |
 *   |------------------------------------|--------------|--------------------|
 *   | seed (adg_backward*)               | libadg       | freed by libadg (1)|
 *   | gradient (adg_step_give,           | libadg       | freed by libadg (2)|
 *   |   adg_step_give_all,               |              |                    |
 *   |   adg_grads_register)              |              |                    |
 *   | a step's user (adg_op, adg_op_with)| libadg (3)   | the caller's       |
 *   | an offered output (adg_op_with)    | libadg       | the caller's       |
 *   | a moved parent's handle            | the node's   | the caller's       |
 *   |   (adg_op_moving, options->moved)  |              |                    |
 *   | a hook's *grad (on_ready)          | the hook's if it sets *grad NULL |
 *   | call->grad in a step               | the step's if it sets it NULL    |
 *   | a value from adg_grads_take*       | the caller's | -                  |
 *   | a reducer's given gradient         | see adg_reducer_give             |
 *
 *   (1) unless the backward has no free to call it with: ops passed
 *   without add or free (the registry's grad_ops are not used then), or
 *   none passed and none on the registry; then the caller's. (2) unless
 *   grads or call is NULL or not libadg's. (3) release runs exactly
 *   once, when the step goes.
 * - It may be called from any thread at any time, concurrently with any other
 *   call; handles may move between threads. Threads need no registration,
 *   and may call libadg at any point of their lives, from a pthread key's
 *   destructor in any round too. After fork, the child (its one thread)
 *   may make and use registries, and use one it inherited, but not what
 *   other threads were using at the fork: a graph one was changing stays
 *   locked, and the parent's pools and reducers have no threads there
 *   (docs/concurrency.md, "Threads' ends, and fork").
 * - It never aborts, prints or leaks on bad input.
 *
 * ABI: what a binary built against one version of this header may assume
 * of a later libadg.so.1 (docs/abi.md says more).
 * - Structs the caller allocates and libadg reads or fills may grow: the
 *   options (adg_registry_options, adg_op_options, adg_backward_options,
 *   adg_dot_options, adg_reducer_options, adg_pool_options) and the
 *   outputs (adg_stats, adg_failure, adg_reducer_failure). Each begins
 *   with size_t size, which the caller sets to the size of its struct:
 *       adg_backward_options o = {.size = sizeof o, .executor = ex};
 *       adg_stats st = {.size = sizeof st};
 *   libadg reads or writes only the first min(size, its own sizeof)
 *   bytes: a field the caller's header lacks reads as zero. A size of 0,
 *   or below the struct's size in 0.2.0, is ADG_EINVAL; a size above
 *   libadg's own (a newer header) is accepted when every byte past
 *   libadg's own is zero (the fields it does not know left unset), else
 *   ADG_EINVAL. A struct only ever grows at its end.
 * - Structs libadg allocates and hands to callbacks (adg_step_call,
 *   adg_recompute_call, adg_graph_node, adg_step_event, adg_reduction)
 *   may grow at their end only, and are never reordered; callers never
 *   allocate them.
 * - Structs of callbacks the caller fills (adg_allocator, adg_grad_ops,
 *   adg_executor, adg_output, adg_step, adg_reducer_ops) are frozen:
 *   changing one is an incompatible change.
 * An incompatible change moves the soname (libadg.so.N); a compatible
 * addition moves the minor version.
 */
#ifndef ADG_H
#define ADG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ADG_BUILDING) && defined(__GNUC__)
#define ADG_API __attribute__((visibility("default")))
#else
#define ADG_API
#endif

/* Marks what is deprecated and will go: a use of it warns, with msg, under
 * GCC and Clang, in C and C++ alike. Empty elsewhere, and in libadg's own
 * build (ADG_BUILDING), which still fills what it marks until it goes. */
#if defined(__GNUC__) && !defined(ADG_BUILDING)
#define ADG_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define ADG_DEPRECATED(msg)
#endif

/* The version of this header; meson's project version, checked at
 * configure time. Compare with adg_version() for the library loaded. */
#define ADG_VERSION_MAJOR 0
#define ADG_VERSION_MINOR 2
#define ADG_VERSION_PATCH 0

/* Error codes: name, value, message (what adg_strerror returns), and what
 * each means. One table, which the enum, adg_strerror and adg_error_name
 * are made from, so that a new code cannot miss its message. Every code is
 * negative; 0 is success. */
#define ADG_ERROR_MAP(X)                                                       \
	X(OK, 0, "success")                                                    \
	/* a NULL or malformed argument */                                     \
	X(EINVAL, -1, "invalid argument")                                      \
	/* the allocator returned NULL */                                      \
	X(ENOMEM, -2, "out of memory")                                         \
	/* a node belongs to another registry */                               \
	X(EFOREIGN, -3, "node belongs to another registry")                    \
	/* the root's step was consumed by a backward */                       \
	X(ECONSUMED, -4, "root's step was consumed by an earlier backward")    \
	/* a step the backward needs was consumed */                           \
	X(EUNAVAILABLE, -5,                                                    \
	  "a step the backward needs was consumed by an earlier backward")     \
	/* no node id is left to hand out */                                   \
	X(ENOIDS, -6, "node ids exhausted")                                    \
	/* no gradient is held for that node id */                             \
	X(ENOTFOUND, -7, "no gradient for that node id")                       \
	/* still in use: a registry with live nodes, a reducer mid-round */    \
	X(EBUSY, -8, "still in use (live nodes, or a round not ended)")        \
	/* a callback returned a positive value */                             \
	X(ECALLBACK, -9, "a callback returned a positive value")               \
	/* out of order: a parameter given twice in a round, say */            \
	X(ESTATE, -10, "call out of order for the object's state")             \
	/* a callback threw an exception (a C++ step, add or hook: adg.hpp     \
	 * rethrows it; C code that runs such callbacks sees this code) */     \
	X(ETHREW, -11, "a callback threw an exception")                        \
	/* a gradient failed the backward's value check (a NaN, say) */        \
	X(EVALUE, -12, "a gradient value failed the value check")

enum adg_error {
#define ADG_ERROR_ENUM_(name, value, message) ADG_##name = value,
	ADG_ERROR_MAP(ADG_ERROR_ENUM_)
#undef ADG_ERROR_ENUM_
};

/* Negative codes at or below this value are never used by libadg: steps and
 * gradient callbacks may return them for their own failures. */
#define ADG_EUSER (-1000)

/* Returns a static, human-readable message for code (never NULL). Codes that
 * libadg does not define, including user codes, read "unknown error".
 * Thread-safe. */
ADG_API const char *adg_strerror(int code);

/* Returns the name of code as a static string, "ADG_EINVAL" for
 * ADG_EINVAL (never NULL); "ADG_UNKNOWN" for codes libadg does not define.
 * Like adg_strerror, it returns no error code. Thread-safe. */
ADG_API const char *adg_error_name(int code);

/* Returns the calling thread's reason for the last error a libadg call
 * returned on this thread: what failed, in which function, and why,
 * naming the argument ("adg_op_with: want_parents[1] (slot 2) names a
 * parent that offers no output"; a callback's code passed on reads
 * "adg_backward: step 'mul' of node 5 returned -1003"). Never NULL: ""
 * before the thread's first failing call. The string is the thread's own
 * (a failure on another thread does not touch it) and stays valid and
 * unchanged until the thread's next failing libadg call, which rewrites
 * it; a successful call never writes it, so the fast paths pay nothing
 * and the reason outlives the calls made after the failure (a cleanup's
 * adg_node_unref, say): read it before the next call that may fail. Where
 * a callback's failure was itself a libadg call's (a step returning
 * adg_step_give's code), the outer reason adds its context before the
 * inner one: "adg_backward: step 'mul' of node 5 returned ADG_EINVAL
 * (-1): adg_step_give: slot 3 out of range (2 parents)". Cut at
 * ADG_ERRMSG_MAX - 1 bytes, between UTF-8 characters. Like adg_strerror,
 * it returns no error code. The functions that return no code
 * (adg_strerror, adg_error_name, adg_version, adg_errmsg) never write it. */
ADG_API const char *adg_errmsg(void);

/* The room adg_errmsg's string has, its NUL included. */
#define ADG_ERRMSG_MAX 512

/* Returns the library's version as "MAJOR.MINOR.PATCH" (static, never
 * NULL): the library that is loaded, which may be newer than this header.
 * Like adg_strerror, it returns no error code. Thread-safe. */
ADG_API const char *adg_version(void);

typedef struct adg_registry adg_registry; /* owns nodes, graphs, locator */
typedef struct adg_node adg_node;	  /* a counted handle to one node */
typedef struct adg_grads adg_grads;	  /* gradients of one backward */

/* ---------------------------------------------------------------- registry */

/* Every allocation libadg makes for a registry: the registry itself, each
 * thread's slice of it, nodes (in slabs of 32 KiB to 1 MiB, each holding
 * many, for nodes of fewer than 8 parents), graphs, checkpointing records,
 * backward scratch and gradient containers. (The executor's jobs, which may
 * outlive the registry, use malloc.) With no allocator given, a thread's
 * node slabs past some 20 MiB are 2 MiB mappings of libadg's own, advised
 * for transparent huge pages (adg_registry_stats counts them); malloc and free
 * passed here keep every slab on the heap. alloc returns NULL on failure, or
 * memory aligned as malloc's is; free receives the size that was asked of
 * alloc. Both may be called from any thread that calls libadg; neither may call
 * into libadg (they may run under libadg's locks). */
typedef struct adg_allocator {
	void *(*alloc)(size_t size, void *ctx);
	void (*free)(void *ptr, size_t size, void *ctx);
	void *ctx;
} adg_allocator;

/* Which forward outputs a registry keeps for the backward (see
 * adg_op_with). */
enum adg_checkpointing {
	/* Every output an op offers is kept until no backward can want it. */
	ADG_CHECKPOINT_NONE = 0,
	/* Outputs of ops marked memory-bound that can recompute themselves
	 * are dropped at once (a backward recomputes them when a step asks);
	 * the others are kept. A dropped value stays the forward's to read
	 * until the same thread's next op or backward on the registry: see
	 * adg_op_with. */
	ADG_CHECKPOINT_BALANCED = 1,
};

/* The largest node id a registry hands out, 2^63 - 1: a node keeps a leaf
 * parent as its id shifted left by one (docs/concurrency.md, "Cost as a
 * graph grows"). Past it, making a node fails with ADG_ENOIDS. */
#define ADG_ID_MAX ((uint64_t)INT64_MAX)

/* Set size (adg.h, "ABI"), zero the rest, then set what you need. */
typedef struct adg_registry_options {
	size_t size; /* sizeof the caller's struct (adg.h, "ABI") */
	/* Both callbacks, or neither (malloc and free). adg_registry_free
	 * gives back all that the registry took, except gradient containers,
	 * which may outlive it: the allocator must outlive every container. */
	adg_allocator allocator;
	/* Largest node id to hand out; 0 means ADG_ID_MAX, as does anything
	 * above it. Ids start at 1 and are handed to threads in batches, so
	 * a thread may see ADG_ENOIDS while another still holds unused ids of
	 * its batch. */
	uint64_t max_node_id;
	/* enum adg_checkpointing; 0 is ADG_CHECKPOINT_NONE. */
	int checkpointing;
	/* The gradient ops a backward uses when it is passed none (NULL ops
	 * in adg_backward and adg_backward_with): the value type's, which
	 * most trainers have one of. Copied. NULL: none. */
	const struct adg_grad_ops *grad_ops;
} adg_registry_options;

/* Creates a registry. options may be NULL for the defaults.
 * The first call of a process (any thread; later calls skip it) sets up
 * libadg's read side, which keeps graph memory from going back to the
 * allocator while a lock-free reader may still touch it: on Linux 4.14 and
 * later it registers the process for private expedited membarrier, so that
 * each graph op's read-side section costs a compiler barrier instead of a
 * full fence, the rare writer that frees graph memory paying with one
 * membarrier call instead. The registration waits in the kernel until
 * every CPU is known to see it (on most kernels a grace period of the
 * kernel's own RCU): some milliseconds, 8 to 30 measured, in a process
 * that already runs several threads. It is paid once per process, here
 * rather than in the first graph op. Without membarrier, readers fence
 * and nothing is registered.
 * Errors: ADG_EINVAL (out NULL, only one allocator callback set, an
 * unknown checkpointing strategy, or grad_ops without add or free),
 * ADG_ENOMEM. */
ADG_API int adg_registry_new(const adg_registry_options *options,
			     adg_registry **out);

/* Frees a registry that has no live node (unref every handle first), and
 * everything it allocated but the gradient containers still held. Once it
 * returns 0 the allocator is no longer used, not even by executor jobs of
 * its backward passes still queued (adg_executor). NULL is a no-op that
 * returns 0. Must not run concurrently with any other call on the same
 * registry, nor inside a step; it waits for one grace period of libadg's
 * read side, so that no lock-free lookup still reads its graphs.
 * Errors: ADG_EBUSY (live nodes remain; nothing is freed). */
ADG_API int adg_registry_free(adg_registry *registry);

/* Fills *out with the registry's allocator (malloc's when it was given
 * none), for what the caller wants on the same memory: a pool
 * (adg_pool_options), its gradient values. Errors: ADG_EINVAL. */
ADG_API int adg_registry_allocator(const adg_registry *registry,
				   adg_allocator *out);

/* Counters of a registry, read without stopping other threads: each is
 * exact once the threads that change it are quiescent. */
typedef struct adg_stats adg_stats;
struct adg_stats {
	size_t size;	      /* sizeof the caller's struct (adg.h, "ABI") */
	uint64_t live_nodes;  /* nodes not yet freed, leaves included */
	uint64_t live_steps;  /* steps registered and not yet released */
	uint64_t live_graphs; /* graphs with at least one unconsumed step */
	uint64_t merges;      /* graphs absorbed into another, so far */
	uint64_t nodes_freed; /* nodes freed, so far */
	/* Memory held in node slabs (nodes of fewer than 8 parents, see
	 * adg_allocator), and how much of it is in 2 MiB slabs that libadg
	 * mapped itself and advised for transparent huge pages: with the
	 * default allocator, once a thread holds some 20 MiB of nodes of one
	 * parent count. */
	uint64_t slab_bytes;
	uint64_t slab_bytes_huge;
};

/* Fills *out (out->size set: see "ABI" above). Costs one read per thread
 * that has used the registry; takes no lock. Named adg_stats before 0.2.0,
 * which hid the struct's name in C++. Errors: ADG_EINVAL (NULL argument,
 * a bad out->size). */
ADG_API int adg_registry_stats(adg_registry *registry, adg_stats *out);

/* ------------------------------------------------------------------- nodes */

/* What a step's backward callback receives. */
typedef struct adg_step_call {
	adg_registry *registry; /* the node's registry (for nested backward) */
	/* Deprecated, and goes in 0.3.0 (a new soname: the members after it
	 * move): use adg_step_give or adg_step_give_all (docs/migration.md).
	 * Where the parents' gradients could be registered by id
	 * (adg_grads_register), the slower path; a use of the field warns
	 * (ADG_DEPRECATED). */
	adg_grads *grads ADG_DEPRECATED(
		"call->grads is deprecated and goes in 0.3.0: give with "
		"adg_step_give (docs/migration.md)");
	uint64_t node_id; /* the node whose step this is */
	/* The node's gradient, summed over its children; NULL when no child
	 * registered one. The step may take ownership by setting it to NULL;
	 * whatever is left here is freed when the step returns. */
	void *grad;
	/* In adg_op's order, repeats kept; valid during the call only (it is
	 * the running thread's scratch): copy what the step keeps. */
	const uint64_t *parent_ids;
	size_t n_parents;
	/* libadg's, for adg_output_get: leave it alone. */
	struct adg_backward_context *context;
	/* Nonzero in a retained backward (adg_backward_options.retain): the
	 * step stays registered and may run again, so it must keep what it
	 * needs; it may record ops whose parents are nodes of the graph
	 * being run (a gradient that is itself a node: higher order). 0: the
	 * step is consumed and runs this once. */
	int retained;
	/* The backward pass running the step: unique in the registry, never
	 * 0, the same for every step of the pass on every thread (a nested
	 * backward is a pass of its own). adg_failure.pass_id names it too,
	 * so that state a step leaves for its caller (adg.hpp keeps what a
	 * step threw) is keyed by the pass, never by the node alone, which
	 * retained passes on several threads run at once. */
	uint64_t pass_id;
} adg_step_call;

/* During a step: hands value (non-NULL), the gradient for the parent at
 * slot (0 <= slot < call->n_parents, adg_op's order), to the backward, in
 * every mode. Takes ownership of value: on error it has been freed, unless
 * call is NULL or not a step's. The fast path: a step that gives its slots
 * in order pays no lookup at all. A parent named in several slots (x * x)
 * takes its gradients in the order they are given, whichever of its slots
 * is named, as registering by id does, so a gradient's sum is folded in
 * the same order with or without an executor. Only a parent has a slot:
 * there is no giving to a node that is not a parent of the step, in any
 * mode; make it a parent (list it in adg_op's parents) and give to its
 * slot, so that its contribution has a place in the fixed fold order.
 * adg_grads_register on call->grads, the slower path, is deprecated and
 * goes in 0.3.0 (docs/migration.md): it finds the slot by comparing ids,
 * and without an executor it accepts any id, a non-parent's included.
 * Errors: ADG_EINVAL (NULL argument, slot out of range, or every slot
 * naming that parent already given), ADG_ENOMEM, or, without an executor,
 * ops->add's code (ADG_ECALLBACK for a positive one); with one an add
 * error is the backward's (see adg_backward_options). */
ADG_API int adg_step_give(adg_step_call *call, size_t slot, void *value);

/* During a step: gives every slot's gradient at once, values[i] for slot i
 * (i < call->n_parents; NULL: none for that slot), in slot order, each as
 * adg_step_give would (its fast path included). Takes ownership of every
 * non-NULL value, failing or not: on error the give that failed has freed
 * its value and this call has freed every later non-NULL one, those given
 * before are the backward's, and the caller owns none, so a step needs no
 * cleanup of its own. Exceptions: call NULL or not a step's, where nothing
 * is taken or freed; values NULL, where there is nothing to take. values
 * itself stays the caller's, unchanged.
 * Errors: ADG_EINVAL (NULL call or values), and those of adg_step_give
 * for the first slot whose give fails (a slot already given, the value
 * check's code, ADG_ENOMEM, an add's code without an executor). */
ADG_API int adg_step_give_all(adg_step_call *call, void *const *values);

/* The backward function of one node. Returns 0, or a negative code that
 * stops the backward and becomes its result. It runs with no libadg lock
 * held and may call any libadg function, adg_backward and adg_op included. */
typedef int (*adg_backward_fn)(adg_step_call *call, void *user);

/* Frees what user holds. Called exactly once per registered step: after a
 * consuming backward ran it, or when it is freed (run only by retained
 * backward passes, or unrun), or when a failed consuming backward drops
 * it. It runs with no libadg lock held and may call libadg (drop the
 * handles a closure keeps, say). */
typedef void (*adg_release_fn)(void *user);

typedef struct adg_step {
	adg_backward_fn backward; /* required */
	adg_release_fn release;	  /* may be NULL */
	void *user;
	/* What the step is called, for people looking at a graph
	 * (adg_graph_visit, adg_graph_write_dot, on_step): a static string
	 * the caller owns (a literal, say), valid and unchanged for as long
	 * as the registry lives, since copies of the pointer reach visitors
	 * on other threads; NULL: none. */
	const char *name;
} adg_step;

/* Creates a leaf: a node without parents that wants a gradient (a parameter,
 * an input that requires grad). Leaves never join graphs and are never
 * written once created, so a parameter shared by many threads neither
 * couples their graphs nor shares a written cache line between them.
 * Children keep only a leaf's id: the leaf is freed with the caller's last
 * handle, and a later backward still gives that id its gradient. *out holds
 * the one reference the caller owns.
 * Errors: ADG_EINVAL, ADG_ENOMEM, ADG_ENOIDS. */
ADG_API int adg_leaf(adg_registry *registry, adg_node **out);

/* Creates a node from n_parents >= 1 parents (repeats allowed: x * x) and
 * registers its step. The node joins its parents' graph; parents in several
 * graphs merge them into one, whose id is the smallest of their origins. A
 * node with no parent in a graph starts a new graph whose origin is its id.
 * The caller must hold a reference to every parent during the call. On
 * success libadg owns the step (its release runs exactly once); on error
 * nothing was called and the caller still owns step->user. The node cannot
 * be registered twice: it is created by this call.
 * Errors: ADG_EINVAL (NULL argument, n_parents 0, NULL step->backward),
 * ADG_EFOREIGN (a parent of another registry), ADG_ENOMEM, ADG_ENOIDS. */
ADG_API int adg_op(adg_registry *registry, adg_node *const *parents,
		   size_t n_parents, const adg_step *step, adg_node **out);

/* Adds a reference to node, for the caller to drop with adg_node_unref.
 * Errors: ADG_EINVAL (NULL). */
ADG_API int adg_node_ref(adg_node *node);

/* Drops one of the caller's references. When no reference is left to the
 * node nor to any node that could still run its step in a backward, the node
 * is freed with its step (release runs, here, on this thread), and so are
 * ancestors that become unreachable: work in proportion to what is freed.
 * Errors: ADG_EINVAL (NULL). */
ADG_API int adg_node_unref(adg_node *node);

/* Fills *id with the node's id: unique in its registry, never 0.
 * Errors: ADG_EINVAL (NULL argument). */
ADG_API int adg_node_id(const adg_node *node, uint64_t *id);

/* Fills *graph_id with the id of the graph the node is in now: the smallest
 * origin of the graphs merged into it. 0 for a leaf or a node whose step was
 * consumed. Lock-free: one RCU read-side section.
 * Errors: ADG_EINVAL (NULL argument). */
ADG_API int adg_node_graph_id(const adg_node *node, uint64_t *graph_id);

/* Fills *registry with the registry node belongs to: what a layer that
 * adopts a C handle checks it against (adg.hpp's node::adopt).
 * Errors: ADG_EINVAL (NULL argument). */
ADG_API int adg_node_registry(const adg_node *node, adg_registry **registry);

/* ---------------------------------------------------------- checkpointing */

/* What a recompute callback receives: the outputs of the node's parents,
 * and where to put the node's own. */
typedef struct adg_recompute_call {
	uint64_t node_id;
	size_t n_parents;
	const uint64_t *parent_ids; /* as adg_step_call's: the call's only */
	/* One per parent slot: its output, or NULL for a leaf (a leaf's value
	 * is the caller's, and the step's closure keeps what it needs). */
	void *const *parent_outputs;
	void *output; /* set by the callback: the node's output, owned by
			 libadg from then on */
} adg_recompute_call;

/* Builds a node's forward output again from its parents' outputs, during a
 * backward. user is the node's step user pointer. Returns 0, or a negative
 * code that stops the backward. Runs with no lock held; it may run a
 * forward and a backward of its own. */
typedef int (*adg_recompute_fn)(adg_recompute_call *call, void *user);

/* The forward output an op offers to the backward. */
typedef struct adg_output {
	void *value; /* the output as computed, or NULL */
	/* Required: frees an output, with ctx. Runs with no libadg lock
	 * held. */
	void (*free)(void *value, void *ctx);
	adg_recompute_fn recompute; /* NULL: it cannot be rebuilt */
	/* Cheap to recompute (an activation, an add): the balanced strategy
	 * drops value at once and recomputes it when asked. Dropped, value
	 * stays valid for the forward that made it until this thread's next
	 * op or backward on the registry (adg_op_with). */
	int memory_bound;
	void *ctx; /* passed to free */
} adg_output;

/* Set size (adg.h, "ABI"), zero the rest, then set what you need. */
typedef struct adg_op_options {
	size_t size; /* sizeof the caller's struct (adg.h, "ABI") */
	/* This node's output, for steps that will ask for it; NULL: none.
	 * Either value or recompute must be set. */
	const adg_output *output;
	/* The outputs this node's step will ask for with adg_output_get: its
	 * own (want_self), and those of the parents at these slots of the
	 * parents array. Each must offer an output; a leaf offers none. */
	int want_self;
	const uint32_t *want_parents;
	size_t n_want_parents;
	/* The parents whose references the caller moves in, as adg_op_moving
	 * does: bit i for parents[i] (i < 64); 0: none. */
	uint64_t moved;
} adg_op_options;

/* adg_op with checkpointing. Requests are counted per backward: a kept
 * output is freed as soon as the last step that asked for it has run (or
 * the last rebuild that would read it has happened, or will not), an
 * output no step of a backward asks for is freed when the backward takes
 * its tape, and a recomputed one is built once and kept only while a
 * later request needs it. Outputs follow nodes through merges, and a
 * failed backward or a node freed unrun frees them exactly once. A
 * recompute callback needs every non-leaf parent to offer an output.
 * Whether a node offers an output is fixed when it is registered: a parent
 * whose step a backward has consumed (or is consuming on another thread)
 * still does, the call succeeds as adg_op's does, and a backward from the
 * new node that needs that parent fails with ADG_EUNAVAILABLE. On error
 * the caller still owns output->value.
 * An offered value stays valid for the forward that made it until this
 * thread's next adg_op, adg_op_with, adg_op_moving or backward on the
 * registry, whatever the strategy: ADG_CHECKPOINT_BALANCED takes a value
 * it drops out of the node at once (a backward, on any thread, rebuilds
 * it) and frees it when the next of those calls on this thread succeeds,
 * or at adg_registry_free; so a forward may go on reading its activation
 * until its next op. One such value per thread and registry at most; a
 * thread that ends leaves its last until the registry is freed.
 * options->moved moves the caller's references in, as adg_op_moving does.
 * Errors: those of adg_op, and ADG_EINVAL for a malformed options (no
 * free, neither value nor recompute, a want out of range or on a node that
 * offers no output, n_want_parents above UINT32_MAX, a bit of moved set at
 * or past n_parents). */
ADG_API int adg_op_with(adg_registry *registry, adg_node *const *parents,
			size_t n_parents, const adg_step *step,
			const adg_op_options *options, adg_node **out);

/* adg_op, moving the caller's references in: for each bit i set in moved
 * (i < 64), the caller's reference to parents[i] becomes the new node's,
 * as if the caller dropped it with adg_node_unref after the call, without
 * the two atomic operations that would cost (a chain's x = f(x), a
 * temporary's last use). A parent named in several slots hands over one
 * reference per set bit. On success the caller must not use the moved
 * references again; on error nothing moved and they are still the
 * caller's. moved 0 is adg_op. With options, adg_op_with moves the same
 * way the parents of options->moved.
 * Errors: those of adg_op, and ADG_EINVAL for a bit set at or past
 * n_parents. */
ADG_API int adg_op_moving(adg_registry *registry, adg_node *const *parents,
			  size_t n_parents, uint64_t moved,
			  const adg_step *step, adg_node **out);

/* During a step: borrows the output of the node (id == call->node_id) or of
 * a parent, one the step asked for in adg_op_with; recomputes it first if
 * it has to. The value stays valid until the step returns. No lock is held
 * across a recompute. With an executor, steps that ask for one output at
 * once get one rebuild: the others sleep until it is there (a second at
 * most, then they rebuild a copy of their own); a thread already inside a
 * recompute (one that runs steps of its own backward, as a cooperative
 * executor does at its wait points) never waits: it rebuilds a copy at
 * once. The first copy made is kept.
 * Errors: ADG_EINVAL (NULL argument, or an output the step did not ask
 * for), or a recompute callback's code. */
ADG_API int adg_output_get(adg_step_call *call, uint64_t id, void **value);

/* --------------------------------------------------------------- backward */

/* The caller's gradient arithmetic. add folds value into *sum (it may
 * replace *sum) and owns value from the call on, failing or not; it returns
 * 0 or a negative code. free releases one value. ctx is passed to both.
 * Both run with no libadg lock held and may call libadg (add may record
 * an op: a sum that is itself a node), but neither may use the container
 * it works for (*sum points into it). */
typedef struct adg_grad_ops {
	int (*add)(void **sum, void *value, void *ctx);
	void (*free)(void *value, void *ctx);
	void *ctx;
} adg_grad_ops;

/* Runs a backward from root with seed as root's gradient (non-NULL).
 * The caller holds a reference to root when it calls; the backward holds
 * its own until it returns, so a step (or another thread) may drop the
 * caller's meanwhile. Takes every step reachable from root through
 * unconsumed steps, once each (the tape), and runs them in tape order on
 * this thread (or on an executor's workers: adg_backward_with), with no
 * lock held; they are consumed (adg_backward_with can retain them). Tape
 * order: a step comes after every step that names its node as a parent,
 * as soon as the last of those has come, and of the steps ready, the one
 * readied last (a node's parents are readied in slot order, so the last
 * slot's branch runs first: for a graph recorded left to right, the
 * reverse of the order it was made in, which is memory order). It depends
 * on the graph's shape and its parent slots' order alone, never on
 * timing, so gradients sum in the same order on every run. On success
 * *out is a new container holding the gradients of the leaves reached (a
 * non-leaf node's gradient is freed once its step has run); the caller
 * frees it with adg_grads_free. A root that is a leaf gives a container
 * holding just seed. ops is copied.
 * ops NULL: the registry's grad_ops (adg_registry_options).
 * seed is owned by libadg from the call on and freed with the ops' free on
 * error, except when there are no ops (none passed, none on the registry)
 * or the ops passed lack a callback (the registry's are not used then):
 * it stays the caller's (the table above, (1)).
 * Errors: ADG_EINVAL, ADG_EFOREIGN (root of another registry),
 * ADG_ECONSUMED (root's step was consumed), ADG_EUNAVAILABLE (a step the
 * backward needs was consumed, or is being run by a retained backward;
 * nothing was taken), ADG_ENOMEM (nothing was taken), or a step's or
 * ops->add's negative code, ADG_ECALLBACK for a positive one: then every
 * step not yet run has been released and *out is NULL. */
ADG_API int adg_backward(adg_registry *registry, adg_node *root, void *seed,
			 const adg_grad_ops *ops, adg_grads **out);

/* Called by a backward once for each node whose gradient has become final:
 * every step of the backward that names the node as a parent has run (for
 * the root: at once). *grad is the gradient, NULL when none arrived; the
 * hook may take it by setting *grad to NULL (for a node that is not a leaf,
 * its step then gets NULL), or leave it where it is. Runs with no lock
 * held, in the order gradients become final: on the thread of the backward,
 * or, with an executor, on the worker whose step made the gradient final
 * (the root's on the calling thread), so that calls for different nodes
 * may run at once. Returns 0, or a negative code that stops the backward as
 * a failing step does. This is the hook a data-parallel trainer starts its
 * all-reduce from, while the rest of the backward runs. */
typedef int (*adg_ready_fn)(uint64_t id, void **grad, void *ctx);

/* A way to run work on other threads: the caller's own thread pool, or
 * libadg's (adg_pool_executor). submit must arrange for fn(arg) to run
 * once, on a thread other than the caller's or later on the caller's
 * thread but not inside submit, and return 0; or return non-zero, and then
 * fn never runs. fn returns when there is no work left for it; it may start
 * long after the backward that submitted it has returned (it then returns
 * at once), so submitted work must not be dropped unrun. Such a late fn
 * touches neither the registry nor its allocator: it may run after
 * adg_registry_free (it frees a few dozen bytes of its own, from malloc).
 * submit may be called from any thread of a backward, concurrently with
 * itself. */
typedef struct adg_executor {
	int (*submit)(void (*fn)(void *arg), void *arg, void *ctx);
	void *ctx;
	/* How many of the executor's threads one backward may use at once,
	 * besides the calling thread, which always works too. At most
	 * ADG_EXECUTOR_MAX_WORKERS. 0: the calling thread alone, in tape
	 * order, with an executor's rules for steps and errors (see
	 * adg_backward_options) at about the sequential backward's cost. */
	unsigned n_workers;
} adg_executor;

#define ADG_EXECUTOR_MAX_WORKERS 256u

/* What on_step (adg_backward_options) is told about one step. */
typedef struct adg_step_event {
	uint64_t node_id;
	const char *name; /* the step's name, or NULL */
	int after;	  /* 0: the step is about to run; 1: it has returned */
	/* After only: how long the step ran (monotonic clock, the hook's own
	 * time not counted), and what it returned (0, or its negative code;
	 * ADG_ECALLBACK for a positive one). 0 before. */
	uint64_t duration_ns;
	int result;
} adg_step_event;

typedef int (*adg_step_hook_fn)(const adg_step_event *event, void *ctx);

/* Where a backward failed (adg_backward_options.failure). */
typedef enum adg_failure_site {
	/* It did not fail, or failed before running anything: bad input,
	 * ADG_ENOMEM, a step it could not take; its code says which. */
	ADG_FAILED_NOWHERE = 0,
	ADG_FAILED_STEP,     /* node_id's step returned code */
	ADG_FAILED_ON_STEP,  /* on_step, around node_id's step */
	ADG_FAILED_ON_READY, /* on_ready, for node_id's gradient */
	/* ops->add, folding a gradient into node_id's: with an executor
	 * only (without one, the add runs inside the registering step,
	 * which is told). */
	ADG_FAILED_ADD,
	/* value_check rejected a gradient node_id's step gave: the step
	 * that produced it, whatever the step then returned. */
	ADG_FAILED_CHECK,
} adg_failure_site;

/* What a backward tells of its result. */
typedef struct adg_failure {
	size_t size; /* sizeof the caller's struct (adg.h, "ABI") */
	int code;    /* the backward's result: 0, or its error */
	adg_failure_site site;
	uint64_t node_id; /* 0 with ADG_FAILED_NOWHERE */
	/* node_id's step name (adg_step.name) when node_id has a step, else
	 * NULL. */
	const char *name;
	/* The pass (adg_step_call.pass_id); 0 when the backward stopped
	 * before it began one (bad input, ADG_ENOMEM for its thread's
	 * state). */
	uint64_t pass_id;
} adg_failure;

/* Set size (adg.h, "ABI"), zero the rest, then set what you need. */
typedef struct adg_backward_options {
	size_t size;	       /* sizeof the caller's struct (adg.h, "ABI") */
	adg_ready_fn on_ready; /* NULL: no hook */
	void *on_ready_ctx;    /* passed to on_ready */
	/* Nonzero: call on_ready for leaves only (a trainer's parameters). */
	int leaves_only;
	/* NULL: every step runs on the calling thread, in tape order. Set:
	 * a step runs as soon as every step that names its node as a parent
	 * has run, on the calling thread or a worker of the executor
	 * (copied), so that independent branches run at once. Steps (and
	 * on_ready, and ops) must then be safe to run on any thread and
	 * concurrently with each other; a chain of steps stays on one thread.
	 *
	 * call->grads (deprecated, and goes in 0.3.0: use adg_step_give) is
	 * then a step's own view: adg_grads_register takes one gradient per
	 * parent slot, as adg_step_give does (a parent named twice, as in
	 * x * x, takes two), and ADG_EINVAL, value freed, for an id that is
	 * not a parent or whose slots are all taken; get, take, count and
	 * free on the view return ADG_EINVAL. An ops->add error
	 * is the backward's, not the step's: the add may happen after the step
	 * has returned.
	 *
	 * Determinism: each gradient is folded in one fixed order, whatever
	 * the number of workers and the timing: by the position of the
	 * contributing step on the tape (the order the sequential backward
	 * runs them in), then by parent slot, a parent's slots taken in the
	 * order its gradients are given in. So ops->add sees the same
	 * operands in the same order with any number of workers as without
	 * an executor, and the gradients are bitwise identical. A node's
	 * contributions are folded once its last one has arrived, on the
	 * thread that delivered it.
	 *
	 * On failure, steps already running finish and the result is the
	 * error that comes first in tape order (a step's at its position,
	 * an ops->add or on_ready error for a node just after the last step
	 * that contributes to it), so that it too does not depend on
	 * timing; once it is seen, steps after it on the tape do not start. */
	const adg_executor *executor;
	/* NULL: no hook. Set: called before and after each step, on the
	 * thread that runs it (see adg_step_event); a non-zero return stops
	 * the backward as a failing step at that position would, and
	 * becomes its result (ADG_ECALLBACK for a positive one). */
	adg_step_hook_fn on_step;
	void *on_step_ctx; /* passed to on_step */
	/* Nonzero: a retained backward. It runs the steps it reaches but
	 * takes none: they stay registered (call->retained tells them so),
	 * the graph is unchanged, and later backward passes, retained or
	 * not, from this root or another node of the graph, run them again.
	 * Retained passes over the same nodes may run at once on different
	 * threads: a step that can be reached by two must then be safe to
	 * run concurrently with itself. While one runs, its nodes cannot be
	 * consumed: a consuming backward whose tape would hold one fails
	 * with ADG_EUNAVAILABLE, nothing taken. A retained backward that
	 * reaches a consumed step fails the same way. Checkpointed outputs
	 * are not freed: one it rebuilds stays held for the passes after it,
	 * until a consuming backward or the node's end frees it. A failed
	 * retained backward leaves every step registered. */
	int retain;
	/* NULL: not wanted. Set: filled on every return with the result and
	 * where it came from, the failure first in tape order (the one whose
	 * code is returned), with or without an executor. */
	adg_failure *failure;
	/* NULL: no check, and no cost. Set: anomaly detection. Called with
	 * every gradient a step gives with adg_step_give, before libadg takes
	 * it, on the thread of the step: returns 0 to accept it, or a
	 * negative code (ADG_EVALUE, say; ADG_ECALLBACK for a positive one)
	 * to reject it. A rejected value is freed, adg_step_give returns the
	 * code, and the backward fails at that step (ADG_FAILED_CHECK, naming
	 * the step that produced the value) whatever the step returns, under
	 * the first-failure-in-tape-order rule, in every mode, consuming or
	 * retained. It must be safe to call concurrently with itself when
	 * there is an executor, and may not call libadg. */
	int (*value_check)(const void *value, void *ctx);
	void *value_check_ctx; /* passed to value_check */
} adg_backward_options;

/* adg_backward with options (NULL: as adg_backward). The counts behind
 * on_ready, and an executor's scheduling, come from the tape as it is
 * taken: the cost is proportional to the tape. A step may run a backward
 * of its own, with or without an executor, the same one included.
 * Errors: those of adg_backward, ADG_EINVAL (an executor with no submit or
 * more than ADG_EXECUTOR_MAX_WORKERS workers), and on_ready's code
 * (ADG_ECALLBACK for a positive one). */
ADG_API int adg_backward_with(adg_registry *registry, adg_node *root,
			      void *seed, const adg_grad_ops *ops,
			      const adg_backward_options *options,
			      adg_grads **out);

/* During a callback that a backward runs on the calling thread: fills
 * *where as the backward's adg_failure would read if the call failed now
 * (code 0; site, node_id, name and pass_id), so that a callback that is
 * not told its node (value_check, ops->add) can key what it leaves for
 * its caller (a C++ exception, say) by the failure that would name it:
 * adg.hpp keeps what its callbacks throw so, and rethrows the one the
 * backward's failure names. Which calls, and what they are told:
 * - a step, and what runs inside it: ADG_FAILED_STEP and the step's
 *   node. Without an executor that includes the ops->add its
 *   adg_step_give (or adg_grads_register on call->grads) runs, whose code
 *   the give returns to the step; and adg_output_get's recompute.
 * - value_check: ADG_FAILED_CHECK and the node whose step gave the value.
 * - ops->add that a backward with an executor runs (alone or on a
 *   worker; its error is the backward's): ADG_FAILED_ADD and the node
 *   whose gradient it folds into (name NULL for a leaf).
 * - on_step: ADG_FAILED_ON_STEP and the step's node.
 * A backward run inside such a call (a step's nested backward, one in an
 * add) answers for its own calls while it runs; once it returns, the
 * outer call's answer is back. Each worker of an executor answers for the
 * calls it runs. *where is the caller's; name is the step's static
 * string. Reads the calling thread's state only, with no lock; a backward
 * pays a store per step for it.
 * Errors: ADG_EINVAL (where NULL, or no such call runs on this thread:
 * outside a backward, or between its calls, in on_ready, a release or
 * ops->free after a step, whose failures no backward reports); *where is
 * then untouched. */
ADG_API int adg_callback_site(adg_failure *where);

/* ---------------------------------------------------------- seeing a graph */

/* A parent, as its child sees it. */
enum adg_parent_kind {
	ADG_PARENT_OP = 0,	 /* an unconsumed op, in the child's graph */
	ADG_PARENT_LEAF = 1,	 /* a leaf: children keep only its id */
	ADG_PARENT_CONSUMED = 2, /* an op whose step a backward has taken */
};

/* One op of a graph, as adg_graph_visit shows it; valid during the call
 * only. */
typedef struct adg_graph_node {
	uint64_t graph_id; /* the graph's id, as adg_node_graph_id gives it */
	uint64_t id;
	const char *name; /* the step's name, or NULL */
	uint32_t depth;	  /* 1 + its deepest parent's; a leaf's is 0 */
	size_t n_parents;
	const uint64_t *parent_ids; /* in adg_op's order, repeats kept */
	/* One enum adg_parent_kind per parent. */
	const uint8_t *parent_kinds;
} adg_graph_node;

/* Returns 0 to go on, or a code that stops the visit. */
typedef int (*adg_visit_fn)(const adg_graph_node *node, void *ctx);

/* Calls visit once for each unconsumed op of the graph node is in, as the
 * graph was at one instant: a copy taken under the graph's lock, visited
 * after the lock is released (visit may call libadg, and other threads go
 * on changing the graph meanwhile). Ops come by depth, then id, so every
 * op comes after its parents. Leaves and consumed ops are in no graph:
 * they show as parents only. The caller holds a reference to node.
 * Errors: ADG_EINVAL (NULL argument, or node a leaf: it is in no graph),
 * ADG_ECONSUMED (node's step was consumed), ADG_ENOMEM (nothing visited),
 * or visit's code (ADG_ECALLBACK for a positive one). */
ADG_API int adg_graph_visit(adg_node *node, adg_visit_fn visit, void *ctx);

/* Takes a piece of text, len bytes, not NUL-terminated. Returns 0, or a
 * code that stops the writing. */
typedef int (*adg_write_fn)(const char *text, size_t len, void *ctx);

/* Writes the graph node is in as Graphviz DOT (`dot -Tpng` draws it),
 * from one copy as adg_graph_visit takes it: each op a box labelled with
 * its id, name and depth; each leaf an ellipse and each consumed op a
 * dashed box, labelled with their ids; an edge from parent to child per
 * parent slot, in slot order, labelled with the slot ("0", "1": the left
 * and right of a subtraction) where the child has two parents or more,
 * bare where it has one; the graph's id as the title. A name is written
 * with quotes and backslashes escaped and control characters as spaces;
 * past 200 bytes it is cut, between UTF-8 characters. Bytes that are not
 * UTF-8 pass through unchanged (Graphviz then reads the file as
 * Latin-1). write is called many times, with no lock held. Errors: those
 * of adg_graph_visit, and write's code (ADG_ECALLBACK for a positive
 * one). */
ADG_API int adg_graph_write_dot(adg_node *node, adg_write_fn write, void *ctx);

/* What adg_graph_write_dot_with adds. Set size (adg.h, "ABI"), zero the
 * rest, then set what you need. */
typedef struct adg_dot_options {
	size_t size; /* sizeof the caller's struct (adg.h, "ABI") */
	/* NULL: a leaf is labelled "leaf <id>". Set: called once for each
	 * leaf written, with no lock held, on the calling thread; returns the
	 * leaf's name (a parameter's, "W1"), read before the next call, or
	 * NULL for the plain label. Children keep only a leaf's id, so the
	 * names are the caller's to keep: adg.hpp's named leaves, say. */
	const char *(*leaf_name)(uint64_t id, void *ctx);
	void *leaf_name_ctx; /* passed to leaf_name */
} adg_dot_options;

/* adg_graph_write_dot with options (NULL: as adg_graph_write_dot). A named
 * leaf reads "<name> (leaf <id>)", its name quoted and cut as an op's.
 * Errors: those of adg_graph_write_dot. */
ADG_API int adg_graph_write_dot_with(adg_node *node,
				     const adg_dot_options *options,
				     adg_write_fn write, void *ctx);

/* ------------------------------------------------------- gradient reducer */

#include "adg/reducer.h"

/* ------------------------------------------------------------ thread pool */

#include "adg/pool.h"

/* ------------------------------------------------------------ exact sums */

#include "adg/exact.h"

/* ------------------------------------------------------------- gradients */

/* A container is owned by one thread at a time: these functions must not
 * run concurrently on the same container. Steps of one backward receive its
 * container in call->grads and may use it during their call (with an
 * executor, a view of it: see adg_backward_options); that field is
 * deprecated and will go: a step gives with adg_step_give. */

/* Borrows the gradient held for id. Errors: ADG_EINVAL, ADG_ENOTFOUND. */
ADG_API int adg_grads_get(const adg_grads *grads, uint64_t id, void **value);

/* Removes the gradient held for id and hands it to the caller.
 * Errors: ADG_EINVAL, ADG_ENOTFOUND. */
ADG_API int adg_grads_take(adg_grads *grads, uint64_t id, void **value);

/* adg_grads_get and adg_grads_take by handle: node's gradient in one
 * call (a leaf's, typically: a trainer's parameter). The node's id is
 * read from the handle, which the caller holds. The node must be of the
 * registry whose backward made grads: ids are unique in a registry only,
 * so another registry's node may share an id with one of grads'.
 * Errors: ADG_EINVAL (NULL argument, grads a step's view),
 * ADG_EFOREIGN (node of another registry: nothing read or taken),
 * ADG_ENOTFOUND. */
ADG_API int adg_grads_get_node(const adg_grads *grads, const adg_node *node,
			       void **value);
ADG_API int adg_grads_take_node(adg_grads *grads, const adg_node *node,
				void **value);

/* Adds value (non-NULL) to the gradient held for id, with ops->add when one
 * is held. Takes ownership of value: on error it has been freed, unless
 * grads is NULL. It stays for containers (a backward's result); its use on
 * a step's call->grads is deprecated and goes in 0.3.0: use adg_step_give
 * (docs/migration.md).
 * Errors: ADG_EINVAL (NULL grads or value, id 0), ADG_ENOMEM, or
 * ops->add's code (ADG_ECALLBACK for a positive one). */
ADG_API int adg_grads_register(adg_grads *grads, uint64_t id, void *value);

/* Fills *count with the number of gradients held. Errors: ADG_EINVAL. */
ADG_API int adg_grads_count(const adg_grads *grads, size_t *count);

/* Frees every gradient held (ops->free) and the container. NULL is a no-op
 * that returns 0. */
ADG_API int adg_grads_free(adg_grads *grads);

#ifdef __cplusplus
}
#endif

#endif /* ADG_H */
