//! The gradient reducer (`adg/reducer.h`): synchronous data parallelism
//! inside one process, with the same bits at any thread count.
//!
//! A round's gradient is the sum of the contributions of U *work units*
//! that the trainer defines (a micro-batch of k samples, a graph, a length
//! group): U and what each unit holds are fixed by the data and the
//! trainer's settings, never by the number of threads. T participants
//! (threads) take the round's units as they come ([`Reducer::next_unit`]:
//! whichever is free takes the next), run a forward and a backward over
//! each, and hand each parameter's gradient to the reducer from the
//! backward's ready hook ([`Reducer::hook`]). The reducer folds each
//! parameter's U gradients in a fixed binary tree over unit indices (each
//! node adds its right subtree's sum into its left one's), as they arrive,
//! while the other units' backward passes go on, and applies the sum once
//! per round.
//!
//! **The promise:** for a given data order, seed, batch, unit definition
//! and BLAS build, the weights are bitwise the same for every T >= 1. The
//! sum [`Reduction::sum`] holds depends only on the U contributions, not on
//! T, on which thread computed which unit, nor on timing. Within a unit the
//! backward sums in tape order, as always; give each unit its own backward,
//! as a sum of two units made inside one backward would tie the bits to how
//! units were packed.
//!
//! **All or nothing:** by default nothing is applied until every
//! participant has ended the round without error; a failed round leaves
//! every parameter as it was, and every participant's [`Reducer::end`]
//! returns the same [`RoundError`]. [`ReducerBuilder::apply_early`] trades
//! that for applies that overlap the backward.
//!
//! See [`Reducer`] for a whole round, and `examples/trainer.rs` for a
//! trainer.

use std::any::Any;
use std::ffi::{c_int, c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{AddAssign, Range};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Mutex;

use adg_sys as sys;

use crate::error::{check, Site};
use crate::{BackwardOptions, Error, ExactSum, Grad, Node, Result};

/// What the apply closure is told about one parameter in one round.
///
/// The sum is borrowed: apply may read and change it (scale it, clip it),
/// not keep it; the reducer drops it after the round's barrier.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// # fn main() -> adg::Result<()> {
/// let reg = adg::Registry::<Vec<f64>>::new()?;
/// let w = reg.leaf()?;
/// let weights = Arc::new(Mutex::new(vec![0.0; 2]));
/// let red = {
///     let weights = Arc::clone(&weights);
///     adg::Reducer::builder(1, [&w]).units(2).build(move |mut r| {
///         assert_eq!((r.param(), r.round(), r.units()), (0, 0, 0..2));
///         let Some(grad) = r.sum_mut() else { return Ok(()) };
///         for g in grad.iter_mut() {
///             *g = g.clamp(-1.0, 1.0); // clip the batch's gradient
///         }
///         for (w, g) in weights.lock().unwrap().iter_mut().zip(grad.iter()) {
///             *w -= 0.5 * g;
///         }
///         Ok(())
///     })?
/// };
/// red.round(0, |unit| red.give(0, &w, vec![unit as f64 + 0.5, -3.0]))?;
/// assert_eq!(*weights.lock().unwrap(), [-0.5, 0.5]); // sums 2 and -6, clipped
/// # Ok(())
/// # }
/// ```
pub struct Reduction<'a, T> {
    param: usize,
    id: u64,
    round: u64,
    sum: Option<&'a mut T>,
    units: Range<usize>,
}

/// The accessors [`Reduction`], [`SliceReduction`] and
/// [`ExactSliceReduction`] share: which parameter, which round, which
/// units.
macro_rules! round_facts {
    () => {
        /// The parameter's index in the list given to [`Reducer::builder`].
        pub fn param(&self) -> usize {
            self.param
        }

        /// The parameter's leaf id ([`Node::id`]).
        pub fn id(&self) -> u64 {
            self.id
        }

        /// The rounds completed before this one (0 in the first round).
        pub fn round(&self) -> u64 {
            self.round
        }

        /// The units the sum covers: all of the round's (`0..U`), or, for
        /// a reducer that holds a range of a job's units
        /// ([`ReducerBuilder::unit_range`]), one of its partial sums.
        pub fn units(&self) -> Range<usize> {
            self.units.clone()
        }
    };
}

/// The accessors [`SliceReduction`] and [`ExactSliceReduction`] share:
/// which slice, and its range.
macro_rules! slice_facts {
    () => {
        /// Which slice, 0 to `slices() - 1`.
        pub fn slice(&self) -> usize {
            self.slice
        }

        /// The parameter's number of slices.
        pub fn slices(&self) -> usize {
            self.n_slices
        }

        /// The elements of the parameter, and so of its sum, this slice
        /// covers.
        pub fn range(&self) -> Range<usize> {
            self.range.clone()
        }
    };
}

impl<'a, T> Reduction<'a, T> {
    round_facts!();

    /// The units' gradients folded in the unit tree; `None` when no unit
    /// of the round had a gradient for this parameter.
    pub fn sum(&self) -> Option<&T> {
        self.sum.as_deref()
    }

    /// The sum, to change in place before using it.
    pub fn sum_mut(&mut self) -> Option<&mut T> {
        self.sum.as_deref_mut()
    }
}

impl<T> fmt::Debug for Reduction<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reduction")
            .field("param", &self.param)
            .field("id", &self.id)
            .field("round", &self.round)
            .field("has_sum", &self.sum.is_some())
            .field("units", &self.units)
            .finish()
    }
}

/// What failed a round first ([`RoundError::site`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureSite {
    /// A participant ended its unit or its round with an error, or with a
    /// panic caught by [`Reducer::round`] ([`RoundError::participant`]
    /// says which, [`RoundError::unit`] which unit).
    Participant,
    /// Folding a parameter's sum panicked ([`RoundError::param_id`]).
    Add,
    /// The apply closure returned an error or panicked, for
    /// [`RoundError::param_id`].
    Apply,
    /// The round ended with units not done (`ADG_ESTATE`).
    Units,
    /// The call itself was refused (a participant out of range, a second
    /// end of one round): it ended no round, and nothing changed.
    Call,
}

/// A failed round, the same on every participant: the round's first
/// error, who failed, and where (`adg_reducer_failure`).
///
/// It converts into [`Error`] (the round's error) for `?`.
///
/// ```
/// use adg::{code, Error, FailureSite};
///
/// # fn main() -> adg::Result<()> {
/// let reg = adg::Registry::<f64>::new()?;
/// let w = reg.leaf()?;
/// let red = adg::Reducer::builder(1, [&w]).units(3).build(|_| Ok(()))?;
/// let e = red
///     .round(0, |unit| match unit {
///         1 => Err(Error::new(code::EUSER - 1, "unit 1 had no samples")),
///         _ => red.give(0, &w, 1.0),
///     })
///     .unwrap_err();
/// assert_eq!((e.code(), e.site()), (code::EUSER - 1, FailureSite::Participant));
/// assert_eq!((e.participant(), e.unit(), e.round()), (Some(0), Some(1), 0));
/// assert_eq!(e.cause().unwrap().reason(), "unit 1 had no samples");
/// assert_eq!(red.rounds(), 1); // abandoned, and the next round starts clean
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RoundError(Box<RoundFacts>);

/// RoundError's facts, boxed so that a `Result` of one stays small.
#[derive(Debug, Clone)]
struct RoundFacts {
    error: Error,
    cause: Option<Error>,
    site: FailureSite,
    round: u64,
    participant: Option<usize>,
    param_id: Option<u64>,
    unit: Option<usize>,
    step_node: Option<u64>,
    step_name: Option<String>,
}

impl RoundError {
    /// The round's first error: its code, and the reason libadg gave on
    /// this thread ("adg_reducer_end_with: round 4 abandoned: participant
    /// 2 failed with ADG_EVALUE (-12) at step 'mul' of node 17").
    pub fn error(&self) -> &Error {
        &self.0.error
    }

    /// The round's code, negative (`ADG_ETHREW` for a panic).
    pub fn code(&self) -> i32 {
        self.0.error.code()
    }

    /// The error that failed the round as it was first made, where it was
    /// made in this process: what a participant's unit returned (with its
    /// own reason), or what apply returned. `None` for failures that only
    /// libadg saw (units not done) and for panics.
    pub fn cause(&self) -> Option<&Error> {
        self.0.cause.as_ref()
    }

    /// Where the round failed first.
    pub fn site(&self) -> FailureSite {
        self.0.site
    }

    /// The rounds completed before the failed one.
    pub fn round(&self) -> u64 {
        self.0.round
    }

    /// The participant to blame ([`FailureSite::Participant`]), or the one
    /// whose gradient completed a failed fold ([`FailureSite::Add`]).
    pub fn participant(&self) -> Option<usize> {
        self.0.participant
    }

    /// The parameter's leaf id, for [`FailureSite::Add`] and
    /// [`FailureSite::Apply`].
    pub fn param_id(&self) -> Option<u64> {
        self.0.param_id
    }

    /// The unit the participant was ending, for
    /// [`FailureSite::Participant`] when it held one.
    pub fn unit(&self) -> Option<usize> {
        self.0.unit
    }

    /// The node whose step failed the participant's backward, where the
    /// failure was handed over with its step.
    pub fn step_node(&self) -> Option<u64> {
        self.0.step_node
    }

    /// The name of that node's step.
    pub fn step_name(&self) -> Option<&str> {
        self.0.step_name.as_deref()
    }
}

impl fmt::Display for RoundError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.error, f)
    }
}

impl std::error::Error for RoundError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .cause
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<RoundError> for Error {
    fn from(e: RoundError) -> Error {
        e.0.error
    }
}

/// Builds a [`Reducer`]: its units, where its applies run, and its apply
/// closure ([`Reducer::builder`]).
#[must_use = "a builder does nothing until build is called"]
pub struct ReducerBuilder<T> {
    participants: usize,
    ids: Vec<u64>,
    units: usize,
    first_unit: usize,
    total_units: usize,
    apply_early: bool,
    slicing: Option<Slicing>,
    _grad: PhantomData<fn() -> T>,
}

/// What [`ReducerBuilder::slices`] set: the counts, the fold of one slice
/// and the apply of one, the latter two knowing the element type.
struct Slicing {
    counts: Vec<usize>,
    add_slice: AddSlice,
    apply_slice: Box<ApplySlice>,
}

/// `ops.add_slice`.
type AddSlice =
    unsafe extern "C" fn(*mut c_void, *const c_void, usize, usize, *mut c_void) -> c_int;

/// A sliced parameter's apply, from C's reduction (its sum non-NULL).
type ApplySlice = dyn Fn(&sys::adg_reduction) -> Result<()> + Send + Sync;

impl<T> fmt::Debug for ReducerBuilder<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReducerBuilder")
            .field("participants", &self.participants)
            .field("params", &self.ids)
            .field("units", &self.units)
            .field("first_unit", &self.first_unit)
            .field("total_units", &self.total_units)
            .field("apply_early", &self.apply_early)
            .field("slices", &self.slicing.as_ref().map(|s| &s.counts))
            .finish()
    }
}

impl<T: Grad> ReducerBuilder<T> {
    /// U, the work units of every round (1 to 2^20), dealt by
    /// [`Reducer::next_unit`] and [`Reducer::round`]: the setting that
    /// makes the bits independent of T. Left at 0 (the default), each
    /// participant is one unit, its share of the batch: the same tree over
    /// T shares, so the bits depend on T.
    pub fn units(mut self, units: usize) -> Self {
        self.units = units;
        self
    }

    /// A rank's share of a job of `total_units` units: this reducer's
    /// units are `first_unit..first_unit + U` (U from [`units`]), dealt as
    /// job indices, and apply sees the partial sums of the largest
    /// subtrees of the job's tree that lie in the range
    /// ([`Reduction::units`]). Folding the ranks' partial sums over the
    /// rest of the job's tree gives the bits of one reducer of all units.
    ///
    /// [`units`]: ReducerBuilder::units
    pub fn unit_range(mut self, first_unit: usize, total_units: usize) -> Self {
        self.first_unit = first_unit;
        self.total_units = total_units;
        self
    }

    /// Applies each parameter as soon as its sum is complete, on the thread
    /// that completed it, overlapping the backward of earlier layers. A
    /// failed round may then have applied some parameters and not others.
    /// By default (`false`) a round is all or nothing.
    pub fn apply_early(mut self, early: bool) -> Self {
        self.apply_early = early;
        self
    }

    /// Creates the reducer with `apply`, the update: called once per
    /// parameter and round that is not abandoned, with the sum of the
    /// round's unit gradients (an SGD step, say). Applies for different
    /// parameters may run at once, on any thread of the round, so `apply`
    /// writes each parameter through its own lock or cell. No forward of
    /// the round still reads the parameter then (its sum is complete only
    /// once every unit's backward has run over it), and [`Reducer::end`]
    /// returns only after every apply, so the next round reads the update.
    ///
    /// An error `apply` returns fails the round (with its code; it becomes
    /// [`RoundError::cause`]); a panic fails it with `ADG_ETHREW` and is
    /// resumed on participant 0's thread once the round has ended there.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL`: no participant or no parameter, U above 2^20, a unit
    /// range that does not fit, a parameter given twice. `ADG_ENOMEM`.
    pub fn build<F>(self, apply: F) -> Result<Reducer<T>>
    where
        F: Fn(Reduction<'_, T>) -> Result<()> + Send + Sync + 'static,
    {
        let (counts, add_slice, apply_slice) = match self.slicing {
            Some(s) => (s.counts, Some(s.add_slice), Some(s.apply_slice)),
            None => (Vec::new(), None, None),
        };
        if add_slice.is_some() && counts.len() != self.ids.len() {
            return Err(Error::new(
                sys::ADG_EINVAL,
                format!(
                    "ReducerBuilder::slices: {} counts for {} parameters",
                    counts.len(),
                    self.ids.len()
                ),
            ));
        }
        let shared = Box::into_raw(Box::new(Shared::<T> {
            apply: Box::new(apply),
            apply_slice,
            raw: AtomicPtr::new(std::ptr::null_mut()),
            participants: self.participants,
            notes: Mutex::new(Vec::new()),
            next_round: (0..self.participants).map(|_| AtomicU64::new(0)).collect(),
        }));
        // SAFETY: all-zero is a valid adg_reducer_options (no allocator,
        // no slices); the pointers set below outlive the call (ids and
        // slice counts are copied by adg_reducer_new).
        let mut o: sys::adg_reducer_options = unsafe { std::mem::zeroed() };
        o.size = std::mem::size_of::<sys::adg_reducer_options>();
        o.n_participants = self.participants;
        o.n_units = self.units;
        o.param_ids = self.ids.as_ptr();
        o.n_params = self.ids.len();
        o.ops.add = Some(add_c::<T>);
        o.ops.apply = Some(apply_c::<T>);
        o.ops.release = Some(release_c::<T>);
        o.ops.ctx = shared.cast();
        o.first_unit = self.first_unit;
        o.total_units = self.total_units;
        o.apply_early = c_int::from(self.apply_early);
        if !counts.is_empty() {
            o.param_slices = counts.as_ptr();
            o.ops.add_slice = add_slice;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: o is valid for the call, out is writable.
        let rc = unsafe { sys::adg_reducer_new(&o, &mut raw) };
        if rc != 0 {
            let error = Error::last(rc);
            // SAFETY: not shared with C: adg_reducer_new failed.
            drop(unsafe { Box::from_raw(shared) });
            return Err(error);
        }
        // SAFETY: shared is live until Reducer's drop; Release pairs with
        // the Acquire of the callbacks (which another thread may run).
        unsafe { (*shared).raw.store(raw, Ordering::Release) };
        Ok(Reducer {
            raw: NonNull::new(raw).expect("adg_reducer_new returned 0 and no reducer"),
            shared: NonNull::new(shared).expect("a Box is never null"),
            participants: self.participants,
            units: self.units,
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// The elements of a gradient that [`ReducerBuilder::slices`] may cut:
/// `f32` and `f64`, whose `Vec` the crate slices itself, so that threads
/// folding and applying different slices of one sum never share a `&mut`.
pub trait SliceElem: Copy + AddAssign + Send + Sync + 'static + sealed::Sealed {}
impl SliceElem for f32 {}
impl SliceElem for f64 {}

impl<E: SliceElem> ReducerBuilder<Vec<E>>
where
    Vec<E>: Grad,
{
    /// Cuts large parameters' sums into slices (reduce-scatter):
    /// `counts[i]` slices for parameter `i` (1: whole; at most 1024), one
    /// count per parameter. When a parameter's last contribution arrives,
    /// its slices are folded over the whole unit tree and applied, each by
    /// one thread: the one that completed the sum and those waiting in
    /// [`Reducer::end`], side by side. Slice `k` of `n` is the elements
    /// `len * k / n .. len * (k + 1) / n`. The bits are those of the
    /// whole sum: each element is added in the same tree order.
    ///
    /// `apply_slice` is a sliced parameter's update, called once per slice
    /// with [`SliceReduction::values`], that slice of the sum; slices of
    /// one parameter run at once on different threads, so it writes the
    /// parameter's elements [`SliceReduction::range`] only; it is not
    /// called when no unit had a gradient for the parameter. Parameters of
    /// one slice still go to [`build`](ReducerBuilder::build)'s `apply`.
    /// Gradients of one parameter must have the same length: a fold of
    /// different lengths panics, which fails the round as a panicking
    /// add does. [`ExactSum`] gradients have a `slices` of their own, whose
    /// apply gets an [`ExactSliceReduction`].
    ///
    /// ```
    /// use std::sync::{Arc, Mutex};
    ///
    /// # fn main() -> adg::Result<()> {
    /// let reg = adg::Registry::<Vec<f64>>::new()?;
    /// let w = reg.leaf()?;
    /// let weights = Arc::new(Mutex::new(vec![0.0; 5]));
    /// let red = {
    ///     let weights = Arc::clone(&weights);
    ///     adg::Reducer::builder(2, [&w])
    ///         .units(3)
    ///         .slices(vec![2], move |r| {
    ///             // One lock here; a trainer keeps a lock or cell per slice.
    ///             let mut weights = weights.lock().unwrap();
    ///             for (w, g) in weights[r.range()].iter_mut().zip(r.values()) {
    ///                 *w -= 0.5 * g;
    ///             }
    ///             Ok(())
    ///         })
    ///         .build(|_| Ok(()))? // no whole parameter
    /// };
    /// std::thread::scope(|s| {
    ///     for p in 0..2 {
    ///         let (red, w) = (&red, &w);
    ///         s.spawn(move || {
    ///             red.round(p, |unit| red.give(p, w, vec![unit as f64; 5]))
    ///         });
    ///     }
    /// });
    /// // The units' gradients 0 + 1 + 2, applied in two slices.
    /// assert_eq!(*weights.lock().unwrap(), [-1.5; 5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn slices<F>(mut self, counts: Vec<usize>, apply_slice: F) -> Self
    where
        F: Fn(SliceReduction<'_, E>) -> Result<()> + Send + Sync + 'static,
    {
        let apply_slice = move |r: &sys::adg_reduction| {
            // SAFETY: the reducer calls this with a sum, a boxed Vec<E>
            // that only this reducer's folds and applies touch, and
            // slice r.slice of it only here until the round ends.
            let values = unsafe { slice_of::<E>(r.sum, r.slice, r.n_slices) };
            apply_slice(SliceReduction {
                param: r.param,
                id: r.id,
                round: r.round,
                slice: r.slice,
                n_slices: r.n_slices,
                range: values.0,
                values: values.1,
                units: r.first_unit..r.first_unit + r.n_units,
            })
        };
        self.slicing = Some(Slicing {
            counts,
            add_slice: add_slice_c::<E>,
            apply_slice: Box::new(apply_slice),
        });
        self
    }
}

/// What a sliced parameter's apply ([`ReducerBuilder::slices`]) is told:
/// one slice of its sum, to read or change in place, not to keep.
pub struct SliceReduction<'a, E> {
    param: usize,
    id: u64,
    round: u64,
    slice: usize,
    n_slices: usize,
    range: Range<usize>,
    values: &'a mut [E],
    units: Range<usize>,
}

impl<E> SliceReduction<'_, E> {
    round_facts!();
    slice_facts!();

    /// The slice of the sum: elements [`range`](SliceReduction::range).
    pub fn values(&self) -> &[E] {
        self.values
    }

    /// The same, to change in place before using it.
    pub fn values_mut(&mut self) -> &mut [E] {
        self.values
    }
}

impl<E> fmt::Debug for SliceReduction<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SliceReduction")
            .field("param", &self.param)
            .field("id", &self.id)
            .field("round", &self.round)
            .field("slice", &self.slice)
            .field("n_slices", &self.n_slices)
            .field("range", &self.range)
            .field("units", &self.units)
            .finish()
    }
}

/// Elements `len * k / n .. len * (k + 1) / n` of `len`, as C++'s and C's
/// examples cut them.
fn slice_range(len: usize, k: usize, n: usize) -> Range<usize> {
    let at = |k: usize| (len as u128 * k as u128 / n as u128) as usize;
    at(k)..at(k + 1)
}

/// The data pointer and length of a boxed `Vec<E>`, read without making a
/// reference to the `Vec`: other threads read it at the same time, each
/// for its own slice. A copy of its header, never dropped, gives them.
///
/// # Safety
///
/// `v` is a live `Box<Vec<E>>`'s pointer whose header no thread writes
/// meanwhile.
unsafe fn vec_parts<E>(v: *const c_void) -> (*mut E, usize) {
    // SAFETY: as the caller promises; the copy is forgotten, so the
    // buffer keeps one owner.
    let mut header = ManuallyDrop::new(unsafe { std::ptr::read(v.cast::<Vec<E>>()) });
    (header.as_mut_ptr(), header.len())
}

/// Slice `k` of `n` of the boxed `Vec<E>` at `v`: its range and elements.
///
/// # Safety
///
/// As [`vec_parts`], and no other thread touches that slice's elements
/// while the result lives.
unsafe fn slice_of<'a, E>(v: *const c_void, k: usize, n: usize) -> (Range<usize>, &'a mut [E]) {
    // SAFETY: as the caller promises; the range lies within the length.
    unsafe {
        let (data, len) = vec_parts::<E>(v);
        let range = slice_range(len, k, n);
        let values = std::slice::from_raw_parts_mut(data.add(range.start), range.len());
        (range, values)
    }
}

/// Folds slice `k` of `n` of the boxed `Vec<E>` at `value` into the same
/// slice of the one at `sum`. Panics when their lengths differ.
///
/// # Safety
///
/// As [`slice_of`] for both, which are distinct.
unsafe fn add_slice<E: SliceElem>(sum: *mut c_void, value: *const c_void, k: usize, n: usize) {
    // SAFETY: as the caller promises; the lengths are checked first.
    unsafe {
        let (sum_len, value_len) = (vec_parts::<E>(sum).1, vec_parts::<E>(value).1);
        assert_eq!(
            sum_len, value_len,
            "adg::Reducer: gradients of different lengths"
        );
        let (_, sum) = slice_of::<E>(sum, k, n);
        let (_, value) = slice_of::<E>(value, k, n);
        for (s, v) in sum.iter_mut().zip(value.iter()) {
            *s += *v;
        }
    }
}

/// `ops.add_slice`: [`add_slice`], with panics kept.
unsafe extern "C" fn add_slice_c<E: SliceElem>(
    sum: *mut c_void,
    value: *const c_void,
    slice: usize,
    n_slices: usize,
    ctx: *mut c_void,
) -> c_int
where
    Vec<E>: Grad,
{
    // SAFETY: ctx is the reducer's Shared<Vec<E>>; sum and value are boxed
    // Vec<E>'s, distinct, whose slice `slice` only this fold touches now
    // (the C contract: one thread per slice).
    let shared = unsafe { &*ctx.cast::<Shared<Vec<E>>>() };
    shared.fold_result(catch_unwind(AssertUnwindSafe(|| unsafe {
        add_slice::<E>(sum, value, slice, n_slices)
    })))
}

impl ReducerBuilder<ExactSum> {
    /// Cuts large parameters' exact sums into slices, as `slices` does for
    /// `Vec<f32>` and `Vec<f64>`: `counts[i]` slices for parameter `i` (1:
    /// whole; at most 1024), one count per parameter. Slice `k` of `n` is
    /// the sums `len * k / n .. len * (k + 1) / n`; each is folded over the
    /// whole unit tree by one thread (`adg_exact_merge` of that range,
    /// several threads merging into one sum at once, which exact.h allows)
    /// and then applied by it. Exact, so the bits are those of the whole
    /// sum, in any order.
    ///
    /// `apply_slice` is a sliced parameter's update, called once per slice
    /// with an [`ExactSliceReduction`], which rounds that slice's sums
    /// ([`ExactSliceReduction::round_into`]); slices of one parameter run at
    /// once on different threads, so it writes the parameter's elements
    /// [`ExactSliceReduction::range`] only; it is not called when no unit
    /// had a gradient for the parameter. Parameters of one slice still go
    /// to [`build`](ReducerBuilder::build)'s `apply`. Gradients of one
    /// parameter must have the same length: a fold of different lengths
    /// panics, which fails the round as a panicking add does.
    ///
    /// ```
    /// use adg::ExactSum;
    /// use std::sync::{Arc, Mutex};
    ///
    /// # fn main() -> adg::Result<()> {
    /// let reg = adg::Registry::<ExactSum>::new()?;
    /// let w = reg.leaf()?;
    /// let weights = Arc::new(Mutex::new(vec![0.0f32; 5]));
    /// let red = {
    ///     let weights = Arc::clone(&weights);
    ///     adg::Reducer::builder(2, [&w])
    ///         .slices(vec![2], move |r| {
    ///             let mut grad = vec![0.0; r.range().len()];
    ///             r.round_into(&mut grad)?; // this slice's sums, rounded
    ///             // One lock here; a trainer keeps a lock or cell per slice.
    ///             let mut weights = weights.lock().unwrap();
    ///             for (w, g) in weights[r.range()].iter_mut().zip(&grad) {
    ///                 *w -= 0.5 * g;
    ///             }
    ///             Ok(())
    ///         })
    ///         .build(|_| Ok(()))? // no whole parameter
    /// };
    /// std::thread::scope(|s| {
    ///     for p in 0..2 {
    ///         let (red, w) = (&red, &w);
    ///         s.spawn(move || {
    ///             red.round(p, |_| {
    ///                 let mut mine = ExactSum::new(5)?; // p's samples
    ///                 mine.add(0, &[p as f32 + 1.0; 5])?;
    ///                 red.give(p, w, mine)
    ///             })
    ///         });
    ///     }
    /// });
    /// // The participants' sums 1 + 2, applied in two slices.
    /// assert_eq!(*weights.lock().unwrap(), [-1.5; 5]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn slices<F>(mut self, counts: Vec<usize>, apply_slice: F) -> Self
    where
        F: Fn(ExactSliceReduction<'_>) -> Result<()> + Send + Sync + 'static,
    {
        let apply_slice = move |r: &sys::adg_reduction| {
            // SAFETY: the reducer calls this with a sum, a boxed ExactSum
            // that only this reducer's folds and applies reach; the `&`
            // covers its handle, which nobody writes, while other threads
            // merge into and round other ranges through C. This slice's
            // range is folded, and only read here until the round ends.
            let sum = unsafe { crate::value::peek_c::<ExactSum>(r.sum) };
            apply_slice(ExactSliceReduction {
                param: r.param,
                id: r.id,
                round: r.round,
                slice: r.slice,
                n_slices: r.n_slices,
                range: slice_range(sum.len(), r.slice, r.n_slices),
                sum: &sum,
                units: r.first_unit..r.first_unit + r.n_units,
            })
        };
        self.slicing = Some(Slicing {
            counts,
            add_slice: add_exact_slice_c,
            apply_slice: Box::new(apply_slice),
        });
        self
    }
}

/// What a sliced exact parameter's apply (`ReducerBuilder<ExactSum>`'s
/// `slices`) is told: one slice of its sum, to round, not to keep.
///
/// It reaches the sum's range [`range`](ExactSliceReduction::range) only:
/// other threads merge into the other ranges meanwhile.
pub struct ExactSliceReduction<'a> {
    param: usize,
    id: u64,
    round: u64,
    slice: usize,
    n_slices: usize,
    range: Range<usize>,
    sum: &'a ExactSum,
    units: Range<usize>,
}

impl ExactSliceReduction<'_> {
    round_facts!();
    slice_facts!();

    /// Writes the slice's sums, each rounded once to the nearest `f32`
    /// (ties to even), to `out`, whose length is the range's
    /// (`adg_exact_round` of [`range`](ExactSliceReduction::range)).
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` when `out` is not as long as the range; `out` is left
    /// as it was then.
    pub fn round_into(&self, out: &mut [f32]) -> Result<()> {
        if out.len() != self.range.len() {
            return Err(Error::new(
                sys::ADG_EINVAL,
                format!(
                    "ExactSliceReduction::round_into: {} floats for the {} sums of slice {}",
                    out.len(),
                    self.range.len(),
                    self.slice
                ),
            ));
        }
        // Rounds of one accumulator may run beside merges into other
        // ranges of it (exact.h), which is what the other slices do.
        self.sum.round(self.range.start, out)
    }

    /// The slice's sums rounded, as [`round_into`](ExactSliceReduction::round_into)
    /// rounds them: a vector of the range's length.
    pub fn rounded(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.range.len()];
        self.round_into(&mut out)
            .expect("adg_exact_round of the slice's range cannot fail");
        out
    }
}

impl fmt::Debug for ExactSliceReduction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactSliceReduction")
            .field("param", &self.param)
            .field("id", &self.id)
            .field("round", &self.round)
            .field("slice", &self.slice)
            .field("n_slices", &self.n_slices)
            .field("range", &self.range)
            .field("units", &self.units)
            .finish()
    }
}

/// Folds the range of slice `k` of `n` of the boxed `ExactSum` at `value`
/// into the same range of the one at `sum`, through `&` only, as other
/// threads fold other slices of `sum` at once. Panics when their lengths
/// differ.
///
/// # Safety
///
/// Both are live boxed `ExactSum`s, distinct, that nobody adds to or
/// clears meanwhile, and no other thread touches `sum`'s range of slice
/// `k` while this runs.
unsafe fn add_exact_slice(sum: *const c_void, value: *const c_void, k: usize, n: usize) {
    // SAFETY: as the caller promises; the `&`s cover the handles, which
    // nobody writes (the sums behind them change through C alone).
    let (sum, value) = unsafe {
        (
            crate::value::peek_c::<ExactSum>(sum),
            crate::value::peek_c::<ExactSum>(value),
        )
    };
    assert_eq!(
        sum.len(),
        value.len(),
        "adg::Reducer: gradients of different lengths"
    );
    let range = slice_range(sum.len(), k, n);
    // SAFETY: exact.h lets merges into disjoint ranges of one accumulator
    // run at once while nobody adds to or clears it; the range is this
    // thread's alone (the caller's promise).
    unsafe { sum.merge_range_shared(&value, range.start, range.len()) }
        .expect("adg_exact_merge of a range within equal lengths cannot fail");
}

/// `ops.add_slice` for `ExactSum`: [`add_exact_slice`], with panics kept.
unsafe extern "C" fn add_exact_slice_c(
    sum: *mut c_void,
    value: *const c_void,
    slice: usize,
    n_slices: usize,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: ctx is the reducer's Shared<ExactSum>; sum and value are
    // boxed ExactSums, distinct, whose slice `slice` only this fold
    // touches now (the C contract: one thread per slice), and which only
    // this reducer's folds and slice applies reach.
    let shared = unsafe { &*ctx.cast::<Shared<ExactSum>>() };
    shared.fold_result(catch_unwind(AssertUnwindSafe(|| unsafe {
        add_exact_slice(sum, value, slice, n_slices)
    })))
}

/// A gradient reducer (`adg_reducer`) over gradients of type `T`, shared by
/// T participants (threads) by reference: it is `Send` and `Sync`.
///
/// A round, on participant `p`'s thread: with units, take units with
/// [`next_unit`](Reducer::next_unit) until none is left, running a forward
/// and a backward over each with [`hook`](Reducer::hook)'s options (or
/// handing gradients over with [`give`](Reducer::give)) and ending each
/// with [`unit_end`](Reducer::unit_end); then [`end`](Reducer::end), the
/// barrier. [`round`](Reducer::round) does all of that around a closure,
/// and is the one to use: it ends the round even when the closure fails or
/// panics, so that no other participant waits forever.
///
/// ```
/// use std::sync::{Arc, Mutex};
///
/// # fn main() -> adg::Result<()> {
/// let reg = adg::Registry::<f64>::new()?;
/// let w = reg.leaf()?;
/// let weight = Arc::new(Mutex::new(1.0_f64));
/// // 5 units; unit u's loss is (u + 1) * w, so its gradient is u + 1.
/// let red = {
///     let weight = Arc::clone(&weight);
///     adg::Reducer::builder(2, [&w]).units(5).build(move |r| {
///         if let Some(g) = r.sum() {
///             *weight.lock().unwrap() -= 0.1 * g; // SGD
///         }
///         Ok(())
///     })?
/// };
/// std::thread::scope(|s| {
///     for p in 0..2 {
///         let (reg, red, w) = (&reg, &red, &w);
///         s.spawn(move || {
///             red.round(p, |unit| {
///                 let c = (unit + 1) as f64;
///                 let loss = reg.op(&[w], move |call| {
///                     let g = *call.grad().unwrap_or(&0.0);
///                     call.give(0, g * c)
///                 })?;
///                 adg::backward_with(&loss, 1.0, &red.hook(p, adg::BackwardOptions::new()))?;
///                 Ok(())
///             })
///         });
///     }
/// });
/// // The sum of the units' gradients, 1 + 2 + 3 + 4 + 5, applied once.
/// assert_eq!(*weight.lock().unwrap(), 1.0 - 0.1 * 15.0);
/// assert_eq!(red.rounds(), 1);
/// # Ok(())
/// # }
/// ```
pub struct Reducer<T: Grad> {
    raw: NonNull<sys::adg_reducer>,
    /// The callbacks' context (`ops.ctx`): boxed so that its address stays
    /// put, freed only once the C reducer is.
    shared: NonNull<Shared<T>>,
    participants: usize,
    units: usize,
}

// SAFETY: every adg_reducer function may be called from any thread, the
// calls of different participants at once (the C contract); the callbacks'
// context (Shared) is Send + Sync since T: Grad (Send + Sync) and its
// closure is Send + Sync; gradients cross threads as T's (Send), packed by value::into_c.
unsafe impl<T: Grad> Send for Reducer<T> {}
// SAFETY: as above: `&Reducer` reaches only thread-safe C calls and
// Shared's Mutex and atomics.
unsafe impl<T: Grad> Sync for Reducer<T> {}

impl<T: Grad> fmt::Debug for Reducer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reducer")
            .field("participants", &self.participants)
            .field("units", &self.units)
            .field("rounds", &self.rounds())
            .finish_non_exhaustive()
    }
}

impl<T: Grad> Reducer<T> {
    /// A builder of a reducer for `participants` threads (T >= 1) over
    /// `params`, the parameters' leaves, whose order is
    /// [`Reduction::param`]'s. Only their ids are kept.
    ///
    /// ```
    /// # fn main() -> adg::Result<()> {
    /// let reg = adg::Registry::<Vec<f64>>::new()?;
    /// let params = vec![reg.leaf()?, reg.leaf()?];
    /// let red = adg::Reducer::builder(4, &params)
    ///     .units(16)
    ///     .build(|_r| Ok(()))?;
    /// assert_eq!((red.participants(), red.units()), (4, Some(16)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder<'p, 'r: 'p, I>(participants: usize, params: I) -> ReducerBuilder<T>
    where
        I: IntoIterator<Item = &'p Node<'r, T>>,
    {
        ReducerBuilder {
            participants,
            ids: params.into_iter().map(Node::id).collect(),
            units: 0,
            first_unit: 0,
            total_units: 0,
            apply_early: false,
            slicing: None,
            _grad: PhantomData,
        }
    }

    /// The number of participants, T.
    pub fn participants(&self) -> usize {
        self.participants
    }

    /// U, the units of every round; `None` for one unit per participant.
    pub fn units(&self) -> Option<usize> {
        (self.units != 0).then_some(self.units)
    }

    /// `options` with participant's parameter gradients going to the
    /// reducer (`adg_reducer_hook`): run participant's backward with them,
    /// once per unit. The gradients of leaves that are not parameters
    /// (inputs) stay in the backward's [`Gradients`](crate::Gradients). A
    /// ready hook of `options`' own still runs, first, and sees each
    /// parameter's gradient before the reducer takes it. The options may
    /// serve every unit and round of the participant.
    ///
    /// A participant out of range fails the backward with `ADG_EINVAL`.
    /// Options hold one such hook: hooking them again (for another
    /// participant, or another reducer) replaces it.
    pub fn hook<'a>(
        &'a self,
        participant: usize,
        mut options: BackwardOptions<'a, T>,
    ) -> BackwardOptions<'a, T> {
        options.extend_c_options(move |c: &mut sys::adg_backward_options| {
            // SAFETY: the reducer outlives 'a, and so the backward; c is
            // the backward's C options, about to be used.
            check(unsafe { sys::adg_reducer_hook(self.as_ptr(), participant, c) })
        });
        options
    }

    /// Deals participant the round's next unit, the lowest not yet dealt:
    /// `Some(index)`, to which its hooked backward and [`give`] go until
    /// [`unit_end`], or `None` once every unit of the round is dealt (or
    /// the round has failed). Which participant gets which unit changes
    /// nothing in the sums.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` (participant out of range), `ADG_ESTATE` (a reducer
    /// without units, participant's unit not ended).
    ///
    /// A round by hand, which [`round`](Reducer::round) does for you:
    ///
    /// ```
    /// # fn main() -> adg::Result<()> {
    /// let reg = adg::Registry::<f64>::new()?;
    /// let w = reg.leaf()?;
    /// let red = adg::Reducer::builder(1, [&w]).units(4).build(|r| {
    ///     assert_eq!(r.sum(), Some(&10.0)); // 1 + 2 + 3 + 4
    ///     Ok(())
    /// })?;
    /// let mut result = Ok(());
    /// while let Some(unit) = red.next_unit(0)? {
    ///     result = red.give(0, &w, unit as f64 + 1.0);
    ///     if result.is_err() {
    ///         break; // end fails the round with it
    ///     }
    ///     red.unit_end(0)?;
    /// }
    /// red.end(0, result)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// [`give`]: Reducer::give
    /// [`unit_end`]: Reducer::unit_end
    pub fn next_unit(&self, participant: usize) -> Result<Option<usize>> {
        let mut unit = sys::ADG_REDUCER_NO_UNIT;
        // SAFETY: raw is live; unit is writable.
        check(unsafe { sys::adg_reducer_next_unit(self.raw.as_ptr(), participant, &mut unit) })?;
        Ok((unit != sys::ADG_REDUCER_NO_UNIT).then_some(unit))
    }

    /// Ends participant's unit, whose backward succeeded: the parameters it
    /// gave nothing for count as none. A fold that fails here fails the
    /// round, which [`end`](Reducer::end) reports. To end a unit that
    /// failed, pass its error to `end` instead.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` (participant out of range), `ADG_ESTATE` (a reducer
    /// without units, or participant holds no unit).
    pub fn unit_end(&self, participant: usize) -> Result<()> {
        // SAFETY: raw is live.
        let rc = unsafe { sys::adg_reducer_unit_end(self.raw.as_ptr(), participant, 0) };
        match rc {
            sys::ADG_EINVAL | sys::ADG_ESTATE => Err(Error::last(rc)),
            _ => Ok(()),
        }
    }

    /// Hands participant's unit's `gradient` for `param` to the reducer, as
    /// the hook does: for a gradient made otherwise than by a hooked
    /// backward. One per parameter and unit.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` (participant out of range, `param` not one of the
    /// reducer's), `ADG_ESTATE` (the unit already has `param`'s gradient,
    /// or participant holds no unit, with units); `gradient` is dropped.
    /// A fold that fails fails the round, which [`end`](Reducer::end)
    /// reports.
    pub fn give(&self, participant: usize, param: &Node<'_, T>, gradient: T) -> Result<()> {
        let value = crate::value::into_c(gradient);
        // SAFETY: raw is live; value is a packed T, as the callbacks expect.
        let rc =
            unsafe { sys::adg_reducer_give(self.raw.as_ptr(), participant, param.id(), value) };
        if rc == sys::ADG_EINVAL || rc == sys::ADG_ESTATE {
            let error = Error::last(rc); // before the drop can fail anything
                                         // SAFETY: not taken (the C contract for these codes).
            drop(unsafe { crate::value::from_c::<T>(value) });
            return Err(error);
        }
        Ok(())
    }

    /// Ends participant's round with `result`, its units' or its
    /// backward's (an error fails the round for every participant, ending
    /// participant's open unit with it): the round's barrier. Waits until
    /// every participant has ended the round and every parameter is
    /// applied, taking a share of the applies meanwhile; so the next
    /// forward reads updated parameters.
    ///
    /// # Errors
    ///
    /// The round's first failure, the same on every participant, with
    /// who failed and where; nothing was applied (but with
    /// [`apply_early`](ReducerBuilder::apply_early)). A panic caught in
    /// apply is resumed here, on participant 0's thread. [`FailureSite::Call`]
    /// for a refused call (participant out of range), which ends no round.
    pub fn end(
        &self,
        participant: usize,
        result: Result<()>,
    ) -> std::result::Result<(), RoundError> {
        self.finish(participant, result)
    }

    /// Runs participant's round around `f`, which runs a forward and a
    /// backward for one unit: with units, `f(unit)` for each unit dealt
    /// to participant, until none is left; without, `f(participant)` once.
    /// Then ends the round ([`end`](Reducer::end)), also when `f` fails or
    /// panics: its error fails the round for every participant, and a
    /// panic in `f` (a step's, resumed by the backward) fails it with
    /// `ADG_ETHREW` and is resumed on this thread after the barrier.
    ///
    /// # Errors
    ///
    /// Those of [`end`](Reducer::end).
    pub fn round<F>(&self, participant: usize, mut f: F) -> std::result::Result<(), RoundError>
    where
        F: FnMut(usize) -> Result<()>,
    {
        let mut panic: Option<Box<dyn Any + Send>> = None;
        let mut run = |unit: usize| match catch_unwind(AssertUnwindSafe(|| f(unit))) {
            Ok(result) => result,
            Err(payload) => {
                panic = Some(payload);
                Err(Error::new(
                    sys::ADG_ETHREW,
                    "a panic in the round's closure",
                ))
            }
        };
        let result = if self.units == 0 {
            run(participant)
        } else {
            loop {
                match self.next_unit(participant) {
                    Ok(Some(unit)) => {
                        if let Err(e) = run(unit).and_then(|()| self.unit_end(participant)) {
                            break Err(e);
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            }
        };
        let ended = self.finish(participant, result);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
        ended
    }

    /// The rounds completed, applied or abandoned.
    pub fn rounds(&self) -> u64 {
        let mut rounds = 0;
        // SAFETY: raw is live; it fails only for NULL arguments.
        unsafe { sys::adg_reducer_rounds(self.raw.as_ptr(), &mut rounds) };
        rounds
    }

    /// The C handle, for calls this crate does not wrap; owned by `self`.
    pub fn as_ptr(&self) -> *mut sys::adg_reducer {
        self.raw.as_ptr()
    }

    fn shared(&self) -> &Shared<T> {
        // SAFETY: live until drop.
        unsafe { self.shared.as_ref() }
    }

    /// end's work.
    fn finish(
        &self,
        participant: usize,
        result: Result<()>,
    ) -> std::result::Result<(), RoundError> {
        let shared = self.shared();
        let Some(next_round) = shared.next_round.get(participant) else {
            let error = Error::new(
                sys::ADG_EINVAL,
                format!(
                    "Reducer::end: participant {participant} of {}",
                    self.participants
                ),
            );
            return Err(RoundError::refused(error, 0));
        };
        // Only participant's own thread ends its rounds: Relaxed suffices.
        let round = next_round.load(Ordering::Relaxed);
        // SAFETY: all zero is a valid adg_failure (no name).
        let mut given: sys::adg_failure = unsafe { std::mem::zeroed() };
        given.size = std::mem::size_of::<sys::adg_failure>();
        if let Err(e) = result {
            given.code = e.c_code();
            // Where a backward failed, for every participant's RoundError;
            // the step's name stays with the error (cause), as C would
            // keep the pointer past this call.
            if let Some(f) = e.failure() {
                given.node_id = f.node_id;
                given.pass_id = f.pass_id;
                given.site = c_site(f.site);
            }
            shared.note_error(round, Culprit::Participant(participant), e);
        }
        // SAFETY: as above.
        let mut failure: sys::adg_reducer_failure = unsafe { std::mem::zeroed() };
        failure.size = std::mem::size_of::<sys::adg_reducer_failure>();
        // SAFETY: raw is live; given and failure are valid for the call.
        let rc = unsafe {
            sys::adg_reducer_end_with(self.raw.as_ptr(), participant, &given, &mut failure)
        };
        if rc == 0 {
            next_round.store(round + 1, Ordering::Relaxed);
            return Ok(());
        }
        let error = Error::last(rc); // the round's reason, read at once
        if failure.code == 0 {
            return Err(RoundError::refused(error, round)); // no round ended
        }
        next_round.store(round + 1, Ordering::Relaxed);
        let (cause, panic) = shared.take_notes(&failure, participant);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
        Err(RoundError::new(error, cause, &failure))
    }
}

impl<T: Grad> Drop for Reducer<T> {
    fn drop(&mut self) {
        // SAFETY: raw is live and nobody borrows self. EBUSY (a round begun
        // and not ended, which only a participant that stopped before its
        // end can leave) frees nothing: the C reducer still points at
        // shared and holds boxed gradients, so both are leaked, which is
        // safe.
        if unsafe { sys::adg_reducer_free(self.raw.as_ptr()) } == 0 {
            // SAFETY: the C reducer is gone, and with it every pointer to
            // shared.
            drop(unsafe { Box::from_raw(self.shared.as_ptr()) });
        }
    }
}

/// Who a round's error came from: matched against its first failure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Culprit {
    Participant(usize),
    Apply(u64),
}

/// What a failed round left for its participants' ends: the errors and
/// the panic of the Rust side, which libadg sees as codes.
struct RoundNotes {
    round: u64,
    /// Participants still to read them; the last one drops them.
    readers: usize,
    errors: Vec<(Culprit, Error)>,
    /// The first panic caught in add or apply, for participant 0.
    panic: Option<Box<dyn Any + Send>>,
}

/// The user's update.
type Apply<T> = dyn Fn(Reduction<'_, T>) -> Result<()> + Send + Sync;

/// The callbacks' context.
struct Shared<T> {
    apply: Box<Apply<T>>,
    /// The apply of parameters in slices ([`ReducerBuilder::slices`]).
    apply_slice: Option<Box<ApplySlice>>,
    /// The C reducer, for the round an add runs in.
    raw: AtomicPtr<sys::adg_reducer>,
    participants: usize,
    /// Notes of failed rounds not yet read by every participant: one
    /// round's, or two while a participant has not read the last one.
    notes: Mutex<Vec<RoundNotes>>,
    /// Each participant's rounds ended, written by its own thread only.
    next_round: Vec<AtomicU64>,
}

impl<T> Shared<T> {
    /// Runs f on round `round`'s notes, made if need be, under the lock.
    fn with_notes(&self, round: u64, f: impl FnOnce(&mut RoundNotes)) {
        let mut rounds = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        let index = match rounds.iter().position(|r| r.round == round) {
            Some(i) => i,
            None => {
                rounds.push(RoundNotes {
                    round,
                    readers: self.participants,
                    errors: Vec::new(),
                    panic: None,
                });
                rounds.len() - 1
            }
        };
        f(&mut rounds[index]);
    }

    /// Keeps the error of a culprit of round `round`, which fails.
    fn note_error(&self, round: u64, culprit: Culprit, error: Error) {
        self.with_notes(round, |n| n.errors.push((culprit, error)));
    }

    /// Keeps a panic caught in add or apply in round `round` (the first;
    /// later ones are dropped).
    fn note_panic(&self, round: u64, payload: Box<dyn Any + Send>) {
        self.with_notes(round, |n| {
            n.panic.get_or_insert(payload);
        });
    }

    /// What a participant's end learns of a failed round: the error of the
    /// first failure's culprit, and, for participant 0, the panic.
    fn take_notes(
        &self,
        failure: &sys::adg_reducer_failure,
        participant: usize,
    ) -> (Option<Error>, Option<Box<dyn Any + Send>>) {
        let culprit = match failure.site {
            sys::ADG_REDUCER_FAILED_RESULT => Some(Culprit::Participant(failure.participant)),
            sys::ADG_REDUCER_FAILED_APPLY => Some(Culprit::Apply(failure.param_id)),
            _ => None,
        };
        let mut rounds = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        let Some(index) = rounds.iter().position(|r| r.round == failure.round) else {
            return (None, None);
        };
        let entry = &mut rounds[index];
        let cause = entry
            .errors
            .iter()
            .find(|(c, _)| Some(*c) == culprit)
            .map(|(_, e)| e.clone());
        let panic = if participant == 0 {
            entry.panic.take()
        } else {
            None
        };
        entry.readers -= 1;
        if entry.readers == 0 {
            rounds.swap_remove(index);
        }
        (cause, panic)
    }

    /// An apply's code for C, its error or panic kept for the round's ends.
    fn apply_result(
        &self,
        r: &sys::adg_reduction,
        result: std::thread::Result<Result<()>>,
    ) -> c_int {
        match result {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                let code = e.c_code();
                self.note_error(r.round, Culprit::Apply(r.id), e);
                code
            }
            Err(payload) => {
                self.note_panic(r.round, payload);
                sys::ADG_ETHREW
            }
        }
    }

    /// A fold's code for C, its panic kept for the round's ends.
    fn fold_result(&self, folded: std::thread::Result<()>) -> c_int {
        match folded {
            Ok(()) => 0,
            Err(payload) => {
                self.note_panic(self.current_round(), payload);
                sys::ADG_ETHREW
            }
        }
    }

    /// The round a callback runs in: the rounds completed, as no round
    /// completes while one of its callbacks runs.
    fn current_round(&self) -> u64 {
        let mut rounds = 0;
        // SAFETY: set before any callback can run (Acquire pairs with the
        // builder's Release), and live while callbacks run.
        unsafe { sys::adg_reducer_rounds(self.raw.load(Ordering::Acquire), &mut rounds) };
        rounds
    }
}

/// A backward's failure site, back in C's terms.
fn c_site(site: Site) -> sys::adg_failure_site {
    match site {
        Site::Step => sys::ADG_FAILED_STEP,
        Site::OnStep => sys::ADG_FAILED_ON_STEP,
        Site::OnReady => sys::ADG_FAILED_ON_READY,
        Site::Add => sys::ADG_FAILED_ADD,
        Site::Check => sys::ADG_FAILED_CHECK,
        _ => sys::ADG_FAILED_NOWHERE,
    }
}

/// `ops.add`: folds the right subtree's sum into the left one's.
unsafe extern "C" fn add_c<T: Grad>(
    sum: *mut *mut c_void,
    value: *const c_void,
    ctx: *mut c_void,
) -> c_int {
    // SAFETY: ctx is the reducer's Shared<T>; sum and value are packed T's
    // (from the backward's container or give), distinct, and no other
    // thread touches them during this fold (the C contract).
    let shared = unsafe { &*ctx.cast::<Shared<T>>() };
    shared.fold_result(catch_unwind(AssertUnwindSafe(|| unsafe {
        let other = crate::value::peek_c::<T>(value);
        crate::value::with_c_mut(sum, |s: &mut T| s.add(&other));
    })))
}

/// `ops.apply`: the user's apply closure, with panics kept.
unsafe extern "C" fn apply_c<T: Grad>(r: *const sys::adg_reduction, ctx: *mut c_void) -> c_int {
    // SAFETY: ctx is the reducer's Shared<T>; r is valid for the call; its
    // sum, when set, is a packed T that only this apply touches now.
    let (shared, r) = unsafe { (&*ctx.cast::<Shared<T>>(), &*r) };
    if r.n_slices > 1 {
        let result = match (&shared.apply_slice, r.sum.is_null()) {
            (Some(apply_slice), false) => catch_unwind(AssertUnwindSafe(|| apply_slice(r))),
            _ => Ok(Ok(())), // no unit had a gradient: nothing to apply
        };
        return shared.apply_result(r, result);
    }
    let run = |sum: Option<&mut T>| {
        let reduction = Reduction {
            param: r.param,
            id: r.id,
            round: r.round,
            sum,
            units: r.first_unit..r.first_unit + r.n_units,
        };
        catch_unwind(AssertUnwindSafe(|| (shared.apply)(reduction)))
    };
    let result = if r.sum.is_null() {
        run(None)
    } else {
        unsafe { crate::value::with_c_value_mut(r.sum, |s: &mut T| run(Some(s))) }
    };
    shared.apply_result(r, result)
}

/// `ops.release`: drops a contribution (or a sum) after the barrier. A
/// panicking drop aborts, as the core's gradient free does: release has
/// no way to report it.
unsafe extern "C" fn release_c<T: Grad>(
    value: *mut c_void,
    _participant: usize,
    _ctx: *mut c_void,
) {
    // SAFETY: value is a packed T the reducer held and now hands back.
    crate::panic::abort_on_panic(|| drop(unsafe { crate::value::from_c::<T>(value) }));
}

impl RoundError {
    fn new(error: Error, cause: Option<Error>, f: &sys::adg_reducer_failure) -> RoundError {
        let site = match f.site {
            sys::ADG_REDUCER_FAILED_RESULT => FailureSite::Participant,
            sys::ADG_REDUCER_FAILED_ADD => FailureSite::Add,
            sys::ADG_REDUCER_FAILED_APPLY => FailureSite::Apply,
            _ => FailureSite::Units,
        };
        let step_name = match (f.step.name.is_null(), &cause) {
            // SAFETY: a step's static, NUL-terminated name.
            (false, _) => Some(
                unsafe { CStr::from_ptr(f.step.name) }
                    .to_string_lossy()
                    .into_owned(),
            ),
            (true, Some(cause)) => cause.failure().and_then(|f| f.name.clone()),
            (true, None) => None,
        };
        RoundError(Box::new(RoundFacts {
            error,
            cause,
            site,
            round: f.round,
            participant: (f.participant != usize::MAX).then_some(f.participant),
            param_id: (f.param_id != 0).then_some(f.param_id),
            unit: (f.unit != sys::ADG_REDUCER_NO_UNIT).then_some(f.unit),
            step_node: (f.step.node_id != 0).then_some(f.step.node_id),
            step_name,
        }))
    }

    fn refused(error: Error, round: u64) -> RoundError {
        RoundError(Box::new(RoundFacts {
            error,
            cause: None,
            site: FailureSite::Call,
            round,
            participant: None,
            param_id: None,
            unit: None,
            step_node: None,
            step_name: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_the_elements_once_in_order() {
        for len in [0, 1, 5, 7, 1000] {
            for n in 1..=9 {
                let mut next = 0;
                for k in 0..n {
                    let r = slice_range(len, k, n);
                    assert_eq!(r.start, next);
                    next = r.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    /// Two boxed Vecs' pointers, shared by threads that each take their
    /// own slice of them.
    struct Both(*mut Vec<f64>, *mut Vec<f64>);
    // SAFETY: the threads touch disjoint slices (the test's point).
    unsafe impl Sync for Both {}

    /// Threads fold and read disjoint slices of the same two boxed Vecs at
    /// once, as the reducer's threads do; Miri checks the pointers.
    #[test]
    fn slices_fold_side_by_side() {
        let both = Both(
            Box::into_raw(Box::new((0..10).map(f64::from).collect())),
            Box::into_raw(Box::new(vec![0.5; 10])),
        );
        std::thread::scope(|s| {
            for k in 0..3 {
                let both = &both;
                s.spawn(move || {
                    let (sum, value) = (both.0.cast::<c_void>(), both.1.cast_const().cast());
                    // SAFETY: live boxed Vecs; each thread its own slice.
                    unsafe { add_slice::<f64>(sum, value, k, 3) };
                    let (range, values) = unsafe { slice_of::<f64>(sum, k, 3) };
                    for (i, v) in range.zip(values.iter()) {
                        assert_eq!(*v, i as f64 + 0.5);
                    }
                });
            }
        });
        // SAFETY: the threads are done; the boxes are still ours.
        let (sum, value) = unsafe { (Box::from_raw(both.0), Box::from_raw(both.1)) };
        assert_eq!(
            *sum,
            (0..10).map(|i| f64::from(i) + 0.5).collect::<Vec<_>>()
        );
        assert_eq!(value.len(), 10);
    }

    #[test]
    fn a_fold_of_different_lengths_panics() {
        let sum = Box::into_raw(Box::new(vec![1.0f32; 4]));
        let value = Box::into_raw(Box::new(vec![1.0f32; 3]));
        let folded = std::panic::catch_unwind(|| unsafe {
            add_slice::<f32>(sum.cast(), value.cast_const().cast(), 0, 2)
        });
        assert!(folded.is_err());
        // SAFETY: nothing else holds them.
        let (sum, _value) = unsafe { (Box::from_raw(sum), Box::from_raw(value)) };
        assert_eq!(*sum, [1.0; 4]); // untouched
    }
}
