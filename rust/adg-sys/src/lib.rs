//! Raw bindings of libadg's C API: `adg.h`, `adg/reducer.h`,
//! `adg/pool.h` and `adg/exact.h`, written by hand, one item per C
//! declaration, in the headers' order.
//!
//! The headers are the reference: each function's contract (what it takes,
//! returns, which errors, who owns what) is stated there, and these
//! bindings repeat none of it. `tests/headers.rs` checks them against the
//! installed headers: every `adg_*` function and `ADG_*` constant bound,
//! constants equal, and every struct's size, alignment and field offsets
//! equal C's. The safe layer is the `adg` crate.
//!
//! The library is found through pkg-config (`build.rs` says why).
//!
//! Enums are bound as their C type (`c_int`, or `c_uint` for an enum whose
//! values are all non-negative, as C compilers lay them out) with one
//! constant per enumerator.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_uint, c_void};

// ------------------------------------------------------------- versions

/// The major version of the headers bound.
pub const ADG_VERSION_MAJOR: c_int = 0;
/// The minor version of the headers bound.
pub const ADG_VERSION_MINOR: c_int = 2;
/// The patch version of the headers bound.
pub const ADG_VERSION_PATCH: c_int = 0;

// --------------------------------------------------------------- errors

/// `enum adg_error`: every code is negative; 0 is success.
pub type adg_error = c_int;
/// Success.
pub const ADG_OK: adg_error = 0;
/// A NULL or malformed argument.
pub const ADG_EINVAL: adg_error = -1;
/// The allocator returned NULL.
pub const ADG_ENOMEM: adg_error = -2;
/// A node belongs to another registry.
pub const ADG_EFOREIGN: adg_error = -3;
/// The root's step was consumed by a backward.
pub const ADG_ECONSUMED: adg_error = -4;
/// A step the backward needs was consumed.
pub const ADG_EUNAVAILABLE: adg_error = -5;
/// No node id is left to hand out.
pub const ADG_ENOIDS: adg_error = -6;
/// No gradient is held for that node id.
pub const ADG_ENOTFOUND: adg_error = -7;
/// Still in use: a registry with live nodes, a reducer mid-round.
pub const ADG_EBUSY: adg_error = -8;
/// A callback returned a positive value.
pub const ADG_ECALLBACK: adg_error = -9;
/// A call out of order for the object's state.
pub const ADG_ESTATE: adg_error = -10;
/// A callback threw an exception (or panicked).
pub const ADG_ETHREW: adg_error = -11;
/// A gradient failed the backward's value check.
pub const ADG_EVALUE: adg_error = -12;

/// Codes at or below this value are never libadg's: steps and callbacks
/// may return them for their own failures.
pub const ADG_EUSER: c_int = -1000;

/// The room `adg_errmsg`'s string has, its NUL included.
pub const ADG_ERRMSG_MAX: c_int = 512;

extern "C" {
    pub fn adg_strerror(code: c_int) -> *const c_char;
    pub fn adg_error_name(code: c_int) -> *const c_char;
    pub fn adg_errmsg() -> *const c_char;
    pub fn adg_version() -> *const c_char;
}

// -------------------------------------------------------------- handles

/// A registry: owns nodes, graphs and the locator (opaque).
#[repr(C)]
pub struct adg_registry {
    _private: [u8; 0],
}

/// A counted handle to one node (opaque).
#[repr(C)]
pub struct adg_node {
    _private: [u8; 0],
}

/// The gradients of one backward (opaque).
#[repr(C)]
pub struct adg_grads {
    _private: [u8; 0],
}

/// libadg's state of a running backward, for `adg_output_get` (opaque).
#[repr(C)]
pub struct adg_backward_context {
    _private: [u8; 0],
}

// ------------------------------------------------------------- registry

/// Every allocation libadg makes for a registry.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_allocator {
    pub alloc: Option<unsafe extern "C" fn(size: usize, ctx: *mut c_void) -> *mut c_void>,
    pub free: Option<unsafe extern "C" fn(ptr: *mut c_void, size: usize, ctx: *mut c_void)>,
    pub ctx: *mut c_void,
}

/// `enum adg_checkpointing`.
pub type adg_checkpointing = c_uint;
/// Every output an op offers is kept.
pub const ADG_CHECKPOINT_NONE: adg_checkpointing = 0;
/// Memory-bound outputs that can recompute themselves are dropped.
pub const ADG_CHECKPOINT_BALANCED: adg_checkpointing = 1;

/// The largest node id a registry hands out, 2^63 - 1.
pub const ADG_ID_MAX: u64 = i64::MAX as u64;

/// Options of `adg_registry_new`; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_registry_options {
    pub size: usize,
    pub allocator: adg_allocator,
    pub max_node_id: u64,
    pub checkpointing: c_int,
    pub grad_ops: *const adg_grad_ops,
}

extern "C" {
    pub fn adg_registry_new(
        options: *const adg_registry_options,
        out: *mut *mut adg_registry,
    ) -> c_int;
    pub fn adg_registry_free(registry: *mut adg_registry) -> c_int;
    pub fn adg_registry_allocator(registry: *const adg_registry, out: *mut adg_allocator) -> c_int;
}

/// A registry's counters; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct adg_stats {
    pub size: usize,
    pub live_nodes: u64,
    pub live_steps: u64,
    pub live_graphs: u64,
    pub merges: u64,
    pub nodes_freed: u64,
    pub slab_bytes: u64,
    pub slab_bytes_huge: u64,
}

extern "C" {
    pub fn adg_registry_stats(registry: *mut adg_registry, out: *mut adg_stats) -> c_int;
}

// ---------------------------------------------------------------- nodes

/// What a step's backward callback receives.
#[repr(C)]
#[derive(Debug)]
pub struct adg_step_call {
    pub registry: *mut adg_registry,
    /// Deprecated in C, goes in 0.3.0: give with `adg_step_give`.
    #[deprecated(note = "call->grads goes in 0.3.0: give with adg_step_give")]
    pub grads: *mut adg_grads,
    pub node_id: u64,
    pub grad: *mut c_void,
    pub parent_ids: *const u64,
    pub n_parents: usize,
    pub context: *mut adg_backward_context,
    pub retained: c_int,
    pub pass_id: u64,
}

extern "C" {
    pub fn adg_step_give(call: *mut adg_step_call, slot: usize, value: *mut c_void) -> c_int;
    pub fn adg_step_give_all(call: *mut adg_step_call, values: *const *mut c_void) -> c_int;
}

/// The backward function of one node.
pub type adg_backward_fn =
    Option<unsafe extern "C" fn(call: *mut adg_step_call, user: *mut c_void) -> c_int>;
/// Frees what a step's user holds.
pub type adg_release_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// A step: its backward, release, user pointer and name.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_step {
    pub backward: adg_backward_fn,
    pub release: adg_release_fn,
    pub user: *mut c_void,
    pub name: *const c_char,
}

extern "C" {
    pub fn adg_leaf(registry: *mut adg_registry, out: *mut *mut adg_node) -> c_int;
    pub fn adg_op(
        registry: *mut adg_registry,
        parents: *const *mut adg_node,
        n_parents: usize,
        step: *const adg_step,
        out: *mut *mut adg_node,
    ) -> c_int;
    pub fn adg_node_ref(node: *mut adg_node) -> c_int;
    pub fn adg_node_unref(node: *mut adg_node) -> c_int;
    pub fn adg_node_id(node: *const adg_node, id: *mut u64) -> c_int;
    pub fn adg_node_graph_id(node: *const adg_node, graph_id: *mut u64) -> c_int;
    pub fn adg_node_registry(node: *const adg_node, registry: *mut *mut adg_registry) -> c_int;
}

// -------------------------------------------------------- checkpointing

/// What a recompute callback receives.
#[repr(C)]
#[derive(Debug)]
pub struct adg_recompute_call {
    pub node_id: u64,
    pub n_parents: usize,
    pub parent_ids: *const u64,
    pub parent_outputs: *const *mut c_void,
    pub output: *mut c_void,
}

/// Builds a node's forward output again during a backward.
pub type adg_recompute_fn =
    Option<unsafe extern "C" fn(call: *mut adg_recompute_call, user: *mut c_void) -> c_int>;

/// The forward output an op offers to the backward.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_output {
    pub value: *mut c_void,
    pub free: Option<unsafe extern "C" fn(value: *mut c_void, ctx: *mut c_void)>,
    pub recompute: adg_recompute_fn,
    pub memory_bound: c_int,
    pub ctx: *mut c_void,
}

/// Options of `adg_op_with`; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_op_options {
    pub size: usize,
    pub output: *const adg_output,
    pub want_self: c_int,
    pub want_parents: *const u32,
    pub n_want_parents: usize,
    pub moved: u64,
}

extern "C" {
    pub fn adg_op_with(
        registry: *mut adg_registry,
        parents: *const *mut adg_node,
        n_parents: usize,
        step: *const adg_step,
        options: *const adg_op_options,
        out: *mut *mut adg_node,
    ) -> c_int;
    pub fn adg_op_moving(
        registry: *mut adg_registry,
        parents: *const *mut adg_node,
        n_parents: usize,
        moved: u64,
        step: *const adg_step,
        out: *mut *mut adg_node,
    ) -> c_int;
    pub fn adg_output_get(call: *mut adg_step_call, id: u64, value: *mut *mut c_void) -> c_int;
}

// ------------------------------------------------------------- backward

/// The caller's gradient arithmetic.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_grad_ops {
    pub add: Option<
        unsafe extern "C" fn(sum: *mut *mut c_void, value: *mut c_void, ctx: *mut c_void) -> c_int,
    >,
    pub free: Option<unsafe extern "C" fn(value: *mut c_void, ctx: *mut c_void)>,
    pub ctx: *mut c_void,
}

extern "C" {
    pub fn adg_backward(
        registry: *mut adg_registry,
        root: *mut adg_node,
        seed: *mut c_void,
        ops: *const adg_grad_ops,
        out: *mut *mut adg_grads,
    ) -> c_int;
}

/// Called once for each node whose gradient has become final.
pub type adg_ready_fn =
    Option<unsafe extern "C" fn(id: u64, grad: *mut *mut c_void, ctx: *mut c_void) -> c_int>;

/// A way to run work on other threads.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_executor {
    pub submit: Option<
        unsafe extern "C" fn(
            fn_: Option<unsafe extern "C" fn(arg: *mut c_void)>,
            arg: *mut c_void,
            ctx: *mut c_void,
        ) -> c_int,
    >,
    pub ctx: *mut c_void,
    pub n_workers: c_uint,
}

/// The most workers an executor may offer one backward.
pub const ADG_EXECUTOR_MAX_WORKERS: c_uint = 256;

/// What `on_step` is told about one step.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_step_event {
    pub node_id: u64,
    pub name: *const c_char,
    pub after: c_int,
    pub duration_ns: u64,
    pub result: c_int,
}

/// Called before and after each step.
pub type adg_step_hook_fn =
    Option<unsafe extern "C" fn(event: *const adg_step_event, ctx: *mut c_void) -> c_int>;

/// `enum adg_failure_site`: where a backward failed.
pub type adg_failure_site = c_uint;
/// It did not fail, or failed before running anything.
pub const ADG_FAILED_NOWHERE: adg_failure_site = 0;
/// `node_id`'s step returned the code.
pub const ADG_FAILED_STEP: adg_failure_site = 1;
/// `on_step`, around `node_id`'s step.
pub const ADG_FAILED_ON_STEP: adg_failure_site = 2;
/// `on_ready`, for `node_id`'s gradient.
pub const ADG_FAILED_ON_READY: adg_failure_site = 3;
/// `ops->add` folding into `node_id`'s gradient (with an executor).
pub const ADG_FAILED_ADD: adg_failure_site = 4;
/// The value check rejected a gradient `node_id`'s step gave.
pub const ADG_FAILED_CHECK: adg_failure_site = 5;

/// What a backward tells of its result; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_failure {
    pub size: usize,
    pub code: c_int,
    pub site: adg_failure_site,
    pub node_id: u64,
    pub name: *const c_char,
    pub pass_id: u64,
}

/// Options of `adg_backward_with`; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_backward_options {
    pub size: usize,
    pub on_ready: adg_ready_fn,
    pub on_ready_ctx: *mut c_void,
    pub leaves_only: c_int,
    pub executor: *const adg_executor,
    pub on_step: adg_step_hook_fn,
    pub on_step_ctx: *mut c_void,
    pub retain: c_int,
    pub failure: *mut adg_failure,
    pub value_check: Option<unsafe extern "C" fn(value: *const c_void, ctx: *mut c_void) -> c_int>,
    pub value_check_ctx: *mut c_void,
}

extern "C" {
    pub fn adg_backward_with(
        registry: *mut adg_registry,
        root: *mut adg_node,
        seed: *mut c_void,
        ops: *const adg_grad_ops,
        options: *const adg_backward_options,
        out: *mut *mut adg_grads,
    ) -> c_int;
    pub fn adg_callback_site(where_: *mut adg_failure) -> c_int;
}

// ------------------------------------------------------ seeing a graph

/// `enum adg_parent_kind`: a parent, as its child sees it.
pub type adg_parent_kind = c_uint;
/// An unconsumed op, in the child's graph.
pub const ADG_PARENT_OP: adg_parent_kind = 0;
/// A leaf: children keep only its id.
pub const ADG_PARENT_LEAF: adg_parent_kind = 1;
/// An op whose step a backward has taken.
pub const ADG_PARENT_CONSUMED: adg_parent_kind = 2;

/// One op of a graph, as `adg_graph_visit` shows it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_graph_node {
    pub graph_id: u64,
    pub id: u64,
    pub name: *const c_char,
    pub depth: u32,
    pub n_parents: usize,
    pub parent_ids: *const u64,
    pub parent_kinds: *const u8,
}

/// Returns 0 to go on, or a code that stops the visit.
pub type adg_visit_fn =
    Option<unsafe extern "C" fn(node: *const adg_graph_node, ctx: *mut c_void) -> c_int>;

/// Takes a piece of text, `len` bytes, not NUL-terminated.
pub type adg_write_fn =
    Option<unsafe extern "C" fn(text: *const c_char, len: usize, ctx: *mut c_void) -> c_int>;

/// Options of `adg_graph_write_dot_with`; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_dot_options {
    pub size: usize,
    pub leaf_name: Option<unsafe extern "C" fn(id: u64, ctx: *mut c_void) -> *const c_char>,
    pub leaf_name_ctx: *mut c_void,
}

extern "C" {
    pub fn adg_graph_visit(node: *mut adg_node, visit: adg_visit_fn, ctx: *mut c_void) -> c_int;
    pub fn adg_graph_write_dot(node: *mut adg_node, write: adg_write_fn, ctx: *mut c_void)
        -> c_int;
    pub fn adg_graph_write_dot_with(
        node: *mut adg_node,
        options: *const adg_dot_options,
        write: adg_write_fn,
        ctx: *mut c_void,
    ) -> c_int;
}

// ------------------------------------------------------ gradient reducer

/// A gradient reducer (opaque).
#[repr(C)]
pub struct adg_reducer {
    _private: [u8; 0],
}

/// What `apply` is told about one parameter.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_reduction {
    pub param: usize,
    pub id: u64,
    pub round: u64,
    pub sum: *mut c_void,
    pub slice: usize,
    pub n_slices: usize,
    pub first_unit: usize,
    pub n_units: usize,
}

/// A reducer's arithmetic and apply.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_reducer_ops {
    pub add: Option<
        unsafe extern "C" fn(
            sum: *mut *mut c_void,
            value: *const c_void,
            ctx: *mut c_void,
        ) -> c_int,
    >,
    pub apply:
        Option<unsafe extern "C" fn(reduction: *const adg_reduction, ctx: *mut c_void) -> c_int>,
    pub release:
        Option<unsafe extern "C" fn(value: *mut c_void, participant: usize, ctx: *mut c_void)>,
    pub ctx: *mut c_void,
    pub add_slice: Option<
        unsafe extern "C" fn(
            sum: *mut c_void,
            value: *const c_void,
            slice: usize,
            n_slices: usize,
            ctx: *mut c_void,
        ) -> c_int,
    >,
}

/// Most slices a parameter may be cut into.
pub const ADG_REDUCER_MAX_SLICES: c_uint = 1024;
/// Most units a round may have.
pub const ADG_REDUCER_MAX_UNITS: usize = 1 << 20;
/// What `adg_reducer_next_unit` gives once every unit is dealt.
pub const ADG_REDUCER_NO_UNIT: usize = usize::MAX;

/// Options of `adg_reducer_new`; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_reducer_options {
    pub size: usize,
    pub n_participants: usize,
    pub n_units: usize,
    pub param_ids: *const u64,
    pub n_params: usize,
    pub ops: adg_reducer_ops,
    pub first_unit: usize,
    pub total_units: usize,
    pub apply_early: c_int,
    pub allocator: adg_allocator,
    pub param_slices: *const usize,
}

extern "C" {
    pub fn adg_reducer_new(
        options: *const adg_reducer_options,
        out: *mut *mut adg_reducer,
    ) -> c_int;
    pub fn adg_reducer_hook(
        reducer: *mut adg_reducer,
        participant: usize,
        options: *mut adg_backward_options,
    ) -> c_int;
    pub fn adg_reducer_give(
        reducer: *mut adg_reducer,
        participant: usize,
        id: u64,
        value: *mut c_void,
    ) -> c_int;
    pub fn adg_reducer_next_unit(
        reducer: *mut adg_reducer,
        participant: usize,
        unit: *mut usize,
    ) -> c_int;
    pub fn adg_reducer_unit_end(
        reducer: *mut adg_reducer,
        participant: usize,
        result: c_int,
    ) -> c_int;
    pub fn adg_reducer_end(reducer: *mut adg_reducer, participant: usize, result: c_int) -> c_int;
}

/// `enum adg_reducer_failure_site`: what failed a round first.
pub type adg_reducer_failure_site = c_uint;
/// The round was applied whole.
pub const ADG_REDUCER_FAILED_NOWHERE: adg_reducer_failure_site = 0;
/// A participant ended its unit or round with an error.
pub const ADG_REDUCER_FAILED_RESULT: adg_reducer_failure_site = 1;
/// `ops.add` (or `add_slice`) folding a parameter's sum.
pub const ADG_REDUCER_FAILED_ADD: adg_reducer_failure_site = 2;
/// `ops.apply` for a parameter.
pub const ADG_REDUCER_FAILED_APPLY: adg_reducer_failure_site = 3;
/// The round ended with units not done.
pub const ADG_REDUCER_FAILED_UNITS: adg_reducer_failure_site = 4;

/// The first failure of a round; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_reducer_failure {
    pub size: usize,
    pub code: c_int,
    pub site: adg_reducer_failure_site,
    pub round: u64,
    pub participant: usize,
    pub param_id: u64,
    pub unit: usize,
    pub step: adg_failure,
}

extern "C" {
    pub fn adg_reducer_unit_end_with(
        reducer: *mut adg_reducer,
        participant: usize,
        failure: *const adg_failure,
    ) -> c_int;
    pub fn adg_reducer_end_with(
        reducer: *mut adg_reducer,
        participant: usize,
        failure: *const adg_failure,
        round: *mut adg_reducer_failure,
    ) -> c_int;
    pub fn adg_reducer_rounds(reducer: *const adg_reducer, rounds: *mut u64) -> c_int;
    pub fn adg_reducer_free(reducer: *mut adg_reducer) -> c_int;
}

// ----------------------------------------------------------- thread pool

/// libadg's own worker threads (opaque).
#[repr(C)]
pub struct adg_pool {
    _private: [u8; 0],
}

/// Options of `adg_pool_new_with`; `size` first (adg.h, "ABI").
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct adg_pool_options {
    pub size: usize,
    pub n_threads: c_uint,
    pub allocator: adg_allocator,
}

extern "C" {
    pub fn adg_pool_new_with(options: *const adg_pool_options, out: *mut *mut adg_pool) -> c_int;
    pub fn adg_pool_new(n_threads: c_uint, out: *mut *mut adg_pool) -> c_int;
    pub fn adg_pool_executor(pool: *mut adg_pool, out: *mut adg_executor) -> c_int;
    pub fn adg_pool_free(pool: *mut adg_pool) -> c_int;
}

// ------------------------------------------------------------ exact sums

/// n float sums kept exactly, whatever the order of their terms (opaque).
#[repr(C)]
pub struct adg_exact {
    _private: [u8; 0],
}

extern "C" {
    pub fn adg_exact_new(n: usize, out: *mut *mut adg_exact) -> c_int;
    pub fn adg_exact_free(sum: *mut adg_exact) -> c_int;
    pub fn adg_exact_length(sum: *const adg_exact, n: *mut usize) -> c_int;
    pub fn adg_exact_clear(sum: *mut adg_exact) -> c_int;
    pub fn adg_exact_add(
        sum: *mut adg_exact,
        first: usize,
        values: *const f32,
        count: usize,
    ) -> c_int;
    pub fn adg_exact_merge(
        sum: *mut adg_exact,
        other: *const adg_exact,
        first: usize,
        count: usize,
    ) -> c_int;
    pub fn adg_exact_round(
        sum: *const adg_exact,
        first: usize,
        out: *mut f32,
        count: usize,
    ) -> c_int;
}

// ------------------------------------------------------------- gradients

extern "C" {
    pub fn adg_grads_get(grads: *const adg_grads, id: u64, value: *mut *mut c_void) -> c_int;
    pub fn adg_grads_take(grads: *mut adg_grads, id: u64, value: *mut *mut c_void) -> c_int;
    pub fn adg_grads_get_node(
        grads: *const adg_grads,
        node: *const adg_node,
        value: *mut *mut c_void,
    ) -> c_int;
    pub fn adg_grads_take_node(
        grads: *mut adg_grads,
        node: *const adg_node,
        value: *mut *mut c_void,
    ) -> c_int;
    pub fn adg_grads_register(grads: *mut adg_grads, id: u64, value: *mut c_void) -> c_int;
    pub fn adg_grads_count(grads: *const adg_grads, count: *mut usize) -> c_int;
    pub fn adg_grads_free(grads: *mut adg_grads) -> c_int;
}
