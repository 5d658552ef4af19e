//! A graph as Graphviz DOT.

use crate::error::{Error, Result};
use crate::gradients::Grad;
use crate::node::Node;
use adg_sys as sys;
use std::any::Any;
use std::ffi::{c_char, c_int, c_void};
use std::io::Write;
use std::panic::AssertUnwindSafe;

struct Sink<'w, W: ?Sized> {
    out: &'w mut W,
    io: Option<std::io::Error>,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn write_text<W: Write + ?Sized>(
    text: *const c_char,
    len: usize,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: ctx is write_dot's Sink; text holds len bytes for the call.
    let sink = unsafe { &mut *ctx.cast::<Sink<'_, W>>() };
    let bytes = unsafe { std::slice::from_raw_parts(text.cast::<u8>(), len) };
    match std::panic::catch_unwind(AssertUnwindSafe(|| sink.out.write_all(bytes))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            sink.io = Some(e);
            sys::ADG_ECALLBACK
        }
        Err(payload) => {
            sink.panic = Some(payload);
            sys::ADG_ETHREW
        }
    }
}

/// Writes the graph `node` is in as Graphviz DOT (`adg_graph_write_dot`;
/// `dot -Tpng` draws it): each op a box labelled with its id, step name
/// and depth, each leaf an ellipse, each consumed op a dashed box, an edge
/// from parent to child per parent slot. The graph is read as it was at
/// one instant; other threads may go on recording meanwhile.
///
/// ```
/// let reg = adg::Registry::<f64>::new()?;
/// let (a, b) = (reg.leaf()?, reg.leaf()?);
/// let y = reg.op_named(c"mul", &[&a, &b], |_| Ok(()))?;
/// let mut text = Vec::new();
/// adg::write_dot(&y, &mut text)?;
/// let text = String::from_utf8(text).unwrap();
/// assert!(text.starts_with("digraph"));
/// assert!(text.contains("mul"));
/// # Ok::<(), adg::Error>(())
/// ```
///
/// Errors: [`EINVAL`](crate::code::EINVAL) (`node` is a leaf: it is in no
/// graph), [`ECONSUMED`](crate::code::ECONSUMED) (its step was consumed),
/// [`ENOMEM`](crate::code::ENOMEM), and [`ECALLBACK`](crate::code::ECALLBACK)
/// with the I/O error as reason when `out` fails. A panic in `out` is
/// resumed once libadg has returned.
pub fn write_dot<T: Grad, W: Write + ?Sized>(node: &Node<'_, T>, out: &mut W) -> Result<()> {
    let mut sink = Sink {
        out,
        io: None,
        panic: None,
    };
    // SAFETY: a live handle; the sink lives across the call.
    let rc = unsafe {
        sys::adg_graph_write_dot(
            node.as_ptr(),
            Some(write_text::<W>),
            std::ptr::from_mut(&mut sink).cast::<c_void>(),
        )
    };
    let error = (rc != 0).then(|| Error::last(rc));
    if let Some(payload) = sink.panic {
        std::panic::resume_unwind(payload);
    }
    match (error, sink.io) {
        (None, _) => Ok(()),
        (Some(_), Some(io)) => Err(Error::new(
            sys::ADG_ECALLBACK,
            format!("write_dot: writing failed: {io}"),
        )),
        (Some(e), None) => Err(e),
    }
}
