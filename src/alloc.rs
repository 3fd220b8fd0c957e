//! Allocations whose size comes from input: refused with an error instead of aborting the
//! process when the size overflows or the allocator cannot serve it.

use crate::error::{Error, Result};

/// An empty vector with room for `n` elements; `what` names them in the error.
pub(crate) fn try_with_capacity<T>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = Vec::new();
    match v.try_reserve_exact(n) {
        Ok(()) => Ok(v),
        Err(_) => Err(refused::<T>(n, what())),
    }
}

/// `n` copies of `value`; `what` names them in the error.
pub(crate) fn try_filled<T: Clone>(n: usize, value: T, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = try_with_capacity(n, what)?;
    v.resize(n, value);
    Ok(v)
}

fn refused<T>(n: usize, what: String) -> Error {
    let bytes = (n as u128) * std::mem::size_of::<T>() as u128;
    Error::invalid(format!("cannot allocate {what}: {n} elements ({bytes} bytes)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        let e = try_filled(usize::MAX, 0f64, || "a test buffer".into()).unwrap_err();
        assert!(e.to_string().starts_with("cannot allocate a test buffer: 18446744073709551615 elements"), "{e}");
        assert_eq!(try_filled(3, 7u8, || unreachable!()).unwrap(), [7, 7, 7]);
    }
}
