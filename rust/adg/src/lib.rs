//! A safe Rust layer over libadg, which records the backward graphs of a
//! reverse-mode autodiff engine and runs backward passes over them, for
//! trainers that run many threads at once.
//!
//! The tensor math is the caller's: libadg sees steps (closures) and
//! gradient values (a [`Grad`] type). A [`Registry`] owns the nodes; a
//! [`Node`] is a counted handle; [`Registry::op`] records a node with its
//! backward step; [`backward()`] runs the steps and returns the leaves'
//! [`Gradients`].
//!
//! ```
//! use adg::Registry;
//!
//! // y = a * b at a = 2, b = 3
//! let reg = Registry::<f64>::new()?;
//! let (a, b) = (reg.leaf()?, reg.leaf()?);
//! let (va, vb) = (2.0, 3.0);
//! let y = reg.op(&[&a, &b], move |call| {
//!     let g = *call.grad().unwrap_or(&0.0);
//!     call.give(0, g * vb)?; // dy/da = b
//!     call.give(1, g * va) // dy/db = a
//! })?;
//! let grads = adg::backward(&y, 1.0)?;
//! assert_eq!(grads.get(&a), Some(&3.0));
//! assert_eq!(grads.get(&b), Some(&2.0));
//! # Ok::<(), adg::Error>(())
//! ```
//!
//! Threads record over one registry at once, each its own graphs, sharing
//! parameters (leaves) that are only read; see `examples/threads.rs`. A
//! [`Pool`] runs one backward's steps on several threads
//! ([`BackwardOptions::executor`]); a [`Reducer`] trains one model on
//! several threads in work units, with the same bits at any thread count
//! (`examples/trainer.rs`); an [`ExactSum`] sums float gradients exactly,
//! the same bits in any order, for work that cannot be cut into units.
//! [`visit`] and [`write_dot`] show a graph.
//!
//! Failures are [`Error`]s: libadg's negative `ADG_E*` code ([`code`]) and
//! the reason the failing call gave. A panic in a step or hook is caught
//! before it reaches C (it never unwinds through libadg), fails the
//! backward as an exception does in adg.hpp, and is resumed on the thread
//! that called [`backward()`] once C has returned.
//!
//! The crate links the libadg that pkg-config finds (`adg-sys`).

#![deny(missing_docs)]
#![warn(unsafe_op_in_unsafe_fn)]

mod backward;
mod blocks;
mod checkpoint;
mod dot;
mod error;
mod exact;
mod gradients;
mod node;
mod panic;
mod pool;
mod reducer;
mod registry;
mod step;
mod value;

pub use backward::{backward, backward_with, BackwardOptions, Ready, StepEvent};
pub use checkpoint::{Checkpoint, Checkpointing, RecomputeCall};
pub use dot::{visit, write_dot, GraphOp, ParentKind};
pub use error::{code, Error, Failure, Result, Site};
pub use exact::ExactSum;
pub use gradients::{Grad, Gradients};
pub use node::Node;
pub use pool::Pool;
pub use reducer::{
    ExactSliceReduction, FailureSite, Reducer, ReducerBuilder, Reduction, RoundError, SliceElem,
    SliceReduction,
};
pub use registry::{Registry, Stats};
pub use step::{Parent, StepCall};

/// docs/guide-rust.md, the guide's Rust page: each of its `rust` blocks is
/// a doctest of this crate, so `cargo test` compiles and runs the page.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide-rust.md")]
pub struct GuideDoctests;

/// The version of the libadg loaded (`adg_version`), `"0.2.0"`: it may be
/// newer than the headers `adg-sys` was written from.
///
/// ```
/// assert!(adg::version().starts_with("0."));
/// ```
pub fn version() -> &'static str {
    // SAFETY: a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(adg_sys::adg_version()) }
        .to_str()
        .unwrap_or("?")
}
