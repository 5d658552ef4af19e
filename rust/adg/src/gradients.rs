//! Gradient values: the [`Grad`] trait, how values cross C, and
//! [`Gradients`], what a backward returns.

use crate::node::Node;
use crate::panic::{self, Thrown};
use crate::registry::Shared;
use crate::value::{from_c, is_inline, peek_c, with_c_mut, CRef};
use adg_sys as sys;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::ptr::{self, NonNull};

/// A gradient value type: what steps give and backward passes sum.
///
/// Values cross the C API as `Box<T>` raw pointers, but `f64` and `f32`,
/// which travel inline, as their bits, allocating nothing; libadg folds the
/// gradients a node receives with [`Grad::add`], in a fixed order (tape
/// order, then parent slot), so that sums are bitwise the same on every run
/// and at any number of executor workers. Implemented for `f32`, `f64`,
/// `Vec<f32>` and `Vec<f64>`; implement it for a tensor type:
///
/// ```
/// struct Tensor(Vec<f32>);
///
/// impl adg::Grad for Tensor {
///     fn add(&mut self, other: &Self) {
///         for (a, b) in self.0.iter_mut().zip(&other.0) {
///             *a += b;
///         }
///     }
/// }
///
/// let reg = adg::Registry::<Tensor>::new()?;
/// let x = reg.leaf()?;
/// let y = reg.op(&[&x, &x], |call| {
///     let g = call.grad().map_or(0.0, |g| g.0[0]);
///     call.give(0, Tensor(vec![g]))?;
///     call.give(1, Tensor(vec![g]))
/// })?;
/// let grads = adg::backward(&y, Tensor(vec![1.0]))?;
/// assert_eq!(grads.get(&x).unwrap().0, [2.0]);
/// # Ok::<(), adg::Error>(())
/// ```
///
/// `add` may run on any thread of a backward with an executor, hence
/// `Send + Sync`. A panic in it fails the backward, which resumes the
/// panic on the thread that called it.
pub trait Grad: Send + Sync + 'static {
    /// Folds `other` into `self` (`self += other`).
    fn add(&mut self, other: &Self);
}

impl Grad for f64 {
    fn add(&mut self, other: &Self) {
        *self += other;
    }
}

impl Grad for f32 {
    fn add(&mut self, other: &Self) {
        *self += other;
    }
}

/// Element by element; panics when the lengths differ.
impl Grad for Vec<f64> {
    fn add(&mut self, other: &Self) {
        add_slices(self, other);
    }
}

/// Element by element; panics when the lengths differ.
impl Grad for Vec<f32> {
    fn add(&mut self, other: &Self) {
        add_slices(self, other);
    }
}

fn add_slices<E: Copy + std::ops::AddAssign>(sum: &mut [E], other: &[E]) {
    assert_eq!(
        sum.len(),
        other.len(),
        "adg::Grad::add: gradients of different lengths"
    );
    for (s, o) in sum.iter_mut().zip(other) {
        *s += *o;
    }
}

/// `adg_grad_ops.add` over T: folds value into *sum and frees value. A
/// panic is caught here (it never unwinds into C) and kept for the
/// backward, keyed by the call libadg says runs (adg_callback_site).
pub(crate) unsafe extern "C" fn grad_add<T: Grad>(
    sum: *mut *mut c_void,
    value: *mut c_void,
    ctx: *mut c_void,
) -> c_int {
    let caught = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: libadg passes two of the backward's values, both T's;
        // value is ours from the call on, dropped with `other`.
        let other: T = unsafe { from_c(value) };
        unsafe { with_c_mut(sum, |sum: &mut T| sum.add(&other)) };
    }));
    match caught {
        Ok(()) => 0,
        Err(payload) => {
            // SAFETY: ctx is the registry's Shared (Registry::new).
            let shared = unsafe { &*ctx.cast::<Shared>() };
            panic::keep_at_site(&shared.store, Thrown::Panic(payload));
            sys::ADG_ETHREW
        }
    }
}

/// `adg_grad_ops.free` over T. It ignores ctx, so that a container may
/// outlive its registry.
pub(crate) unsafe extern "C" fn grad_free<T: Grad>(value: *mut c_void, _ctx: *mut c_void) {
    // SAFETY: a T libadg hands back to be freed.
    panic::abort_on_panic(|| drop(unsafe { from_c::<T>(value) }));
}

/// The gradients a backward returns: the leaves' it reached (the root's
/// alone when the root is a leaf), by node.
///
/// Owned by one thread at a time: `Send`, not `Sync` (libadg's containers
/// are not to be read concurrently). Dropping it frees every value left.
///
/// ```
/// let reg = adg::Registry::<f64>::new()?;
/// let x = reg.leaf()?;
/// let y = reg.op(&[&x], |call| call.give(0, 3.0))?;
/// let mut grads = adg::backward(&y, 1.0)?;
/// assert_eq!(grads.len(), 1);
/// assert_eq!(grads.get(&x), Some(&3.0));
/// assert_eq!(grads.take(&x), Some(3.0));
/// assert_eq!(grads.get(&x), None);
/// # Ok::<(), adg::Error>(())
/// ```
pub struct Gradients<T: Grad> {
    raw: NonNull<sys::adg_grads>,
    /// Copies of inline values (f64, f32) that get lent out, by node id:
    /// such a value has no address in the container. One per id, freed
    /// when it is taken or with the container.
    copies: RefCell<HashMap<u64, *mut T>>,
    _values: PhantomData<T>,
}

// SAFETY: the container holds T's (T: Send) and libadg lets it move
// between threads; !Sync stays (RefCell), as it must not be used from two
// at once.
unsafe impl<T: Grad> Send for Gradients<T> {}

impl<T: Grad> Gradients<T> {
    /// # Safety
    /// `raw` is a container of boxed T's that the caller hands over.
    pub(crate) unsafe fn from_raw(raw: NonNull<sys::adg_grads>) -> Gradients<T> {
        Gradients {
            raw,
            copies: RefCell::new(HashMap::new()),
            _values: PhantomData,
        }
    }

    /// Lends the value libadg returned for node `id`, which lives until
    /// `&mut self`.
    ///
    /// # Safety
    /// `value` is the container's live value for `id`.
    unsafe fn lend(&self, id: impl FnOnce() -> u64, value: *mut c_void) -> &T {
        // SAFETY: the caller's contract.
        match unsafe { peek_c::<T>(value) } {
            CRef::Boxed(r) => r,
            CRef::Inline(v) => {
                let mut copies = self.copies.borrow_mut();
                let copy = *copies
                    .entry(id())
                    .or_insert_with(|| Box::into_raw(Box::new(v)));
                // SAFETY: freed only by &mut self methods and Drop, after
                // every borrow of self; the container's value for id
                // does not change while self is borrowed.
                unsafe { &*copy }
            }
        }
    }

    /// Frees the lent copy of id's value, which is leaving the container.
    fn forget_copy(&mut self, id: u64) {
        if let Some(copy) = self.copies.get_mut().remove(&id) {
            // SAFETY: made by lend; &mut self: no longer borrowed.
            drop(unsafe { Box::from_raw(copy) });
        }
    }

    /// The C container, still this value's.
    #[allow(dead_code)]
    pub(crate) fn as_ptr(&self) -> *mut sys::adg_grads {
        self.raw.as_ptr()
    }

    /// The gradient of `node`, a node of the registry whose backward made
    /// these; `None` when there is none (or `node` is another registry's).
    pub fn get(&self, node: &Node<'_, T>) -> Option<&T> {
        let mut value = ptr::null_mut();
        // SAFETY: both handles are live; the value stays in the container
        // for as long as &self, as no &mut self call can run meanwhile.
        let rc = unsafe { sys::adg_grads_get_node(self.raw.as_ptr(), node.as_ptr(), &mut value) };
        (rc == 0).then(|| unsafe { self.lend(|| node.id(), value) })
    }

    /// The gradient held for node id `id`; `None` when there is none.
    pub fn get_id(&self, id: u64) -> Option<&T> {
        let mut value = ptr::null_mut();
        // SAFETY: as get.
        let rc = unsafe { sys::adg_grads_get(self.raw.as_ptr(), id, &mut value) };
        (rc == 0).then(|| unsafe { self.lend(|| id, value) })
    }

    /// Takes the gradient of `node` out; `None` when there is none (or
    /// `node` is another registry's).
    pub fn take(&mut self, node: &Node<'_, T>) -> Option<T> {
        let mut value = ptr::null_mut();
        // SAFETY: a taken value is the caller's.
        let rc = unsafe { sys::adg_grads_take_node(self.raw.as_ptr(), node.as_ptr(), &mut value) };
        if rc == 0 && is_inline::<T>() {
            self.forget_copy(node.id());
        }
        (rc == 0).then(|| unsafe { from_c(value) })
    }

    /// Takes the gradient held for node id `id` out; `None` when there is
    /// none.
    pub fn take_id(&mut self, id: u64) -> Option<T> {
        let mut value = ptr::null_mut();
        // SAFETY: as take.
        let rc = unsafe { sys::adg_grads_take(self.raw.as_ptr(), id, &mut value) };
        if rc == 0 && is_inline::<T>() {
            self.forget_copy(id);
        }
        (rc == 0).then(|| unsafe { from_c(value) })
    }

    /// How many gradients are held.
    pub fn len(&self) -> usize {
        let mut n = 0;
        // SAFETY: a live container.
        unsafe { sys::adg_grads_count(self.raw.as_ptr(), &mut n) };
        n
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T: Grad> Drop for Gradients<T> {
    fn drop(&mut self) {
        // SAFETY: ours; frees the values with grad_free::<T>.
        unsafe { sys::adg_grads_free(self.raw.as_ptr()) };
        for (_, copy) in self.copies.get_mut().drain() {
            // SAFETY: made by lend, no longer borrowed.
            drop(unsafe { Box::from_raw(copy) });
        }
    }
}

impl<T: Grad> std::fmt::Debug for Gradients<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gradients")
            .field("len", &self.len())
            .finish()
    }
}
