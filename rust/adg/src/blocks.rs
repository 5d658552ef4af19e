//! Where step closures live: a thread's cache of freed blocks by size (16
//! to 128 bytes), so that recording an op allocates nothing once the cache
//! is warm, as adg.hpp's closure cache does. A block freed on another
//! thread joins that thread's cache; each size keeps at most KEEP_BYTES of
//! blocks (a graph of a few thousand small steps, dropped, is recorded
//! again from the cache), the rest go back to the heap, and a thread's
//! cache goes back to the heap when the thread exits (after which the
//! thread, in a late TLS destructor, uses the heap directly).

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::Cell;
use std::ptr;

const GRAIN: usize = 16;
const CLASSES: usize = 8;
const KEEP_BYTES: usize = 64 * 1024;

struct Free {
    next: *mut Free,
}

struct Cache {
    head: [Cell<*mut Free>; CLASSES],
    count: [Cell<usize>; CLASSES],
}

impl Drop for Cache {
    fn drop(&mut self) {
        for (k, head) in self.head.iter().enumerate() {
            let mut b = head.replace(ptr::null_mut());
            while !b.is_null() {
                // SAFETY: a block of class k, cached, no longer used.
                let next = unsafe { (*b).next };
                unsafe { dealloc(b.cast(), class_layout(k)) };
                b = next;
            }
        }
    }
}

thread_local! {
    static CACHE: Cache = const {
        Cache {
            head: [const { Cell::new(ptr::null_mut()) }; CLASSES],
            count: [const { Cell::new(0) }; CLASSES],
        }
    };
}

fn class_layout(k: usize) -> Layout {
    Layout::from_size_align((k + 1) * GRAIN, GRAIN).expect("a class's layout")
}

/// The class of a layout the cache serves, or None.
fn class(layout: Layout) -> Option<usize> {
    let size = layout.size();
    (size > 0 && size <= CLASSES * GRAIN && layout.align() <= GRAIN).then(|| (size - 1) / GRAIN)
}

/// Memory for a value of layout (size > 0).
pub(crate) fn allocate(layout: Layout) -> *mut u8 {
    let Some(k) = class(layout) else {
        // SAFETY: a layout of non-zero size (the callers').
        return checked(unsafe { alloc(layout) }, layout);
    };
    let cached = CACHE
        .try_with(|c| {
            let b = c.head[k].get();
            if !b.is_null() {
                // SAFETY: a cached block of class k.
                c.head[k].set(unsafe { (*b).next });
                c.count[k].set(c.count[k].get() - 1);
            }
            b
        })
        .unwrap_or(ptr::null_mut());
    if cached.is_null() {
        // SAFETY: a class layout, of non-zero size.
        checked(unsafe { alloc(class_layout(k)) }, class_layout(k))
    } else {
        cached.cast()
    }
}

fn checked(p: *mut u8, layout: Layout) -> *mut u8 {
    if p.is_null() {
        handle_alloc_error(layout);
    }
    p
}

/// Frees memory `allocate(layout)` gave.
///
/// # Safety
/// `p` came from `allocate(layout)` and is no longer used.
pub(crate) unsafe fn release(p: *mut u8, layout: Layout) {
    let Some(k) = class(layout) else {
        // SAFETY: the caller's contract.
        return unsafe { dealloc(p, layout) };
    };
    let kept = CACHE
        .try_with(|c| {
            if c.count[k].get() * (k + 1) * GRAIN >= KEEP_BYTES {
                return false;
            }
            let b = p.cast::<Free>();
            // SAFETY: a block of class k, at least GRAIN bytes, aligned.
            unsafe {
                b.write(Free {
                    next: c.head[k].get(),
                })
            };
            c.head[k].set(b);
            c.count[k].set(c.count[k].get() + 1);
            true
        })
        .unwrap_or(false);
    if !kept {
        // SAFETY: allocated with the class layout.
        unsafe { dealloc(p, class_layout(k)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_reused_by_size_and_freed_across_threads() {
        let small = Layout::new::<[u64; 3]>();
        let a = allocate(small);
        // SAFETY: a block of 24 bytes or more, ours.
        unsafe { a.cast::<[u64; 3]>().write([1, 2, 3]) };
        unsafe { release(a, small) };
        let b = allocate(small);
        assert_eq!(a, b, "the cached block comes back");
        // A block freed on another thread joins that thread's cache.
        struct Sent(*mut u8);
        // SAFETY: the block is handed over whole.
        unsafe impl Send for Sent {}
        let sent = Sent(b);
        std::thread::spawn(move || {
            let sent = sent;
            unsafe { release(sent.0, small) }
        })
        .join()
        .unwrap();
        // Layouts the cache does not serve go to the heap.
        let big = Layout::from_size_align(4096, 8).unwrap();
        let c = allocate(big);
        unsafe { release(c, big) };
        let aligned = Layout::from_size_align(32, 64).unwrap();
        let d = allocate(aligned);
        assert_eq!(d as usize % 64, 0);
        unsafe { release(d, aligned) };
    }
}
