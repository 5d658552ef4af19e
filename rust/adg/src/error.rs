//! Errors: libadg's codes with the reason the failing call gave.

use adg_sys as sys;
use std::ffi::CStr;
use std::fmt;

/// libadg's error codes (`ADG_E*`), as [`Error::code`] returns them. Every
/// code is negative; codes at or below [`code::EUSER`] are never libadg's
/// own, for steps to fail with.
pub mod code {
    use adg_sys as sys;

    /// A NULL or malformed argument.
    pub const EINVAL: i32 = sys::ADG_EINVAL;
    /// The allocator returned NULL.
    pub const ENOMEM: i32 = sys::ADG_ENOMEM;
    /// A node belongs to another registry.
    pub const EFOREIGN: i32 = sys::ADG_EFOREIGN;
    /// The root's step was consumed by an earlier backward.
    pub const ECONSUMED: i32 = sys::ADG_ECONSUMED;
    /// A step the backward needs was consumed by an earlier backward.
    pub const EUNAVAILABLE: i32 = sys::ADG_EUNAVAILABLE;
    /// Node ids exhausted.
    pub const ENOIDS: i32 = sys::ADG_ENOIDS;
    /// No gradient for that node id.
    pub const ENOTFOUND: i32 = sys::ADG_ENOTFOUND;
    /// Still in use (live nodes, or a round not ended).
    pub const EBUSY: i32 = sys::ADG_EBUSY;
    /// A callback returned a positive value, or failed in a way that has no
    /// code of its own (a writer's I/O error).
    pub const ECALLBACK: i32 = sys::ADG_ECALLBACK;
    /// A call out of order for the object's state.
    pub const ESTATE: i32 = sys::ADG_ESTATE;
    /// A callback panicked (in C++: threw). The backward resumes the panic
    /// rather than return this code; C code running Rust steps sees it.
    pub const ETHREW: i32 = sys::ADG_ETHREW;
    /// A gradient failed the backward's value check.
    pub const EVALUE: i32 = sys::ADG_EVALUE;
    /// The highest code a step may use for its own failures: any code at
    /// or below it is never libadg's.
    pub const EUSER: i32 = sys::ADG_EUSER;
}

/// Where a backward failed ([`Failure::site`]), as `adg_failure_site`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Site {
    /// It failed before running anything (bad input, no memory, a step
    /// it could not take), or did not fail.
    Nowhere,
    /// A step failed (returned an error or panicked).
    Step,
    /// The step hook ([`BackwardOptions::on_step`](crate::BackwardOptions::on_step)),
    /// around a step.
    OnStep,
    /// The ready hook ([`BackwardOptions::on_ready`](crate::BackwardOptions::on_ready)).
    OnReady,
    /// A gradient add ([`Grad::add`](crate::Grad::add)) run by an executor.
    Add,
    /// The value check rejected a gradient the step gave.
    Check,
}

impl Site {
    pub(crate) fn from_c(site: sys::adg_failure_site) -> Site {
        match site {
            sys::ADG_FAILED_STEP => Site::Step,
            sys::ADG_FAILED_ON_STEP => Site::OnStep,
            sys::ADG_FAILED_ON_READY => Site::OnReady,
            sys::ADG_FAILED_ADD => Site::Add,
            sys::ADG_FAILED_CHECK => Site::Check,
            _ => Site::Nowhere,
        }
    }
}

/// Where a failed backward failed: the first failure in tape order, as
/// libadg's `adg_failure` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What failed.
    pub site: Site,
    /// The node whose step (or gradient) failed; 0 with [`Site::Nowhere`].
    pub node_id: u64,
    /// The step's name ([`Registry::op_named`](crate::Registry::op_named)),
    /// when it has one.
    pub name: Option<String>,
    /// The backward pass; 0 when it stopped before beginning one.
    pub pass_id: u64,
}

impl Failure {
    pub(crate) fn from_c(f: &sys::adg_failure) -> Failure {
        let name = if f.name.is_null() {
            None
        } else {
            // SAFETY: a step's name is a static C string (adg_step.name).
            Some(
                unsafe { CStr::from_ptr(f.name) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        Failure {
            site: Site::from_c(f.site),
            node_id: f.node_id,
            name,
            pass_id: f.pass_id,
        }
    }
}

/// A libadg error: a negative `ADG_E*` code and the reason the failing call
/// gave (`adg_errmsg`), or a step's own.
///
/// ```
/// use adg::{code, Registry};
///
/// let reg = Registry::<f64>::new()?;
/// let x = reg.leaf()?;
/// let y = reg.op(&[&x], |_| Ok(()))?;
/// adg::backward(&y, 1.0)?;
/// let again = adg::backward(&y, 1.0).unwrap_err();
/// assert_eq!(again.code(), code::ECONSUMED);
/// assert_eq!(again.name(), "ADG_ECONSUMED");
/// assert!(!again.reason().is_empty());
/// # Ok::<(), adg::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    code: i32,
    reason: String,
    failure: Option<Box<Failure>>,
}

/// `std::result::Result` with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

fn static_str(s: *const std::ffi::c_char) -> &'static str {
    // SAFETY: adg_strerror and adg_error_name return static strings.
    unsafe { CStr::from_ptr(s) }.to_str().unwrap_or("?")
}

impl Error {
    /// An error of a step or hook of the caller's: `code` should be one of
    /// [`code`]'s or a code of the caller's at or below [`code::EUSER`]. A
    /// code of 0 or above, which is no error, reaches libadg as
    /// [`code::ECALLBACK`].
    ///
    /// ```
    /// let e = adg::Error::new(adg::code::EUSER - 1, "the batch was empty");
    /// assert_eq!(e.reason(), "the batch was empty");
    /// ```
    pub fn new(code: i32, reason: impl Into<String>) -> Error {
        Error {
            code,
            reason: reason.into(),
            failure: None,
        }
    }

    /// The error of the libadg call that just returned `code` on this
    /// thread: its reason is this thread's `adg_errmsg`.
    #[cold]
    pub(crate) fn last(code: i32) -> Error {
        // SAFETY: adg_errmsg returns the thread's own NUL-terminated string.
        let reason = unsafe { CStr::from_ptr(sys::adg_errmsg()) };
        Error::new(code, reason.to_string_lossy().into_owned())
    }

    pub(crate) fn with_failure(mut self, failure: Failure) -> Error {
        self.failure = Some(Box::new(failure));
        self
    }

    /// The negative `ADG_E*` code (see [`code`]), or a step's own.
    pub fn code(&self) -> i32 {
        self.code
    }

    /// The code's name, `"ADG_EINVAL"` (`adg_error_name`); `"ADG_UNKNOWN"`
    /// for a code libadg does not define.
    pub fn name(&self) -> &'static str {
        // SAFETY: no precondition; the string is static.
        static_str(unsafe { sys::adg_error_name(self.code) })
    }

    /// What the code means, `"invalid argument"` (`adg_strerror`).
    pub fn message(&self) -> &'static str {
        // SAFETY: no precondition; the string is static.
        static_str(unsafe { sys::adg_strerror(self.code) })
    }

    /// What failed, in which function, with which argument: the failing
    /// call's `adg_errmsg`, or the reason a step gave [`Error::new`].
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// For an error of a backward: where it failed (the step, its node and
    /// name). `None` for other calls.
    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_deref()
    }

    /// The code a C callback returns for this error: never 0 or above.
    pub(crate) fn c_code(&self) -> i32 {
        if self.code < 0 {
            self.code
        } else {
            sys::ADG_ECALLBACK
        }
    }
}

impl fmt::Display for Error {
    /// `"ADG_EINVAL: invalid argument: <reason>"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name(), self.message())?;
        if !self.reason.is_empty() {
            write!(f, ": {}", self.reason)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// `Ok(())` for 0, else the error of the call that returned `rc` on this
/// thread.
#[inline]
pub(crate) fn check(rc: i32) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::last(rc))
    }
}
