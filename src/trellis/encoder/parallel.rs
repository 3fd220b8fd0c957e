//! Row-parallel loops and the f64 vector kernels of the Hessian-weighted encoder's linear algebra.
//!
//! Work is split into contiguous runs of rows, one per thread, and every value is computed by
//! the same operations whatever the thread count, so results do not depend on it.

/// Splits `data` (rows of `row_len` values) into at most `threads` contiguous runs of whole rows
/// and calls `f(first_row, run)` for each, on its own thread when there is more than one run.
pub(super) fn rows_in_parallel<T: Send>(
    data: &mut [T],
    row_len: usize,
    threads: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if row_len == 0 || data.is_empty() {
        return;
    }
    let rows = data.len() / row_len;
    let threads = threads.clamp(1, rows.max(1));
    if threads == 1 {
        f(0, data);
        return;
    }
    let per_thread = rows.div_ceil(threads);
    std::thread::scope(|scope| {
        let f = &f;
        for (i, run) in data.chunks_mut(per_thread * row_len).enumerate() {
            scope.spawn(move || f(i * per_thread, run));
        }
    });
}

/// `acc += c * x`, element-wise.
#[inline]
pub(super) fn axpy(acc: &mut [f64], c: f64, x: &[f64]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += c * v;
    }
}

/// The dot product of `a` and `b` in f64, in four interleaved partial sums (so the loop
/// vectorises) added in a fixed order.
#[inline]
pub(super) fn dot(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut s = [0f64; 4];
    let (ac, bc) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        s[0] += x[0] * y[0];
        s[1] += x[1] * y[1];
        s[2] += x[2] * y[2];
        s[3] += x[3] * y[3];
    }
    let tail: f64 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    (s[0] + s[1]) + (s[2] + s[3]) + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_plain_loops() {
        let a: Vec<f64> = (0..11).map(|i| i as f64 * 0.5 - 2.0).collect();
        let b: Vec<f64> = (0..11).map(|i| (i * i) as f64 * 0.25).collect();
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - plain).abs() <= 1e-12 * plain.abs());
        let mut acc = b.clone();
        axpy(&mut acc, 3.0, &a);
        for ((&r, &x), &y) in acc.iter().zip(&a).zip(&b) {
            assert_eq!(r, y + 3.0 * x);
        }
    }

    #[test]
    fn every_row_is_visited_once_for_any_thread_count() {
        for threads in [1, 2, 3, 7, 20] {
            let mut data = vec![0usize; 13 * 3];
            rows_in_parallel(&mut data, 3, threads, |first, run| {
                for (r, row) in run.chunks_mut(3).enumerate() {
                    row.iter_mut().for_each(|v| *v += first + r + 1);
                }
            });
            let want: Vec<usize> = (0..13).flat_map(|r| [r + 1; 3]).collect();
            assert_eq!(data, want, "threads {threads}");
        }
    }
}
