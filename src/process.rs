//! [`exit_process`]: how a program that ran MLX work ends, on every exit path.
//!
//! On MLX's CUDA back-end, returning from `main` (or `std::process::exit`) runs the C++ static
//! destructors of MLX's CUDA objects (streams, events, the allocator's buffers, NCCL and cuBLAS
//! handles) after the CUDA driver has begun to shut down, or while MLX's worker threads are still
//! running. Their destructors then throw (`Destroy(handle_) failed: driver shutting down`), and
//! a throwing destructor at exit is `std::terminate`: the process aborts with status 134 instead
//! of the status it chose, often after an error it had already reported cleanly. Which runs
//! first is a race, so it happened in about half of the runs that ended with an error.
//!
//! [`exit_process`] avoids the race instead of trying to win it: it waits for MLX's queued work,
//! flushes the standard streams, and ends the process with `_exit`, which runs no destructors
//! and no `atexit` handlers. Skipping them is safe because nothing they would do outlives the
//! process: the OS reclaims memory, files and sockets, the CUDA driver reclaims the process's
//! contexts, allocations and handles, and every file the program wrote was closed when its
//! writer returned. Rust values dropped before the call (temporary directories, child
//! processes) have run their `Drop`s as usual.

use std::io::Write;

/// Ends the process with exit status `code`, skipping C++ static destructors (see the module
/// documentation for why): first waits for the work queued on this thread's default MLX stream
/// and frees MLX's buffer cache ([`synchronize`](crate::synchronize); an error there is printed
/// to stderr, and the status is still `code`), then flushes Rust's and C's standard output
/// streams, then calls `_exit(code)`.
///
/// Call it last, from the thread that ran the MLX work, once every value whose `Drop` matters
/// (temporary files, child processes) has been dropped: a program's `main` after its work
/// returned, or a tensor-parallel rank when it is done or has failed.
pub fn exit_process(code: i32) -> ! {
    if let Err(e) = crate::device::synchronize() {
        eprintln!("error while waiting for MLX's queued work before exiting: {e}");
    }
    exit_without_waiting(code)
}

/// [`exit_process`] without waiting for MLX's queued work: for a watchdog whose other thread is
/// blocked inside MLX (waiting there could hang, and tearing MLX's objects down could abort).
pub(crate) fn exit_without_waiting(code: i32) -> ! {
    // A failed flush (a closed pipe) leaves nothing to report to: exit with `code` regardless.
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    flush_c_streams();
    end_now(code)
}

/// Makes the process's ordinary exit from now on (returning from `main`, `std::process::exit`, a
/// test harness's own end) end it with `_exit` and the status `exit` was given, after flushing
/// the standard streams, instead of running the exit handlers and C++ static destructors
/// registered before this call: the ones that abort on MLX's CUDA back-end (see the module
/// documentation). For programs that cannot route every exit through [`exit_process`], such as
/// a test binary, whose harness calls `exit` itself.
///
/// Exit handlers run in the reverse order of their registration, so what is registered after
/// this call (a C++ static constructed later) still runs first: call it once MLX has done GPU
/// work (the back-end's device, streams and allocator exist then), and again after work that
/// may create more (each call registers the handler once more; the latest runs first and ends
/// the process). Nothing waits for MLX's queued work. On targets other than Linux with glibc it
/// does nothing.
pub fn skip_static_destructors_at_exit() {
    register_exit_handler();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn register_exit_handler() {
    // glibc's `on_exit` (not in the libc crate): like `atexit`, and the handler receives the
    // status given to `exit`.
    extern "C" {
        fn on_exit(handler: extern "C" fn(libc::c_int, *mut libc::c_void), arg: *mut libc::c_void) -> libc::c_int;
    }
    extern "C" fn end_with_status(status: libc::c_int, _arg: *mut libc::c_void) {
        exit_without_waiting(status)
    }
    // SAFETY: `end_with_status` is a valid handler for the whole process; the argument is unused.
    // A failed registration (out of memory) leaves the ordinary exit, so its result is ignored.
    let _ = unsafe { on_exit(end_with_status, std::ptr::null_mut()) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn register_exit_handler() {}

/// Flushes every C `FILE` output stream (MLX and NCCL write some messages through C stdio).
#[cfg(unix)]
fn flush_c_streams() {
    // SAFETY: fflush(NULL) flushes all open output streams; it has no preconditions.
    unsafe { libc::fflush(std::ptr::null_mut()) };
}

#[cfg(not(unix))]
fn flush_c_streams() {}

/// `_exit(code)`: the process ends here, without destructors or `atexit` handlers.
#[cfg(unix)]
fn end_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions and does not return.
    unsafe { libc::_exit(code) }
}

/// Elsewhere the ordinary exit (MLX's CUDA back-end runs on Linux only).
#[cfg(not(unix))]
fn end_now(code: i32) -> ! {
    std::process::exit(code)
}
