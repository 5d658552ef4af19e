//! Running a backward: its options and hooks, and carrying what failed it
//! back to the caller.

use crate::error::{Error, Result};
use crate::gradients::{Grad, Gradients};
use crate::node::Node;
use crate::panic::{self, Store, Thrown};
use crate::value::{from_c, into_c, is_inline, peek_c};
use adg_sys as sys;
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::panic::AssertUnwindSafe;
use std::ptr::{self, NonNull};

type ReadyHook<'o, T> = dyn Fn(&mut Ready<'_, T>) -> Result<()> + Send + Sync + 'o;
type ValueCheck<'o, T> = dyn Fn(&T) -> bool + Send + Sync + 'o;
type StepHook<'o> = dyn Fn(&StepEvent) -> Result<()> + Send + Sync + 'o;
type ExtendFn<'o> = dyn Fn(&mut sys::adg_backward_options) -> Result<()> + Send + Sync + 'o;

/// An executor's C struct, which libadg copies and calls from any thread.
#[derive(Clone, Copy)]
struct CExecutor(sys::adg_executor);

// SAFETY: set_executor's contract: submit may be called from any thread at
// once, and ctx lives as long as the options ('o).
unsafe impl Send for CExecutor {}
unsafe impl Sync for CExecutor {}

/// How a backward runs ([`backward_with`]): retained or consuming, its
/// hooks, the value check. A builder; `BackwardOptions::new()` is what
/// [`backward()`] runs with.
///
/// ```
/// use adg::BackwardOptions;
///
/// let reg = adg::Registry::<f64>::new()?;
/// let x = reg.leaf()?;
/// let y = reg.op(&[&x], |call| call.give(0, 2.0))?;
/// let o = BackwardOptions::new().retain(true);
/// for _ in 0..2 {
///     let grads = adg::backward_with(&y, 1.0, &o)?;
///     assert_eq!(grads.get(&x), Some(&2.0));
/// }
/// # Ok::<(), adg::Error>(())
/// ```
pub struct BackwardOptions<'o, T: Grad> {
    retain: bool,
    leaves_only: bool,
    on_ready: Option<Box<ReadyHook<'o, T>>>,
    value_check: Option<Box<ValueCheck<'o, T>>>,
    on_step: Option<Box<StepHook<'o>>>,
    executor: Option<CExecutor>,
    extend: Option<Box<ExtendFn<'o>>>,
    _borrows: PhantomData<&'o ()>,
}

impl<T: Grad> Default for BackwardOptions<'_, T> {
    fn default() -> Self {
        BackwardOptions {
            retain: false,
            leaves_only: false,
            on_ready: None,
            value_check: None,
            on_step: None,
            executor: None,
            extend: None,
            _borrows: PhantomData,
        }
    }
}

impl<'o, T: Grad> BackwardOptions<'o, T> {
    /// A consuming backward on the calling thread, with no hook: what
    /// [`backward()`] runs.
    pub fn new() -> Self {
        Self::default()
    }

    /// A retained backward (`retain`): it runs the steps it reaches but
    /// takes none, so later passes, retained or not, run them again; the
    /// graph is unchanged. Retained passes over one graph may run at once
    /// on several threads (a step then runs concurrently with itself).
    pub fn retain(mut self, retain: bool) -> Self {
        self.retain = retain;
        self
    }

    /// Calls `hook` once for each node whose gradient has become final
    /// (`on_ready`), with its id and gradient, which the hook may read,
    /// change in place or take ([`Ready`]): a trainer's parameter update
    /// or all-reduce, started while the rest of the backward runs. With an
    /// executor it runs on the worker that finished the gradient,
    /// concurrently with other calls. An `Err` or a panic stops the
    /// backward as a failing step does (a panic is resumed by the
    /// backward).
    ///
    /// ```
    /// use std::sync::Mutex;
    ///
    /// let reg = adg::Registry::<f64>::new()?;
    /// let w = reg.leaf()?;
    /// let y = reg.op(&[&w], |call| call.give(0, 0.5))?;
    /// let seen = Mutex::new(Vec::new());
    /// let o = adg::BackwardOptions::new().leaves_only(true).on_ready(|r| {
    ///     seen.lock().unwrap().push((r.id(), r.take()));
    ///     Ok(())
    /// });
    /// let grads = adg::backward_with(&y, 1.0, &o)?;
    /// assert_eq!(*seen.lock().unwrap(), [(w.id(), Some(0.5))]);
    /// assert!(grads.is_empty()); // the hook took it
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn on_ready<F>(mut self, hook: F) -> Self
    where
        F: Fn(&mut Ready<'_, T>) -> Result<()> + Send + Sync + 'o,
    {
        self.on_ready = Some(Box::new(hook));
        self
    }

    /// Calls the ready hook for leaves only (a trainer's parameters).
    pub fn leaves_only(mut self, leaves_only: bool) -> Self {
        self.leaves_only = leaves_only;
        self
    }

    /// Anomaly detection, the value check (`value_check`): `check` sees
    /// every gradient a step gives, on the step's thread, before libadg
    /// takes it, and returns false to reject it. The step's
    /// [`give`](crate::StepCall::give) then fails, and the backward fails
    /// at that step with [`EVALUE`](crate::code::EVALUE), whatever the
    /// step returns; the error's [`failure`](Error::failure) names the
    /// step ([`Site::Check`](crate::Site::Check), its node and name). A
    /// panic in the check fails it the same way and is resumed by the
    /// backward. Without a check a backward pays nothing for it.
    ///
    /// ```
    /// use adg::{code, BackwardOptions, Site};
    ///
    /// let reg = adg::Registry::<f64>::new()?;
    /// let x = reg.leaf()?;
    /// let y = reg.op_named(c"log", &[&x], |call| call.give(0, f64::NAN))?;
    /// let o = BackwardOptions::new().value_check(|g: &f64| g.is_finite());
    /// let e = adg::backward_with(&y, 1.0, &o).unwrap_err();
    /// assert_eq!(e.code(), code::EVALUE);
    /// let at = e.failure().unwrap();
    /// assert_eq!((at.site, at.node_id), (Site::Check, y.id()));
    /// assert_eq!(at.name.as_deref(), Some("log"));
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn value_check<F>(mut self, check: F) -> Self
    where
        F: Fn(&T) -> bool + Send + Sync + 'o,
    {
        self.value_check = Some(Box::new(check));
        self
    }

    /// Calls `hook` before and after each step (`on_step`), on the thread
    /// that runs it: a profile, a timeline of a threaded backward. An
    /// `Err` or a panic stops the backward as a failing step at that
    /// position would ([`Site::OnStep`](crate::Site::OnStep)).
    ///
    /// ```
    /// use std::sync::Mutex;
    ///
    /// let reg = adg::Registry::<f64>::new()?;
    /// let x = reg.leaf()?;
    /// let y = reg.op_named(c"relu", &[&x], |call| call.give(0, 1.0))?;
    /// let seen = Mutex::new(Vec::new());
    /// let o = adg::BackwardOptions::new().on_step(|e| {
    ///     seen.lock().unwrap().push((e.name, e.after, e.result));
    ///     Ok(())
    /// });
    /// adg::backward_with(&y, 1.0, &o)?;
    /// let seen = seen.lock().unwrap();
    /// assert_eq!(*seen, [(Some("relu"), false, 0), (Some("relu"), true, 0)]);
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn on_step<F>(mut self, hook: F) -> Self
    where
        F: Fn(&StepEvent) -> Result<()> + Send + Sync + 'o,
    {
        self.on_step = Some(Box::new(hook));
        self
    }

    /// Runs the backward's steps on the calling thread and `executor`'s
    /// workers (`adg_backward_options.executor`, copied).
    ///
    /// # Safety
    /// `executor.submit` may be called from any thread, concurrently with
    /// itself, and `executor.ctx` stays valid for `'o`.
    #[allow(dead_code)]
    pub(crate) unsafe fn set_executor(&mut self, executor: sys::adg_executor) {
        self.executor = Some(CExecutor(executor));
    }

    /// The last word on the C options a backward is given, for a layer
    /// over this one (the reducer installs its ready hook with it, as
    /// adg.hpp's `extend_c_options`): `f` runs after this layer has set its
    /// own hooks, and may change the options (chaining a hook it finds) or
    /// fail, which fails the backward before it starts (the seed dropped).
    /// One per options: a second replaces the first.
    #[allow(dead_code)]
    pub(crate) fn extend_c_options<F>(&mut self, f: F)
    where
        F: Fn(&mut sys::adg_backward_options) -> Result<()> + Send + Sync + 'o,
    {
        self.extend = Some(Box::new(f));
    }

    /// The C options of one backward call: `pass` is its hooks' ctx.
    fn c_options(
        &self,
        pass: &Pass<'_, 'o, T>,
        failure: &mut sys::adg_failure,
        executor: &sys::adg_executor,
    ) -> Result<sys::adg_backward_options> {
        let ctx = ptr::from_ref(pass).cast_mut().cast::<c_void>();
        let mut o = sys::adg_backward_options {
            size: std::mem::size_of::<sys::adg_backward_options>(),
            on_ready: None,
            on_ready_ctx: ptr::null_mut(),
            leaves_only: c_int::from(self.leaves_only),
            executor: match self.executor {
                Some(_) => executor,
                None => ptr::null(),
            },
            on_step: None,
            on_step_ctx: ptr::null_mut(),
            retain: c_int::from(self.retain),
            failure,
            value_check: None,
            value_check_ctx: ptr::null_mut(),
        };
        if self.on_ready.is_some() {
            o.on_ready = Some(ready::<T>);
            o.on_ready_ctx = ctx;
        }
        if self.value_check.is_some() {
            o.value_check = Some(check::<T>);
            o.value_check_ctx = ctx;
        }
        if self.on_step.is_some() {
            o.on_step = Some(step_event::<T>);
            o.on_step_ctx = ctx;
        }
        if let Some(extend) = &self.extend {
            extend(&mut o)?;
        }
        Ok(o)
    }
}

impl<T: Grad> std::fmt::Debug for BackwardOptions<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackwardOptions")
            .field("retain", &self.retain)
            .field("leaves_only", &self.leaves_only)
            .field("on_ready", &self.on_ready.is_some())
            .field("value_check", &self.value_check.is_some())
            .field("on_step", &self.on_step.is_some())
            .field("executor", &self.executor.is_some())
            .finish()
    }
}

/// A gradient the ready hook sees ([`BackwardOptions::on_ready`]),
/// borrowed for the hook's call.
pub struct Ready<'h, T: Grad> {
    id: u64,
    slot: *mut *mut c_void,
    /// An inline gradient (f64, f32), unpacked for the hook and packed
    /// back into the slot after it.
    unpacked: Option<T>,
    _grad: PhantomData<&'h mut T>,
}

impl<T: Grad> Ready<'_, T> {
    /// The node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The gradient; `None` when none arrived (or it was taken).
    pub fn grad(&self) -> Option<&T> {
        if is_inline::<T>() {
            return self.unpacked.as_ref();
        }
        // SAFETY: on_ready's *grad: a boxed T or NULL, the hook's to use.
        let g = unsafe { *self.slot };
        (!g.is_null()).then(|| unsafe { &*g.cast::<T>() })
    }

    /// The gradient, to change in place.
    pub fn grad_mut(&mut self) -> Option<&mut T> {
        if is_inline::<T>() {
            return self.unpacked.as_mut();
        }
        // SAFETY: as grad; &mut self is the one borrow.
        let g = unsafe { *self.slot };
        (!g.is_null()).then(|| unsafe { &mut *g.cast::<T>() })
    }

    /// Takes the gradient: it leaves the backward (a leaf's is then not in
    /// the [`Gradients`]; an op's step gets none).
    pub fn take(&mut self) -> Option<T> {
        // SAFETY: setting *grad to NULL hands it to the hook (adg_ready_fn).
        let g = std::mem::replace(unsafe { &mut *self.slot }, ptr::null_mut());
        if is_inline::<T>() {
            return self.unpacked.take();
        }
        (!g.is_null()).then(|| unsafe { from_c(g) })
    }
}

/// What the step hook ([`BackwardOptions::on_step`]) is told about one
/// step (`adg_step_event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepEvent {
    /// The node whose step it is.
    pub node_id: u64,
    /// The step's name ([`Registry::op_named`](crate::Registry::op_named)).
    pub name: Option<&'static str>,
    /// false: the step is about to run; true: it has returned.
    pub after: bool,
    /// After: how long the step ran (the hook's own time not counted);
    /// zero before.
    pub duration: std::time::Duration,
    /// After: what the step returned, 0 or its negative code; 0 before.
    pub result: i32,
}

unsafe extern "C" fn step_event<T: Grad>(
    event: *const sys::adg_step_event,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: ctx is this call's Pass; event is libadg's, for the call.
    let pass = unsafe { &*ctx.cast::<Pass<'_, '_, T>>() };
    let e = unsafe { &*event };
    let hook = pass.options.on_step.as_ref().expect("set with on_step");
    let name = (!e.name.is_null())
        // SAFETY: a step's name is a static C string (adg_step.name).
        .then(|| unsafe { std::ffi::CStr::from_ptr(e.name) }.to_str().ok())
        .flatten();
    let event = StepEvent {
        node_id: e.node_id,
        name,
        after: e.after != 0,
        duration: std::time::Duration::from_nanos(e.duration_ns),
        result: e.result,
    };
    let at = || {
        let mut at = panic::sized_failure();
        at.site = sys::ADG_FAILED_ON_STEP;
        at.node_id = event.node_id;
        at
    };
    guarded(&pass.hooks, at, || hook(&event))
}

/// One backward call's hooks and what they left. On the backward's stack:
/// every hook has returned when the backward returns.
struct Pass<'a, 'o, T: Grad> {
    options: &'a BackwardOptions<'o, T>,
    hooks: Store,
}

/// Runs a hook's body, keeping an `Err` or a panic by `at` and returning
/// the code C sees.
fn guarded(
    hooks: &Store,
    at: impl Fn() -> sys::adg_failure,
    f: impl FnOnce() -> Result<()>,
) -> c_int {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            let code = e.c_code();
            hooks.keep(&at(), Thrown::Error(e));
            code
        }
        Err(payload) => {
            hooks.keep(&at(), Thrown::Panic(payload));
            sys::ADG_ETHREW
        }
    }
}

unsafe extern "C" fn ready<T: Grad>(id: u64, grad: *mut *mut c_void, ctx: *mut c_void) -> c_int {
    // SAFETY: ctx is this call's Pass (c_options), alive while C runs.
    let pass = unsafe { &*ctx.cast::<Pass<'_, '_, T>>() };
    let hook = pass.options.on_ready.as_ref().expect("set with on_ready");
    let at = || {
        // A hook is this call's alone: keyed by site and node (pass 0).
        let mut at = panic::sized_failure();
        at.site = sys::ADG_FAILED_ON_READY;
        at.node_id = id;
        at
    };
    guarded(&pass.hooks, at, || {
        // SAFETY: *grad is NULL or a T of the backward, the hook's.
        let g = unsafe { *grad };
        let unpacked = (is_inline::<T>() && !g.is_null()).then(|| unsafe { from_c(g) });
        let mut r = Ready {
            id,
            slot: grad,
            unpacked,
            _grad: PhantomData,
        };
        let result = hook(&mut r);
        if let Some(v) = r.unpacked.take() {
            // SAFETY: an inline value, packed back where it was.
            unsafe { *grad = into_c(v) };
        }
        result
    })
}

/// A rejection is kept by the step that gave the value, which a check is
/// not told: libadg says (adg_callback_site). A false is kept too, so
/// that a later check's panic does not stand for the step's first
/// rejection, whose code is the backward's.
unsafe extern "C" fn check<T: Grad>(value: *const c_void, ctx: *mut c_void) -> c_int {
    // SAFETY: ctx is this call's Pass; value a T being given.
    let pass = unsafe { &*ctx.cast::<Pass<'_, '_, T>>() };
    let value = unsafe { peek_c::<T>(value) };
    let f = pass
        .options
        .value_check
        .as_ref()
        .expect("set with value_check");
    match std::panic::catch_unwind(AssertUnwindSafe(|| f(&value))) {
        Ok(true) => 0,
        Ok(false) => {
            panic::keep_at_site(&pass.hooks, Thrown::Rejected);
            sys::ADG_EVALUE
        }
        Err(payload) => {
            panic::keep_at_site(&pass.hooks, Thrown::Panic(payload));
            sys::ADG_ETHREW
        }
    }
}

/// Runs a consuming backward from `root` with `seed` as its gradient, on
/// the calling thread, and returns the leaves' gradients.
///
/// ```
/// let reg = adg::Registry::<f64>::new()?;
/// let x = reg.leaf()?;
/// let y = reg.op(&[&x], |call| call.give(0, 4.0))?;
/// let grads = adg::backward(&y, 0.5)?; // the seed: dL/dy
/// assert_eq!(grads.get(&x), Some(&4.0));
/// # Ok::<(), adg::Error>(())
/// ```
///
/// Errors: [`ECONSUMED`](crate::code::ECONSUMED) (the root's step ran in an
/// earlier consuming backward), [`EUNAVAILABLE`](crate::code::EUNAVAILABLE),
/// [`ENOMEM`](crate::code::ENOMEM), or the error a step returned, with the
/// step named ([`Error::failure`]).
///
/// # Panics
/// Resumes the panic of a step (or of [`Grad::add`]) that failed the
/// backward, on this thread, once libadg has returned: what the panicking
/// step held is dropped, steps not run are released, and the registry
/// stays usable.
pub fn backward<T: Grad>(root: &Node<'_, T>, seed: T) -> Result<Gradients<T>> {
    backward_with(root, seed, &BackwardOptions::new())
}

/// [`backward()`] with options: retained, hooks, the value check, an
/// executor.
///
/// Errors and panics: those of [`backward()`], and a hook's or the value
/// check's (resumed as a step's are).
pub fn backward_with<T: Grad>(
    root: &Node<'_, T>,
    seed: T,
    options: &BackwardOptions<'_, T>,
) -> Result<Gradients<T>> {
    let mut failure = panic::sized_failure();
    backward_reporting(root, seed, options, &mut failure)
}

/// [`backward_with`] that also fills `failure` with libadg's account of
/// the result (adg_backward_options.failure): what a layer over this one
/// hands on (the reducer's adg_reducer_unit_end_with). A panic is still
/// resumed, after `failure` is filled.
pub(crate) fn backward_reporting<T: Grad>(
    root: &Node<'_, T>,
    seed: T,
    options: &BackwardOptions<'_, T>,
    failure: &mut sys::adg_failure,
) -> Result<Gradients<T>> {
    let registry = root.registry();
    let pass = Pass {
        options,
        hooks: Store::default(),
    };
    *failure = panic::sized_failure();
    let executor = options.executor.map_or(
        sys::adg_executor {
            submit: None,
            ctx: ptr::null_mut(),
            n_workers: 0,
        },
        |e| e.0,
    );
    let c = options.c_options(&pass, failure, &executor)?;
    let mut out = ptr::null_mut();
    // SAFETY: live handles; NULL ops: the registry's, T's. The seed is
    // libadg's from the call on (freed by it on error).
    let rc = unsafe {
        sys::adg_backward_with(
            registry.as_ptr(),
            root.as_ptr(),
            into_c(seed),
            ptr::null(),
            &c,
            &mut out,
        )
    };
    let steps = &registry.shared().store;
    if rc != 0 {
        let reason = Error::last(rc).reason().to_string();
        return Err(panic::rethrow(
            rc,
            reason,
            failure,
            steps,
            Some(&pass.hooks),
        ));
    }
    steps.drop_pass(failure.pass_id);
    let out = NonNull::new(out).expect("adg_backward_with returned gradients");
    // SAFETY: the container of this backward, of T's, now ours.
    Ok(unsafe { Gradients::from_raw(out) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{code, Registry, Site};
    use std::panic::catch_unwind;

    /// An executor that runs each submitted job on a thread of its own.
    unsafe extern "C" fn spawn(
        f: Option<unsafe extern "C" fn(*mut c_void)>,
        arg: *mut c_void,
        _ctx: *mut c_void,
    ) -> c_int {
        struct Job(unsafe extern "C" fn(*mut c_void), *mut c_void);
        // SAFETY: libadg's job may run on any thread.
        unsafe impl Send for Job {}
        let job = Job(f.expect("a job"), arg);
        std::thread::spawn(move || {
            let job = job;
            // SAFETY: run once, as submit promises.
            unsafe { (job.0)(job.1) }
        });
        0
    }

    fn threaded<'o>() -> BackwardOptions<'o, f64> {
        let mut o = BackwardOptions::new();
        // SAFETY: spawn may be called from any thread; no ctx.
        unsafe {
            o.set_executor(sys::adg_executor {
                submit: Some(spawn),
                ctx: ptr::null_mut(),
                n_workers: 3,
            })
        };
        o
    }

    /// y = sum of `width` branches x * k, each its own op.
    fn fan<'r>(
        reg: &'r Registry,
        x: &Node<'r>,
        width: usize,
        bad: Option<usize>,
    ) -> Result<Node<'r>> {
        let branches: Vec<Node<'r>> = (0..width)
            .map(|k| {
                reg.op(&[x], move |call| {
                    if Some(k) == bad {
                        panic!("branch {k} exploded");
                    }
                    let g = *call.grad().unwrap_or(&0.0);
                    call.give(0, g * k as f64)
                })
            })
            .collect::<Result<_>>()?;
        let parents: Vec<&Node<'r>> = branches.iter().collect();
        reg.op(&parents, |call| {
            let g = *call.grad().unwrap_or(&0.0);
            (0..call.n_parents()).try_for_each(|s| call.give(s, g))
        })
    }

    #[test]
    fn an_executor_runs_the_steps_with_the_same_sums() -> Result<()> {
        let reg = Registry::<f64>::new()?;
        let x = reg.leaf()?;
        let y = fan(&reg, &x, 16, None)?;
        let grads = backward_with(&y, 1.0, &threaded())?;
        assert_eq!(grads.get(&x), Some(&120.0)); // 0 + 1 + ... + 15
        Ok(())
    }

    #[test]
    fn a_worker_panic_is_resumed_on_the_caller() -> Result<()> {
        let reg = Registry::<f64>::new()?;
        let x = reg.leaf()?;
        let y = fan(&reg, &x, 16, Some(7))?;
        let caught = catch_unwind(AssertUnwindSafe(|| backward_with(&y, 1.0, &threaded())));
        let payload = caught.expect_err("the worker's panic is resumed");
        let message = payload.downcast_ref::<String>().map(String::as_str);
        assert_eq!(message, Some("branch 7 exploded"));
        assert_eq!(
            reg.shared()
                .store
                .count
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        // The registry goes on, with the executor too.
        let z = fan(&reg, &x, 4, None)?;
        assert_eq!(backward_with(&z, 1.0, &threaded())?.get(&x), Some(&6.0));
        Ok(())
    }

    #[test]
    fn the_value_check_names_the_step_with_an_executor() -> Result<()> {
        let reg = Registry::<f64>::new()?;
        let x = reg.leaf()?;
        let y = fan(&reg, &x, 8, None)?;
        // Branch k gives k: reject 5's.
        let o = threaded().value_check(|g: &f64| *g != 5.0);
        let e = backward_with(&y, 1.0, &o).unwrap_err();
        assert_eq!(e.code(), code::EVALUE);
        assert_eq!(e.failure().unwrap().site, Site::Check);
        Ok(())
    }
}
