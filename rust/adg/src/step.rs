//! Steps: closures registered with an op, and what they are given.

use crate::blocks;
use crate::error::{check, Error, Result};
use crate::gradients::Grad;
use crate::node::Node;
use crate::panic::{self, Thrown};
use crate::registry::{Registry, Shared};
use crate::value::{from_c, into_c, peek_c, CRef};
use adg_sys as sys;
use std::alloc::Layout;
use std::cell::OnceCell;
use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::ptr;

/// What a step is given when a backward runs it: the node's gradient, and
/// where to give its parents' ([`StepCall::give`]). Valid during the call.
///
/// ```
/// let reg = adg::Registry::<f64>::new()?;
/// let (a, b) = (reg.leaf()?, reg.leaf()?);
/// let (ia, ib) = (a.id(), b.id());
/// let y = reg.op(&[&a, &b], move |call| {
///     assert_eq!(call.n_parents(), 2);
///     assert_eq!(call.parent_ids(), [ia, ib]);
///     assert!(!call.retained());
///     let g = call.take_grad().unwrap_or(0.0);
///     call.give(0, g)?;
///     call.give(1, -g) // y = a - b
/// })?;
/// let grads = adg::backward(&y, 1.0)?;
/// assert_eq!(grads.get(&b), Some(&-1.0));
/// # Ok::<(), adg::Error>(())
/// ```
pub struct StepCall<'c, T: Grad> {
    raw: *mut sys::adg_step_call,
    /// grad()'s copy of an inline gradient (f64, f32), which has no
    /// address of its own.
    unpacked: OnceCell<T>,
    _call: PhantomData<&'c mut sys::adg_step_call>,
}

impl<T: Grad> StepCall<'_, T> {
    fn call(&self) -> &sys::adg_step_call {
        // SAFETY: libadg's call, valid while the step runs.
        unsafe { &*self.raw }
    }

    /// The node's gradient, summed over its children; `None` when no child
    /// gave one.
    pub fn grad(&self) -> Option<&T> {
        let g = self.call().grad;
        if g.is_null() {
            return None;
        }
        // SAFETY: a T of the backward, the step's while it runs, changed
        // only by take_grad (&mut self).
        match unsafe { peek_c::<T>(g) } {
            CRef::Boxed(r) => Some(r),
            CRef::Inline(v) => Some(self.unpacked.get_or_init(|| v)),
        }
    }

    /// Takes the node's gradient: the step owns it (to give it on to a
    /// parent without a copy, say).
    pub fn take_grad(&mut self) -> Option<T> {
        // SAFETY: setting call->grad to NULL takes it (adg_step_call).
        let g = std::mem::replace(unsafe { &mut (*self.raw).grad }, ptr::null_mut());
        self.unpacked.take();
        (!g.is_null()).then(|| unsafe { from_c(g) })
    }

    /// Gives `value`, the gradient for the parent at `slot` (the order of
    /// the op's parents), to the backward (`adg_step_give`). A parent named
    /// in several slots (`x * x`) takes one per slot.
    ///
    /// Errors: [`EINVAL`](crate::code::EINVAL) (a slot out of range or
    /// given twice), the value check's rejection
    /// ([`EVALUE`](crate::code::EVALUE)), [`ENOMEM`](crate::code::ENOMEM).
    /// The value is gone either way. Return the error (`?`): the backward
    /// fails at this step.
    pub fn give(&mut self, slot: usize, value: T) -> Result<()> {
        // SAFETY: a step's call; the value is libadg's from here on.
        check(unsafe { sys::adg_step_give(self.raw, slot, into_c(value)) })
    }

    /// Gives every slot's gradient in one call (`adg_step_give_all`):
    /// `values` yields one per parent slot, in slot order, `None` for a
    /// slot that gets none. Every value is gone whatever happens: given,
    /// or dropped when the call fails, so a step needs no cleanup.
    ///
    /// Errors: [`EINVAL`](crate::code::EINVAL) for a count that is not
    /// [`n_parents`](Self::n_parents) (nothing given) or a slot already
    /// given, the value check's rejection
    /// ([`EVALUE`](crate::code::EVALUE)), [`ENOMEM`](crate::code::ENOMEM);
    /// the slots before the one that failed are given. Return the error
    /// (`?`): the backward fails at this step.
    ///
    /// ```
    /// let reg = adg::Registry::<f64>::new()?;
    /// let (a, b) = (reg.leaf()?, reg.leaf()?);
    /// let y = reg.op(&[&a, &b, &a], |call| {
    ///     let g = call.take_grad().unwrap_or(0.0);
    ///     call.give_all([Some(g), None, Some(2.0 * g)]) // y = a + 2 a
    /// })?;
    /// let grads = adg::backward(&y, 1.0)?;
    /// assert_eq!((grads.get(&a), grads.get(&b)), (Some(&3.0), None));
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn give_all(&mut self, values: impl IntoIterator<Item = Option<T>>) -> Result<()> {
        const INLINE: usize = 8;
        let n = self.n_parents();
        let (mut inline, mut spilled) = ([ptr::null_mut(); INLINE], Vec::new());
        let packed: &mut [*mut c_void] = if n <= INLINE {
            &mut inline[..n]
        } else {
            spilled.resize(n, ptr::null_mut());
            &mut spilled
        };
        let mut values = values.into_iter();
        let mut count = 0;
        for value in values.by_ref().take(n) {
            packed[count] = value.map_or(ptr::null_mut(), into_c);
            count += 1;
        }
        let count = count + values.count(); // the extra ones dropped
        if count != n {
            for &value in packed.iter().filter(|v| !v.is_null()) {
                // SAFETY: made by into_c above and not handed over.
                drop(unsafe { from_c::<T>(value) });
            }
            return Err(Error::new(
                crate::code::EINVAL,
                format!("StepCall::give_all: {count} values for {n} parents"),
            ));
        }
        // SAFETY: a step's call and n values, each NULL or into_c's;
        // libadg owns every one from here on, failing or not.
        check(unsafe { sys::adg_step_give_all(self.raw, packed.as_ptr()) })
    }

    /// The forward output of this node or of a parent (`id`:
    /// [`node_id`](Self::node_id) or one of [`parent_ids`](Self::parent_ids))
    /// that its [`Checkpoint`](crate::Checkpoint) asked for, as `V`, the
    /// type the op offered; rebuilt first if it was dropped
    /// (`adg_output_get`). Borrowed until the step returns.
    ///
    /// Errors: [`EINVAL`](crate::code::EINVAL) (an output the step did not
    /// ask for, or another type), or the rebuild's error. A panic in the
    /// rebuild is resumed here, and then by the backward.
    pub fn output<V: 'static>(&self, id: u64) -> Result<&V> {
        crate::checkpoint::output(self.raw, id)
    }

    /// The number of parent slots.
    pub fn n_parents(&self) -> usize {
        self.call().n_parents
    }

    /// The parents' ids, one per slot, repeats kept.
    pub fn parent_ids(&self) -> &[u64] {
        let c = self.call();
        // SAFETY: n_parents ids, valid during the call.
        unsafe { std::slice::from_raw_parts(c.parent_ids, c.n_parents) }
    }

    /// The id of the node whose step this is.
    pub fn node_id(&self) -> u64 {
        self.call().node_id
    }

    /// Whether the backward is retained: the step stays registered and
    /// may run again, so it keeps what it captured.
    pub fn retained(&self) -> bool {
        self.call().retained != 0
    }

    /// The backward pass running the step: unique in the registry.
    pub fn pass_id(&self) -> u64 {
        self.call().pass_id
    }
}

/// A step's closure, as libadg holds it (adg_step.user).
struct Closure<F> {
    step: F,
    /// Where a failure is kept for the backward; the registry's, which
    /// outlives every step.
    shared: *const Shared,
}

/// adg_step.backward of a closure that libadg holds boxed.
unsafe extern "C" fn run<T: Grad, F>(call: *mut sys::adg_step_call, user: *mut c_void) -> c_int
where
    F: Fn(&mut StepCall<'_, T>) -> Result<()>,
{
    // SAFETY: user is the Closure<F> registered with this step; the
    // registry's Shared outlives its steps.
    let closure = unsafe { &*user.cast::<Closure<F>>() };
    unsafe { run_step(call, &closure.step, &*closure.shared) }
}

/// adg_step.backward of a closure of no size and no drop (one that
/// captures nothing): libadg holds the registry's Shared as user, and the
/// closure, forgotten at registration, is only ever borrowed, so that
/// registering it allocates nothing.
unsafe extern "C" fn run_unsized<T: Grad, F>(
    call: *mut sys::adg_step_call,
    user: *mut c_void,
) -> c_int
where
    F: Fn(&mut StepCall<'_, T>) -> Result<()>,
{
    // SAFETY: F has no size: any aligned pointer is a valid &F (register
    // forgot the one value, so none is dropped). user is the Shared.
    let step = unsafe { std::ptr::NonNull::<F>::dangling().as_ref() };
    unsafe { run_step(call, step, &*user.cast::<Shared>()) }
}

/// Runs a step's closure, catching a panic before it can unwind into C,
/// and keeps the panic (or the step's error) for the backward, by pass and
/// node, as adg.hpp keeps what a step threw.
///
/// # Safety
/// `call` is libadg's call of the running step.
pub(crate) unsafe fn run_step<T: Grad, F>(
    call: *mut sys::adg_step_call,
    step: &F,
    shared: &Shared,
) -> c_int
where
    F: Fn(&mut StepCall<'_, T>) -> Result<()>,
{
    let mut sc = StepCall {
        raw: call,
        unpacked: OnceCell::new(),
        _call: PhantomData,
    };
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| step(&mut sc)));
    let (code, thrown) = match result {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => (e.c_code(), Thrown::Error(e)),
        Err(payload) => (sys::ADG_ETHREW, Thrown::Panic(payload)),
    };
    // SAFETY: libadg's call, valid during the step.
    let (node_id, pass_id) = unsafe { ((*call).node_id, (*call).pass_id) };
    let mut at = panic::sized_failure();
    at.site = sys::ADG_FAILED_STEP;
    at.node_id = node_id;
    at.pass_id = pass_id;
    shared.store.keep(&at, thrown);
    code
}

/// adg_step.release: drops the closure, exactly once. A panic in a
/// captured value's drop aborts: there is no caller to hand it to.
unsafe extern "C" fn release<F>(user: *mut c_void) {
    // SAFETY: the Closure<F> register made.
    panic::abort_on_panic(|| unsafe { free_closure(user.cast::<Closure<F>>()) });
}

/// Drops a closure and gives back its block.
///
/// # Safety
/// `user` is a live `Closure<F>` of register's, used no more.
unsafe fn free_closure<F>(user: *mut Closure<F>) {
    /// Gives the block back even when the closure's drop panics.
    struct Block(*mut u8, Layout);
    impl Drop for Block {
        fn drop(&mut self) {
            // SAFETY: the block allocate gave, its value dropped.
            unsafe { blocks::release(self.0, self.1) };
        }
    }
    let _block = Block(user.cast(), Layout::new::<Closure<F>>());
    // SAFETY: the caller's contract.
    unsafe { ptr::drop_in_place(user) };
}

/// The parents' C handles: on the stack for up to 8, the common case.
fn with_raw_parents<T: Grad, R>(
    parents: &[&Node<'_, T>],
    f: impl FnOnce(&[*mut sys::adg_node]) -> R,
) -> R {
    const INLINE: usize = 8;
    if parents.len() <= INLINE {
        let mut raw = [ptr::null_mut(); INLINE];
        for (r, p) in raw.iter_mut().zip(parents) {
            *r = p.as_ptr();
        }
        f(&raw[..parents.len()])
    } else {
        let raw: Vec<_> = parents.iter().map(|p| p.as_ptr()).collect();
        f(&raw)
    }
}

pub(crate) fn register<'r, T, F>(
    registry: &'r Registry<T>,
    parents: &[&Node<'r, T>],
    step: F,
    name: Option<&'static CStr>,
) -> Result<Node<'r, T>>
where
    T: Grad,
    F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
{
    register_by(registry, step, name, |c_step| {
        create(registry, parents, c_step)
    })
}

/// register with parents moved in where they say so (`adg_op_moving`).
pub(crate) fn register_moving<'r, T, F, const N: usize>(
    registry: &'r Registry<T>,
    parents: [Parent<'_, 'r, T>; N],
    step: F,
    name: Option<&'static CStr>,
) -> Result<Node<'r, T>>
where
    T: Grad,
    F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
{
    register_by(registry, step, name, |c_step| {
        create_moving(registry, parents, c_step)
    })
}

/// step as an adg_step, handed to create, which makes the node; the
/// closure is freed here if create fails.
fn register_by<'r, T, F>(
    registry: &'r Registry<T>,
    step: F,
    name: Option<&'static CStr>,
    create: impl FnOnce(&sys::adg_step) -> Result<Node<'r, T>>,
) -> Result<Node<'r, T>>
where
    T: Grad,
    F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
{
    let name = name.map_or(ptr::null(), CStr::as_ptr);
    let shared: *const Shared = registry.shared();
    if std::mem::size_of::<F>() == 0 && !std::mem::needs_drop::<F>() {
        std::mem::forget(step); /* borrowed from nothing by run_unsized */
        let c_step = sys::adg_step {
            backward: Some(run_unsized::<T, F>),
            release: None,
            user: shared.cast_mut().cast(),
            name,
        };
        return create(&c_step);
    }
    let layout = Layout::new::<Closure<F>>();
    let user = blocks::allocate(layout).cast::<Closure<F>>();
    // SAFETY: fresh memory for a Closure<F>.
    unsafe { user.write(Closure { step, shared }) };
    let c_step = sys::adg_step {
        backward: Some(run::<T, F>),
        release: Some(release::<F>),
        user: user.cast(),
        name,
    };
    create(&c_step).inspect_err(|_| {
        // SAFETY: not taken by libadg: ours to free.
        unsafe { free_closure(user) };
    })
}

/// adg_op: a node of registry's with c_step.
fn create<'r, T: Grad>(
    registry: &'r Registry<T>,
    parents: &[&Node<'r, T>],
    c_step: &sys::adg_step,
) -> Result<Node<'r, T>> {
    let mut out = ptr::null_mut();
    // SAFETY: the parents are live handles (borrowed for the call); on
    // success libadg owns user, on error nothing was called and it is ours.
    let rc = with_raw_parents(parents, |raw| unsafe {
        sys::adg_op(registry.as_ptr(), raw.as_ptr(), raw.len(), c_step, &mut out)
    });
    if rc != 0 {
        return Err(Error::last(rc));
    }
    // SAFETY: the one reference adg_op hands the caller.
    Ok(unsafe { Node::adopt(registry, out) })
}

/// A parent of [`Registry::op_moving`]: a node borrowed for the call, or
/// a node moved in, whose reference becomes the new node's.
///
/// `From` makes one of either: `(&x).into()` borrows, `x.into()` moves.
pub enum Parent<'a, 'r, T: Grad> {
    /// Borrowed for the call, as [`Registry::op`] takes every parent.
    Borrowed(&'a Node<'r, T>),
    /// Moved in: its reference is the new node's, without the count's
    /// increment and the handle's decrement that borrowing and then
    /// dropping it would cost.
    Moved(Node<'r, T>),
}

impl<'a, 'r, T: Grad> From<&'a Node<'r, T>> for Parent<'a, 'r, T> {
    fn from(node: &'a Node<'r, T>) -> Self {
        Parent::Borrowed(node)
    }
}

impl<'r, T: Grad> From<Node<'r, T>> for Parent<'_, 'r, T> {
    fn from(node: Node<'r, T>) -> Self {
        Parent::Moved(node)
    }
}

impl<'r, T: Grad> Parent<'_, 'r, T> {
    fn node(&self) -> &Node<'r, T> {
        match self {
            Parent::Borrowed(node) => node,
            Parent::Moved(node) => node,
        }
    }
}

/// adg_op_moving: a node of registry's with c_step, taking over the
/// references of the moved parents among the first 64 (the width of
/// libadg's mask); the others are dropped as borrowed ones would be. On
/// error libadg took nothing, and every moved handle is dropped here.
fn create_moving<'r, T: Grad, const N: usize>(
    registry: &'r Registry<T>,
    parents: [Parent<'_, 'r, T>; N],
    c_step: &sys::adg_step,
) -> Result<Node<'r, T>> {
    let raw: [*mut sys::adg_node; N] = std::array::from_fn(|i| parents[i].node().as_ptr());
    let moved = parents
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, p)| matches!(p, Parent::Moved(_)))
        .fold(0u64, |mask, (i, _)| mask | 1 << i);
    let mut out = ptr::null_mut();
    // SAFETY: the parents are live handles for the call; on success
    // libadg owns user and the references of moved's bits, on error
    // nothing was called or taken.
    let rc =
        unsafe { sys::adg_op_moving(registry.as_ptr(), raw.as_ptr(), N, moved, c_step, &mut out) };
    if rc != 0 {
        return Err(Error::last(rc));
    }
    for (i, parent) in parents.into_iter().enumerate() {
        match parent {
            Parent::Moved(node) if i < 64 => std::mem::forget(node), // the new node's now
            _ => {} // borrowed, or past the mask: dropped as a borrowed one
        }
    }
    // SAFETY: the one reference adg_op_moving hands the caller.
    Ok(unsafe { Node::adopt(registry, out) })
}
