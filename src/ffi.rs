//! The one funnel through which every mlx-c call reports failure.
//!
//! mlx-c reports a failure by calling a process-global handler and returning a non-zero status
//! (or an empty handle / null pointer from functions that return values). Its default handler
//! prints the message and calls `exit(-1)`. [`call`] and [`call_value`] install this crate's
//! handler once, before the first call, which stores the message in a thread-local slot; the
//! funnel then turns the status (or the presence of a message) into an [`Error::Mlx`].

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Once;

use crate::error::{Error, Result};

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

/// Runs one mlx-c call that returns a status: non-zero becomes an [`Error::Mlx`] that
/// carries MLX's message.
pub(crate) fn call(f: impl FnOnce() -> c_int) -> Result<()> {
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
pub(crate) fn call_value<T>(f: impl FnOnce() -> T) -> Result<T> {
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
    fn a_nonzero_status_without_message_is_still_an_error() {
        let err = call(|| 3).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Mlx);
        assert!(err.message().contains("status 3"), "{err}");
    }
}
