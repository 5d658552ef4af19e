//! libadg's thread pool: worker threads that run a backward's steps beside
//! the calling thread (`adg/pool.h`).

use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;

use adg_sys as sys;

use crate::error::{check, Result};
use crate::{BackwardOptions, Grad};

/// libadg's thread pool (`adg_pool`): `n_threads` worker threads that sleep,
/// without spinning, while there is no work.
///
/// Give it to a backward as its executor
/// ([`BackwardOptions::executor`](crate::BackwardOptions::executor)) and the
/// steps run on the calling thread and the pool's workers as soon as they
/// are ready: independent branches at once, a chain on one thread. The
/// gradients are bitwise those of the sequential backward, whatever the
/// number of workers. Worth it when one backward has branches of a few
/// microseconds each or more; for many small graphs on many threads, the
/// threads are the parallelism already.
///
/// A pool belongs to no registry and may serve any number of backward
/// passes, from any thread, at once (it is `Send` and `Sync`). The borrow
/// that [`BackwardOptions`](crate::BackwardOptions) holds keeps it alive
/// for as long as a backward may use it. Dropping it runs what is still
/// queued, stops the threads and frees it (`adg_pool_free`); its memory
/// comes from the C library's `malloc`.
///
/// ```
/// # fn main() -> adg::Result<()> {
/// let reg = adg::Registry::<f64>::new()?;
/// let (a, b) = (reg.leaf()?, reg.leaf()?);
/// // y = a * b at a = 3, b = 4: dy/da = b, dy/db = a.
/// let y = reg.op(&[&a, &b], |call| {
///     let g = *call.grad().unwrap_or(&0.0);
///     call.give(0, g * 4.0)?;
///     call.give(1, g * 3.0)
/// })?;
/// let pool = adg::Pool::new(2)?; // 2 workers beside the calling thread
/// let grads = adg::backward_with(&y, 1.0, &adg::BackwardOptions::new().executor(&pool))?;
/// assert_eq!(grads.get(&a), Some(&4.0));
/// assert_eq!(grads.get(&b), Some(&3.0));
/// # Ok(())
/// # }
/// ```
pub struct Pool {
    raw: NonNull<sys::adg_pool>,
    /// The executor that submits to `raw`, filled once: its `ctx` is the
    /// pool's heap address, so moving a `Pool` leaves it valid.
    executor: sys::adg_executor,
    n_threads: u32,
}

// SAFETY: every adg_pool function may be called from any thread at once
// (its queue is under a mutex), and the executor's submit is documented to
// be called from any thread of a backward concurrently with itself; the
// pool is freed only by Drop, which takes it by `&mut`.
unsafe impl Send for Pool {}
// SAFETY: as above: `&Pool` only reaches submit, which is thread-safe.
unsafe impl Sync for Pool {}

impl Pool {
    /// Starts `n_threads` worker threads (1 to 256,
    /// `ADG_EXECUTOR_MAX_WORKERS`).
    ///
    /// # Errors
    ///
    /// `ADG_EINVAL` for `n_threads` out of range, `ADG_ENOMEM` when no
    /// memory is left or a thread could not start (nothing is left
    /// running then).
    ///
    /// ```
    /// let pool = adg::Pool::new(3)?;
    /// assert_eq!(pool.threads(), 3);
    /// assert_eq!(adg::Pool::new(0).unwrap_err().name(), "ADG_EINVAL");
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn new(n_threads: u32) -> Result<Pool> {
        // SAFETY: all-zero is a valid adg_pool_options (no allocator:
        // malloc's), and size is set as the ABI asks.
        let mut options: sys::adg_pool_options = unsafe { std::mem::zeroed() };
        options.size = std::mem::size_of::<sys::adg_pool_options>();
        options.n_threads = n_threads;
        let mut raw = std::ptr::null_mut();
        // SAFETY: options and out are valid for the call.
        check(unsafe { sys::adg_pool_new_with(&options, &mut raw) })?;
        let raw = NonNull::new(raw).expect("adg_pool_new_with returned 0 and no pool");
        let mut executor = MaybeUninit::<sys::adg_executor>::zeroed();
        // SAFETY: raw is a live pool; adg_pool_executor only fails for
        // NULL arguments, which neither is.
        let rc = unsafe { sys::adg_pool_executor(raw.as_ptr(), executor.as_mut_ptr()) };
        debug_assert_eq!(rc, 0);
        Ok(Pool {
            raw,
            // SAFETY: zeroed, then filled by adg_pool_executor.
            executor: unsafe { executor.assume_init() },
            n_threads,
        })
    }

    /// The number of worker threads, as given to [`Pool::new`]: how many
    /// a backward may use beside its calling thread.
    pub fn threads(&self) -> u32 {
        self.n_threads
    }

    /// The C handle, for calls this crate does not wrap. It stays owned by
    /// `self`: do not free it.
    pub fn as_ptr(&self) -> *mut sys::adg_pool {
        self.raw.as_ptr()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: raw is live and no backward borrows self any more. It
        // fails (ADG_EINVAL, nothing freed) only when called from one of
        // the pool's own threads, where a step dropped the last owner of
        // the pool: the pool is then leaked, which is safe.
        unsafe { sys::adg_pool_free(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.n_threads)
            .finish_non_exhaustive()
    }
}

impl<'o, T: Grad> BackwardOptions<'o, T> {
    /// Runs the backward's steps on the calling thread and `pool`'s
    /// workers, each step as soon as the steps that give to its node have
    /// run (`adg_backward_options.executor`). The gradients are bitwise
    /// those of the sequential backward; steps, hooks and [`Grad::add`]
    /// then run on several threads at once. The borrow keeps the pool
    /// alive for as long as the options may run a backward.
    ///
    /// ```
    /// let pool = adg::Pool::new(4)?;
    /// let options = adg::BackwardOptions::<Vec<f32>>::new().executor(&pool);
    /// # drop(options);
    /// # Ok::<(), adg::Error>(())
    /// ```
    pub fn executor(mut self, pool: &'o Pool) -> Self {
        // SAFETY: the pool's submit may be called from any thread at once,
        // and its ctx, the pool, lives for 'o, which the borrow holds.
        unsafe { self.set_executor(pool.executor) };
        self
    }
}
