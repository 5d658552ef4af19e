//! Forward outputs (`adg_op_with`, `adg_output_get`): an op offers its
//! forward value to the steps that will ask for it, kept by libadg until
//! no step needs it, or dropped and rebuilt (checkpointing).

use crate::error::{Error, Result};
use crate::gradients::Grad;
use crate::node::Node;
use crate::panic::{self, Thrown};
use crate::registry::{Registry, Shared};
use crate::step::{self, StepCall};
use adg_sys as sys;
use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::ptr;

/// How libadg holds an output: a thin pointer to a boxed `dyn Any`, so
/// that a step reading it as the wrong type gets an error, not garbage.
type Held = Box<dyn Any + Send + Sync>;

type Rebuild<'r, V> = dyn Fn(&RecomputeCall<'_>) -> Result<V> + Send + Sync + 'r;

/// Which forward outputs a registry keeps for the backward
/// ([`Registry::with_checkpointing`]), as `enum adg_checkpointing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Checkpointing {
    /// Every output an op offers is kept until no backward can want it.
    #[default]
    None,
    /// Outputs of ops marked memory-bound that can be rebuilt are dropped
    /// at once, and rebuilt when a step asks for them.
    Balanced,
}

impl Checkpointing {
    pub(crate) fn to_c(self) -> c_int {
        match self {
            Checkpointing::None => sys::ADG_CHECKPOINT_NONE as c_int,
            Checkpointing::Balanced => sys::ADG_CHECKPOINT_BALANCED as c_int,
        }
    }
}

/// What [`Registry::op_with`] registers beside a step: the forward output
/// the op offers its children's steps (a `V`, kept or rebuilt), and the
/// outputs its own step asks for ([`StepCall::output`]). A builder.
///
/// ```
/// use adg::{Checkpoint, Registry};
///
/// let reg = Registry::<f64>::new()?;
/// let x = reg.leaf()?;
/// let xv = 3.0;
/// // s = x * x, which offers its value; y = relu(s) asks for it.
/// let s = reg.op_with(&[&x, &x], Checkpoint::new().value(xv * xv), move |call| {
///     let g = *call.grad().unwrap_or(&0.0);
///     call.give(0, g * xv)?;
///     call.give(1, g * xv)
/// })?;
/// let y = reg.op_with(&[&s], Checkpoint::<()>::new().want_parent(0), |call| {
///     let sv: &f64 = call.output(call.parent_ids()[0])?;
///     let g = *call.grad().unwrap_or(&0.0);
///     call.give(0, if *sv > 0.0 { g } else { 0.0 })
/// })?;
/// assert_eq!(adg::backward(&y, 1.0)?.get(&x), Some(&6.0));
/// # Ok::<(), adg::Error>(())
/// ```
pub struct Checkpoint<'r, V> {
    value: Option<V>,
    rebuild: Option<Box<Rebuild<'r, V>>>,
    memory_bound: bool,
    want_self: bool,
    want_parents: Vec<u32>,
}

impl<V> Default for Checkpoint<'_, V> {
    fn default() -> Self {
        Checkpoint {
            value: None,
            rebuild: None,
            memory_bound: false,
            want_self: false,
            want_parents: Vec::new(),
        }
    }
}

impl<'r, V: Send + Sync + 'static> Checkpoint<'r, V> {
    /// Offers nothing and asks for nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// The output as the forward computed it, which libadg holds from
    /// then on.
    pub fn value(mut self, value: V) -> Self {
        self.value = Some(value);
        self
    }

    /// Builds the output again from the parents' outputs
    /// ([`RecomputeCall::parent`]), during a backward, on the thread of
    /// the step that asked. An `Err` or a panic fails that step's
    /// [`StepCall::output`] (a panic is resumed by the backward). It
    /// needs every parent that is not a leaf to offer an output.
    pub fn recompute<F>(mut self, rebuild: F) -> Self
    where
        F: Fn(&RecomputeCall<'_>) -> Result<V> + Send + Sync + 'r,
    {
        self.rebuild = Some(Box::new(rebuild));
        self
    }

    /// Cheap to rebuild (an activation, an add): with
    /// [`Checkpointing::Balanced`], an output that can be rebuilt is then
    /// dropped at once.
    pub fn memory_bound(mut self, memory_bound: bool) -> Self {
        self.memory_bound = memory_bound;
        self
    }

    /// The step asks for the op's own output.
    pub fn want_self(mut self) -> Self {
        self.want_self = true;
        self
    }

    /// The step asks for the output of the parent at `slot` (which must
    /// offer one: a leaf offers none).
    pub fn want_parent(mut self, slot: u32) -> Self {
        self.want_parents.push(slot);
        self
    }
}

impl<V> std::fmt::Debug for Checkpoint<'_, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("value", &self.value.is_some())
            .field("recompute", &self.rebuild.is_some())
            .field("memory_bound", &self.memory_bound)
            .field("want_self", &self.want_self)
            .field("want_parents", &self.want_parents)
            .finish()
    }
}

/// What a rebuild ([`Checkpoint::recompute`]) receives: its parents'
/// outputs.
pub struct RecomputeCall<'c> {
    raw: *mut sys::adg_recompute_call,
    _call: PhantomData<&'c mut sys::adg_recompute_call>,
}

impl RecomputeCall<'_> {
    fn call(&self) -> &sys::adg_recompute_call {
        // SAFETY: libadg's call, valid while the rebuild runs.
        unsafe { &*self.raw }
    }

    /// The output of the parent at `slot`, as `U`, the type its op
    /// offered. Errors: [`EINVAL`](crate::code::EINVAL) for a slot out of
    /// range, a leaf's (it has none: capture what the rebuild needs of
    /// leaves) or another type.
    pub fn parent<U: 'static>(&self, slot: usize) -> Result<&U> {
        let c = self.call();
        if slot >= c.n_parents {
            return Err(Error::new(
                sys::ADG_EINVAL,
                format!("RecomputeCall::parent: slot {slot} out of range"),
            ));
        }
        // SAFETY: n_parents outputs, valid during the call.
        let value = unsafe { *c.parent_outputs.add(slot) };
        if value.is_null() {
            return Err(Error::new(
                sys::ADG_EINVAL,
                format!("RecomputeCall::parent: slot {slot} has no output (a leaf?)"),
            ));
        }
        // SAFETY: an output of op_with's, a Held, live during the call.
        downcast(unsafe { &*value.cast::<Held>() }, "RecomputeCall::parent")
    }

    /// The number of parent slots.
    pub fn n_parents(&self) -> usize {
        self.call().n_parents
    }

    /// The id of the node whose output is rebuilt.
    pub fn node_id(&self) -> u64 {
        self.call().node_id
    }
}

fn downcast<'a, U: 'static>(held: &'a Held, what: &str) -> Result<&'a U> {
    held.downcast_ref::<U>().ok_or_else(|| {
        Error::new(
            sys::ADG_EINVAL,
            format!("{what}: the output is not a {}", std::any::type_name::<U>()),
        )
    })
}

thread_local! {
    /// What a rebuild left on the thread whose StepCall::output ran it: a
    /// recompute callback reports a code only (adg.hpp's rebuild_thrown).
    static REBUILD_FAILED: RefCell<Option<Thrown>> = const { RefCell::new(None) };
}

/// A step's closure with its output's rebuild, which libadg hands the
/// step's user pointer (adg_recompute_fn).
struct CkptClosure<F, R> {
    step: F,
    shared: *const Shared,
    rebuild: Option<R>,
}

unsafe extern "C" fn run<T: Grad, F, R>(call: *mut sys::adg_step_call, user: *mut c_void) -> c_int
where
    F: Fn(&mut StepCall<'_, T>) -> Result<()>,
{
    // SAFETY: user is the CkptClosure registered with this step; the
    // registry's Shared outlives its steps.
    let closure = unsafe { &*user.cast::<CkptClosure<F, R>>() };
    unsafe { step::run_step(call, &closure.step, &*closure.shared) }
}

unsafe extern "C" fn release<F, R>(user: *mut c_void) {
    // SAFETY: the Box op_with made.
    panic::abort_on_panic(|| drop(unsafe { Box::from_raw(user.cast::<CkptClosure<F, R>>()) }));
}

unsafe extern "C" fn rebuild<F, R, V>(
    call: *mut sys::adg_recompute_call,
    user: *mut c_void,
) -> c_int
where
    R: Fn(&RecomputeCall<'_>) -> Result<V>,
    V: Send + Sync + 'static,
{
    // SAFETY: user is the step's CkptClosure.
    let closure = unsafe { &*user.cast::<CkptClosure<F, R>>() };
    let f = closure.rebuild.as_ref().expect("recompute set");
    let rc = RecomputeCall {
        raw: call,
        _call: PhantomData,
    };
    let (code, thrown) = match std::panic::catch_unwind(AssertUnwindSafe(|| f(&rc))) {
        Ok(Ok(v)) => {
            // SAFETY: libadg's call; the output is libadg's from here on.
            unsafe { (*call).output = hold(v) };
            return 0;
        }
        Ok(Err(e)) => (e.c_code(), Thrown::Error(e)),
        Err(payload) => (sys::ADG_ETHREW, Thrown::Panic(payload)),
    };
    REBUILD_FAILED.with(|r| *r.borrow_mut() = Some(thrown));
    code
}

fn hold<V: Send + Sync + 'static>(value: V) -> *mut c_void {
    let held: Held = Box::new(value);
    Box::into_raw(Box::new(held)).cast()
}

unsafe extern "C" fn free_output(value: *mut c_void, _ctx: *mut c_void) {
    // SAFETY: a Held of hold's, libadg's to free.
    panic::abort_on_panic(|| drop(unsafe { Box::from_raw(value.cast::<Held>()) }));
}

/// StepCall::output: the output of node `id` (the step's own or a
/// parent's), as V, rebuilt first if it has to be.
pub(crate) fn output<'s, V: 'static>(call: *mut sys::adg_step_call, id: u64) -> Result<&'s V> {
    REBUILD_FAILED.with(|r| r.borrow_mut().take());
    let mut value = ptr::null_mut();
    // SAFETY: a step's call, during the step.
    let rc = unsafe { sys::adg_output_get(call, id, &mut value) };
    if rc != 0 {
        let e = Error::last(rc);
        return match REBUILD_FAILED.with(|r| r.borrow_mut().take()) {
            Some(Thrown::Panic(payload)) => std::panic::resume_unwind(payload),
            Some(Thrown::Error(inner)) => Err(Error::new(
                rc,
                format!("{}: {}", e.reason(), inner.reason()),
            )),
            _ => Err(e),
        };
    }
    // SAFETY: an output of op_with's, a Held, valid until the step
    // returns (the caller ties 's to its borrow of the call).
    downcast(unsafe { &*value.cast::<Held>() }, "StepCall::output")
}

pub(crate) fn register<'r, T, V, F>(
    registry: &'r Registry<T>,
    parents: &[&Node<'r, T>],
    checkpoint: Checkpoint<'r, V>,
    step: F,
    name: Option<&'static CStr>,
) -> Result<Node<'r, T>>
where
    T: Grad,
    V: Send + Sync + 'static,
    F: Fn(&mut StepCall<'_, T>) -> Result<()> + Send + Sync + 'r,
{
    let Checkpoint {
        value,
        rebuild: rebuild_fn,
        memory_bound,
        want_self,
        want_parents,
    } = checkpoint;
    let offers = value.is_some() || rebuild_fn.is_some();
    let can_rebuild = rebuild_fn.is_some();
    let user = Box::into_raw(Box::new(CkptClosure {
        step,
        shared: registry.shared(),
        rebuild: rebuild_fn,
    }));
    type R<'r, V> = Box<Rebuild<'r, V>>;
    let held = value.map_or(ptr::null_mut(), hold);
    let out = sys::adg_output {
        value: held,
        free: Some(free_output),
        recompute: if can_rebuild {
            Some(rebuild::<F, R<'r, V>, V>)
        } else {
            None
        },
        memory_bound: c_int::from(memory_bound),
        ctx: ptr::null_mut(),
    };
    let options = sys::adg_op_options {
        size: std::mem::size_of::<sys::adg_op_options>(),
        output: if offers { &out } else { ptr::null() },
        want_self: c_int::from(want_self),
        want_parents: want_parents.as_ptr(),
        n_want_parents: want_parents.len(),
        moved: 0,
    };
    let c_step = sys::adg_step {
        backward: Some(run::<T, F, R<'r, V>>),
        release: Some(release::<F, R<'r, V>>),
        user: user.cast(),
        name: name.map_or(ptr::null(), CStr::as_ptr),
    };
    let raw: Vec<*mut sys::adg_node> = parents.iter().map(|p| p.as_ptr()).collect();
    let mut node = ptr::null_mut();
    // SAFETY: live parents; on success libadg owns user and the output,
    // on error both are still ours.
    let rc = unsafe {
        sys::adg_op_with(
            registry.as_ptr(),
            raw.as_ptr(),
            raw.len(),
            &c_step,
            &options,
            &mut node,
        )
    };
    if rc != 0 {
        let e = Error::last(rc);
        // SAFETY: not taken by libadg.
        unsafe {
            drop(Box::from_raw(user));
            if !held.is_null() {
                drop(Box::from_raw(held.cast::<Held>()));
            }
        }
        return Err(e);
    }
    // SAFETY: the one reference adg_op_with hands the caller.
    Ok(unsafe { Node::adopt(registry, node) })
}
