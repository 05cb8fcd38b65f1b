//! `cuGetProcAddress`: the CUDA runtime (and cuBLAS, PyTorch...) asks for
//! every driver entry point by base name, ABI version and stream flavour.
//!
//! The answers are the real driver's, recorded from driver 580 by
//! `tools/driver-facts/probe.py` (`data/proc_address.tsv`): for each name
//! and flag, the versions at which the answer changes. A query takes the
//! last row at or below its version ("newest variant first" is wrong). The
//! symbol named is then looked up in this library itself. Answered locally,
//! before `cuInit` too.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::OnceLock;

use gpuplex_protocol::CuError;

use crate::ffi::{check_out, entry, write_out, CUresult};

enum Answer {
    /// This exported symbol.
    Symbol(&'static str),
    /// No function: the call's status and the query status.
    Status { rc: u32, status: i32 },
}

/// `(name, flags, from_version, answer)`, sorted by name, flags, version.
static TABLE: &[(&str, u8, u32, Answer)] = include!(concat!(env!("OUT_DIR"), "/proc_address.rs"));

/// `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`.
const SYMBOL_NOT_FOUND: i32 = 1;

/// What the driver answers for `(name, version, flags)`.
fn lookup(name: &str, version: i32, flags: u64) -> &'static Answer {
    static NOT_FOUND: Answer = Answer::Status { rc: 0, status: SYMBOL_NOT_FOUND };
    let Ok(flags) = u8::try_from(flags) else { return &NOT_FOUND };
    let start = TABLE.partition_point(|r| (r.0, r.1) < (name, flags));
    TABLE[start..]
        .iter()
        .take_while(|r| (r.0, r.1) == (name, flags))
        .take_while(|r| r.2 as i64 <= version as i64)
        .last()
        .map_or(&NOT_FOUND, |r| &r.3)
}

/// The address of one of this library's own exports.
fn own_symbol(name: &str) -> *mut c_void {
    static SELF: OnceLock<usize> = OnceLock::new();
    let handle = *SELF.get_or_init(|| {
        // SAFETY: Dl_info is plain data; all-zero is a valid value.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid out-pointer; the address is our own function.
        let found = unsafe { libc::dladdr(cuGetProcAddress_v2 as *const c_void, &mut info) };
        if found == 0 || info.dli_fname.is_null() {
            return 0;
        }
        // SAFETY: dladdr gave this library's file name; NOLOAD only finds it.
        unsafe { libc::dlopen(info.dli_fname, libc::RTLD_NOW | libc::RTLD_NOLOAD) as usize }
    });
    let Ok(name) = CString::new(name) else { return std::ptr::null_mut() };
    if handle == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a live handle and a C string.
    unsafe { libc::dlsym(handle as *mut c_void, name.as_ptr()) }
}

fn get(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> Result<(), CuError> {
    check_out(pfn)?;
    if symbol.is_null() {
        return Err(CuError::INVALID_VALUE);
    }
    // SAFETY: the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    let (function, rc, query) = match lookup(name, version, flags) {
        Answer::Symbol(s) => {
            let f = own_symbol(s);
            if f.is_null() {
                crate::log::error(&format!("cuGetProcAddress: {s} is not exported by this library"));
                return Err(CuError::NOT_FOUND);
            }
            (f, 0, 0)
        }
        Answer::Status { rc, status } => (std::ptr::null_mut(), *rc, *status),
    };
    // SAFETY: checked non-NULL / NULL skipped; the caller vouches for them.
    unsafe {
        write_out(pfn, function);
        if query >= 0 {
            write_out(status, query);
        }
    }
    match rc {
        // The old form has no status to say "not found" with.
        0 if function.is_null() && status.is_null() => Err(CuError::NOT_FOUND),
        0 => Ok(()),
        rc => Err(CuError(rc)),
    }
}

/// # Safety
/// `symbol` is a C string; `pfn` and `status` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut i32,
) -> CUresult {
    entry("cuGetProcAddress_v2", || get(symbol, pfn, version, flags, status))
}

/// The CUDA 11.3 form, without a query status: a missing symbol is
/// `CUDA_ERROR_NOT_FOUND`.
///
/// # Safety
/// `symbol` is a C string; `pfn` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    entry("cuGetProcAddress", || get(symbol, pfn, version, flags, std::ptr::null_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(name: &str, version: i32, flags: u64) -> String {
        match lookup(name, version, flags) {
            Answer::Symbol(s) => s.to_string(),
            Answer::Status { rc, status } => format!("rc={rc},status={status}"),
        }
    }

    #[test]
    fn picks_the_variant_of_the_asked_version() {
        assert_eq!(answer("cuMemAlloc", 3020, 0), "cuMemAlloc_v2");
        assert_eq!(answer("cuMemAlloc", 13000, 0), "cuMemAlloc_v2");
        assert_eq!(answer("cuMemAlloc", 2000, 0), "cuMemAlloc");
        assert_eq!(answer("cuCtxCreate", 12000, 0), "cuCtxCreate_v3");
        assert_eq!(answer("cuCtxCreate", 13000, 0), "cuCtxCreate_v4");
        assert_eq!(answer("cuGetProcAddress", 12000, 0), "cuGetProcAddress_v2");
    }

    #[test]
    fn per_thread_flag_picks_ptsz_variants() {
        assert_eq!(answer("cuLaunchKernel", 13000, 2), "cuLaunchKernel_ptsz");
        assert_eq!(answer("cuLaunchKernel", 13000, 1), "cuLaunchKernel");
        assert_eq!(answer("cuMemcpyHtoD", 13000, 2), "cuMemcpyHtoD_v2_ptds");
    }

    #[test]
    fn unknown_and_too_new_answer_as_the_driver_does() {
        assert_eq!(answer("cuNoSuchThing", 13000, 0), "rc=0,status=1");
        assert_eq!(answer("cuMemAlloc", 13010, 0), "rc=1,status=-1");
        assert_eq!(answer("cuLaunchKernel", 6000, 2), "rc=0,status=2");
    }
}
