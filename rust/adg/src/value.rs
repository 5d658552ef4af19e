//! How a gradient of type T travels through the C API as a `void *`:
//! inline, as its bits, for `f64` and `f32`, so that giving a gradient
//! allocates nothing; any other T as a `Box<T>` raw pointer. The crate's
//! modules (the reducer's too) go through these functions, never through a
//! cast of the pointer to `*mut T`:
//!
//! | instead of                      | use                        |
//! |---------------------------------|----------------------------|
//! | `Box::into_raw(Box::new(v))`    | `into_c(v)`                |
//! | `*Box::from_raw(p.cast::<T>())` | `from_c::<T>(p)`           |
//! | `&*p.cast::<T>()`               | `peek_c::<T>(p)` (derefs)  |
//! | `&mut *(*slot).cast::<T>()`     | `with_c_mut(slot, f)`      |
//! | `&mut *p.cast::<T>()`, no slot  | `with_c_value_mut(p, f)`   |
//!
//! NULL is libadg's "no gradient", so an inline value never packs to it: a
//! `f64`'s bits are XORed with those of one signaling NaN that no
//! arithmetic makes (that NaN, if given, arrives as a quiet NaN), and an
//! `f32`'s carry a tag bit above them, as adg.hpp's `packing` does.

use crate::gradients::Grad;
use std::any::TypeId;
use std::ffi::c_void;
use std::mem::{transmute_copy, ManuallyDrop};
use std::ops::Deref;

const F64_TAG: u64 = 0x7ff4_d1a9_c0ff_ee01;
const F32_TAG: usize = 1 << (usize::BITS - 1);
const QUIET: u64 = 0x0008_0000_0000_0000;

#[derive(PartialEq, Eq)]
enum Repr {
    Boxed,
    F64,
    F32,
}

/// T's representation: constant per T once monomorphized.
fn repr<T: 'static>() -> Repr {
    if TypeId::of::<T>() == TypeId::of::<f64>() {
        Repr::F64
    } else if TypeId::of::<T>() == TypeId::of::<f32>() && usize::BITS > 32 {
        Repr::F32
    } else {
        Repr::Boxed
    }
}

/// Whether T travels inline (no allocation, no address).
pub(crate) fn is_inline<T: Grad>() -> bool {
    repr::<T>() != Repr::Boxed
}

/// A value handed to libadg, which owns it from then on.
pub(crate) fn into_c<T: Grad>(value: T) -> *mut c_void {
    let value = ManuallyDrop::new(value);
    match repr::<T>() {
        Repr::F64 => {
            // SAFETY: T is f64.
            let d: f64 = unsafe { transmute_copy(&*value) };
            let mut bits = d.to_bits() ^ F64_TAG;
            if bits == 0 {
                bits = QUIET; /* the tag's own NaN: a quiet NaN instead */
            }
            from_bits(bits as usize)
        }
        Repr::F32 => {
            // SAFETY: T is f32.
            let f: f32 = unsafe { transmute_copy(&*value) };
            from_bits(f.to_bits() as usize | F32_TAG)
        }
        Repr::Boxed => Box::into_raw(Box::new(ManuallyDrop::into_inner(value))).cast(),
    }
}

/// A pointer that is only bits (no provenance: it is never dereferenced).
fn from_bits(bits: usize) -> *mut c_void {
    std::ptr::null_mut::<u8>().wrapping_add(bits).cast()
}

/// A copy of an inline value.
///
/// # Safety
/// T is inline and `value` is one of its packed values.
unsafe fn unpack<T: Grad>(value: *const c_void) -> T {
    match repr::<T>() {
        Repr::F64 => {
            let d = f64::from_bits(value as usize as u64 ^ F64_TAG);
            // SAFETY: T is f64.
            unsafe { transmute_copy(&d) }
        }
        Repr::F32 => {
            let f = f32::from_bits((value as usize & !F32_TAG) as u32);
            // SAFETY: T is f32.
            unsafe { transmute_copy(&f) }
        }
        Repr::Boxed => unreachable!("unpack of a boxed value"),
    }
}

/// Takes back a value libadg handed over.
///
/// # Safety
/// `value` is non-NULL, made by [`into_c::<T>`], and the caller's to own.
pub(crate) unsafe fn from_c<T: Grad>(value: *mut c_void) -> T {
    if is_inline::<T>() {
        // SAFETY: the caller's contract.
        unsafe { unpack(value) }
    } else {
        // SAFETY: a Box<T> of into_c, handed over.
        *unsafe { Box::from_raw(value.cast::<T>()) }
    }
}

/// A value borrowed from libadg: the boxed value itself, or a copy of an
/// inline one.
pub(crate) enum CRef<'a, T> {
    Boxed(&'a T),
    Inline(T),
}

impl<T> Deref for CRef<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            CRef::Boxed(r) => r,
            CRef::Inline(v) => v,
        }
    }
}

/// Borrows a value libadg holds.
///
/// # Safety
/// `value` is non-NULL, made by [`into_c::<T>`], and stays live and
/// unchanged for `'a`.
pub(crate) unsafe fn peek_c<'a, T: Grad>(value: *const c_void) -> CRef<'a, T> {
    if is_inline::<T>() {
        // SAFETY: the caller's contract.
        CRef::Inline(unsafe { unpack(value) })
    } else {
        // SAFETY: a live Box<T>.
        CRef::Boxed(unsafe { &*value.cast::<T>() })
    }
}

/// Runs `f` on the value in `*slot`, changing it in place (an inline
/// value is unpacked, changed and packed back; unchanged if `f` panics).
///
/// # Safety
/// `*slot` is non-NULL, made by [`into_c::<T>`], and the caller's to
/// change.
pub(crate) unsafe fn with_c_mut<T: Grad, R>(
    slot: *mut *mut c_void,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    if is_inline::<T>() {
        // SAFETY: the caller's contract.
        let mut v: T = unsafe { unpack(*slot) };
        let r = f(&mut v);
        // SAFETY: as above; an inline value owns nothing.
        unsafe { *slot = into_c(v) };
        r
    } else {
        // SAFETY: a live Box<T> the caller may change.
        f(unsafe { &mut *(*slot).cast::<T>() })
    }
}

/// Runs `f` on the value `value` points to, where the caller may change
/// it but has no slot to replace it in (a reducer's apply, told a sum in a
/// const struct): a boxed value itself, or a copy of an inline one, whose
/// changes are not kept (nothing reads the value after such a callback).
///
/// # Safety
/// `value` is non-NULL, made by [`into_c::<T>`], and the caller's to
/// change.
#[allow(dead_code)]
pub(crate) unsafe fn with_c_value_mut<T: Grad, R>(
    value: *mut c_void,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    if is_inline::<T>() {
        // SAFETY: the caller's contract.
        let mut copy: T = unsafe { unpack(value) };
        f(&mut copy)
    } else {
        // SAFETY: a live Box<T> the caller may change.
        f(unsafe { &mut *value.cast::<T>() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Grad + Copy + PartialEq + std::fmt::Debug>(v: T) {
        let p = into_c(v);
        assert!(!p.is_null());
        // SAFETY: just packed, ours.
        assert_eq!(*unsafe { peek_c::<T>(p) }, v);
        assert_eq!(unsafe { from_c::<T>(p) }, v);
    }

    #[test]
    fn values_round_trip_and_never_pack_to_null() {
        for d in [0.0, -0.0, 1.5, f64::INFINITY, f64::MIN_POSITIVE, f64::MAX] {
            round_trip(d);
        }
        for f in [0.0f32, -0.0, 1.5, f32::INFINITY] {
            round_trip(f);
        }
        // The tag's own NaN packs to a quiet NaN, not to NULL.
        let p = into_c(f64::from_bits(F64_TAG));
        assert!(!p.is_null());
        assert!(unsafe { from_c::<f64>(p) }.is_nan());
        let v = into_c(vec![1.0f64, 2.0]);
        assert_eq!(unsafe { from_c::<Vec<f64>>(v) }, [1.0, 2.0]);
    }

    #[test]
    fn a_value_changes_in_place() {
        let mut p = into_c(2.0f64);
        unsafe { with_c_mut::<f64, _>(&mut p, |v| *v *= 3.0) };
        assert_eq!(unsafe { from_c::<f64>(p) }, 6.0);
        let mut q = into_c(vec![1.0f32]);
        unsafe { with_c_mut::<Vec<f32>, _>(&mut q, |v| v.push(2.0)) };
        unsafe { with_c_value_mut::<Vec<f32>, _>(q, |v| v.push(3.0)) };
        assert_eq!(unsafe { from_c::<Vec<f32>>(q) }, [1.0, 2.0, 3.0]);
        let r = into_c(1.0f64);
        let seen = unsafe { with_c_value_mut::<f64, _>(r, |v| *v + 1.0) };
        assert_eq!(seen, 2.0);
    }
}
