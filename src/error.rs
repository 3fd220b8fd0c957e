//! Errors, and the one funnel through which every mlx-c call reports failure.
//!
//! mlx-c reports a failure by calling a process-global handler and returning a non-zero status
//! (or an empty handle / null pointer from functions that return values). Its default handler
//! prints the message and calls `exit(-1)`. [`call`] and [`call_value`] install this crate's
//! handler once, before the first call, which stores the message in a thread-local slot; the
//! funnel then turns the status (or the presence of a message) into an [`Error`].

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::fmt;
use std::sync::Once;

/// The API's result type: an [`anyhow::Result`] whose root cause is an [`Error`] where the failure
/// came from MLX or from a check in this crate.
pub type Result<T> = anyhow::Result<T>;

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// MLX (through mlx-c) reported the failure; the message is MLX's.
    Mlx,
    /// This crate refused a call before reaching MLX (wrong length, dtype, shape, argument).
    InvalidArgument,
}

/// A failure reported by MLX or caught by this crate's own checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// An error for a call this crate refuses before reaching MLX.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::InvalidArgument, message: message.into() }
    }

    pub(crate) fn mlx(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Mlx, message: message.into() }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message (MLX's own text for [`ErrorKind::Mlx`]).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ErrorKind::Mlx => write!(f, "MLX: {}", self.message),
            ErrorKind::InvalidArgument => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {}

/// Returns early with an [`ErrorKind::InvalidArgument`] error built from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::invalid(format!($($arg)*)).into())
    };
}
pub(crate) use invalid;

thread_local! {
    /// The last message mlx-c reported on this thread and nobody has taken yet.
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

extern "C" fn store_error(msg: *const c_char, _data: *mut c_void) {
    let text = if msg.is_null() {
        "unknown error (mlx-c passed no message)".to_string()
    } else {
        // SAFETY: mlx-c passes a NUL-terminated string that lives for the duration of the call.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    };
    // A handler must never unwind into C++: `try_with` cannot panic, even during thread exit.
    let _ = LAST_ERROR.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            *slot = Some(text);
        }
    });
}

/// Installs this crate's error handler exactly once per process.
pub(crate) fn ensure_handler() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: `store_error` matches `mlx_error_handler_func`, never unwinds, and uses no data
        // pointer, so passing null data without a destructor is sound.
        unsafe { mlx_sys::mlx_set_error_handler(Some(store_error), std::ptr::null_mut(), None) };
    });
}

fn take_last_error() -> Option<String> {
    LAST_ERROR.with(|slot| slot.borrow_mut().take())
}

/// Runs one mlx-c call that returns a status: non-zero becomes an [`ErrorKind::Mlx`] error that
/// carries MLX's message.
pub(crate) fn call(f: impl FnOnce() -> c_int) -> std::result::Result<(), Error> {
    ensure_handler();
    drop(take_last_error());
    let status = f();
    match (status, take_last_error()) {
        (0, None) => Ok(()),
        (0, Some(msg)) | (_, Some(msg)) => Err(Error::mlx(msg)),
        (status, None) => Err(Error::mlx(format!("mlx-c call failed with status {status} and no message"))),
    }
}

/// Runs one mlx-c call that returns a value and reports failure only through the handler.
pub(crate) fn call_value<T>(f: impl FnOnce() -> T) -> std::result::Result<T, Error> {
    ensure_handler();
    drop(take_last_error());
    let value = f();
    match take_last_error() {
        None => Ok(value),
        Some(msg) => Err(Error::mlx(msg)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_source() {
        assert_eq!(Error::mlx("boom").to_string(), "MLX: boom");
        assert_eq!(Error::invalid("bad shape").to_string(), "bad shape");
        assert_eq!(Error::invalid("x").kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn a_nonzero_status_without_message_is_still_an_error() {
        let err = call(|| 3).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Mlx);
        assert!(err.message().contains("status 3"), "{err}");
    }
}
