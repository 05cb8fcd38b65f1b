//! The C boundary: every export runs its body through [`entry`], which turns
//! `Result`s into CUresult codes and stops panics at the border (unwinding
//! into C is undefined behaviour).

use std::collections::HashSet;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use gpuplex_protocol::{CuError, Stream};

/// `CUresult`.
pub type CUresult = u32;
pub const CUDA_SUCCESS: CUresult = 0;

/// Runs one export's body.
pub fn entry(name: &'static str, body: impl FnOnce() -> Result<(), CuError>) -> CUresult {
    let run = || match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e.0,
        Err(_) => {
            crate::log::error(&format!("{name} panicked; returning CUDA_ERROR_UNKNOWN"));
            CuError::UNKNOWN.0
        }
    };
    if crate::trace::on() {
        crate::trace::export(name, run, |&rc| rc != CUDA_SUCCESS)
    } else {
        run()
    }
}

/// Refuses a NULL out-pointer before anything is sent, as the driver does.
pub fn check_out<T>(ptr: *mut T) -> Result<(), CuError> {
    if ptr.is_null() {
        Err(CuError::INVALID_VALUE)
    } else {
        Ok(())
    }
}

/// Writes an out-parameter; NULL is skipped (optional outs).
///
/// # Safety
/// `ptr` is NULL or valid for a write of `T`.
pub unsafe fn write_out<T>(ptr: *mut T, value: T) {
    if !ptr.is_null() {
        // SAFETY: non-NULL and valid per this function's contract.
        unsafe { ptr.write_unaligned(value) }
    }
}

/// An input the caller passes by pointer (a union it filled in); NULL is
/// CUDA_ERROR_INVALID_VALUE, as the driver answers.
pub fn read_in<T: Copy>(ptr: *const T) -> Result<T, CuError> {
    if ptr.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: non-NULL, and valid for a read of `T` as the CUDA API requires
    // of the caller.
    Ok(unsafe { ptr.read_unaligned() })
}

/// A C string argument (a kernel or global name).
pub fn c_name(ptr: *const c_char) -> Result<String, CuError> {
    if ptr.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated string, as the CUDA API requires.
    let s = unsafe { CStr::from_ptr(ptr) };
    s.to_str().map(str::to_owned).map_err(|_| CuError::INVALID_VALUE)
}

/// A stream argument of a `_ptsz` entry point: NULL means the calling
/// thread's per-thread default stream.
pub fn ptsz_stream(stream: *mut std::ffi::c_void) -> Stream {
    match stream as u64 {
        0 => Stream::PER_THREAD,
        s => Stream(s),
    }
}

/// A stream argument of an ordinary entry point.
pub fn stream(stream: *mut std::ffi::c_void) -> Stream {
    Stream(stream as u64)
}

/// The answer of every export gpuplex does not implement yet: an error,
/// never a pretended success, and one log line per function.
pub fn unsupported(name: &'static str) -> CUresult {
    if crate::trace::on() {
        return crate::trace::export(name, || refuse(name), |_| true);
    }
    refuse(name)
}

fn refuse(name: &'static str) -> CUresult {
    static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let first = SEEN.lock().map(|mut seen| seen.get_or_insert_with(HashSet::new).insert(name)).unwrap_or(false);
    if first {
        crate::log::warn(&format!("{name} is not supported by gpuplex yet; returning CUDA_ERROR_NOT_SUPPORTED"));
    }
    CuError::NOT_SUPPORTED.0
}

/// Defines the NOT_SUPPORTED stubs listed by the generated code.
macro_rules! unsupported_exports {
    ($($name:ident),* $(,)?) => {$(
        /// Not implemented yet.
        ///
        /// # Safety
        /// Reads no arguments.
        #[no_mangle]
        pub unsafe extern "C" fn $name() -> $crate::ffi::CUresult {
            $crate::ffi::unsupported(stringify!($name))
        }
    )*};
}
pub(crate) use unsupported_exports;
