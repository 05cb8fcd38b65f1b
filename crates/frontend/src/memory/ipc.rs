//! Interprocess (IPC) handles: the driver's 64 bytes, made and opened by
//! the server, which opens only handles that the same tenant's sessions
//! gave out.

use std::ffi::c_void;

use gpuplex_protocol::{calls, CuError, DevPtr, Event};

use crate::client;
use crate::ffi::{check_out, entry, write_out, CUresult};

/// `CUipcMemHandle` and `CUipcEventHandle`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

fn to_handle(bytes: Vec<u8>) -> Result<IpcHandle, CuError> {
    let reserved = bytes.try_into().map_err(|_| CuError::UNKNOWN)?;
    Ok(IpcHandle { reserved })
}

fn open_mem(dptr: *mut u64, handle: IpcHandle, flags: u32) -> Result<(), CuError> {
    check_out(dptr)?;
    let req = calls::IpcOpenMemHandle::Request { handle: handle.reserved.to_vec(), flags };
    let reply = client::call(req)?;
    // SAFETY: checked non-NULL; the caller vouches for it.
    unsafe { write_out(dptr, reply.dptr.0) };
    Ok(())
}

/// # Safety
/// `handle` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut IpcHandle, dptr: u64) -> CUresult {
    entry("cuIpcGetMemHandle", || {
        check_out(handle)?;
        let reply = client::call(calls::IpcGetMemHandle::Request { dptr: DevPtr(dptr) })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(handle, to_handle(reply.handle)?) };
        Ok(())
    })
}

/// # Safety
/// `dptr` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(dptr: *mut u64, handle: IpcHandle, flags: u32) -> CUresult {
    entry("cuIpcOpenMemHandle_v2", || open_mem(dptr, handle, flags))
}

/// # Safety
/// As `cuIpcOpenMemHandle_v2`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle(dptr: *mut u64, handle: IpcHandle, flags: u32) -> CUresult {
    entry("cuIpcOpenMemHandle", || open_mem(dptr, handle, flags))
}

/// # Safety
/// `handle` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetEventHandle(handle: *mut IpcHandle, event: *mut c_void) -> CUresult {
    entry("cuIpcGetEventHandle", || {
        check_out(handle)?;
        let reply = client::call(calls::IpcGetEventHandle::Request { event: Event(event as u64) })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(handle, to_handle(reply.handle)?) };
        Ok(())
    })
}

/// # Safety
/// `event` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenEventHandle(event: *mut *mut c_void, handle: IpcHandle) -> CUresult {
    entry("cuIpcOpenEventHandle", || {
        check_out(event)?;
        let reply = client::call(calls::IpcOpenEventHandle::Request { handle: handle.reserved.to_vec() })?;
        // SAFETY: checked non-NULL; the caller vouches for it.
        unsafe { write_out(event, reply.event.0 as *mut c_void) };
        Ok(())
    })
}
