//! Exact float sums (`adg/exact.h`): the same bits whatever the order of
//! the terms, and however they were grouped into accumulators.

use std::fmt;
use std::ptr::NonNull;

use adg_sys as sys;

use crate::error::{check, Result};
use crate::Grad;

/// `n` sums of `f32` terms, each kept exactly (`adg_exact`): a fixed-point
/// integer of 72 bytes counting units of 2^-149, the smallest subnormal,
/// exact for any number of terms while a sum stays below 2^160 in
/// magnitude. Integer addition is associative, so a sum's bits depend on
/// its terms alone: not on their order, not on how they were split into
/// accumulators that were then [`merge`](ExactSum::merge)d, not on which
/// thread added which. [`round`](ExactSum::round) rounds each sum once, to
/// the nearest float (ties to even).
///
/// ```
/// let (big, small) = (2f32.powi(100), 2f32.powi(-100));
/// assert_eq!(big + small - big, 0.0); // float addition loses `small`
///
/// let mut sum = adg::ExactSum::new(1)?; // one sum
/// for term in [big, small, -big] {
///     sum.add(0, &[term])?; // each term into sum 0
/// }
/// assert_eq!(sum.rounded(), [small]);
/// # Ok::<(), adg::Error>(())
/// ```
///
/// For a trainer whose work cannot be cut into fixed units of the
/// [`Reducer`](crate::Reducer): each thread adds the gradient of each piece
/// of work it takes (a sample, a graph) to an accumulator of its own, and
/// the accumulators are merged and rounded. The weights are then the same
/// at every thread count, as long as each piece's float gradient is
/// computed alone (a backward each). `ExactSum` is a [`Grad`] whose add is
/// a whole [`merge`](ExactSum::merge), so a `Reducer<ExactSum>` takes one
/// accumulator per participant ([`Reducer::give`](crate::Reducer::give))
/// and its apply rounds the sum. A large parameter's sum may be cut into
/// slices ([`ReducerBuilder<ExactSum>`](crate::ReducerBuilder)'s `slices`):
/// threads then merge and round disjoint ranges of one sum side by side,
/// each apply reading its own range through an
/// [`ExactSliceReduction`](crate::ExactSliceReduction).
///
/// The price, against under 0.1 ns for a float add: 72 bytes a sum, and
/// about 3.4 ns a term, 0.3 to 0.5 ns a sum to merge and 3 to 9 ns a sum
/// to round (`docs/bench.md`, "Exact sums").
///
/// It is `Send` and `Sync`: `&self` only reads (rounds, or serves as a
/// merge's `other`, which C allows on several threads at once), and adds,
/// clears and merges into `self` take `&mut self`. [`Clone`] makes an
/// exact copy. Dropping it frees it (`adg_exact_free`); its memory comes
/// from the C library's `malloc`.
pub struct ExactSum {
    raw: NonNull<sys::adg_exact>,
    len: usize,
}

// SAFETY: an accumulator is plain memory that no thread owns; exact.h's
// rules are about what runs at once, not where.
unsafe impl Send for ExactSum {}
// SAFETY: exact.h: one thread at a time adds to or clears an accumulator;
// rounds of it, and merges that read it as `other`, may run on several
// threads at once while nobody adds to or clears it. `&ExactSum` reaches
// only adg_exact_round, adg_exact_length and the `other` of a merge; add,
// clear and merge into self take `&mut self`, which no `&` can overlap.
// (C also allows merges into disjoint ranges of one accumulator at once:
// the reducer's slices do them through `&self` with the unsafe
// `merge_range_shared`, on sums that only its folds and slice applies
// reach, each thread its own range.)
unsafe impl Sync for ExactSum {}

impl ExactSum {
    /// A new accumulator of `n` sums, each 0 (`adg_exact_new`).
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` for `n` 0 or so large that the size overflows,
    /// `ADG_ENOMEM`.
    ///
    /// ```
    /// let sum = adg::ExactSum::new(3)?;
    /// assert_eq!(sum.len(), 3);
    /// assert_eq!(sum.rounded(), [0.0; 3]);
    /// assert_eq!(adg::ExactSum::new(0).unwrap_err().name(), "ADG_EINVAL");
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn new(n: usize) -> Result<ExactSum> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: out is writable.
        check(unsafe { sys::adg_exact_new(n, &mut raw) })?;
        Ok(ExactSum {
            raw: NonNull::new(raw).expect("adg_exact_new returned 0 and no accumulator"),
            len: n,
        })
    }

    /// The number of sums, `n` of [`ExactSum::new`].
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: an accumulator holds at least one sum.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets every sum to 0 (`adg_exact_clear`), to start again with the
    /// same memory.
    pub fn clear(&mut self) {
        // SAFETY: raw is live and ours alone (&mut self).
        let rc = unsafe { sys::adg_exact_clear(self.raw.as_ptr()) };
        debug_assert_eq!(rc, 0, "adg_exact_clear fails only for NULL");
    }

    /// Adds `values[i]` to sum `first + i`, for each `i`, exactly
    /// (`adg_exact_add`): one term per sum. `-0.0` adds as `0.0`. To add
    /// several terms to one sum, call it once per term, or add a slice of
    /// gradients to the accumulator's sums element by element.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` when `first + values.len()` is past [`len`]
    /// (`first` past it with no values too). `ADG_EVALUE` when a value is
    /// infinite or NaN: nothing is added then, and the reason names the
    /// first such index.
    ///
    /// ```
    /// let mut sum = adg::ExactSum::new(2)?;
    /// sum.add(0, &[1.0, 2.0])?; // sums 1 and 2
    /// sum.add(1, &[0.5])?; // sum 1 now 2.5
    /// assert_eq!(sum.rounded(), [1.0, 2.5]);
    /// let e = sum.add(0, &[1.0, f32::NAN]).unwrap_err();
    /// assert_eq!(e.name(), "ADG_EVALUE");
    /// assert_eq!(sum.rounded(), [1.0, 2.5]); // nothing added
    /// # Ok::<(), adg::Error>(())
    /// ```
    ///
    /// [`len`]: ExactSum::len
    pub fn add(&mut self, first: usize, values: &[f32]) -> Result<()> {
        // SAFETY: raw is live and ours alone; values are valid for their
        // length (a dangling non-NULL pointer when empty, which C does not
        // read).
        check(unsafe {
            sys::adg_exact_add(self.raw.as_ptr(), first, values.as_ptr(), values.len())
        })
    }

    /// Adds each of `other`'s sums to the same sum of `self`, exactly
    /// (`adg_exact_merge` over all of them); `other` is only read.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` when the lengths differ; nothing changes then.
    ///
    /// ```
    /// let (mut a, mut b) = (adg::ExactSum::new(1)?, adg::ExactSum::new(1)?);
    /// a.add(0, &[1.0])?;
    /// b.add(0, &[2f32.powi(-30)])?;
    /// a.merge(&b)?;
    /// assert_eq!(a.rounded(), [1.0]); // 1 + 2^-30, rounded once
    /// b.merge(&a)?; // 1 + 2^-29 exactly, rounded: 1.0
    /// assert_eq!(b.rounded(), [1.0]);
    /// assert!(a.merge(&adg::ExactSum::new(2)?).is_err());
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn merge(&mut self, other: &ExactSum) -> Result<()> {
        self.merge_range(other, 0, self.len)
    }

    /// Adds `other`'s sums `first..first + count` to the same sums of
    /// `self`, exactly (`adg_exact_merge`); `other` is only read.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` when the lengths differ or the range is past
    /// [`len`](ExactSum::len); nothing changes then.
    ///
    /// ```
    /// let (mut a, mut b) = (adg::ExactSum::new(3)?, adg::ExactSum::new(3)?);
    /// b.add(0, &[1.0, 2.0, 3.0])?;
    /// a.merge_range(&b, 1, 2)?;
    /// assert_eq!(a.rounded(), [0.0, 2.0, 3.0]);
    /// assert_eq!(a.merge_range(&b, 2, 2).unwrap_err().name(), "ADG_EINVAL");
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn merge_range(&mut self, other: &ExactSum, first: usize, count: usize) -> Result<()> {
        // SAFETY: both are live; self is ours alone (&mut self), and other
        // is another accumulator (the borrows cannot alias) that only
        // reads happen to while its & lives.
        check(unsafe { sys::adg_exact_merge(self.raw.as_ptr(), other.raw.as_ptr(), first, count) })
    }

    /// [`merge_range`](ExactSum::merge_range) through `&self`, for the
    /// reducer's slices: several threads merge into disjoint ranges of one
    /// sum at once, so none may hold `&mut` to it.
    ///
    /// # Safety
    ///
    /// Until it returns, no other thread touches `self`'s sums
    /// `first..first + count` (merges into them, rounds them, or reads
    /// them as a merge's `other`), nor adds to or clears `self` or
    /// `other`: exact.h lets merges into disjoint ranges of one
    /// accumulator, and rounds of it, run at once on several threads while
    /// no thread adds to or clears the accumulators they read.
    pub(crate) unsafe fn merge_range_shared(
        &self,
        other: &ExactSum,
        first: usize,
        count: usize,
    ) -> Result<()> {
        // SAFETY: both are live; the caller keeps the range ours alone and
        // both accumulators free of adds and clears (exact.h's rule). C
        // refuses other being self.
        check(unsafe { sys::adg_exact_merge(self.raw.as_ptr(), other.raw.as_ptr(), first, count) })
    }

    /// Writes sums `first..first + out.len()`, each rounded once to the
    /// nearest `f32` (ties to even), to `out` (`adg_exact_round`): `+0.0`
    /// for a sum of 0, an infinity for a sum beyond `f32::MAX`'s rounding,
    /// as IEEE addition would give.
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` when the range is past [`len`](ExactSum::len); `out`
    /// is left as it was then.
    ///
    /// ```
    /// let mut sum = adg::ExactSum::new(3)?;
    /// sum.add(0, &[1.0, 2.0, 3.0])?;
    /// let mut out = [0.0; 2];
    /// sum.round(1, &mut out)?;
    /// assert_eq!(out, [2.0, 3.0]);
    /// assert!(sum.round(2, &mut out).is_err());
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn round(&self, first: usize, out: &mut [f32]) -> Result<()> {
        // SAFETY: raw is live and only read, which C allows on several
        // threads at once; out is writable for its length.
        check(unsafe {
            sys::adg_exact_round(self.raw.as_ptr(), first, out.as_mut_ptr(), out.len())
        })
    }

    /// Every sum rounded, as [`round`](ExactSum::round) rounds them: a
    /// vector of [`len`](ExactSum::len) floats.
    pub fn rounded(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len];
        self.round(0, &mut out)
            .expect("adg_exact_round of every sum cannot fail");
        out
    }

    /// The C handle, for calls this crate does not wrap. It stays owned by
    /// `self`: do not free it.
    pub fn as_ptr(&self) -> *mut sys::adg_exact {
        self.raw.as_ptr()
    }
}

impl Drop for ExactSum {
    fn drop(&mut self) {
        // SAFETY: raw is live and nobody borrows self; it cannot fail.
        unsafe { sys::adg_exact_free(self.raw.as_ptr()) };
    }
}

/// A new accumulator of the same length with `self` merged in: the same
/// sums, exactly, that change apart from then on. When the allocation
/// fails, it calls [`handle_alloc_error`](std::alloc::handle_alloc_error),
/// as `Vec` does: by default that aborts the process with a message.
///
/// ```
/// let mut a = adg::ExactSum::new(2)?;
/// a.add(0, &[1.0, 2f32.powi(-40)])?;
/// let mut b = a.clone();
/// b.add(1, &[1.0])?;
/// assert_eq!(a.rounded(), [1.0, 2f32.powi(-40)]);
/// assert_eq!(b.rounded(), [1.0, 1.0]); // 1 + 2^-40, rounded
/// # Ok::<(), adg::Error>(())
/// ```
impl Clone for ExactSum {
    fn clone(&self) -> ExactSum {
        // An accumulator of this length exists, so new fails only for
        // want of memory (ADG_ENOMEM).
        let mut copy = ExactSum::new(self.len).unwrap_or_else(|_| {
            let layout = std::alloc::Layout::array::<[u64; 9]>(self.len)
                .expect("an existing accumulator's size fits");
            std::alloc::handle_alloc_error(layout)
        });
        copy.merge(self)
            .expect("adg_exact_merge of equal lengths cannot fail");
        copy
    }

    /// Reuses `self`'s memory when the lengths are equal.
    fn clone_from(&mut self, source: &ExactSum) {
        if self.len == source.len {
            self.clear();
            self.merge(source)
                .expect("adg_exact_merge of equal lengths cannot fail");
        } else {
            *self = source.clone();
        }
    }
}

impl fmt::Debug for ExactSum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactSum")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

/// A whole [`merge`](ExactSum::merge): exact, so a backward's or a
/// reducer's sum of `ExactSum`s has the same bits in any fold order.
/// Panics when the lengths differ, as the `Vec` gradients do.
impl Grad for ExactSum {
    fn add(&mut self, other: &Self) {
        assert_eq!(
            self.len, other.len,
            "adg::Grad::add: gradients of different lengths"
        );
        self.merge(other)
            .expect("adg_exact_merge of equal lengths cannot fail");
    }
}
