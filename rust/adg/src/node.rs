//! Node handles.

use crate::gradients::Grad;
use crate::registry::Registry;
use adg_sys as sys;
use std::ptr::NonNull;

/// One counted reference to a node of a [`Registry`]: a leaf or an op.
///
/// `Clone` takes a reference (`adg_node_ref`), `Drop` releases it
/// (`adg_node_unref`); a node is freed, with its step, when no handle and
/// no node that could still run its step is left. `&Node` is the borrowed
/// form: what [`Registry::op`] takes its parents as, and
/// [`backward()`](crate::backward()) its root, touching no count.
///
/// A node borrows its registry (`'r`), so that the registry outlives every
/// handle without a shared count: threads that record over one registry
/// write no common line for it. `Send + Sync`.
///
/// ```
/// let reg = adg::Registry::<f64>::new()?;
/// let x = reg.leaf()?;
/// let y = reg.op(&[&x], |_| Ok(()))?;
/// let z = y.clone();
/// assert_eq!(z.id(), y.id());
/// assert_ne!(y.graph_id(), 0); // an op is in a graph
/// assert_eq!(x.graph_id(), 0); // a leaf is in none
/// # Ok::<(), adg::Error>(())
/// ```
pub struct Node<'r, T: Grad = f64> {
    raw: NonNull<sys::adg_node>,
    registry: &'r Registry<T>,
}

// SAFETY: handles may move between threads and be used from several at
// once (adg.h); the registry they borrow is Sync.
unsafe impl<T: Grad> Send for Node<'_, T> {}
unsafe impl<T: Grad> Sync for Node<'_, T> {}

impl<'r, T: Grad> Node<'r, T> {
    /// A handle owning the reference `raw` carries.
    ///
    /// # Safety
    /// `raw` is a non-NULL node of `registry` whose one reference the
    /// caller hands over.
    pub(crate) unsafe fn adopt(registry: &'r Registry<T>, raw: *mut sys::adg_node) -> Self {
        Node {
            raw: NonNull::new(raw).expect("libadg returned a node"),
            registry,
        }
    }

    /// The C handle, still this handle's reference.
    pub(crate) fn as_ptr(&self) -> *mut sys::adg_node {
        self.raw.as_ptr()
    }

    /// The node's id (`adg_node_id`): unique in its registry, never 0.
    pub fn id(&self) -> u64 {
        let mut id = 0;
        // SAFETY: a live handle; it cannot fail.
        unsafe { sys::adg_node_id(self.as_ptr(), &mut id) };
        id
    }

    /// The id of the graph the node is in now (`adg_node_graph_id`): 0
    /// for a leaf, or for an op whose step a backward consumed.
    pub fn graph_id(&self) -> u64 {
        let mut id = 0;
        // SAFETY: a live handle; it cannot fail.
        unsafe { sys::adg_node_graph_id(self.as_ptr(), &mut id) };
        id
    }

    /// The registry the node is in.
    pub fn registry(&self) -> &'r Registry<T> {
        self.registry
    }
}

impl<T: Grad> Clone for Node<'_, T> {
    fn clone(&self) -> Self {
        // SAFETY: a live handle; it cannot fail.
        unsafe { sys::adg_node_ref(self.as_ptr()) };
        Node {
            raw: self.raw,
            registry: self.registry,
        }
    }
}

impl<T: Grad> Drop for Node<'_, T> {
    fn drop(&mut self) {
        // SAFETY: this handle's reference. The steps it frees run their
        // release here (a panic in a closure's drop aborts: step.rs).
        unsafe { sys::adg_node_unref(self.as_ptr()) };
    }
}

impl<T: Grad> std::fmt::Debug for Node<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("id", &self.id()).finish()
    }
}
