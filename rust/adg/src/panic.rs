//! What a callback's failure leaves for the backward that ran it: a panic
//! (caught at the extern "C" boundary, so it never unwinds through C) or a
//! step's error, kept by where libadg's failure will name it, and taken by
//! the backward once C has returned, as adg.hpp keeps what a step threw.

use crate::error::{Error, Failure};
use adg_sys as sys;
use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What a callback left.
pub(crate) enum Thrown {
    Panic(Box<dyn Any + Send>),
    Error(Error),
    /// The value check returned false: kept so that a later check's panic
    /// does not stand for the step's first rejection.
    Rejected,
}

struct Kept {
    /// 0: any pass (a hook, which is one backward call's alone).
    pass_id: u64,
    site: sys::adg_failure_site,
    node_id: u64,
    thrown: Thrown,
}

/// Kept failures, by pass, site and node. Touched only on a failure: a
/// backward that succeeds reads `count` alone (a line no thread writes
/// while nothing fails).
#[derive(Default)]
pub(crate) struct Store {
    kept: Mutex<Vec<Kept>>,
    pub(crate) count: AtomicUsize,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept>> {
        // A panic never happens under this lock; take it whatever.
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn keep(&self, at: &sys::adg_failure, thrown: Thrown) {
        let mut kept = self.lock();
        kept.push(Kept {
            pass_id: at.pass_id,
            site: at.site,
            node_id: at.node_id,
            thrown,
        });
        self.count.store(kept.len(), Ordering::Relaxed);
    }

    /// The first kept for where `failure` names (the first kept is the
    /// first failure of that call: its code is the backward's).
    pub(crate) fn take(&self, failure: &sys::adg_failure) -> Option<Thrown> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut kept = self.lock();
        let at = kept.iter().position(|k| {
            (k.pass_id == 0 || k.pass_id == failure.pass_id)
                && k.site == failure.site
                && k.node_id == failure.node_id
        })?;
        let k = kept.remove(at);
        self.count.store(kept.len(), Ordering::Relaxed);
        Some(k.thrown)
    }

    /// Drops what a pass's callbacks left (a second step failing at once
    /// on an executor, or an error a step caught).
    pub(crate) fn drop_pass(&self, pass_id: u64) {
        // Relaxed: the backward's return orders every callback it ran
        // before this load.
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let gone: Vec<Kept> = {
            let mut kept = self.lock();
            let (gone, stay) = kept.drain(..).partition(|k| k.pass_id == pass_id);
            *kept = stay;
            self.count.store(kept.len(), Ordering::Relaxed);
            gone
        };
        drop(gone); /* payloads' drops run outside the lock */
    }
}

/// Keeps `thrown` by the callback libadg says runs on this thread (a
/// value check, an add); dropped when no backward's call runs, as no
/// failure will name it.
pub(crate) fn keep_at_site(store: &Store, thrown: Thrown) {
    let mut at = sized_failure();
    // SAFETY: at is a sized adg_failure of ours.
    if unsafe { sys::adg_callback_site(&mut at) } == 0 {
        store.keep(&at, thrown);
    }
}

pub(crate) fn sized_failure() -> sys::adg_failure {
    sys::adg_failure {
        size: std::mem::size_of::<sys::adg_failure>(),
        code: 0,
        site: sys::ADG_FAILED_NOWHERE,
        node_id: 0,
        name: std::ptr::null(),
        pass_id: 0,
    }
}

/// Runs f, which must not unwind into C and has no way to report a
/// failure (a release, a free): a panic aborts the process, as a panic in
/// an extern "C" function or a throwing destructor in C++ would.
pub(crate) fn abort_on_panic(f: impl FnOnce()) {
    if std::panic::catch_unwind(AssertUnwindSafe(f)).is_err() {
        std::process::abort();
    }
}

/// The backward's error for a failure with code rc and this thread's
/// reason: resumes a panic the failing call left; adds a step's own error
/// to the reason; drops what else the pass left.
pub(crate) fn rethrow(
    rc: i32,
    reason: String,
    failure: &sys::adg_failure,
    steps: &Store,
    hooks: Option<&Store>,
) -> Error {
    let thrown = steps
        .take(failure)
        .or_else(|| hooks.and_then(|h| h.take(failure)));
    steps.drop_pass(failure.pass_id);
    let where_ = Failure::from_c(failure);
    match thrown {
        Some(Thrown::Panic(payload)) => std::panic::resume_unwind(payload),
        Some(Thrown::Error(inner)) if !reason.ends_with(inner.reason()) => {
            Error::new(rc, format!("{reason}: {}", inner.reason())).with_failure(where_)
        }
        _ => Error::new(rc, reason).with_failure(where_),
    }
}
