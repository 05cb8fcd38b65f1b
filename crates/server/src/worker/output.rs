//! What a guest's kernels print, caught in its worker and sent to the guest.
//!
//! The CUDA driver prints a kernel's `printf` output and failed device
//! `assert` messages at synchronization points, through the C library's
//! `stdout` and `stderr` streams of the process that owns the context. In a
//! worker that process serves one guest, so the worker points those two
//! streams at buffers of its own ([`capture`]); the session sends what they
//! caught to the guest just before the reply to the call that printed it,
//! and the front-end writes it to the program's own `stdout` and `stderr`,
//! where it lands in order with what the program prints itself, as natively.
//!
//! Writes arrive through `fopencookie`, so checking for output after a call
//! costs one atomic load, no system call. The worker's own logs do not pass
//! through here: they go to the standard error descriptor directly.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

/// Bytes held per stream before older output is dropped for newer: the
/// driver's own device buffer for `printf` is far smaller.
const MAX_HELD: usize = 64 << 20;

/// Output caught and not yet sent: `[stdout, stderr]`.
static HELD: Mutex<[Vec<u8>; 2]> = Mutex::new([Vec::new(), Vec::new()]);
static PENDING: AtomicBool = AtomicBool::new(false);

/// `cookie_io_functions_t`.
#[repr(C)]
struct CookieFunctions {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> isize>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> isize>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}

extern "C" {
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, functions: CookieFunctions) -> *mut libc::FILE;
}

/// The cookie's write: `cookie` is the stream's index (0 stdout, 1 stderr).
unsafe extern "C" fn write(cookie: *mut c_void, data: *const c_char, len: usize) -> isize {
    // SAFETY: the C library passes `len` readable bytes at `data`.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    let stream = &mut held[(cookie as usize).min(1)];
    if stream.len() + bytes.len() > MAX_HELD {
        let drop = (stream.len() + bytes.len() - MAX_HELD).min(stream.len());
        stream.drain(..drop);
    }
    stream.extend_from_slice(&bytes[bytes.len().saturating_sub(MAX_HELD)..]);
    PENDING.store(true, Ordering::Release);
    len as isize
}

/// Points this process's C `stdout` and `stderr` at the buffers. Called
/// once, in a worker, before the backend is opened.
pub fn capture() -> std::io::Result<()> {
    for (index, which) in [(0usize, "stdout"), (1, "stderr")] {
        let functions = CookieFunctions { read: None, write: Some(write), seek: None, close: None };
        // SAFETY: a valid mode string and function table; the cookie is a
        // plain index, never dereferenced.
        let file = unsafe { fopencookie(std::ptr::without_provenance_mut(index), c"w".as_ptr(), functions) };
        if file.is_null() {
            return Err(std::io::Error::other(format!("fopencookie for {which} failed")));
        }
        // SAFETY: `file` is a new stream; unbuffered, so every write reaches
        // the buffer at once and nothing waits in the C library.
        unsafe { libc::setvbuf(file, std::ptr::null_mut(), libc::_IONBF, 0) };
        // SAFETY: replacing the C library's stream pointers, before any other
        // thread of this process prints through them.
        unsafe {
            match index {
                0 => stdout = file,
                _ => stderr = file,
            }
        }
    }
    Ok(())
}

/// Output caught since the last call, as `(stream, bytes)` with stream 1
/// for stdout and 2 for stderr; empty (after one atomic load) if none.
pub fn take() -> Vec<(u32, Vec<u8>)> {
    // A plain load first: this runs after every call, and output is rare.
    if !PENDING.load(Ordering::Relaxed) || !PENDING.swap(false, Ordering::Acquire) {
        return Vec::new();
    }
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    let mut taken = Vec::new();
    for (i, stream) in held.iter_mut().enumerate() {
        if !stream.is_empty() {
            taken.push((i as u32 + 1, std::mem::take(stream)));
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_held_per_stream_until_taken() {
        // Exercises the cookie's write directly: replacing this test
        // process's streams would swallow the test harness's own output.
        // SAFETY: live byte strings and their lengths.
        unsafe {
            write(std::ptr::null_mut(), c"out ".as_ptr(), 4);
            write(std::ptr::without_provenance_mut(1), c"err".as_ptr(), 3);
            write(std::ptr::null_mut(), c"more".as_ptr(), 4);
        }
        assert_eq!(take(), vec![(1, b"out more".to_vec()), (2, b"err".to_vec())]);
        assert!(take().is_empty());
    }
}
