//! Looking at a graph: its ops one by one, or as Graphviz DOT.

use crate::error::{Error, Result};
use crate::gradients::Grad;
use crate::node::Node;
use adg_sys as sys;
use std::any::Any;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
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
    let io = sink.io.map(|io| {
        Error::new(
            sys::ADG_ECALLBACK,
            format!("write_dot: writing failed: {io}"),
        )
    });
    finish(rc, sink.panic, io)
}

/// What a call that ran a Rust callback returns: `rc`'s error (read at
/// once, on this thread), or the callback's own when it stopped the call;
/// a panic the callback caught is resumed instead.
fn finish(rc: c_int, panic: Option<Box<dyn Any + Send>>, callback: Option<Error>) -> Result<()> {
    let error = (rc != 0).then(|| Error::last(rc));
    if let Some(payload) = panic {
        std::panic::resume_unwind(payload);
    }
    match (error, callback) {
        (None, _) => Ok(()),
        (Some(_), Some(mine)) => Err(mine),
        (Some(e), None) => Err(e),
    }
}

/// What a parent of an op is, as [`GraphOp::parents`] tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentKind {
    /// An op not yet consumed, in the same graph (visited before its
    /// children).
    Op,
    /// A leaf: in no graph; its children keep only its id.
    Leaf,
    /// An op whose step a backward has taken.
    Consumed,
}

/// One op of a graph, as [`visit`] shows it: borrowed for the call.
pub struct GraphOp<'a> {
    op: &'a sys::adg_graph_node,
}

impl<'a> GraphOp<'a> {
    /// The graph's id, as [`Node::graph_id`](crate::Node::graph_id) gives
    /// it.
    pub fn graph_id(&self) -> u64 {
        self.op.graph_id
    }

    /// The op's node id ([`Node::id`]).
    pub fn id(&self) -> u64 {
        self.op.id
    }

    /// Its step's name ([`Registry::op_named`](crate::Registry::op_named)),
    /// if it has one.
    pub fn name(&self) -> Option<&'a CStr> {
        // SAFETY: a NUL-terminated name that outlives the visit.
        (!self.op.name.is_null()).then(|| unsafe { CStr::from_ptr(self.op.name) })
    }

    /// 1 + its deepest parent's depth (a leaf's is 0).
    pub fn depth(&self) -> u32 {
        self.op.depth
    }

    /// Its parents in the op's order, repeats kept: each one's node id and
    /// what it is.
    pub fn parents(&self) -> impl ExactSizeIterator<Item = (u64, ParentKind)> + 'a {
        let n = self.op.n_parents;
        // SAFETY: n ids and n kinds, live for the call (C's contract);
        // empty slices when there are none.
        let (ids, kinds) = unsafe {
            if n == 0 {
                (&[][..], &[][..])
            } else {
                (
                    std::slice::from_raw_parts(self.op.parent_ids, n),
                    std::slice::from_raw_parts(self.op.parent_kinds, n),
                )
            }
        };
        ids.iter().zip(kinds).map(|(&id, &kind)| {
            let kind = match sys::adg_parent_kind::from(kind) {
                sys::ADG_PARENT_LEAF => ParentKind::Leaf,
                sys::ADG_PARENT_CONSUMED => ParentKind::Consumed,
                _ => ParentKind::Op,
            };
            (id, kind)
        })
    }
}

impl fmt::Debug for GraphOp<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphOp")
            .field("graph_id", &self.graph_id())
            .field("id", &self.id())
            .field("name", &self.name())
            .field("depth", &self.depth())
            .field("parents", &self.parents().collect::<Vec<_>>())
            .finish()
    }
}

struct Visitor<'f, F> {
    f: &'f mut F,
    error: Option<Error>,
    panic: Option<Box<dyn Any + Send>>,
}

unsafe extern "C" fn visit_op<F: FnMut(&GraphOp<'_>) -> Result<()>>(
    op: *const sys::adg_graph_node,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: ctx is visit's Visitor; op is valid for the call.
    let (visitor, op) = unsafe { (&mut *ctx.cast::<Visitor<'_, F>>(), &*op) };
    match std::panic::catch_unwind(AssertUnwindSafe(|| (visitor.f)(&GraphOp { op }))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            let code = e.c_code();
            visitor.error = Some(e);
            code
        }
        Err(payload) => {
            visitor.panic = Some(payload);
            sys::ADG_ETHREW
        }
    }
}

/// Calls `f` once for each op of the graph `node` is in, not yet consumed
/// (`adg_graph_visit`): by depth, then id, so each op comes after its
/// parents. The graph is read as it was at one instant, from a copy; `f`
/// runs with no lock held and may call libadg, while other threads go on
/// recording. Leaves and consumed ops are in no graph: they show as
/// parents only.
///
/// ```
/// use adg::ParentKind;
///
/// let reg = adg::Registry::<f64>::new()?;
/// let (w, x) = (reg.leaf()?, reg.leaf()?);
/// let y = reg.op_named(c"mul", &[&w, &x], |_| Ok(()))?;
/// let z = reg.op_named(c"tanh", &[&y], |_| Ok(()))?;
/// let mut seen = Vec::new();
/// adg::visit(&z, |op| {
///     let name = op.name().unwrap().to_str().unwrap().to_owned();
///     seen.push((name, op.depth(), op.parents().collect::<Vec<_>>()));
///     Ok(())
/// })?;
/// assert_eq!(
///     seen,
///     [
///         ("mul".to_owned(), 1, vec![(w.id(), ParentKind::Leaf), (x.id(), ParentKind::Leaf)]),
///         ("tanh".to_owned(), 2, vec![(y.id(), ParentKind::Op)]),
///     ]
/// );
/// # Ok::<(), adg::Error>(())
/// ```
///
/// Errors: [`EINVAL`](crate::code::EINVAL) (`node` is a leaf: it is in no
/// graph), [`ECONSUMED`](crate::code::ECONSUMED) (its step was consumed),
/// [`ENOMEM`](crate::code::ENOMEM) (nothing visited), and what `f`
/// returned, which stops the visit. A panic in `f` stops it too and is
/// resumed once libadg has returned.
pub fn visit<T: Grad, F>(node: &Node<'_, T>, mut f: F) -> Result<()>
where
    F: FnMut(&GraphOp<'_>) -> Result<()>,
{
    let mut visitor = Visitor {
        f: &mut f,
        error: None,
        panic: None,
    };
    // SAFETY: a live handle; the visitor lives across the call.
    let rc = unsafe {
        sys::adg_graph_visit(
            node.as_ptr(),
            Some(visit_op::<F>),
            std::ptr::from_mut(&mut visitor).cast::<c_void>(),
        )
    };
    finish(rc, visitor.panic, visitor.error)
}
