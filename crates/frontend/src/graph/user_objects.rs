//! `cuUserObjectCreate`: the destructor stays here, registered under a
//! number as a host node's function is; the server posts that number back
//! when the driver destroys the object. The references are the server
//! driver's to count (`cuUserObjectRetain` and the rest are rows of the
//! table).

use std::ffi::c_void;

use gpuplex_protocol::{calls, CuError};

use crate::ffi::{check_out, entry, write_out, CUresult};
use crate::{client, host_calls};

/// # Safety
/// `object` is valid for a write; `destroy` may be called with `ptr` once,
/// on a thread of gpuplex's, as CUDA calls it on one of its own.
#[no_mangle]
pub unsafe extern "C" fn cuUserObjectCreate(
    object: *mut *mut c_void,
    ptr: *mut c_void,
    destroy: Option<host_calls::HostFn>,
    refs: u32,
    flags: u32,
) -> CUresult {
    entry("cuUserObjectCreate", || {
        check_out(object)?;
        let destroy = destroy.ok_or(CuError::INVALID_VALUE)?;
        let id = host_calls::register(destroy, ptr)?;
        let reply = client::call(calls::UserObjectCreate::Request { destroy: id, initialRefcount: refs, flags })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(object, reply.object.0 as *mut c_void) };
        Ok(())
    })
}
